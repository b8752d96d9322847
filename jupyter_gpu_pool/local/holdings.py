"""What the allocation decision (``pool.allocation.allocate``) reads of the local ledger for one ask: the
leases its quotas count, each GPU's usage, the queue, the MPS users of each GPU, the asker's budget and
what sharing needs, all in the caller's write transaction."""

from __future__ import annotations

import sqlite3

from ..pool import ACTIVE, MPS, GPUUsage, QuotaBook
from ..pool.allocation import Ask, Holdings
from ..pool.budgets import BudgetBook
from ..pool.sharing import Sharing
from . import inventory, leases, queue, usage
from . import sharing as sharing_reads


def read(db: sqlite3.Connection, ask: Ask, quotas: QuotaBook, budgets: BudgetBook, now: float, *,
         waiter_ttl: float, sharing: Sharing, gpu_usage: list[GPUUsage] | None = None) -> Holdings:
    """The holdings for ``ask`` (``gpu_usage``: each GPU's usage where the caller read it already)."""
    waiters = queue.live(db, now, waiter_ttl)
    return Holdings(leases=leases.counted_for_quota(db, ask.owner, quotas.limited_groups(ask.groups)),
                    gpus=tuple(gpu_usage if gpu_usage is not None else inventory.usage(db)),
                    waiters=tuple(waiters),
                    mps_users=mps_users(db) if ask.profile.isolation == MPS else {},
                    budget=usage.standing(db, budgets, ask.owner, ask.groups, now),
                    **sharing_reads.shared(db, sharing, now, waiters, sharing_reads.held_now(db)))


def mps_users(db: sqlite3.Connection) -> dict[str, frozenset[str]]:
    """The users with an active MPS slice on each GPU (one MPS daemon serves one user at a time)."""
    found: dict[str, set[str]] = {}
    for uuid, owner in db.execute(
            "SELECT a.gpu_uuid, l.owner FROM allocations a JOIN leases l ON l.id = a.lease_id "
            "WHERE l.isolation = ? AND l.state = ?", (MPS, ACTIVE)):
        found.setdefault(uuid, set()).add(owner)
    return {uuid: frozenset(owners) for uuid, owners in found.items()}
