"""The activity trace's table in the local ledger (``pool.trace``): events in time order, kept for
``GPUPool.trace_retention``, read back in pages for ``jupyter gpu-pool trace export``."""

from __future__ import annotations

import json
import sqlite3

from ..pool.trace import TraceEvent


def write(db: sqlite3.Connection, events: list[TraceEvent]) -> None:
    db.executemany("INSERT INTO trace(at, kind, kernel_id, owner, data) VALUES(?,?,?,?,?)",
                   [(e.at, e.kind, e.kernel_id, e.owner, json.dumps(e.data, separators=(",", ":")))
                    for e in events])


def read(db: sqlite3.Connection, *, since: float, until: float, owner: str | None,
         after: tuple[float, int] | None, limit: int) -> list[tuple[int, TraceEvent]]:
    """Up to ``limit`` events in [since, until] in time order, each with its row number, from just past
    ``after`` (the (time, row) of the last event of the previous page); ``owner``: theirs only."""
    sql, args = "SELECT seq, at, kind, kernel_id, owner, data FROM trace WHERE at >= ? AND at <= ?", [since, until]
    if after is not None:
        sql += " AND (at > ? OR (at = ? AND seq > ?))"
        args += [after[0], after[0], after[1]]
    if owner is not None:
        sql += " AND owner = ?"
        args.append(owner)
    sql += " ORDER BY at, seq LIMIT ?"
    args.append(limit)
    return [(r[0], TraceEvent(r[1], r[2], r[3], r[4], json.loads(r[5]))) for r in db.execute(sql, args)]


def prune(db: sqlite3.Connection, before: float) -> None:
    db.execute("DELETE FROM trace WHERE at < ?", (before,))
