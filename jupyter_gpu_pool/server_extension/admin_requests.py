"""An admin's action on a kernel that runs in another Jupyter server of the same pool.

Only the server that runs a kernel can hibernate it or shut it down (the process is its child; on a
teaching machine it runs as another Unix user).  So the admin's server puts the request on the
pool's journal (kind ``requested``: the action and who asked, :func:`ask`), and the kernel's own
server's culler carries it out at its next pass, through the same path as its own user's request
(``Culler.act``), and puts on record that an admin did it.  The journal is the pool's one shared
record; nothing else is shared.
"""

from __future__ import annotations

from ..pool import Lease
from .backends.base import PoolBackend

KIND = "requested"
ACTIONS = ("release", "hibernate", "shutdown")


async def ask(backend: PoolBackend, lease: Lease, action: str, by: str) -> None:
    """Put the request on the journal, for the kernel's own server."""
    await backend.record(KIND, lease_id=lease.id, kernel_id=lease.kernel_id, owner=lease.owner,
                         reason="admin", detail={"action": action, "by": by, "name": lease.label,
                                                 "profile": lease.profile})
