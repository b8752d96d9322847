"""The GPUs' table in the local ledger: the pool's GPUs as last discovered, and what each holds now."""

from __future__ import annotations

import sqlite3

from ..pool import GPU, GPUUsage
from . import rows


def sync(db: sqlite3.Connection, gpus: list[GPU], now: float) -> None:
    """Make the pool's GPUs these; the others are kept, marked absent (they may still hold leases)."""
    db.execute("UPDATE gpus SET present=0")
    for g in gpus:
        db.execute(
            """INSERT INTO gpus(uuid, name, memory, idx, sm_count, node, source, mig, present, seen)
               VALUES(?,?,?,?,?,?,?,?,1,?)
               ON CONFLICT(uuid) DO UPDATE SET name=excluded.name, memory=excluded.memory,
                 idx=excluded.idx, sm_count=excluded.sm_count, node=excluded.node,
                 source=excluded.source, mig=excluded.mig, present=1, seen=excluded.seen""",
            (g.uuid, g.name, g.memory, g.index, g.sm_count, g.node, g.source, int(g.mig), now),
        )


def gpus(db: sqlite3.Connection, present_only: bool = True) -> list[GPU]:
    where = "WHERE present=1" if present_only else ""
    return [rows.gpu(r) for r in db.execute(f"SELECT * FROM gpus {where} ORDER BY node, idx, uuid")]


def usage(db: sqlite3.Connection) -> list[GPUUsage]:
    """Each present GPU's usage, summed by SQLite from the allocations (one query, any number of leases)."""
    found = db.execute(
        """SELECT g.*, COALESCE(SUM(a.memory), 0) AS used, COALESCE(SUM(a.sm_percent), 0) AS sm,
                  COALESCE(MAX(a.exclusive), 0) AS excl, COUNT(a.lease_id) AS n
           FROM gpus g LEFT JOIN allocations a ON a.gpu_uuid = g.uuid
           WHERE g.present = 1 GROUP BY g.uuid ORDER BY g.node, g.idx, g.uuid""")
    return [GPUUsage(rows.gpu(r), r["used"], r["sm"], bool(r["excl"]), r["n"]) for r in found]


def overcommitted(db: sqlite3.Connection) -> list[str]:
    """GPUs whose allocations pass their capacity, in words (must always be empty: invariant 1)."""
    return [f"{u.gpu.uuid}: {u.memory}/{u.gpu.memory} bytes, {u.sm_percent}% SM, {u.leases} leases"
            for u in usage(db) if u.memory > u.gpu.memory or u.sm_percent > 100 or (u.exclusive and u.leases > 1)]
