"""What the server extension needs from "the pool", declared once: :class:`PoolBackend`.

Handlers and the culler read the pool only through it: settings (profiles, quotas, policy), one
consistent snapshot (GPUs, held leases, the queue), and the journal; and they claim a kernel for a
shutdown through it.  :class:`LocalBackend` serves it from this machine's SQLite ledger; the
cluster backend (``kubernetes_backend``) from Kubernetes custom resources.  Every call that does
I/O is async (the local one runs the ledger in a thread).  What only some pools have (a watch to
start, a reconcile, telemetry from elsewhere, hibernation) has a no-op default here.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod

from ..devices.telemetry import ProcessSource, Sampler
from ..local.pool import Pool
from ..pool import GPU, JournalEntry, Lease, LeaseNotFound, Profile, Quota, Snapshot
from ..pool.allocation import Ask, Grant, Holdings, allocate
from ..pool.budgets import Standing
from ..pool.phases import PhaseConflict
from ..pool.rules import Policy
from ..pool.trace import TraceEvent


class PoolBackend(ABC):
    enabled: bool = True
    declared: bool = False  # every GPU of the pool is declared (not real)
    hibernation: bool = False  # kernels of this pool can hibernate (a hook can be installed)
    note: str = ""  # one line for humans: where the GPUs come from, or why there is no pool
    owner_admin: bool | None = None  # the pool's word on whether this server's owner administers it (None: no say)

    @property
    @abstractmethod
    def policy(self) -> Policy: ...

    @property
    @abstractmethod
    def owner(self) -> str:
        """The user this server's kernels are leased to."""

    @abstractmethod
    def gpus(self) -> list[GPU]: ...

    @abstractmethod
    def profile(self, name: str) -> Profile | None: ...

    @abstractmethod
    def profiles(self) -> dict[str, Profile]: ...

    @abstractmethod
    def groups_of(self, user: str) -> tuple[str, ...]: ...

    @abstractmethod
    def user_quota(self, user: str) -> Quota: ...

    @abstractmethod
    def group_quota(self, group: str) -> Quota | None: ...

    @abstractmethod
    async def snapshot(self) -> Snapshot: ...

    @abstractmethod
    async def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                      limit: int = 200) -> list[JournalEntry]:
        """Entries newest first."""

    @abstractmethod
    async def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
                     owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        """Put one entry on the journal."""

    # -- what only some pools do -------------------------------------------------------------------

    async def start(self, kernel_manager) -> None:
        """Start whatever the pool needs running (a cluster's watch; re-adopting this server's kernels)."""

    async def stop(self) -> None:
        """Stop what :meth:`start` started."""

    async def reconcile(self) -> list[Lease]:
        """Release leases whose holders are gone; return them (a cluster's operator does it itself)."""
        return []

    async def budget(self, user: str, groups: tuple[str, ...]) -> Standing | None:
        """Where ``user`` stands against their tightest GPU-hour budget (None: no budget applies)."""
        return None

    def budget_users(self) -> set[str]:
        """Users the admin's budgets name, themselves or as members of a group with a budget."""
        return set()

    async def starts_now(self, user: str, groups: tuple[str, ...], snapshot: Snapshot) -> dict[str, bool]:
        """Profile name -> whether a kernel of ``user`` on it would start now (the pool's allocation
        decision on ``snapshot``); empty where this pool cannot say (a cluster's scheduler places)."""
        return {}

    async def relabel(self, lease: Lease, label: str) -> None:
        """Name ``lease``'s notebook anew in the pool, for every server's view (a renamed notebook).  A pool
        without a way to (a cluster's GPUKernel keeps the label it was made with) leaves it: this server's
        views name the kernel by its session's path anyway."""

    async def claim_stop(self, lease: Lease) -> bool:
        """The server is about to shut this lease's kernel down (a cull, its user's release).  Mark it
        so that nothing else moves it meanwhile and a reconcile does not take the shutdown for a
        crash; False when another move holds it already (the shutdown must not start)."""
        return True

    @property
    def trace_sampling(self) -> float | None:
        """Seconds between two GPU readings in the pool's activity trace, where it keeps one (None: none)."""
        return None

    async def trace(self, events: list[TraceEvent]) -> None:
        """Add events to the pool's activity trace."""

    def make_sampler(self, source: ProcessSource | None, thresholds: tuple[float, ...], history: int) -> Sampler:
        """Where this pool's per-kernel GPU readings come from (this machine's NVML by default)."""
        return Sampler(source, thresholds=thresholds, history=history)


