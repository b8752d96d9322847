"""The queue's table in the local ledger: waiters in arrival order, kept alive by heartbeats.

A waiter whose heartbeat is older than the ledger's ``waiter_ttl`` is gone (its server died or
gave up): it is no longer in line, and the next reconcile deletes it.
"""

from __future__ import annotations

import sqlite3

from ..pool import SliceSpec, Waiter
from . import rows


def add(db: sqlite3.Connection, waiter_id: str, owner: str, kernel_id: str, profile: str, spec: SliceSpec,
        lease_id: str | None, label: str, now: float, groups: tuple[str, ...] = ()) -> None:
    db.execute(
        """INSERT INTO waiters(id, owner, kernel_id, lease_id, profile, slice, label, enqueued, heartbeat, groups)
           VALUES(?,?,?,?,?,?,?,?,?,?)""",
        (waiter_id, owner, kernel_id, lease_id, profile, spec.to_text(), label, now, now, "\n".join(groups)),
    )


def live(db: sqlite3.Connection, now: float, ttl: float) -> list[Waiter]:
    found = db.execute("SELECT * FROM waiters WHERE heartbeat >= ? ORDER BY enqueued, rowid", (now - ttl,))
    return [rows.waiter(r, i + 1) for i, r in enumerate(found.fetchall())]


def touch(db: sqlite3.Connection, waiter_id: str, now: float) -> None:
    db.execute("UPDATE waiters SET heartbeat=? WHERE id=?", (now, waiter_id))


def remove(db: sqlite3.Connection, waiter_id: str) -> None:
    db.execute("DELETE FROM waiters WHERE id=?", (waiter_id,))


def remove_for_lease(db: sqlite3.Connection, lease_id: str) -> None:
    db.execute("DELETE FROM waiters WHERE lease_id=?", (lease_id,))


def prune(db: sqlite3.Connection, now: float, ttl: float) -> None:
    db.execute("DELETE FROM waiters WHERE heartbeat < ?", (now - ttl,))


def owner(db: sqlite3.Connection, waiter_id: str) -> str | None:
    """Whose place ``waiter_id`` is, live or past its heartbeat (None: no such place)."""
    row = db.execute("SELECT owner FROM waiters WHERE id=?", (waiter_id,)).fetchone()
    return row[0] if row else None
