"""The local ledger: who holds which slice of which GPU, in one SQLite file on this machine.

An adapter around the pure pool core.  It reads the pool's state into the core's types, asks
:func:`jupyter_gpu_pool.pool.allocation.allocate` where a slice goes (or why not), and writes the
answer, all in one write transaction so that no two processes can take the same free slice
(invariant 1).  Nothing else is decided here.

Every held lease names its holders (the managing server process and the kernel process, each as
pid + start time).  :meth:`Ledger.reconcile` releases leases whose holders are gone (invariant 2).
Judging liveness reads the process table, so it is done *outside* the write lock, and each dead
lease is released by a short write that first checks nothing changed since it was judged.  The
culler reconciles on its interval; an allocation reconciles only when it is refused (a dead
kernel may be what fills the pool), at most once a second per process.

All methods are synchronous and short; async callers run them in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
import uuid
from typing import Callable

from ..pool import (
    ACTIVE,
    BINPACK,
    GPU,
    HELD,
    HIBERNATED,
    RELEASED,
    GPUUsage,
    MPS,
    Holder,
    JournalEntry,
    Lease,
    LeaseNotFound,
    LeaseRequest,
    PoolError,
    PoolExhausted,
    Profile,
    QuotaExceeded,
    QuotaBook,
    SliceSpec,
    Snapshot,
    Usage,
    Waiter,
)
from ..pool.allocation import Ask, Grant, Holdings, allocate, check_quota, resume_candidates
from ..pool.budgets import NO_BUDGETS, BudgetBook, BudgetExceeded, Standing, share_of
from ..pool.errors import MPSUserBusy
from ..pool.sharing import Sharing
from ..pool.leases import FIRST_CELL
from ..pool.liveness import Graces, IsAlive, dead_reason
from ..pool.phases import STOPPING, PhaseConflict
from ..pool.residency import check_move
from ..pool.trace import TraceEvent
from . import journal, queue, rows, trace, usage
from . import sharing as sharing_reads
from .database import Database
from .rows import LEASE_SELECT
from .store import LeaseStore


REFUSALS = (QuotaExceeded, PoolExhausted, BudgetExceeded, MPSUserBusy)  # the answers a reconcile may change
USAGE_KEPT = 40 * 86400  # GPU-time intervals are kept past the longest budget period (a month)


class Ledger(LeaseStore):
    """The lease ledger on one SQLite file, shared by every process of the pool on this machine."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 30.0,
        holder_grace: float = 30.0,
        launch_grace: float = 120.0,
        waiter_ttl: float = 15.0,
        history_seconds: float = 7 * 86400,
        reconcile_on_refusal: float = 1.0,
        mode: int | None = None,
        sharing: Sharing | None = None,
    ):
        self.db = Database(path, busy_timeout=busy_timeout, mode=mode)
        self.path = self.db.path
        self.clock = clock
        self.graces = Graces(holder=holder_grace, launch=launch_grace)
        self.waiter_ttl = waiter_ttl
        self.history_seconds = history_seconds
        self.reconcile_on_refusal = reconcile_on_refusal  # seconds between two refusal-driven reconciles
        self._reconciled_at = float("-inf")  # time.monotonic() of this process's last reconcile
        # the admin's reservations and queue order (pool.sharing): the allocation decision and the queue's
        # places follow them; the default is first come, first served
        self.sharing = sharing or Sharing()

    @property
    def where(self) -> str:
        """Where the leases are kept, for people."""
        return f"ledger {self.path}"

    def reconciled_within(self, seconds: float) -> bool:
        """Whether this process reconciled in the last ``seconds`` (another reconcile would find
        what that one found: callers asking for one now may skip it)."""
        return time.monotonic() - self._reconciled_at < seconds

    def close(self) -> None:
        self.db.close()

    # -- inventory -----------------------------------------------------------------------------

    def sync_gpus(self, gpus: list[GPU]) -> None:
        """Make the pool's GPUs these.  GPUs no longer present take no new leases but keep
        the leases they hold (a kernel on a GPU that vanished is the admin's to deal with)."""
        now = self.clock()
        with self.db.write() as db:
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

    def gpus(self, present_only: bool = True) -> list[GPU]:
        with self.db.read() as db:
            where = "WHERE present=1" if present_only else ""
            return [rows.gpu(r) for r in db.execute(f"SELECT * FROM gpus {where} ORDER BY node, idx, uuid")]

    @staticmethod
    def _usage(db: sqlite3.Connection) -> list[GPUUsage]:
        """Each present GPU's usage, summed by SQLite from the allocations (one query, any number of leases)."""
        found = db.execute(
            """SELECT g.*, COALESCE(SUM(a.memory), 0) AS used, COALESCE(SUM(a.sm_percent), 0) AS sm,
                      COALESCE(MAX(a.exclusive), 0) AS excl, COUNT(a.lease_id) AS n
               FROM gpus g LEFT JOIN allocations a ON a.gpu_uuid = g.uuid
               WHERE g.present = 1 GROUP BY g.uuid ORDER BY g.node, g.idx, g.uuid""")
        return [GPUUsage(rows.gpu(r), r["used"], r["sm"], bool(r["excl"]), r["n"]) for r in found]

    # -- reading leases ------------------------------------------------------------------------

    def get(self, lease_id: str) -> Lease | None:
        with self.db.read() as db:
            return self._get(db, lease_id)

    @staticmethod
    def _get(db: sqlite3.Connection, lease_id: str) -> Lease | None:
        row = db.execute(f"{LEASE_SELECT} WHERE l.id=?", (lease_id,)).fetchone()
        return rows.lease(row) if row else None

    def by_kernel(self, kernel_id: str) -> Lease | None:
        """The held lease of a kernel, if any."""
        with self.db.read() as db:
            row = db.execute(
                f"{LEASE_SELECT} WHERE l.kernel_id=? AND l.state IN (?,?) ORDER BY l.created DESC",
                (kernel_id, *HELD),
            ).fetchone()
            return rows.lease(row) if row else None

    def kernel_owners(self, kernel_id: str) -> set[str]:
        """Who holds or held a lease for ``kernel_id`` (while its rows are kept)."""
        with self.db.read() as db:
            return {r[0] for r in db.execute("SELECT DISTINCT owner FROM leases WHERE kernel_id=?", (kernel_id,))}

    def leases(self, owner: str | None = None, states: tuple[str, ...] = HELD) -> list[Lease]:
        with self.db.read() as db:
            return self._leases(db, owner, states)

    @staticmethod
    def _leases(db: sqlite3.Connection, owner: str | None, states: tuple[str, ...]) -> list[Lease]:
        sql = f"{LEASE_SELECT} WHERE l.state IN ({','.join('?' * len(states))})"
        args: list = list(states)
        if owner is not None:
            sql += " AND l.owner=?"
            args.append(owner)
        return [rows.lease(r) for r in db.execute(sql + " ORDER BY l.created", args)]

    @staticmethod
    def _quota_leases(db: sqlite3.Connection, owner: str, groups: list[str]) -> tuple[Lease, ...]:
        """The held leases a quota decision for ``owner`` needs: theirs and their limited groups'."""
        sql = f"{LEASE_SELECT} WHERE l.state IN (?,?) AND (l.owner=?"
        args: list = [*HELD, owner]
        if groups:
            sql += f" OR l.id IN (SELECT lease_id FROM lease_groups WHERE grp IN ({','.join('?' * len(groups))}))"
            args += groups
        return tuple(rows.lease(r) for r in db.execute(sql + ") ORDER BY l.created", args))

    def snapshot(self) -> Snapshot:
        now = self.clock()
        with self.db.read() as db:
            return Snapshot(at=now, gpus=self._usage(db), leases=self._leases(db, None, HELD),
                            waiters=self._queue(db, now))

    def usage_of(self, owner: str) -> Usage:
        from ..pool.quotas import usage_of

        return usage_of(self.leases(owner))

    # -- allocation ----------------------------------------------------------------------------

    def _holdings(self, db: sqlite3.Connection, ask: Ask, quotas: QuotaBook, budgets: BudgetBook, now: float,
                  gpu_usage: list[GPUUsage] | None = None) -> Holdings:
        waiters = queue.live(db, now, self.waiter_ttl)
        return Holdings(leases=self._quota_leases(db, ask.owner, quotas.limited_groups(ask.groups)),
                        gpus=tuple(gpu_usage if gpu_usage is not None else self._usage(db)),
                        waiters=tuple(waiters),
                        mps_users=self._mps_users(db) if ask.profile.isolation == MPS else {},
                        budget=self._standing(db, budgets, ask.owner, ask.groups, now), **self._shared(db, now, waiters))

    def _shared(self, db: sqlite3.Connection, now: float, waiters: list[Waiter]) -> dict:
        return sharing_reads.shared(db, self.sharing, now, waiters, lambda: self._leases(db, None, HELD))

    def _queue(self, db: sqlite3.Connection, now: float) -> list[Waiter]:
        """The live queue with each waiter's place as it is served (sharing's order, and why), else arrival."""
        waiters = queue.live(db, now, self.waiter_ttl)
        if self.sharing.plain or not waiters:
            return waiters
        return sharing_reads.told(self.sharing, now, waiters, self._usage(db), self._shared(db, now, waiters))

    @staticmethod
    def _mps_users(db: sqlite3.Connection) -> dict[str, frozenset[str]]:
        found: dict[str, set[str]] = {}
        for uuid, owner in db.execute(
                "SELECT a.gpu_uuid, l.owner FROM allocations a JOIN leases l ON l.id = a.lease_id "
                "WHERE l.isolation = ? AND l.state = ?", (MPS, ACTIVE)):
            found.setdefault(uuid, set()).add(owner)
        return {uuid: frozenset(owners) for uuid, owners in found.items()}

    @staticmethod
    def _standing(db: sqlite3.Connection, budgets: BudgetBook, owner: str, groups: tuple[str, ...],
                  now: float) -> Standing | None:
        if not budgets.budgets:
            return None
        return budgets.standing(owner, groups, lambda scope, start: usage.spent_hours(db, scope, owner, start, now),
                                lambda scope: usage.rate(db, scope, owner), now)

    def budget_standing(self, owner: str, groups: tuple[str, ...], budgets: BudgetBook) -> Standing | None:
        """Where ``owner`` stands against their tightest GPU-hour budget now (None: no budget applies)."""
        with self.db.read() as db:
            return self._standing(db, budgets, owner, groups, self.clock())

    def spenders(self, since: float) -> list[str]:
        """The users whose slices were active at some time since ``since`` (whose GPU time an admin reviews)."""
        with self.db.read() as db:
            return [r[0] for r in db.execute("SELECT DISTINCT owner FROM usage WHERE COALESCE(stop, ?) > ? "
                                             "ORDER BY owner", (self.clock(), since))]

    def allocate(self, request: LeaseRequest, quotas: QuotaBook, *, placement: str = BINPACK,
                 is_alive: IsAlive | None = None, host: str = "", waiter_id: str | None = None,
                 record_refusal: bool = True, budgets: BudgetBook = NO_BUDGETS) -> Lease:
        """Take a slice for a kernel, atomically across processes, or raise the refusal
        (:class:`QuotaExceeded`, checked first, or :class:`PoolExhausted`); on a refusal nothing is
        held.  Earlier waiters in the queue that fit are served first (``waiter_id`` is this
        request's own place in the queue, if it has one).  With ``is_alive``, a refusal first
        reclaims leases whose holders are gone and tries once more.  A refusal is journaled unless
        ``record_refusal`` is False (a request that waits in the queue is not refused yet)."""
        return self._with_reconcile(request, is_alive, host, record_refusal, request.label,
                                    lambda: self._allocate(request, quotas, budgets, placement, host, waiter_id))

    def _with_reconcile(self, ask: Ask, is_alive: IsAlive | None, host: str, record_refusal: bool, label: str,
                        attempt: Callable[[], Lease]) -> Lease:
        try:
            return attempt()
        except REFUSALS as refusal:
            err: PoolError = refusal
        if is_alive is not None and not self.reconciled_within(self.reconcile_on_refusal):
            if self.reconcile(is_alive, host):
                try:
                    return attempt()
                except REFUSALS as refusal:
                    err = refusal
        if record_refusal:
            self.record_refusal(ask.kernel_id, ask.owner, ask.profile.name, err, label)
        raise err

    def record_refusal(self, kernel_id: str, owner: str, profile: str, err: PoolError, label: str = "") -> None:
        detail = {"profile": profile, "message": str(err)}
        if label:
            detail["name"] = label  # the notebook, as the user knows it: what the logs show, not the kernel's id
        self.record("refused", kernel_id=kernel_id, owner=owner, reason=err.reason, detail=detail)

    def _allocate(self, request: LeaseRequest, quotas: QuotaBook, budgets: BudgetBook, placement: str, host: str,
                  waiter_id: str | None) -> Lease:
        now = self.clock()
        with self.db.write() as db:
            result = allocate(self._holdings(db, request, quotas, budgets, now), request, quotas, now=now,
                              placement=placement, waiter_id=waiter_id, sharing=self.sharing)
            if isinstance(result, PoolError):
                raise result
            spec = request.profile.slice
            lease_id = uuid.uuid4().hex
            manager = request.manager
            db.execute(
                """INSERT INTO leases(id, owner, kernel_id, profile, isolation, memory, sm_percent, whole,
                     gpu_count, state, last_gpus, groups, label, created, updated, state_since, host,
                     manager_pid, manager_start, borrowed)
                   VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (lease_id, request.owner, request.kernel_id, request.profile.name, request.profile.isolation,
                 result.memory, spec.sm_percent, int(spec.whole), spec.gpu_count, ACTIVE,
                 " ".join(g.uuid for g in result.gpus), "\n".join(request.groups), request.label, now, now, now,
                 host or (manager.host if manager else ""), manager.pid if manager else None,
                 manager.start if manager else None, "\n".join(result.borrowed)),
            )
            self._insert_allocations(db, lease_id, spec, result)
            db.executemany("INSERT INTO lease_groups(lease_id, grp) VALUES(?,?)",
                           [(lease_id, group) for group in request.groups])
            if waiter_id:
                queue.remove(db, waiter_id)
            journal.write(db, now, "allocated", lease_id, request.kernel_id, request.owner, "",
                          {"profile": request.profile.name, "gpus": [g.uuid for g in result.gpus],
                           "label": request.label, **({"borrowed": list(result.borrowed)} if result.borrowed else {})})
            lease = self._get(db, lease_id)
            usage.open_interval(db, lease_id, request.owner, share_of(lease, result.gpus[0].memory), now)
            return lease  # type: ignore[return-value]

    def start_without_slice(self, request: LeaseRequest, quotas: QuotaBook, *, host: str = "") -> Lease:
        """Record a kernel that starts holding no slice (its rule's ``slice_at: first-cell``): a lease
        in state hibernated with reason ``first_cell``, no GPU and nothing to restore, so that the pool,
        the quota views and the UI know the kernel; its first cell takes a slice through :meth:`resume`.
        Only the kernel count of a quota is checked now (it is a kernel); the slice's quotas, budget and
        room are checked when it takes one."""
        try:
            return self._start_without_slice(request, quotas, host)
        except QuotaExceeded as refusal:
            self.record_refusal(request.kernel_id, request.owner, request.profile.name, refusal)
            raise

    def _start_without_slice(self, request: LeaseRequest, quotas: QuotaBook, host: str) -> Lease:
        now = self.clock()
        with self.db.write() as db:
            held = self._quota_leases(db, request.owner, quotas.limited_groups(request.groups))
            refusal = check_quota(held, request, quotas, Usage(kernels=1), now)
            if refusal is not None:
                raise refusal
            spec = request.profile.slice
            lease_id = uuid.uuid4().hex
            manager = request.manager
            db.execute(
                """INSERT INTO leases(id, owner, kernel_id, profile, isolation, memory, sm_percent, whole,
                     gpu_count, state, last_gpus, groups, label, created, updated, state_since, host,
                     manager_pid, manager_start, reason)
                   VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (lease_id, request.owner, request.kernel_id, request.profile.name, request.profile.isolation,
                 spec.memory or 0, spec.sm_percent, int(spec.whole), spec.gpu_count, HIBERNATED, "",
                 "\n".join(request.groups), request.label, now, now, now,
                 host or (manager.host if manager else ""), manager.pid if manager else None,
                 manager.start if manager else None, FIRST_CELL),
            )
            db.executemany("INSERT INTO lease_groups(lease_id, grp) VALUES(?,?)",
                           [(lease_id, group) for group in request.groups])
            journal.write(db, now, "opened", lease_id, request.kernel_id, request.owner, FIRST_CELL,
                          {"profile": request.profile.name})
            return self._get(db, lease_id)  # type: ignore[return-value]

    @staticmethod
    def _insert_allocations(db: sqlite3.Connection, lease_id: str, spec: SliceSpec, grant: Grant) -> None:
        db.executemany(
            "INSERT INTO allocations(lease_id, gpu_uuid, memory, sm_percent, exclusive) VALUES(?,?,?,?,?)",
            [(lease_id, g.uuid, spec.memory_on(g.memory), spec.sm_on(), int(spec.whole)) for g in grant.gpus],
        )

    def resume(self, lease_id: str, quotas: QuotaBook, *, placement: str = BINPACK, same_model: bool = True,
               waiter_id: str | None = None, profile: Profile | None = None, same_gpu: bool = False,
               is_alive: IsAlive | None = None, host: str = "", record_refusal: bool = True,
               budgets: BudgetBook = NO_BUDGETS) -> Lease:
        """Take a slice again for a hibernated lease: its last GPU if it fits, else another GPU of
        the same model (when ``same_model``), else raise the refusal.  ``same_gpu`` allows its
        last GPUs only (a driver that cannot restore elsewhere).  The lease's phase is kept (the
        resume's mover settles it when the memory is back)."""
        lease = self.get(lease_id)
        if lease is None or lease.state != HIBERNATED:
            raise LeaseNotFound(lease_id)
        named = profile or Profile(name=lease.profile, slice=lease.slice, isolation=lease.isolation,
                                   display_name=lease.profile)
        ask = Ask(owner=lease.owner, kernel_id=lease.kernel_id, profile=dataclasses.replace(named, slice=lease.slice),
                  groups=lease.groups, new_kernel=False, prefer=lease.last_gpus)
        return self._with_reconcile(ask, is_alive, host, record_refusal, lease.label,
                                    lambda: self._resume(lease_id, ask, quotas, budgets, placement, same_model,
                                                         same_gpu, waiter_id))

    def _resume(self, lease_id: str, ask: Ask, quotas: QuotaBook, budgets: BudgetBook, placement: str,
                same_model: bool, same_gpu: bool, waiter_id: str | None) -> Lease:
        now = self.clock()
        with self.db.write() as db:
            lease = self._get(db, lease_id)
            if lease is None or lease.state != HIBERNATED:  # changed since the caller looked
                raise LeaseNotFound(lease_id)
            gpu_usage = self._usage(db)
            ask = dataclasses.replace(ask, only=resume_candidates(gpu_usage, lease.last_gpus, same_gpu=same_gpu,
                                                                  same_model=same_model))
            result = allocate(self._holdings(db, ask, quotas, budgets, now, gpu_usage), ask, quotas, now=now,
                              placement=placement, waiter_id=waiter_id, sharing=self.sharing)
            if isinstance(result, PoolError):
                raise result
            self._insert_allocations(db, lease_id, lease.slice, result)
            db.execute(
                "UPDATE leases SET state=?, updated=?, state_since=?, last_gpus=?, host_bytes=0, memory=?, reason=?, "
                "borrowed=? WHERE id=?",  # memory: a whole GPU's size is known once it is placed (a first cell's)
                (ACTIVE, now, now, " ".join(g.uuid for g in result.gpus), result.memory,
                 "" if lease.awaits_first_cell else lease.reason, "\n".join(result.borrowed), lease_id),
            )
            if waiter_id:
                queue.remove(db, waiter_id)
            if lease.awaits_first_cell:  # its first slice: the kernel's start, as the journal and the trace count it
                journal.write(db, now, "allocated", lease_id, lease.kernel_id, lease.owner, FIRST_CELL,
                              {"profile": lease.profile, "gpus": [g.uuid for g in result.gpus],
                               "waited_for_cell": now - lease.created})
            else:
                journal.write(db, now, "resumed", lease_id, lease.kernel_id, lease.owner, "",
                              {"gpus": [g.uuid for g in result.gpus], "hibernated_for": now - lease.state_since})
            taken = self._get(db, lease_id)
            usage.open_interval(db, lease_id, lease.owner, share_of(taken, result.gpus[0].memory), now)
            return taken  # type: ignore[return-value]

    # -- lifecycle -----------------------------------------------------------------------------

    def set_holder(self, lease_id: str, holder: Holder | None, phase: str | None = None) -> None:
        """Record the kernel process holding the lease (None while it restarts or stops).

        ``phase`` sets the lease's phase too: ``""`` when a (new) kernel process holds it."""
        now = self.clock()
        with self.db.write() as db:
            sets, args = "holder_pid=?, holder_start=?, updated=?", [holder.pid if holder else None,
                                                                      holder.start if holder else None, now]
            if phase is not None:
                sets += ", phase=?, phase_deadline=NULL"
                args.append(phase)
            cur = db.execute(f"UPDATE leases SET {sets} WHERE id=? AND state IN (?,?)", (*args, lease_id, *HELD))
            if cur.rowcount == 0:
                raise LeaseNotFound(lease_id)

    def relabel(self, lease_id: str, label: str) -> None:
        with self.db.write() as db:
            cur = db.execute("UPDATE leases SET label=?, updated=? WHERE id=? AND state IN (?,?)",
                             (label, self.clock(), lease_id, *HELD))
            if cur.rowcount == 0:
                raise LeaseNotFound(lease_id)

    def stop(self, lease_id: str, *, expect: str | None = None) -> Lease:
        """The lease's kernel is being shut down: phase ``stopping``, no kernel process recorded (so
        that reconcile judges it by its live server, and names the right reason if the server never
        finishes).  With ``expect``, only from that phase (a cull must not cut into a hibernation):
        else :class:`PhaseConflict`."""
        now = self.clock()
        with self.db.write() as db:
            current = self._held(db, lease_id)
            if expect is not None and current.phase != expect:
                raise PhaseConflict(lease_id, expect, current.phase, current.state)
            db.execute("UPDATE leases SET holder_pid=NULL, holder_start=NULL, updated=?, phase=?, phase_deadline=NULL "
                       "WHERE id=?", (now, STOPPING, lease_id))
            return self._get(db, lease_id)  # type: ignore[return-value]

    def _held(self, db: sqlite3.Connection, lease_id: str) -> Lease:
        lease = self._get(db, lease_id)
        if lease is None or lease.state not in HELD:
            raise LeaseNotFound(lease_id)
        return lease

    def set_phase(self, lease_id: str, to: str, *, expect: str | None = None, deadline: float | None = None) -> Lease:
        """Move a held lease to phase ``to`` (``""``: settled), by compare-and-set: with ``expect``,
        only from that phase (else :class:`PhaseConflict`), and only along the moves the state
        machine allows (``pool.phases``; else :class:`PhaseError`).  The state stays as it is."""
        with self.db.write() as db:  # leaves `updated` alone: reconcile's grace counts from the holder's changes
            current = self._held(db, lease_id)
            if expect is not None and current.phase != expect:
                raise PhaseConflict(lease_id, expect, current.phase, current.state)
            check_move(current.state, current.phase, to)
            db.execute("UPDATE leases SET phase=?, phase_deadline=? WHERE id=?", (to, deadline, lease_id))
            return self._get(db, lease_id)  # type: ignore[return-value]

    def adopt(self, lease_id: str, manager: Holder) -> Lease:
        """A restarted server takes over a running kernel's lease."""
        now = self.clock()
        with self.db.write() as db:
            cur = db.execute(
                "UPDATE leases SET manager_pid=?, manager_start=?, updated=? WHERE id=? AND state IN (?,?)",
                (manager.pid, manager.start, now, lease_id, *HELD),
            )
            if cur.rowcount == 0:
                raise LeaseNotFound(lease_id)
            return self._get(db, lease_id)  # type: ignore[return-value]

    def release(self, lease_id: str, reason: str = "shutdown") -> Lease | None:
        """Give the slice back.  Idempotent: releasing a released lease returns None."""
        now = self.clock()
        with self.db.write() as db:
            return self._release(db, self._get(db, lease_id), reason, now)

    def _release(self, db: sqlite3.Connection, lease: Lease | None, reason: str, now: float,
                 kind: str = "released") -> Lease | None:
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
        return self._get(db, lease.id)

    def hibernate(self, lease_id: str, host_bytes: int, reason: str = "idle",
                  last_gpus: tuple[str, ...] | None = None, phase: str = "") -> Lease:
        """The kernel's GPU memory is now in host RAM: its slice goes back to the pool, and the lease
        is left in ``phase`` (settled by default; a resume that will try another GPU keeps ``resuming``).
        ``last_gpus``: where the memory came from, when not the GPUs held now (a resume given up
        before its restore)."""
        now = self.clock()
        with self.db.write() as db:
            lease = self._get(db, lease_id)
            if lease is None or lease.state != ACTIVE:
                raise LeaseNotFound(lease_id)
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
            return self._get(db, lease_id)  # type: ignore[return-value]

    def reserve_host_bytes(self, lease_id: str, host_bytes: int, cap: int | None, host: str = "") -> tuple[bool, int]:
        """Claim ``host_bytes`` of the host-RAM budget of hibernation on ``host`` for an active lease
        about to hibernate, atomically against every other server.  Returns (granted, bytes already
        claimed by the others); with ``cap`` None there is no limit."""
        with self.db.write() as db:
            lease = self._get(db, lease_id)
            if lease is None or lease.state != ACTIVE:
                raise LeaseNotFound(lease_id)
            (others,) = db.execute(
                "SELECT COALESCE(SUM(host_bytes),0) FROM leases WHERE state IN (?,?) AND host=? AND id<>?",
                (*HELD, host, lease_id)).fetchone()
            if cap is not None and others + host_bytes > cap:
                return False, others
            db.execute("UPDATE leases SET host_bytes=? WHERE id=?", (host_bytes, lease_id))
            return True, others

    def host_bytes_on(self, host: str = "") -> int:
        """Host RAM held or claimed by hibernation on ``host``."""
        with self.db.read() as db:
            (total,) = db.execute("SELECT COALESCE(SUM(host_bytes),0) FROM leases WHERE state IN (?,?) AND host=?",
                                  (*HELD, host)).fetchone()
            return total

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self, is_alive: IsAlive, host: str = "") -> list[Lease]:
        """Release every lease on this host whose holders are gone; return what was reclaimed.

        Liveness is judged outside any write lock; each release then re-reads its lease inside a
        short write and skips it if it changed since it was judged (its next reconcile judges it
        anew).  Old history and dead waiters are pruned on the way."""
        now = self.clock()
        self._reconciled_at = time.monotonic()
        with self.db.read() as db:
            held = self._leases(db, None, HELD)
        doomed = []
        for lease in held:
            if host and lease.host and lease.host != host:
                continue  # another machine's processes are not ours to judge
            reason = dead_reason(lease, is_alive, now, self.graces)
            if reason:
                doomed.append((lease, reason))
        reclaimed = []
        for judged, reason in doomed:
            with self.db.write() as db:
                current = self._get(db, judged.id)
                if current != judged:
                    continue
                released = self._release(db, current, reason, now, kind="reclaimed")
                if released:
                    reclaimed.append(released)
        with self.db.write() as db:
            queue.prune(db, now, self.waiter_ttl)
            journal.prune(db, now - self.history_seconds)
            usage.prune(db, now - max(self.history_seconds, USAGE_KEPT))
            old = [(r[0],) for r in db.execute("SELECT id FROM leases WHERE state=? AND ended < ?",
                                               (RELEASED, now - self.history_seconds))]
            db.executemany("DELETE FROM lease_groups WHERE lease_id=?", old)
            db.executemany("DELETE FROM leases WHERE id=?", old)
        return reclaimed

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, owner: str, kernel_id: str, profile: str, spec: SliceSpec, *,
                lease_id: str | None = None, label: str = "", groups: tuple[str, ...] = ()) -> Waiter:
        now = self.clock()
        waiter_id = uuid.uuid4().hex
        with self.db.write() as db:
            queue.add(db, waiter_id, owner, kernel_id, profile, spec, lease_id, label, now, groups)
            return next(w for w in self._queue(db, now) if w.id == waiter_id)

    def heartbeat(self, waiter_id: str) -> Waiter | None:
        """Keep a waiter alive and return it with its current position (None if gone)."""
        now = self.clock()
        with self.db.write() as db:
            queue.touch(db, waiter_id, now)
            return next((w for w in self._queue(db, now) if w.id == waiter_id), None)

    def dequeue(self, waiter_id: str) -> None:
        with self.db.write() as db:
            queue.remove(db, waiter_id)

    def waiter_owner(self, waiter_id: str) -> str | None:
        """Whose place in the queue ``waiter_id`` is, live or past its heartbeat (None: no such place)."""
        with self.db.read() as db:
            row = db.execute("SELECT owner FROM waiters WHERE id=?", (waiter_id,)).fetchone()
            return row[0] if row else None

    def waiters(self) -> list[Waiter]:
        now = self.clock()
        with self.db.read() as db:
            return self._queue(db, now)

    # -- journal -------------------------------------------------------------------------------

    def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
               owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        """Put an event on record (the culler's decisions, for example)."""
        with self.db.write() as db:
            journal.write(db, self.clock(), kind, lease_id, kernel_id, owner, reason, detail or {})

    def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                limit: int = 200, after_seq: int = 0) -> list[JournalEntry]:
        """Entries newest first."""
        with self.db.read() as db:
            return journal.read(db, since=since, kinds=kinds, owner=owner, limit=limit, after_seq=after_seq)

    def journal_held(self, owner: str) -> tuple[int, int]:
        """The entries the journal keeps about ``owner``, and the size of their detail."""
        with self.db.read() as db:
            return journal.held(db, owner)

    # -- checks --------------------------------------------------------------------------------

    def overcommitted(self) -> list[str]:
        """GPUs whose allocations pass their capacity (must always be empty: invariant 1)."""
        with self.db.read() as db:
            return [f"{u.gpu.uuid}: {u.memory}/{u.gpu.memory} bytes, {u.sm_percent}% SM, {u.leases} leases"
                    for u in self._usage(db)
                    if u.memory > u.gpu.memory or u.sm_percent > 100 or (u.exclusive and u.leases > 1)]

    # -- the activity trace (local/trace.py) -----------------------------------------------------

    _trace_pruned = float("-inf")  # this process's last pruning of the trace

    def trace_record(self, events: list[TraceEvent], keep: float | None = None) -> None:
        """Add events to the activity trace; with ``keep`` (seconds), events older than that go (checked
        at most once an hour per process)."""
        now = self.clock()
        with self.db.write() as db:
            trace.write(db, events)
            if keep is not None and now - self._trace_pruned >= 3600:
                trace.prune(db, now - keep)
                self._trace_pruned = now

    def trace_export(self, *, since: float = 0.0, until: float = float("inf"), owner: str | None = None,
                     after: tuple[float, int] | None = None,
                     limit: int = 2000) -> tuple[list[TraceEvent], tuple[float, int] | None]:
        """One page of the trace in time order (``owner``: theirs only) and where the next page starts
        (None: this was the last)."""
        with self.db.read() as db:
            found = trace.read(db, since=since, until=until, owner=owner, after=after, limit=limit)
        return [e for _, e in found], ((found[-1][1].at, found[-1][0]) if len(found) == limit else None)
