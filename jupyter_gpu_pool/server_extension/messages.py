"""What a kernel's user reads when the slice is given back on request (theirs or an admin's): the
one place these messages are written."""

from __future__ import annotations

from ..pool import policy as P


def on_request(action: str, by: str | None = None) -> str:
    """``action``: what was done (hibernate or shutdown); ``by``: the admin who asked (None: the user did)."""
    who = "at your request" if by is None else f"by an admin ({by})"
    if action == P.HIBERNATE:
        return f"Hibernated {who}: the GPU slice is back in the pool, your variables are kept."
    return f"Shut down {who}: the GPU slice is back in the pool."


# A kernel ended because its server stopped (jupyter_server shuts its kernels down at exit).
SERVER_STOPPED = ("Ended when the server stopped: the GPU slice is back in the pool, the kernel's variables are gone. "
                  "Open the notebook and start a kernel to go on.")
