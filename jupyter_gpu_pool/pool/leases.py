"""Leases: one kernel's hold on a slice, the ledger's unit of truth.

Every slice handed out is a lease and every lease ends ``released``.  A lease
records who holds it (the Jupyter server process that manages the kernel and
the kernel process itself, each as pid plus process start time, so that a
reused pid is never mistaken for the holder) so that a lease whose holder died
can be reclaimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .slices import SliceSpec

ACTIVE = "active"
HIBERNATED = "hibernated"
RELEASED = "released"
STATES = (ACTIVE, HIBERNATED, RELEASED)
HELD = (ACTIVE, HIBERNATED)
# The reason of a lease that has held no slice yet (the rule's ``slice_at: first-cell``): its kernel started
# without one, holding nothing like a hibernated kernel with nothing to restore; its first cell takes one.
FIRST_CELL = "first_cell"
_PRIVATE = ("manager_start", "holder_start", "extra")  # left out of to_dict


@dataclass(frozen=True)
class Holder:
    """A process, identified by pid and start time (pids are reused; the pair is not)."""

    pid: int
    start: float
    host: str = ""


@dataclass(frozen=True)
class Lease:
    id: str
    owner: str
    kernel_id: str
    profile: str
    isolation: str
    memory: int  # bytes per GPU
    sm_percent: int | None
    whole: bool
    gpu_count: int
    state: str
    gpus: tuple[str, ...]  # uuids held now (empty when hibernated or released)
    last_gpus: tuple[str, ...]  # uuids held last (for resuming where the memory was)
    groups: tuple[str, ...]
    label: str
    created: float
    updated: float
    state_since: float
    host: str = ""
    manager_pid: int | None = None
    manager_start: float | None = None
    holder_pid: int | None = None
    holder_start: float | None = None
    host_bytes: int = 0
    reason: str = ""
    phase: str = ""  # transient: hibernating, resuming, queued, evicting, failed ("" when settled)
    phase_deadline: float | None = None
    borrowed: tuple[str, ...] = ()  # the reservations whose unused room it took (pool.sharing): it may be reclaimed
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def slice(self) -> SliceSpec:
        """The slice this lease holds (or held, when hibernated)."""
        if self.whole:
            return SliceSpec(whole=True, gpu_count=self.gpu_count)
        return SliceSpec(memory=self.memory, sm_percent=self.sm_percent)

    @property
    def awaits_first_cell(self) -> bool:
        """Whether its kernel has held no slice yet: it takes one when its first cell runs."""
        return self.state == HIBERNATED and self.reason == FIRST_CELL

    @property
    def total_memory(self) -> int:
        return self.memory * self.gpu_count

    @property
    def total_sm(self) -> int:
        if self.whole:
            return 100 * self.gpu_count
        return self.sm_percent or 0

    @property
    def short_id(self) -> str:
        return self.id[:8]

    def to_dict(self) -> dict:
        """The lease as JSON (a process's start time is an identity detail, not for the API)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self) if f.name not in _PRIVATE}
