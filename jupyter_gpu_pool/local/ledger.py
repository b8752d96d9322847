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
Each opens one transaction and leaves the SQL to the modules named after what they keep: ``leases.py``,
``inventory.py`` (the GPUs), ``holdings.py`` (what the allocation decision reads) and ``grants.py`` (what it
grants, written), ``phases.py``, ``hibernation.py``, ``queue.py``, ``sharing.py``, ``journal.py``,
``usage.py`` (GPU time, budgets), ``trace.py``.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
import uuid
from typing import Callable

from ..pool import (
    BINPACK,
    GPU,
    HELD,
    GPUUsage,
    HIBERNATED,
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
from ..pool.allocation import Ask, Grant, allocate, check_quota, resume_candidates
from ..pool.budgets import NO_BUDGETS, BudgetBook, BudgetExceeded, Standing
from ..pool.errors import MPSUserBusy
from ..pool.sharing import Sharing
from ..pool.liveness import Graces, IsAlive, dead_reason
from ..pool.trace import TraceEvent
from . import grants, hibernation, holdings, inventory, journal, leases, phases, queue, trace, usage
from . import sharing as sharing_reads
from .database import Database
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

    # -- inventory (inventory.py) ----------------------------------------------------------------

    def sync_gpus(self, gpus: list[GPU]) -> None:
        """Make the pool's GPUs these.  GPUs no longer present take no new leases but keep
        the leases they hold (a kernel on a GPU that vanished is the admin's to deal with)."""
        with self.db.write() as db:
            inventory.sync(db, gpus, self.clock())

    def gpus(self, present_only: bool = True) -> list[GPU]:
        with self.db.read() as db:
            return inventory.gpus(db, present_only)

    def overcommitted(self) -> list[str]:
        """GPUs whose allocations pass their capacity (must always be empty: invariant 1)."""
        with self.db.read() as db:
            return inventory.overcommitted(db)

    # -- reading leases (leases.py) --------------------------------------------------------------

    def get(self, lease_id: str) -> Lease | None:
        with self.db.read() as db:
            return leases.get(db, lease_id)

    def by_kernel(self, kernel_id: str) -> Lease | None:
        """The held lease of a kernel, if any."""
        with self.db.read() as db:
            return leases.of_kernel(db, kernel_id)

    def kernel_owners(self, kernel_id: str) -> set[str]:
        """Who holds or held a lease for ``kernel_id`` (while its rows are kept)."""
        with self.db.read() as db:
            return leases.owners_of_kernel(db, kernel_id)

    def leases(self, owner: str | None = None, states: tuple[str, ...] = HELD) -> list[Lease]:
        with self.db.read() as db:
            return leases.in_states(db, owner, states)

    def snapshot(self) -> Snapshot:
        now = self.clock()
        with self.db.read() as db:
            return Snapshot(at=now, gpus=inventory.usage(db), leases=leases.in_states(db, None, HELD),
                            waiters=sharing_reads.places(db, self.sharing, now, self.waiter_ttl))

    def usage_of(self, owner: str) -> Usage:
        from ..pool.quotas import usage_of

        return usage_of(self.leases(owner))

    # -- GPU time (usage.py) -----------------------------------------------------------------------

    def budget_standing(self, owner: str, groups: tuple[str, ...], budgets: BudgetBook) -> Standing | None:
        """Where ``owner`` stands against their tightest GPU-hour budget now (None: no budget applies)."""
        with self.db.read() as db:
            return usage.standing(db, budgets, owner, groups, self.clock())

    def spenders(self, since: float) -> list[str]:
        """The users whose slices were active at some time since ``since`` (whose GPU time an admin reviews)."""
        with self.db.read() as db:
            return usage.spenders(db, since, self.clock())

    # -- allocation (holdings.py reads for the decision, grants.py writes what it grants) -----------

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

    def _decide(self, db: sqlite3.Connection, ask: Ask, quotas: QuotaBook, budgets: BudgetBook, now: float,
                placement: str, waiter_id: str | None, gpu_usage: list[GPUUsage] | None = None) -> Grant:
        """The allocation decision on what the ledger holds now: the grant, or the refusal raised."""
        found = holdings.read(db, ask, quotas, budgets, now, waiter_ttl=self.waiter_ttl, sharing=self.sharing,
                              gpu_usage=gpu_usage)
        result = allocate(found, ask, quotas, now=now, placement=placement, waiter_id=waiter_id,
                          sharing=self.sharing)
        if isinstance(result, PoolError):
            raise result
        return result

    def _allocate(self, request: LeaseRequest, quotas: QuotaBook, budgets: BudgetBook, placement: str, host: str,
                  waiter_id: str | None) -> Lease:
        now = self.clock()
        with self.db.write() as db:
            grant = self._decide(db, request, quotas, budgets, now, placement, waiter_id)
            return grants.open_lease(db, request, grant, host=host, waiter_id=waiter_id, now=now)

    def start_without_slice(self, request: LeaseRequest, quotas: QuotaBook, *, host: str = "") -> Lease:
        """Record a kernel that starts holding no slice (its rule's ``slice_at: first-cell``): a lease
        in state hibernated with reason ``first_cell``, no GPU and nothing to restore, so that the pool,
        the quota views and the UI know the kernel; its first cell takes a slice through :meth:`resume`.
        Only the kernel count of a quota is checked now (it is a kernel); the slice's quotas, budget and
        room are checked when it takes one."""
        now = self.clock()
        try:
            with self.db.write() as db:
                held = leases.counted_for_quota(db, request.owner, quotas.limited_groups(request.groups))
                refusal = check_quota(held, request, quotas, Usage(kernels=1), now)
                if refusal is not None:
                    raise refusal
                return grants.open_without_slice(db, request, host=host, now=now)
        except QuotaExceeded as refusal:
            self.record_refusal(request.kernel_id, request.owner, request.profile.name, refusal)
            raise

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
            lease = leases.get(db, lease_id)
            if lease is None or lease.state != HIBERNATED:  # changed since the caller looked
                raise LeaseNotFound(lease_id)
            gpu_usage = inventory.usage(db)
            ask = dataclasses.replace(ask, only=resume_candidates(gpu_usage, lease.last_gpus, same_gpu=same_gpu,
                                                                  same_model=same_model))
            grant = self._decide(db, ask, quotas, budgets, now, placement, waiter_id, gpu_usage)
            return grants.take_again(db, lease, grant, waiter_id=waiter_id, now=now)

    # -- a held lease: its holders, name, phase (phases.py), hibernation (hibernation.py), end ---------

    def set_holder(self, lease_id: str, holder: Holder | None, phase: str | None = None) -> None:
        """Record the kernel process holding the lease (None while it restarts or stops).

        ``phase`` sets the lease's phase too: ``""`` when a (new) kernel process holds it."""
        with self.db.write() as db:
            leases.set_holder(db, lease_id, holder, phase, self.clock())

    def relabel(self, lease_id: str, label: str) -> None:
        with self.db.write() as db:
            leases.relabel(db, lease_id, label, self.clock())

    def stop(self, lease_id: str, *, expect: str | None = None) -> Lease:
        """The lease's kernel is being shut down: phase ``stopping``, no kernel process recorded (so
        that reconcile judges it by its live server, and names the right reason if the server never
        finishes).  With ``expect``, only from that phase (a cull must not cut into a hibernation):
        else :class:`PhaseConflict`."""
        with self.db.write() as db:
            return phases.stop(db, lease_id, expect, self.clock())

    def set_phase(self, lease_id: str, to: str, *, expect: str | None = None, deadline: float | None = None) -> Lease:
        """Move a held lease to phase ``to`` (``""``: settled), by compare-and-set: with ``expect``,
        only from that phase (else :class:`PhaseConflict`), and only along the moves the state
        machine allows (``pool.phases``; else :class:`PhaseError`).  The state stays as it is."""
        with self.db.write() as db:
            return phases.set_phase(db, lease_id, to, expect, deadline)

    def adopt(self, lease_id: str, manager: Holder) -> Lease:
        """A restarted server takes over a running kernel's lease."""
        with self.db.write() as db:
            return leases.adopt(db, lease_id, manager, self.clock())

    def release(self, lease_id: str, reason: str = "shutdown") -> Lease | None:
        """Give the slice back.  Idempotent: releasing a released lease returns None."""
        now = self.clock()
        with self.db.write() as db:
            return leases.release(db, leases.get(db, lease_id), reason, now)

    def hibernate(self, lease_id: str, host_bytes: int, reason: str = "idle",
                  last_gpus: tuple[str, ...] | None = None, phase: str = "") -> Lease:
        """The kernel's GPU memory is now in host RAM: its slice goes back to the pool, and the lease
        is left in ``phase`` (settled by default; a resume that will try another GPU keeps ``resuming``).
        ``last_gpus``: where the memory came from, when not the GPUs held now (a resume given up
        before its restore)."""
        with self.db.write() as db:
            return hibernation.hibernate(db, lease_id, host_bytes, reason, last_gpus, phase, self.clock())

    def reserve_host_bytes(self, lease_id: str, host_bytes: int, cap: int | None, host: str = "") -> tuple[bool, int]:
        """Claim ``host_bytes`` of the host-RAM budget of hibernation on ``host`` for an active lease
        about to hibernate, atomically against every other server.  Returns (granted, bytes already
        claimed by the others); with ``cap`` None there is no limit."""
        with self.db.write() as db:
            return hibernation.reserve_host_bytes(db, lease_id, host_bytes, cap, host)

    def host_bytes_on(self, host: str = "") -> int:
        """Host RAM held or claimed by hibernation on ``host``."""
        with self.db.read() as db:
            return hibernation.host_bytes_on(db, host)

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self, is_alive: IsAlive, host: str = "") -> list[Lease]:
        """Release every lease on this host whose holders are gone; return what was reclaimed.

        Liveness is judged outside any write lock; each release then re-reads its lease inside a
        short write and skips it if it changed since it was judged (its next reconcile judges it
        anew).  Old history and dead waiters are pruned on the way."""
        now = self.clock()
        self._reconciled_at = time.monotonic()
        with self.db.read() as db:
            held = leases.in_states(db, None, HELD)
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
                current = leases.get(db, judged.id)
                if current != judged:
                    continue
                released = leases.release(db, current, reason, now, kind="reclaimed")
                if released:
                    reclaimed.append(released)
        with self.db.write() as db:
            queue.prune(db, now, self.waiter_ttl)
            journal.prune(db, now - self.history_seconds)
            usage.prune(db, now - max(self.history_seconds, USAGE_KEPT))
            leases.prune(db, now - self.history_seconds)
        return reclaimed

    # -- queue (queue.py; places as sharing.py orders them) ----------------------------------------

    def enqueue(self, owner: str, kernel_id: str, profile: str, spec: SliceSpec, *,
                lease_id: str | None = None, label: str = "", groups: tuple[str, ...] = ()) -> Waiter:
        now = self.clock()
        waiter_id = uuid.uuid4().hex
        with self.db.write() as db:
            queue.add(db, waiter_id, owner, kernel_id, profile, spec, lease_id, label, now, groups)
            return next(w for w in sharing_reads.places(db, self.sharing, now, self.waiter_ttl) if w.id == waiter_id)

    def heartbeat(self, waiter_id: str) -> Waiter | None:
        """Keep a waiter alive and return it with its current position (None if gone)."""
        now = self.clock()
        with self.db.write() as db:
            queue.touch(db, waiter_id, now)
            return next((w for w in sharing_reads.places(db, self.sharing, now, self.waiter_ttl)
                         if w.id == waiter_id), None)

    def dequeue(self, waiter_id: str) -> None:
        with self.db.write() as db:
            queue.remove(db, waiter_id)

    def waiter_owner(self, waiter_id: str) -> str | None:
        """Whose place in the queue ``waiter_id`` is, live or past its heartbeat (None: no such place)."""
        with self.db.read() as db:
            return queue.owner(db, waiter_id)

    def waiters(self) -> list[Waiter]:
        now = self.clock()
        with self.db.read() as db:
            return sharing_reads.places(db, self.sharing, now, self.waiter_ttl)

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
