"""What a kernel's user reads when the slice is given back on request (theirs or an admin's), when a
hibernation the policy ordered failed, when a Keep alive was granted or a kernel waits in the queue: the
one place these messages are written, from the pool's catalogue of words (``pool.words``)."""

from __future__ import annotations

from ..pool.units import format_clock
from ..pool.words import ACTIONS, count, notebook_label


def on_request(action: str, by: str | None = None) -> str:
    """``action``: what was done (hibernate or shutdown); ``by``: the admin who asked (None: the user did)."""
    who = "at your request" if by is None else f"by an admin ({by})"
    done = ACTIONS[action]
    return f"{done.done} {who}: {done.outcome}."


# A kernel ended because its server stopped (jupyter_server shuts its kernels down at exit).
SERVER_STOPPED = ("Ended when the server stopped: the GPU slice is back in the pool, the kernel's variables are gone. "
                  "Open the notebook and start a kernel to go on.")


def hibernation_failed(why: str, retry_after: float, now: float) -> str:
    """A hibernation the policy ordered failed and was undone (``why``: the hibernator's sentence); the
    policy tries again from ``retry_after`` on, if the kernel is still due then."""
    why = why.rstrip(".")
    return (f"Hibernation failed: {why[:1].lower()}{why[1:]}; the kernel kept running, with its variables and its "
            f"GPU slice. The pool tries again at {format_clock(retry_after, now)} at the earliest.")


def kept_alive(until: float, now: float, left: int, then: str | None) -> str:
    """What a Keep alive did, said once: until when (``until``), how many more the rule allows (``left``),
    and what follows if the kernel stays idle (``then``: hibernate or shutdown; None: nothing soon after)."""
    more = f"{count(left, 'more Keep alive')} allowed" if left else "no more Keep alive allowed"
    after = f", then {ACTIONS[then].then} if still idle" if then is not None else ""
    return f"Kept alive until {format_clock(until, now)}{after}; {more}."


def queued(for_resume: bool, name: str, launcher: str | None, position: int) -> str:
    """A kernel waits in the queue: to resume (``name``: its notebook), or to start (``launcher``: the profile
    as the launcher shows it)."""
    name = notebook_label(name)
    if for_resume:
        what = f"resume {name or 'this kernel'}"
    else:
        profile = f"'{launcher}'" if launcher else "a kernel"
        what = f"start {profile}{f' for {name}' if name else ''}"
    return f"Waiting for a GPU slice to {what}: position {position} in the queue."
