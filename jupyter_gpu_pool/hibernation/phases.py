"""The phases of a kernel's hibernation, and the moves between them.

The ledger keeps a lease's settled state (``active`` / ``hibernated``); while a move is under way
the lease also carries a phase, so that every server and ``jupyter gpu-pool status`` see it::

    active ──hibernate──▶ hibernating ──▶ hibernated ──resume──▶ resuming ──▶ active
      ▲                        │                          │          ▲
      └── lock timed out, ─────┘                          └▶ queued ─┘  (no slice free: waits its turn)
          a cell started,                                        │
          a step failed and was undone                           └── quota / refusal ──▶ hibernated

    hibernated ──evicting (host RAM cap, warned, deadline)──▶ shut down
    any ──failed──  a step failed and could not be undone: the message says each process's CUDA state

What the user sees (``state`` in ``GET me``) is the phase where there is one, else the lease's state.
The provisioner marks a lease ``stopping`` while its kernel shuts down (pool.leases.STOPPING): no
hibernation or resume starts then, and none of ours changes that phase.
"""

from __future__ import annotations

from ..pool import ACTIVE, HIBERNATED, RELEASED, Lease

HIBERNATING = "hibernating"
RESUMING = "resuming"
QUEUED = "queued"
EVICTING = "evicting"  # hibernated, and to be shut down at the phase deadline (host RAM cap)
FAILED = "failed"

PHASES = (HIBERNATING, RESUMING, QUEUED, EVICTING, FAILED)
IN_FLIGHT = (HIBERNATING, RESUMING, QUEUED)

# (settled state, phase) → the phases that may follow; "" is "settled, no phase".
MOVES: dict[tuple[str, str], tuple[str, ...]] = {
    (ACTIVE, ""): (HIBERNATING, FAILED),
    (ACTIVE, HIBERNATING): ("", FAILED),  # "" with state active: undone; with state hibernated: done
    (HIBERNATED, ""): (RESUMING, QUEUED, EVICTING),
    (HIBERNATED, RESUMING): ("", QUEUED, FAILED),
    (HIBERNATED, QUEUED): (RESUMING, ""),
    (HIBERNATED, EVICTING): ("", RESUMING, QUEUED),
    (HIBERNATED, HIBERNATING): ("",),  # checkpointed and the slice given back: settled
    (ACTIVE, QUEUED): (RESUMING,),  # the queue just handed it a slice
    (ACTIVE, RESUMING): ("", FAILED),  # slice taken, memory being restored
    (ACTIVE, EVICTING): ("",),  # resumed by its user before the deadline: spared
    (ACTIVE, FAILED): ("",),  # an admin or a restart clears it
    (HIBERNATED, FAILED): ("",),
}


class PhaseError(RuntimeError):
    """A move the state machine does not allow (a bug, or two movers at once)."""


def check_move(state: str, phase: str, new_phase: str) -> None:
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
    return lease.state
