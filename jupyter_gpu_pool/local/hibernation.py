"""A lease's hibernation in the local ledger: its GPU memory in host RAM, its slice back in the pool, and the
host RAM that hibernations hold or have claimed on each machine (the cap every server shares)."""

from __future__ import annotations

import sqlite3

from ..pool import ACTIVE, HELD, HIBERNATED, Lease, LeaseNotFound
from . import journal, leases, usage


def _active(db: sqlite3.Connection, lease_id: str) -> Lease:
    lease = leases.get(db, lease_id)
    if lease is None or lease.state != ACTIVE:
        raise LeaseNotFound(lease_id)
    return lease


def hibernate(db: sqlite3.Connection, lease_id: str, host_bytes: int, reason: str,
              last_gpus: tuple[str, ...] | None, phase: str, now: float) -> Lease:
    """The active lease's memory is in host RAM (``host_bytes``): its slice and GPU time end, it is left in
    ``phase``; ``last_gpus``: where the memory came from, when not the GPUs held now."""
    lease = _active(db, lease_id)
    db.execute("DELETE FROM allocations WHERE lease_id=?", (lease_id,))
    usage.close_intervals(db, lease_id, now)
    db.execute(
        """UPDATE leases SET state=?, last_gpus=?, host_bytes=?, reason=?, updated=?, state_since=?,
           phase=?, phase_deadline=NULL WHERE id=?""",
        (HIBERNATED, " ".join(last_gpus if last_gpus is not None else lease.gpus), host_bytes, reason, now,
         now, phase, lease_id),
    )
    journal.write(db, now, "hibernated", lease_id, lease.kernel_id, lease.owner, reason,
                  {"host_bytes": host_bytes, "gpus": list(lease.gpus)})
    return leases.get(db, lease_id)  # type: ignore[return-value]


def reserve_host_bytes(db: sqlite3.Connection, lease_id: str, host_bytes: int, cap: int | None,
                       host: str) -> tuple[bool, int]:
    """Claim ``host_bytes`` on ``host`` for an active lease about to hibernate: (granted, bytes the others
    hold or claimed); with ``cap`` None there is no limit."""
    _active(db, lease_id)
    (others,) = db.execute(
        "SELECT COALESCE(SUM(host_bytes),0) FROM leases WHERE state IN (?,?) AND host=? AND id<>?",
        (*HELD, host, lease_id)).fetchone()
    if cap is not None and others + host_bytes > cap:
        return False, others
    db.execute("UPDATE leases SET host_bytes=? WHERE id=?", (host_bytes, lease_id))
    return True, others


def host_bytes_on(db: sqlite3.Connection, host: str) -> int:
    """Host RAM held or claimed by hibernation on ``host``."""
    (total,) = db.execute("SELECT COALESCE(SUM(host_bytes),0) FROM leases WHERE state IN (?,?) AND host=?",
                          (*HELD, host)).fetchone()
    return total
