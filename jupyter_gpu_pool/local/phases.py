"""A held lease's phase in the local ledger (what is under way: ``pool.phases``), changed only by
compare-and-set so that two movers never act on one kernel at once (invariant 7)."""

from __future__ import annotations

import sqlite3

from ..pool import Lease
from ..pool.phases import STOPPING, PhaseConflict
from ..pool.residency import check_move
from . import leases


def _expected(current: Lease, expect: str | None) -> None:
    if expect is not None and current.phase != expect:
        raise PhaseConflict(current.id, expect, current.phase, current.state)


def stop(db: sqlite3.Connection, lease_id: str, expect: str | None, now: float) -> Lease:
    """Phase ``stopping``, no kernel process recorded; with ``expect``, only from that phase."""
    _expected(leases.held(db, lease_id), expect)
    db.execute("UPDATE leases SET holder_pid=NULL, holder_start=NULL, updated=?, phase=?, phase_deadline=NULL "
               "WHERE id=?", (now, STOPPING, lease_id))
    return leases.get(db, lease_id)  # type: ignore[return-value]


def set_phase(db: sqlite3.Connection, lease_id: str, to: str, expect: str | None, deadline: float | None) -> Lease:
    """Phase ``to`` along a move the residency model allows; with ``expect``, only from that phase.  Leaves
    ``updated`` alone: reconcile's grace counts from the holder's changes."""
    current = leases.held(db, lease_id)
    _expected(current, expect)
    check_move(current.state, current.phase, to)
    db.execute("UPDATE leases SET phase=?, phase_deadline=? WHERE id=?", (to, deadline, lease_id))
    return leases.get(db, lease_id)  # type: ignore[return-value]
