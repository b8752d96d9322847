"""What a kernel's user reads when the slice is given back on request (theirs or an admin's), or when
a hibernation the policy ordered failed: the one place these messages are written."""

from __future__ import annotations

from ..pool import policy as P
from ..pool.units import format_clock


def on_request(action: str, by: str | None = None) -> str:
    """``action``: what was done (hibernate or shutdown); ``by``: the admin who asked (None: the user did)."""
    who = "at your request" if by is None else f"by an admin ({by})"
    if action == P.HIBERNATE:
        return f"Hibernated {who}: the GPU slice is back in the pool, your variables are kept."
    return f"Shut down {who}: the GPU slice is back in the pool."


# A kernel ended because its server stopped (jupyter_server shuts its kernels down at exit).
SERVER_STOPPED = ("Ended when the server stopped: the GPU slice is back in the pool, the kernel's variables are gone. "
                  "Open the notebook and start a kernel to go on.")


def hibernation_failed(why: str, retry_after: float) -> str:
    """A hibernation the policy ordered failed and was undone (``why``: the hibernator's sentence); the
    policy tries again from ``retry_after`` on, if the kernel is still due then."""
    why = why.rstrip(".")
    return (f"Hibernation failed: {why[:1].lower()}{why[1:]}; the kernel kept running, with its variables and its "
            f"GPU slice. The pool tries again at {format_clock(retry_after)} at the earliest.")
