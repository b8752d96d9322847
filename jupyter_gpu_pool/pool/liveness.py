"""Whether a held lease's holders are gone, so that its slice must be reclaimed (invariant 2).

Pure: the store passes in ``is_alive(pid, start)``, which the edge answers from the process
table (``local.processes.is_alive``); nothing here looks at processes itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .leases import Lease
from .phases import STOPPING

IsAlive = Callable[[int, float], bool]

# Why a lease ended with its server: the server stopped and shut its kernels down (jupyter_server's
# exit), or a later reconcile found the server's process gone.  Either way the kernel's variables
# are gone, a hibernated kernel's too; the user's "What happened" says so.
SERVER_STOPPED = "server_stopped"
SERVER_GONE = "server process is gone"
KERNEL_AND_SERVER_GONE = "kernel process and its server are gone"


def ended_with_server(reason: str) -> bool:
    """Whether a lease released for ``reason`` ended because its server stopped."""
    return reason in (SERVER_STOPPED, SERVER_GONE, KERNEL_AND_SERVER_GONE)


@dataclass(frozen=True)
class Graces:
    """How long a lease may be held by no live kernel process before it is reclaimed."""

    holder: float = 30.0  # a kernel that died, for its server's restarter; a shutdown its server did not finish
    launch: float = 120.0  # a lease taken for a kernel that never recorded its process


def dead_reason(lease: Lease, is_alive: IsAlive, now: float, graces: Graces = Graces()) -> str | None:
    """Why the lease's slice must be reclaimed now, or None while it is really held."""
    manager_alive = lease.manager_pid is None or is_alive(lease.manager_pid, lease.manager_start or 0.0)
    if lease.holder_pid is not None:
        if is_alive(lease.holder_pid, lease.holder_start or 0.0):
            return None  # the kernel lives, so the memory is really held
        if not manager_alive:
            return KERNEL_AND_SERVER_GONE
        if now - lease.updated > graces.holder:
            return "kernel process ended and its server did not restart it"
        return None
    if not manager_alive:
        return SERVER_GONE
    if lease.phase == STOPPING:
        if now - lease.updated > graces.holder:
            return "kernel was shut down but its server did not release the slice"
        return None
    if now - lease.updated > graces.launch:
        return "kernel never started"
    return None
