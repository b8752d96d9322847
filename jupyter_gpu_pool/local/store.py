"""What the provisioner, the server extension, the hibernator and the CLI ask of the machine's lease
store (``Pool.ledger``), declared once: :class:`LeaseStore`.

Two stores serve it: the SQLite :class:`~jupyter_gpu_pool.local.ledger.Ledger`, kept by this process
(one user's machine), and the pool service's proxy of it (``service.client.ServiceLedger``), where
one service keeps the ledger for every user of a shared machine.  Taking and resuming a slice and
reconciling go through the :class:`~jupyter_gpu_pool.local.pool.Pool`, which knows the settings;
everything else a client does with leases, the queue and the journal is here.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from ..pool import HELD, Holder, JournalEntry, Lease, PoolError, SliceSpec, Snapshot, Waiter
from ..pool.budgets import BudgetBook, Standing
from ..pool.trace import TraceEvent


class LeaseStore(ABC):
    path: str  # where the leases are kept (a file, or the service's socket)

    @property
    @abstractmethod
    def where(self) -> str:
        """Where the leases are kept, for people."""

    @abstractmethod
    def close(self) -> None: ...

    # -- reading -----------------------------------------------------------------------------

    @abstractmethod
    def get(self, lease_id: str) -> Lease | None: ...

    @abstractmethod
    def by_kernel(self, kernel_id: str) -> Lease | None:
        """The held lease of a kernel, if any."""

    @abstractmethod
    def leases(self, owner: str | None = None, states: tuple[str, ...] = HELD) -> list[Lease]: ...

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """Every GPU's usage, the held leases and the queue, at one moment."""

    @abstractmethod
    def budget_standing(self, owner: str, groups: tuple[str, ...], budgets: BudgetBook) -> Standing | None:
        """Where ``owner`` stands against their tightest GPU-hour budget (None: no budget applies)."""

    @abstractmethod
    def spenders(self, since: float) -> list[str]:
        """The users whose slices were active at some time since ``since``."""

    # -- a kernel's lease ----------------------------------------------------------------------

    @abstractmethod
    def release(self, lease_id: str, reason: str = "shutdown") -> Lease | None:
        """Give the slice back; None when it was released already."""

    @abstractmethod
    def set_holder(self, lease_id: str, holder: Holder | None, phase: str | None = None) -> None:
        """Record the kernel process holding the lease (None while it restarts or stops)."""

    @abstractmethod
    def relabel(self, lease_id: str, label: str) -> None:
        """Name a held lease's notebook anew (its user renamed or moved it): what every server, the dashboard
        and ``jupyter gpu-pool status`` show.  :class:`LeaseNotFound` where it is not held."""

    @abstractmethod
    def stop(self, lease_id: str, *, expect: str | None = None) -> Lease:
        """The lease's kernel is being shut down (phase ``stopping``), by compare-and-set on ``expect``."""

    @abstractmethod
    def set_phase(self, lease_id: str, to: str, *, expect: str | None = None, deadline: float | None = None) -> Lease:
        """Move a held lease to phase ``to`` by compare-and-set."""

    @abstractmethod
    def adopt(self, lease_id: str, manager: Holder) -> Lease:
        """A restarted server takes over a running kernel's lease."""

    @abstractmethod
    def hibernate(self, lease_id: str, host_bytes: int, reason: str = "idle",
                  last_gpus: tuple[str, ...] | None = None, phase: str = "") -> Lease:
        """The kernel's GPU memory is in host RAM: its slice goes back to the pool."""

    @abstractmethod
    def reserve_host_bytes(self, lease_id: str, host_bytes: int, cap: int | None, host: str = "") -> tuple[bool, int]:
        """Claim host RAM for a hibernation under ``cap``: (granted, bytes the others claimed)."""

    @abstractmethod
    def host_bytes_on(self, host: str = "") -> int:
        """Host RAM held or claimed by hibernation on ``host``."""

    # -- the queue -----------------------------------------------------------------------------

    @abstractmethod
    def enqueue(self, owner: str, kernel_id: str, profile: str, spec: SliceSpec, *,
                lease_id: str | None = None, label: str = "", groups: tuple[str, ...] = ()) -> Waiter:
        """A place in the queue; ``groups``: the owner's (reservations' members, fair share's groups; the pool
        service knows its callers' and takes none from them)."""

    @abstractmethod
    def heartbeat(self, waiter_id: str) -> Waiter | None:
        """Keep a waiter alive; it with its current position, or None when it is gone."""

    @abstractmethod
    def dequeue(self, waiter_id: str) -> None: ...

    @abstractmethod
    def waiters(self) -> list[Waiter]: ...

    # -- the journal ---------------------------------------------------------------------------

    @abstractmethod
    def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
               owner: str | None = None, reason: str = "", detail: dict | None = None) -> None: ...

    @abstractmethod
    def record_refusal(self, kernel_id: str, owner: str, profile: str, err: PoolError, label: str = "") -> None: ...

    @abstractmethod
    def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                limit: int = 200, after_seq: int = 0) -> list[JournalEntry]:
        """Entries newest first."""

    # -- the activity trace (pool.trace; the capacity planner's) -------------------------------------

    @abstractmethod
    def trace_record(self, events: list[TraceEvent], keep: float | None = None) -> None:
        """Add events to the activity trace (``keep``: seconds old events are kept, where this store decides)."""

    @abstractmethod
    def trace_export(self, *, since: float = 0.0, until: float = math.inf, owner: str | None = None,
                     after: tuple[float, int] | None = None,
                     limit: int = 2000) -> tuple[list[TraceEvent], tuple[float, int] | None]:
        """One page of the trace in time order (``owner``: theirs only), and where the next page starts."""
