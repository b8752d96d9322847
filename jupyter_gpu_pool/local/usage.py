"""GPU time spent, in the local ledger: one row per active interval of a lease (its share of its GPU,
from its grant or resume to its hibernation or release).  Budgets are judged on these rows."""

from __future__ import annotations

import sqlite3

from ..pool.budgets import BudgetBook, Scope, Standing

# The spending of a scope's intervals within [start, now]: SQLite sums the overlap of each.
_SPENT = """SELECT COALESCE(SUM(u.share * (MIN(COALESCE(u.stop, :now), :now) - MAX(u.start, :start))), 0)
            FROM usage u {join} WHERE {who} AND u.start < :now AND COALESCE(u.stop, :now) > :start"""
_RATE = "SELECT COALESCE(SUM(u.share), 0) FROM usage u {join} WHERE {who} AND u.stop IS NULL"


def _who(scope: Scope, user: str) -> tuple[str, str, dict]:
    if scope.kind == "shared":
        return "JOIN lease_groups g ON g.lease_id = u.lease_id", "g.grp = :name", {"name": scope.name}
    return "", "u.owner = :name", {"name": user}


def open_interval(db: sqlite3.Connection, lease_id: str, owner: str, share: float, now: float) -> None:
    db.execute("INSERT INTO usage(lease_id, owner, share, start, stop) VALUES(?,?,?,?,NULL)",
               (lease_id, owner, share, now))


def close_intervals(db: sqlite3.Connection, lease_id: str, now: float) -> None:
    db.execute("UPDATE usage SET stop=? WHERE lease_id=? AND stop IS NULL", (now, lease_id))


def spent_hours(db: sqlite3.Connection, scope: Scope, user: str, start: float, now: float) -> float:
    join, who, args = _who(scope, user)
    (seconds,) = db.execute(_SPENT.format(join=join, who=who), {**args, "start": start, "now": now}).fetchone()
    return seconds / 3600


def rate(db: sqlite3.Connection, scope: Scope, user: str) -> float:
    join, who, args = _who(scope, user)
    (shares,) = db.execute(_RATE.format(join=join, who=who), args).fetchone()
    return shares


def prune(db: sqlite3.Connection, before: float) -> None:
    db.execute("DELETE FROM usage WHERE stop IS NOT NULL AND stop < ?", (before,))


def standing(db: sqlite3.Connection, budgets: BudgetBook, owner: str, groups: tuple[str, ...],
             now: float) -> Standing | None:
    """Where ``owner`` stands against their tightest GPU-hour budget now (None: no budget applies)."""
    if not budgets.budgets:
        return None
    return budgets.standing(owner, groups, lambda scope, start: spent_hours(db, scope, owner, start, now),
                            lambda scope: rate(db, scope, owner), now)


def spenders(db: sqlite3.Connection, since: float, now: float) -> list[str]:
    """The users whose slices were active at some time since ``since``."""
    return [r[0] for r in db.execute("SELECT DISTINCT owner FROM usage WHERE COALESCE(stop, ?) > ? ORDER BY owner",
                                     (now, since))]
