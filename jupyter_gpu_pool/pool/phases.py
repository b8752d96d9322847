"""A held lease's transient phase, and the moves between phases.

The ledger keeps a lease's settled state (``active`` / ``hibernated``) and, while something is
being done to its kernel, a phase.  The phase is the one record of "what is under way": every
server, the CLI and the UI read it from the store, and every mover changes it by compare-and-set
(the store's ``set_phase(lease_id, to, expect=...)``), so two movers can never both start::

    active ──hibernate──▶ hibernating ──▶ hibernated ──resume──▶ resuming ──▶ active
      ▲                        │                          │          ▲
      └── lock timed out, ─────┘                          └▶ queued ─┘  (no slice free: waits its turn)
          a cell started,                                        │
          a step failed and was undone                           └── quota / refusal ──▶ hibernated

    (start) ──▶ hibernated, reason first_cell ("no GPU yet")  slice_at first-cell: the kernel started
                 holding nothing; its first cell takes a slice the way a resume does (resuming / queued),
                 with nothing to restore
    hibernated ──evicting (host RAM cap, warned, deadline)──▶ shut down
    any ──failed──  a step failed and could not be undone: the message says each process's CUDA state
    any ──stopping──▶ released   the kernel is being shut down (a cull, its user, its server);
                                 a restart's new process clears it

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

# (settled state, phase) → the phases that may follow; "" is "settled, no phase".
# Any phase may move to STOPPING (a shutdown wins over a move in flight); see check_move.
MOVES: dict[tuple[str, str], tuple[str, ...]] = {
    (ACTIVE, ""): (HIBERNATING, FAILED),
    (ACTIVE, HIBERNATING): ("", FAILED),  # "" with state active: undone; with state hibernated: done
    (HIBERNATED, ""): (RESUMING, QUEUED, EVICTING),
    (HIBERNATED, RESUMING): ("", QUEUED, FAILED),
    (HIBERNATED, QUEUED): (RESUMING, ""),
    (HIBERNATED, EVICTING): ("", RESUMING, QUEUED),
    (HIBERNATED, HIBERNATING): ("",),  # checkpointed and the slice given back: settled
    (ACTIVE, QUEUED): (RESUMING, ""),  # the queue just handed it a slice ("": its server died; recovered)
    (ACTIVE, RESUMING): ("", FAILED),  # slice taken, memory being restored
    (ACTIVE, EVICTING): ("",),  # resumed by its user before the deadline: spared
    (ACTIVE, FAILED): ("",),  # an admin or a restart clears it
    (HIBERNATED, FAILED): ("",),
    (ACTIVE, STOPPING): ("",),  # a restart: the new kernel process holds it again
    (HIBERNATED, STOPPING): ("",),
}


class PhaseError(RuntimeError):
    """A move the state machine does not allow (a bug, or two movers at once)."""


class PhaseConflict(PhaseError):
    """The lease was not in the phase the mover expected: another mover got there first."""

    def __init__(self, lease_id: str, expected: str, found: str, state: str):
        self.lease_id, self.expected, self.found, self.state = lease_id, expected, found, state
        super().__init__(f"lease {lease_id[:8]} is {state} in phase {found or 'settled'!r}, "
                         f"not {expected or 'settled'!r} as expected")


def check_move(state: str, phase: str, new_phase: str) -> None:
    if new_phase == STOPPING:
        return
    allowed = MOVES.get((state, phase), ())
    if new_phase not in allowed:
        shown = phase or "settled"
        raise PhaseError(f"a {state} lease in phase {shown!r} cannot move to {new_phase or 'settled'!r}; "
                         f"allowed: {', '.join(p or 'settled' for p in allowed) or 'nothing'}")


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
