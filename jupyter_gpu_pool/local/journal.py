"""The journal's table in the local ledger: one row per thing that happened, kept for a while."""

from __future__ import annotations

import json
import sqlite3

from ..pool import JournalEntry
from . import rows


def write(db: sqlite3.Connection, at: float, kind: str, lease_id: str | None, kernel_id: str | None,
          owner: str | None, reason: str, detail: dict) -> None:
    db.execute(
        "INSERT INTO journal(at, kind, lease_id, kernel_id, owner, reason, detail) VALUES(?,?,?,?,?,?,?)",
        (at, kind, lease_id, kernel_id, owner, reason, json.dumps(detail)),
    )


def read(db: sqlite3.Connection, *, since: float, kinds: tuple[str, ...], owner: str | None,
         limit: int, after_seq: int = 0) -> list[JournalEntry]:
    """Newest first."""
    sql, args = "SELECT * FROM journal WHERE at >= ? AND seq > ?", [since, after_seq]
    if kinds:
        sql += f" AND kind IN ({','.join('?' * len(kinds))})"
        args += list(kinds)
    if owner is not None:
        sql += " AND owner=?"
        args.append(owner)
    sql += " ORDER BY seq DESC LIMIT ?"
    args.append(limit)
    return [rows.journal_entry(r) for r in db.execute(sql, args)]


def held(db: sqlite3.Connection, owner: str) -> tuple[int, int]:
    """How many entries of ``owner`` the journal keeps, and the characters of their detail."""
    entries, stored = db.execute("SELECT count(*), coalesce(sum(length(detail)), 0) FROM journal WHERE owner=?",
                                 (owner,)).fetchone()
    return entries, stored


def prune(db: sqlite3.Connection, before: float) -> None:
    db.execute("DELETE FROM journal WHERE at < ?", (before,))
