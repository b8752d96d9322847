"""What the server extension needs from "the pool", declared once: :class:`PoolBackend`.

Handlers and the culler read the pool only through it: settings (profiles, quotas, policy), one
consistent snapshot (GPUs, held leases, the queue), and the journal; and they claim a kernel for a
shutdown through it.  :class:`~.local.LocalBackend` serves it from this machine's SQLite ledger; the
cluster backend (``kubernetes.KubernetesBackend``) from Kubernetes custom resources.  Every call that does
I/O is async (the local one runs the ledger in a thread).  What only some pools have (a watch to
start, a reconcile, telemetry from elsewhere, hibernation) has a no-op default here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from ...devices.telemetry import ProcessSource, Sampler
from ...pool import GPU, JournalEntry, Lease, Profile, Quota, Snapshot
from ...pool.budgets import Standing
from ...pool.rules import Policy
from ...pool.sharing import Sharing
from ...pool.trace import TraceEvent


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

    @property
    def sharing(self) -> Sharing:
        """The admin's reservations and queue order, where this pool follows them (else first come, first served)."""
        return Sharing()

    async def reserved(self, candidates: list, freeing: tuple[str, ...] = (),
                       warned: tuple[str, ...] = ()) -> dict[str, str]:
        """Of this server's ``candidates`` (``pool.reclaim.Candidate``), those to give back room a reservation
        keeps now, each with why in words (judged on the whole pool, which this server may not read)."""
        return {}

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
