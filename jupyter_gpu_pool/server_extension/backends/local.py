"""The pool backend of this machine: :class:`LocalBackend`, serving :class:`~.base.PoolBackend` from the
pool's ledger (SQLite here, or the pool service's), each call in a thread."""

from __future__ import annotations

import asyncio

from ...local.pool import Pool
from ...pool import GPU, JournalEntry, Lease, LeaseNotFound, Profile, Quota, Snapshot
from ...pool.allocation import Ask, Grant, Holdings, allocate
from ...pool.budgets import Standing
from ...pool.phases import PhaseConflict
from ...pool.rules import Policy
from ...pool.sharing import Sharing
from ...pool.trace import TraceEvent
from .base import PoolBackend


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
    def sharing(self) -> Sharing:
        return self.pool.settings.sharing

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

    async def reserved(self, candidates: list, freeing: tuple[str, ...] = (),
                       warned: tuple[str, ...] = ()) -> dict[str, str]:
        if not candidates or not self.sharing.reservations:
            return {}
        return await asyncio.to_thread(self.pool.reserved, candidates, freeing, warned)

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
                                          now=snapshot.at, placement=settings.placement, sharing=settings.sharing),
                                 Grant)
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
