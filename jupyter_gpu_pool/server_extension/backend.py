"""What the server extension needs from "the pool", behind one small protocol.

Handlers and the culler read the pool only through :class:`PoolBackend`:
settings (profiles, quotas, policy), one consistent snapshot (GPUs, held
leases, the queue), and the journal.  :class:`LocalBackend` serves it from the
machine's SQLite ledger; a cluster backend serves the same from Kubernetes
custom resources without any handler changing.  Every call that does I/O is
async (the local one runs the ledger in a thread).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..config import Settings
from ..local_pool import LocalPool
from ..pool import GPU, JournalEntry, Lease, Profile, Quota, Snapshot, Usage
from ..pool.leases import ACTIVE
from ..pool.policy import Policy


class PoolBackend(Protocol):
    enabled: bool
    note: str  # one line for humans: where the GPUs come from, or why there is no pool

    @property
    def declared(self) -> bool: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def owner(self) -> str:
        """The user this server's kernels are leased to."""

    def gpus(self) -> list[GPU]: ...

    def profile(self, name: str) -> Profile | None: ...

    def groups_of(self, user: str) -> tuple[str, ...]: ...

    def user_quota(self, user: str) -> Quota: ...

    def group_quota(self, group: str) -> Quota | None: ...

    async def snapshot(self) -> Snapshot: ...

    async def reconcile(self) -> list[Lease]:
        """Release leases whose holders are gone; return them."""

    async def stopping(self, lease_id: str) -> None:
        """The server is about to stop this lease's kernel: until its provisioner releases the lease
        (with the reason we set), a reconcile must not reclaim it as a kernel that died."""

    async def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                      limit: int = 200) -> list[JournalEntry]: ...

    async def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
                     owner: str | None = None, reason: str = "", detail: dict | None = None) -> None: ...


def usage_from(leases: list[Lease]) -> Usage:
    """What these leases hold against quotas: memory and SM of active leases, every held kernel."""
    active = [lease for lease in leases if lease.state == ACTIVE]
    return Usage(sum(lease.total_memory for lease in active), sum(lease.total_sm for lease in active), len(leases))


class LocalBackend:
    """The pool on this machine: a :class:`LocalPool` (settings, inventory, SQLite ledger)."""

    enabled = True

    def __init__(self, pool: LocalPool):
        self.pool = pool
        self.note = pool.inventory.note

    @property
    def settings(self) -> Settings:
        return self.pool.settings

    @property
    def declared(self) -> bool:
        return self.pool.inventory.declared

    @property
    def policy(self) -> Policy:
        return self.pool.settings.policy

    @property
    def owner(self) -> str:
        return self.pool.settings.owner

    def gpus(self) -> list[GPU]:
        return self.pool.gpus

    def profile(self, name: str) -> Profile | None:
        return self.pool.settings.profiles.get(name)

    def groups_of(self, user: str) -> tuple[str, ...]:
        return self.pool.settings.groups_of(user)

    def user_quota(self, user: str) -> Quota:
        return self.pool.settings.quotas.user_quota(user)

    def group_quota(self, group: str) -> Quota | None:
        return self.pool.settings.quotas.groups.get(group)

    async def snapshot(self) -> Snapshot:
        return await asyncio.to_thread(self.pool.ledger.snapshot)

    async def reconcile(self) -> list[Lease]:
        return await self.pool.areconcile()

    async def stopping(self, lease_id: str) -> None:
        from ..pool import LeaseNotFound

        try:  # holder None, as between two launches: judged by its (live) server, not by the dying process
            await asyncio.to_thread(self.pool.ledger.set_holder, lease_id, None)
        except LeaseNotFound:
            pass

    async def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                      limit: int = 200) -> list[JournalEntry]:
        return await asyncio.to_thread(self.pool.ledger.journal, since=since, kinds=kinds, owner=owner, limit=limit)

    async def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
                     owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        await asyncio.to_thread(self.pool.ledger.record, kind, lease_id=lease_id, kernel_id=kernel_id,
                                owner=owner, reason=reason, detail=detail)


class NoPool:
    """Stands where the pool would be when its configuration is bad and the admin chose to run on
    (``GPUPoolExtension.exit_on_config_error = False``): every view says why there is no pool."""

    enabled = False
    declared = False

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

    def groups_of(self, user: str) -> tuple[str, ...]:
        return ()

    def user_quota(self, user: str) -> Quota:
        return Quota()

    def group_quota(self, group: str) -> Quota | None:
        return None

    async def snapshot(self) -> Snapshot:
        import time

        return Snapshot(at=time.time(), gpus=[], leases=[], waiters=[])

    async def reconcile(self) -> list[Lease]:
        return []

    async def stopping(self, lease_id: str) -> None:
        return None

    async def journal(self, **kwargs) -> list[JournalEntry]:
        return []

    async def record(self, kind: str, **kwargs) -> None:
        return None
