"""What the admin's sharing (``pool.sharing``: reservations, a fair queue) reads of the local ledger: every
held lease while a reservation keeps room (members' use of it), each share group's decayed use from the
GPU-time intervals, and the queue's places as sharing orders them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ..pool import HELD, GPUUsage, Lease, Waiter
from ..pool.fairshare import FAIR, FairShare, decayed
from ..pool.sharing import Sharing
from . import inventory, leases, queue


def shared(db: sqlite3.Connection, sharing: Sharing, now: float, waiters: list[Waiter],
           held: Callable[[], list[Lease]]) -> dict:
    """``Holdings``' sharing inputs: ``everyone`` (``held()``, every held lease) while a reservation keeps
    room, ``group_use`` in a fair queue with waiters; nothing first come, first served."""
    found: dict = {}
    if sharing.plain:
        return found
    if sharing.needs_everyone(now):
        found["everyone"] = tuple(held())
    if sharing.order == FAIR and waiters:
        found["group_use"] = group_use(db, sharing.fair, now)
    return found


def group_use(db: sqlite3.Connection, fair: FairShare, now: float) -> dict[str, float]:
    """Each share group's GPU memory held over time, decayed by the half-life (``fairshare.decayed``), from
    the GPU-time intervals of the leases still on record (released ones a week: 2^-7 of a day's half-life)."""
    intervals: dict[str, list] = {}
    for memory, start, stop, groups in db.execute(
            "SELECT l.memory * l.gpu_count, u.start, u.stop, l.groups FROM usage u JOIN leases l ON l.id = u.lease_id "
            "WHERE COALESCE(u.stop, ?) > ?", (now, now - 20 * fair.half_life)):
        group = fair.group_of(g for g in groups.split("\n") if g)
        intervals.setdefault(group, []).append((memory, start, stop))
    return {group: decayed(found, now, fair.half_life) for group, found in intervals.items()}


def told(sharing: Sharing, now: float, waiters: list[Waiter], usage: list[GPUUsage], inputs: dict) -> list[Waiter]:
    """The live queue with each waiter's place as it is served, and why (``Line.told``)."""
    line = sharing.line(waiters, now=now, gpus=usage, use=inputs.get("group_use", {}),
                        everyone=inputs.get("everyone", ()))
    return list(line.told())


def places(db: sqlite3.Connection, sharing: Sharing, now: float, ttl: float) -> list[Waiter]:
    """The live queue with each waiter's place as it is served (sharing's order, and why), else by arrival."""
    waiters = queue.live(db, now, ttl)
    if sharing.plain or not waiters:
        return waiters
    return told(sharing, now, waiters, inventory.usage(db), shared(db, sharing, now, waiters, held_now(db)))


def held_now(db: sqlite3.Connection) -> Callable[[], list[Lease]]:
    """Every held lease, read only where sharing asks for them."""
    return lambda: leases.in_states(db, None, HELD)
