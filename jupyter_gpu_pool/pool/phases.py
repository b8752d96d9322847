"""A held lease's transient phase: its names, the errors of a move, and what the UI shows.

The ledger keeps a lease's settled state (``active`` / ``hibernated``) and, while something is
being done to its kernel, a phase.  The phase is the one record of "what is under way": every
server, the CLI and the UI read it from the store, and every mover changes it by compare-and-set
(the store's ``set_phase(lease_id, to, expect=...)``), so two movers can never both start.  Which
phase may follow which is not written here: it is derived from the kernel's lifecycle, written once
in :mod:`.residency` (``residency.MOVES``, ``residency.check_move``), with its diagram.

What the user sees (``state`` in ``GET me``) is :func:`display_state`.
"""

from __future__ import annotations

from .leases import ACTIVE, HIBERNATED, RELEASED, Lease

NO_GPU_YET = "no_gpu_yet"  # what the UI shows for a kernel that has held no slice yet (Lease.awaits_first_cell)

HIBERNATING = "hibernating"
RESUMING = "resuming"
QUEUED = "queued"
EVICTING = "evicting"  # hibernated, and to be shut down at the phase deadline (host RAM cap)
FAILED = "failed"
STOPPING = "stopping"  # its kernel is being shut down: nothing else may start on it

PHASES = (HIBERNATING, RESUMING, QUEUED, EVICTING, FAILED, STOPPING)
IN_FLIGHT = (HIBERNATING, RESUMING, QUEUED)  # a move of the kernel's memory under way
SETTLED = ""


class PhaseError(RuntimeError):
    """A move the state machine does not allow (a bug, or two movers at once)."""


class PhaseConflict(PhaseError):
    """The lease was not in the phase the mover expected: another mover got there first."""

    def __init__(self, lease_id: str, expected: str, found: str, state: str):
        self.lease_id, self.expected, self.found, self.state = lease_id, expected, found, state
        super().__init__(f"lease {lease_id[:8]} is {state} in phase {found or 'settled'!r}, "
                         f"not {expected or 'settled'!r} as expected")


def display_state(lease: Lease | None) -> str:
    """The word the UI shows for a kernel's GPU state."""
    if lease is None or lease.state == RELEASED:
        return RELEASED
    if lease.phase in IN_FLIGHT:
        return lease.phase
    if lease.phase == EVICTING:
        return HIBERNATED
    if lease.awaits_first_cell:
        return NO_GPU_YET
    return lease.state
