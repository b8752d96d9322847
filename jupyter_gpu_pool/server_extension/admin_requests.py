"""An admin's action on a kernel that runs in another Jupyter server of the same pool.

Only the server that runs a kernel can hibernate it or shut it down (the process is its child; on a
teaching machine it runs as another Unix user).  So the admin's server puts the request on the
pool's journal (kind ``requested``: the action and who asked), and the kernel's own server carries it
out at its next culling pass, through the same paths as its own user's request, and puts on record
that an admin did it.  The journal is the pool's one shared record; nothing else is shared.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..pool import HIBERNATED, Lease
from ..pool import policy as P

if TYPE_CHECKING:
    from .culler import Culler

log = logging.getLogger(__name__)

KIND = "requested"
ACTIONS = ("release", "hibernate", "shutdown")


def message_for(action: str, by: str | None) -> str:
    """What the kernel's user reads of it (``by``: the admin who asked; None: the user did)."""
    if action == P.HIBERNATE:
        who = "at your request" if by is None else f"by an admin ({by})"
        return f"Hibernated {who}: the GPU slice is back in the pool, your variables are kept."
    who = "at your request" if by is None else f"by an admin ({by})"
    return f"Shut down {who}: the GPU slice is back in the pool."


async def ask(culler: Culler, lease: Lease, action: str, by: str) -> None:
    """Put the request on the journal, for the kernel's own server."""
    await culler.backend.record(KIND, lease_id=lease.id, kernel_id=lease.kernel_id, owner=lease.owner,
                                reason="admin", detail={"action": action, "by": by, "name": lease.label,
                                                        "profile": lease.profile})


def carry_out(culler: Culler, lease: Lease, action: str, by: str | None) -> str:
    """Start the action on a kernel of this server; return what is done (hibernate or shutdown).

    ``by``: the admin who asked (None: the kernel's own user).  ``release`` is what the kernel's rule
    says (hibernate where it can, else shut down); a ``hibernate`` the kernel cannot do is refused
    (ValueError, saying why)."""
    kernel = culler.km.get_kernel(lease.kernel_id)
    rule = culler.rule_for(kernel, lease)
    if action == "release" and by is None:
        return culler.release(lease.kernel_id, lease, rule)  # the user's own Release GPU
    can, why = culler.hibernation(lease)
    note = None
    if action == "hibernate":
        if lease.state == HIBERNATED:
            raise ValueError("it is hibernated already")
        if not can:
            raise ValueError(f"it cannot hibernate: {why}")
        done = P.HIBERNATE
    elif action == "release":
        done, note = P.release_action(rule, can, why)
    else:
        done = P.SHUTDOWN
    culler.states[lease.kernel_id] = P.FRESH
    culler.spawn(lease.kernel_id, culler.carry_out(lease.kernel_id, lease, rule, done, "user" if by is None else "admin",
                                                   message_for(done, by), note, user_release=True))
    return done


async def follow(culler: Culler, entries) -> None:
    """Carry out the requests among ``entries`` (new journal entries of this server's owner) for
    kernels this server runs; a request for a kernel that ended meanwhile has nothing to do."""
    if not entries:
        return
    snapshot = await culler.backend.snapshot()
    for e in entries:
        if e.kind != KIND or e.kernel_id not in culler.km or culler.busy(e.kernel_id):
            continue
        lease = snapshot.lease_of_kernel(e.kernel_id)
        action, by = e.detail.get("action"), str(e.detail.get("by") or "an admin")
        if lease is None or lease.phase or action not in ACTIONS:
            continue
        try:
            done = carry_out(culler, lease, action, by)
        except ValueError as why:
            log.info("kernel %s: %s's request to %s it is not carried out: %s", e.kernel_id, by, action, why)
            await culler.recorder.record("refused", lease, reason="admin", message=f"Not {action}d: {why}.",
                                         action=action)
            continue
        log.info("kernel %s: %s at the request of admin %s", e.kernel_id, done, by)
