"""What the admin allows hibernation (``c.GPUPool.hibernation_*``): the host-RAM cap, what happens past
it, the moves' time limits, the room a resume needs on its GPU and how a resumed kernel is shut down.
Pure values, validated on creation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .slices import format_size, parse_size

EVICT_OLDEST = "evict_oldest"
SHUTDOWN = "shutdown"
KEEP_RUNNING = "keep_running"
OVER_CAP = (EVICT_OLDEST, SHUTDOWN, KEEP_RUNNING)

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_COST = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*s?\s*\+\s*(\d+(?:\.\d+)?)\s*s?\s*/\s*GiB\s*$")
GiB = 2**30


def parse_restore_cost(text) -> tuple[float, float] | None:
    """``"0.306s + 0.179s/GiB"`` → (0.306, 0.179): seconds a restore takes, and seconds more per GiB;
    ``""`` → None (no modelled cost).  Raises ValueError naming the text."""
    if not isinstance(text, str):
        raise ValueError(f"the restore cost must be text such as '0.306s + 0.179s/GiB', or '', not {text!r}")
    if not text.strip():
        return None
    m = _COST.match(text)
    if not m:
        raise ValueError(f"{text[:40]!r} is not a restore cost: write seconds plus seconds per GiB, such as "
                         "'0.306s + 0.179s/GiB', or '' for none")
    return float(m.group(1)), float(m.group(2))


def parse_margin(text) -> int:
    """The GPU memory a resume needs free beyond its checkpoint: ``"1GiB"`` → bytes, ``"0"`` → 0."""
    if isinstance(text, str) and text.strip() in ("0", "0B", "0 B"):
        return 0
    try:
        return parse_size(text)
    except ValueError as e:
        raise ValueError(f"{e}; or 0 for no margin") from None


def parse_host_memory(text) -> tuple[int | None, float | None]:
    """``"64GiB"`` → (bytes, None); ``"50%"`` → (None, 50.0) of the machine's RAM; ``"none"`` → (None, None),
    no cap.  Raises ValueError naming the text."""
    if not isinstance(text, str):
        raise ValueError(f"the host memory cap must be text such as '64GiB' or '50%', not {text!r}")
    if text.strip().lower() in ("none", "unlimited"):
        return None, None
    m = _PERCENT.match(text)
    if m:
        percent = float(m.group(1))
        if not 0 < percent <= 100:
            raise ValueError(f"{text!r}: a share of the machine's RAM is above 0% and at most 100%")
        return None, percent
    try:
        return parse_size(text), None
    except ValueError as e:
        raise ValueError(f"{e}; or write a share of the machine's RAM such as '50%', or 'none'") from None


ANSWER_GRACE = 5.0  # seconds, beyond the lock timeout, for a kernel to answer the silent cache release


@dataclass(frozen=True)
class HibernationSettings:
    host_memory: str = "50%"  # cap on host RAM that hibernated kernels may hold, per machine
    over_cap: str = EVICT_OLDEST  # what happens when a hibernation would pass the cap
    eviction_warning: float = 300.0  # seconds between the warning and the shutdown of an evicted kernel
    lock_timeout: float = 10.0  # seconds the lock may wait for a kernel's GPU work to finish
    release_cache: bool = True  # empty PyTorch's / CuPy's cached GPU memory before the checkpoint
    queue_poll: float = 1.0  # seconds between tries of a queued resume
    resume_margin: int = 2**30  # bytes a resume needs free on its GPU beyond its checkpoint
    checkpoint_before_kill: bool = True  # re-checkpoint a restored process before a kill (driver workaround)
    shutdown_timeout: float = 60.0  # seconds that checkpoint may take before the kill goes ahead anyway
    # A modelled restore time on declared GPUs (benchmarks and their tests only): "0.306s + 0.179s/GiB".
    declared_restore_cost: str = ""

    def __post_init__(self):
        parse_host_memory(self.host_memory)
        parse_restore_cost(self.declared_restore_cost)
        if isinstance(self.resume_margin, bool) or not isinstance(self.resume_margin, int) or self.resume_margin < 0:
            raise ValueError(f"resume_margin must be a number of bytes, 0 or more, not {self.resume_margin!r}")
        if self.over_cap not in OVER_CAP:
            raise ValueError(f"over_cap: {self.over_cap!r} is not one of {', '.join(OVER_CAP)}")
        for name in ("eviction_warning", "lock_timeout", "queue_poll", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number of seconds above 0, not {value!r}")

    @property
    def cache_release_timeout(self) -> float:
        """How long a kernel may take to release its framework's cache before a hibernation: bounded like
        the lock (freeing GPU memory waits for the GPU work in flight), and a little more to answer."""
        return self.lock_timeout + ANSWER_GRACE

    def declared_restore_seconds(self, declared_bytes: int) -> float:
        """Seconds a restore of ``declared_bytes`` takes on declared GPUs under the modelled cost (0 without)."""
        cost = parse_restore_cost(self.declared_restore_cost)
        if cost is None:
            return 0.0
        fixed, per_gib = cost
        return fixed + per_gib * declared_bytes / GiB

    def cap_bytes(self, machine_ram: int) -> int | None:
        """The cap in bytes on a machine with ``machine_ram`` bytes of RAM (None: no cap)."""
        size, percent = parse_host_memory(self.host_memory)
        if percent is not None:
            return int(machine_ram * percent / 100)
        return size

    def describe_cap(self, machine_ram: int) -> str:
        cap = self.cap_bytes(machine_ram)
        if cap is None:
            return "no cap"
        size, percent = parse_host_memory(self.host_memory)
        return format_size(cap) + (f" ({percent:g}% of {format_size(machine_ram)})" if percent is not None else "")