class LocalBackend(PoolBackend):
    """The pool on this machine: kept by this process (a ``LocalPool``) or by the pool service (a
    ``ServicePool``); the same settings, inventory and ledger either way."""

    hibernation = True

    def __init__(self, pool: Pool):
        self.pool = pool
        self.note = pool.inventory.note
        self.owner_admin = pool.admin  # the pool service's word on its caller; None for this process's own ledger

    @property
    def settings(self):
        return self.pool.settings

    @property
    def declared(self) -> bool:
        return self.pool.inventory.declared

    @property
    def policy(self) -> Policy:
        return self.pool.settings.idle_policy

    @property
    def owner(self) -> str:
        return self.pool.settings.owner

    def gpus(self) -> list[GPU]:
        return self.pool.gpus

    def profile(self, name: str) -> Profile | None:
        return self.pool.settings.profiles.get(name)

    def profiles(self) -> dict[str, Profile]:
        return self.pool.settings.profiles

    def groups_of(self, user: str) -> tuple[str, ...]:
        return self.pool.groups_of(user)

    def user_quota(self, user: str) -> Quota:
        return self.pool.settings.quotas.user_quota(user)

    def group_quota(self, group: str) -> Quota | None:
        return self.pool.settings.quotas.groups.get(group)

    async def snapshot(self) -> Snapshot:
        return await asyncio.to_thread(self.pool.ledger.snapshot)

    async def reconcile(self) -> list[Lease]:
        return await self.pool.areconcile()

    async def budget(self, user: str, groups: tuple[str, ...]) -> Standing | None:
        book = self.pool.settings.budget_book
        if not book.scopes(user, groups):
            return None
        return await asyncio.to_thread(self.pool.ledger.budget_standing, user, groups, book)

    def budget_users(self) -> set[str]:
        settings = self.pool.settings
        members = settings.quotas.members
        found: set[str] = set()
        for name in settings.budget_book.budgets:
            found |= members[name] if name in members else {name}
        return found

    async def starts_now(self, user: str, groups: tuple[str, ...], snapshot: Snapshot) -> dict[str, bool]:
        settings = self.pool.settings
        budget = await self.budget(user, groups)
        holdings = Holdings.of(self.pool.gpus, snapshot.leases, snapshot.waiters, budget)
        return {name: isinstance(allocate(holdings, Ask(user, "", profile, groups=groups), settings.quotas,
                                          now=snapshot.at, placement=settings.placement), Grant)
                for name, profile in settings.profiles.items()}

    async def claim_stop(self, lease: Lease) -> bool:
        try:  # from the phase the culler saw: a hibernation that started since wins
            await asyncio.to_thread(self.pool.ledger.stop, lease.id, expect=lease.phase)
        except PhaseConflict:
            return False
        except LeaseNotFound:
            return False
        return True

    async def relabel(self, lease: Lease, label: str) -> None:
        try:
            await asyncio.to_thread(self.pool.ledger.relabel, lease.id, label)
        except LeaseNotFound:
            pass  # released meanwhile: nothing left to name

    async def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                      limit: int = 200) -> list[JournalEntry]:
        return await asyncio.to_thread(self.pool.ledger.journal, since=since, kinds=kinds, owner=owner, limit=limit)

    @property
    def trace_sampling(self) -> float | None:
        s = self.pool.settings
        return s.trace_sample_interval if s.trace_recording else None

    async def trace(self, events: list[TraceEvent]) -> None:
        await asyncio.to_thread(self.pool.ledger.trace_record, events, self.pool.settings.trace_retention)

    async def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
                     owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        await asyncio.to_thread(self.pool.ledger.record, kind, lease_id=lease_id, kernel_id=kernel_id,
                                owner=owner, reason=reason, detail=detail)


class NoPool(PoolBackend):
    """Stands where the pool would be when its configuration is bad and the admin chose to run on
    (``GPUPoolExtension.exit_on_config_error = False``): every view says why there is no pool."""

    enabled = False

    def __init__(self, note: str, owner: str = ""):
        self.note = note
        self._owner = owner

    @property
    def policy(self) -> Policy:
        return Policy()

    @property
    def owner(self) -> str:
        return self._owner

    def gpus(self) -> list[GPU]:
        return []

    def profile(self, name: str) -> Profile | None:
        return None

    def profiles(self) -> dict[str, Profile]:
        return {}

    def groups_of(self, user: str) -> tuple[str, ...]:
        return ()

    def user_quota(self, user: str) -> Quota:
        return Quota()

    def group_quota(self, group: str) -> Quota | None:
        return None

    async def snapshot(self) -> Snapshot:
        return Snapshot(at=time.time(), gpus=[], leases=[], waiters=[])

    async def journal(self, **kwargs) -> list[JournalEntry]:
        return []

    async def record(self, kind: str, **kwargs) -> None:
        return None
