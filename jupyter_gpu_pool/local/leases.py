"""The leases' table in the local ledger: reading leases, who holds one, its notebook's name, its end.

Each function runs inside the caller's transaction (``Database.read`` / ``write``); the ones that change a
lease act on a held one only (:class:`LeaseNotFound` otherwise).
"""

from __future__ import annotations

import sqlite3

from ..pool import HELD, RELEASED, Holder, Lease, LeaseNotFound
from . import journal, queue, rows, usage
from .rows import LEASE_SELECT


def get(db: sqlite3.Connection, lease_id: str) -> Lease | None:
    row = db.execute(f"{LEASE_SELECT} WHERE l.id=?", (lease_id,)).fetchone()
    return rows.lease(row) if row else None


def held(db: sqlite3.Connection, lease_id: str) -> Lease:
    """The lease, where it is held (active or hibernated)."""
    lease = get(db, lease_id)
    if lease is None or lease.state not in HELD:
        raise LeaseNotFound(lease_id)
    return lease


def of_kernel(db: sqlite3.Connection, kernel_id: str) -> Lease | None:
    """The held lease of a kernel, if any (the newest, were there ever two)."""
    row = db.execute(f"{LEASE_SELECT} WHERE l.kernel_id=? AND l.state IN (?,?) ORDER BY l.created DESC",
                     (kernel_id, *HELD)).fetchone()
    return rows.lease(row) if row else None


def owners_of_kernel(db: sqlite3.Connection, kernel_id: str) -> set[str]:
    """Who holds or held a lease for ``kernel_id`` (while its rows are kept)."""
    return {r[0] for r in db.execute("SELECT DISTINCT owner FROM leases WHERE kernel_id=?", (kernel_id,))}


def in_states(db: sqlite3.Connection, owner: str | None, states: tuple[str, ...]) -> list[Lease]:
    sql = f"{LEASE_SELECT} WHERE l.state IN ({','.join('?' * len(states))})"
    args: list = list(states)
    if owner is not None:
        sql += " AND l.owner=?"
        args.append(owner)
    return [rows.lease(r) for r in db.execute(sql + " ORDER BY l.created", args)]


def counted_for_quota(db: sqlite3.Connection, owner: str, groups: list[str]) -> tuple[Lease, ...]:
    """The held leases a quota decision for ``owner`` needs: theirs and their limited groups'."""
    sql = f"{LEASE_SELECT} WHERE l.state IN (?,?) AND (l.owner=?"
    args: list = [*HELD, owner]
    if groups:
        sql += f" OR l.id IN (SELECT lease_id FROM lease_groups WHERE grp IN ({','.join('?' * len(groups))}))"
        args += groups
    return tuple(rows.lease(r) for r in db.execute(sql + ") ORDER BY l.created", args))


def _update_held(db: sqlite3.Connection, lease_id: str, sets: str, args: list) -> None:
    cur = db.execute(f"UPDATE leases SET {sets} WHERE id=? AND state IN (?,?)", (*args, lease_id, *HELD))
    if cur.rowcount == 0:
        raise LeaseNotFound(lease_id)


def set_holder(db: sqlite3.Connection, lease_id: str, holder: Holder | None, phase: str | None, now: float) -> None:
    """The kernel process holding the lease (None while it restarts or stops); ``phase`` too where given."""
    sets, args = "holder_pid=?, holder_start=?, updated=?", [holder.pid if holder else None,
                                                              holder.start if holder else None, now]
    if phase is not None:
        sets += ", phase=?, phase_deadline=NULL"
        args.append(phase)
    _update_held(db, lease_id, sets, args)


def relabel(db: sqlite3.Connection, lease_id: str, label: str, now: float) -> None:
    _update_held(db, lease_id, "label=?, updated=?", [label, now])


def adopt(db: sqlite3.Connection, lease_id: str, manager: Holder, now: float) -> Lease:
    """A restarted server (``manager``) takes over a running kernel's lease."""
    _update_held(db, lease_id, "manager_pid=?, manager_start=?, updated=?", [manager.pid, manager.start, now])
    return get(db, lease_id)  # type: ignore[return-value]


def release(db: sqlite3.Connection, lease: Lease | None, reason: str, now: float,
            kind: str = "released") -> Lease | None:
    """Give the slice back, end its GPU time and its place in the queue, journal it as ``kind``; None where
    it was released already."""
    if lease is None or lease.state == RELEASED:
        return None
    db.execute("DELETE FROM allocations WHERE lease_id=?", (lease.id,))
    usage.close_intervals(db, lease.id, now)
    queue.remove_for_lease(db, lease.id)
    db.execute(
        "UPDATE leases SET state=?, reason=?, updated=?, state_since=?, ended=?, phase='', phase_deadline=NULL "
        "WHERE id=?",
        (RELEASED, reason, now, now, now, lease.id),
    )
    journal.write(db, now, kind, lease.id, lease.kernel_id, lease.owner, reason,
                  {"profile": lease.profile, "gpus": list(lease.gpus), "held_for": now - lease.created,
                   "label": lease.label})
    return get(db, lease.id)


def prune(db: sqlite3.Connection, before: float) -> None:
    """Forget leases that ended before ``before``."""
    old = [(r[0],) for r in db.execute("SELECT id FROM leases WHERE state=? AND ended < ?", (RELEASED, before))]
    db.executemany("DELETE FROM lease_groups WHERE lease_id=?", old)
    db.executemany("DELETE FROM leases WHERE id=?", old)
