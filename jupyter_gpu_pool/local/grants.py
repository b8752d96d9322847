"""A slice the allocation decision granted, written into the local ledger: a new kernel's lease with its
allocations, a lease that holds no slice until its first cell, and a hibernated lease's slice taken again.
Each runs in the caller's write transaction, after the decision it writes."""

from __future__ import annotations

import sqlite3
import uuid

from ..pool import ACTIVE, HIBERNATED, Lease, LeaseRequest, SliceSpec
from ..pool.allocation import Grant
from ..pool.budgets import share_of
from ..pool.leases import FIRST_CELL
from . import journal, leases, queue, usage


def _insert_lease(db: sqlite3.Connection, request: LeaseRequest, *, state: str, memory: int, gpus: str,
                  host: str, now: float, reason: str = "", borrowed: tuple[str, ...] = ()) -> str:
    """A new lease row of ``request`` and its groups; its id."""
    spec = request.profile.slice
    lease_id = uuid.uuid4().hex
    manager = request.manager
    db.execute(
        """INSERT INTO leases(id, owner, kernel_id, profile, isolation, memory, sm_percent, whole,
             gpu_count, state, last_gpus, groups, label, created, updated, state_since, host,
             manager_pid, manager_start, reason, borrowed)
           VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
        (lease_id, request.owner, request.kernel_id, request.profile.name, request.profile.isolation,
         memory, spec.sm_percent, int(spec.whole), spec.gpu_count, state, gpus, "\n".join(request.groups),
         request.label, now, now, now, host or (manager.host if manager else ""),
         manager.pid if manager else None, manager.start if manager else None, reason, "\n".join(borrowed)),
    )
    db.executemany("INSERT INTO lease_groups(lease_id, grp) VALUES(?,?)",
                   [(lease_id, group) for group in request.groups])
    return lease_id


def _allocations(db: sqlite3.Connection, lease_id: str, spec: SliceSpec, grant: Grant) -> None:
    db.executemany(
        "INSERT INTO allocations(lease_id, gpu_uuid, memory, sm_percent, exclusive) VALUES(?,?,?,?,?)",
        [(lease_id, g.uuid, spec.memory_on(g.memory), spec.sm_on(), int(spec.whole)) for g in grant.gpus],
    )


def _gpu_time(db: sqlite3.Connection, lease_id: str, grant: Grant, now: float) -> Lease:
    """The lease as taken, its GPU time counted from now."""
    taken = leases.held(db, lease_id)
    usage.open_interval(db, lease_id, taken.owner, share_of(taken, grant.gpus[0].memory), now)
    return taken


def open_lease(db: sqlite3.Connection, request: LeaseRequest, grant: Grant, *, host: str, waiter_id: str | None,
               now: float) -> Lease:
    """A new kernel's lease on the granted GPUs; its place in the queue, if it had one, ends."""
    gpus = [g.uuid for g in grant.gpus]
    lease_id = _insert_lease(db, request, state=ACTIVE, memory=grant.memory, gpus=" ".join(gpus), host=host,
                             now=now, borrowed=grant.borrowed)
    _allocations(db, lease_id, request.profile.slice, grant)
    if waiter_id:
        queue.remove(db, waiter_id)
    journal.write(db, now, "allocated", lease_id, request.kernel_id, request.owner, "",
                  {"profile": request.profile.name, "gpus": gpus, "label": request.label,
                   **({"borrowed": list(grant.borrowed)} if grant.borrowed else {})})
    return _gpu_time(db, lease_id, grant, now)


def open_without_slice(db: sqlite3.Connection, request: LeaseRequest, *, host: str, now: float) -> Lease:
    """A kernel that holds no slice until its first cell: hibernated with reason ``first_cell``, no GPU."""
    lease_id = _insert_lease(db, request, state=HIBERNATED, memory=request.profile.slice.memory or 0, gpus="",
                             host=host, now=now, reason=FIRST_CELL)
    journal.write(db, now, "opened", lease_id, request.kernel_id, request.owner, FIRST_CELL,
                  {"profile": request.profile.name})
    return leases.held(db, lease_id)


def take_again(db: sqlite3.Connection, lease: Lease, grant: Grant, *, waiter_id: str | None, now: float) -> Lease:
    """A hibernated lease active again on the granted GPUs (a first cell's first slice: the kernel's start, as
    the journal and the trace count it); its phase is kept for the resume's mover to settle."""
    gpus = [g.uuid for g in grant.gpus]
    _allocations(db, lease.id, lease.slice, grant)
    db.execute(
        "UPDATE leases SET state=?, updated=?, state_since=?, last_gpus=?, host_bytes=0, memory=?, reason=?, "
        "borrowed=? WHERE id=?",  # memory: a whole GPU's size is known once it is placed (a first cell's)
        (ACTIVE, now, now, " ".join(gpus), grant.memory, "" if lease.awaits_first_cell else lease.reason,
         "\n".join(grant.borrowed), lease.id),
    )
    if waiter_id:
        queue.remove(db, waiter_id)
    if lease.awaits_first_cell:
        journal.write(db, now, "allocated", lease.id, lease.kernel_id, lease.owner, FIRST_CELL,
                      {"profile": lease.profile, "gpus": gpus, "waited_for_cell": now - lease.created})
    else:
        journal.write(db, now, "resumed", lease.id, lease.kernel_id, lease.owner, "",
                      {"gpus": gpus, "hibernated_for": now - lease.state_since})
    return _gpu_time(db, lease.id, grant, now)
