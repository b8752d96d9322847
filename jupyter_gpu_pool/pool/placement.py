"""Placement: which GPU a slice goes on.  Pure functions over a usage snapshot.

``binpack`` fills the fullest GPU that still fits (keeps whole GPUs free for
whole-GPU requests and for big slices); ``spread`` takes the emptiest (less
contention for SMs and memory bandwidth between kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpus import GPU
from .slices import SliceSpec

BINPACK = "binpack"
SPREAD = "spread"
PLACEMENTS = (BINPACK, SPREAD)


@dataclass(frozen=True)
class GPUUsage:
    gpu: GPU
    memory: int = 0
    sm_percent: int = 0
    exclusive: bool = False
    leases: int = 0

    @property
    def free_memory(self) -> int:
        return 0 if self.exclusive else max(self.gpu.memory - self.memory, 0)

    @property
    def free_sm(self) -> int:
        return 0 if self.exclusive else max(100 - self.sm_percent, 0)

    def fits(self, spec: SliceSpec) -> bool:
        if self.exclusive:
            return False
        if spec.whole:
            return self.leases == 0
        return spec.memory <= self.free_memory and spec.sm_on() <= self.free_sm  # type: ignore[operator]

    def plus(self, spec: SliceSpec) -> GPUUsage:
        return GPUUsage(
            gpu=self.gpu,
            memory=self.memory + spec.memory_on(self.gpu.memory),
            sm_percent=self.sm_percent + spec.sm_on(),
            exclusive=self.exclusive or spec.whole,
            leases=self.leases + 1,
        )


def choose(usage: list[GPUUsage], spec: SliceSpec, placement: str, prefer: tuple[str, ...] = ()) -> list[GPU] | None:
    """The GPUs for this slice, or None when it fits nowhere.

    ``prefer`` lists GPU uuids to take first if they fit (a resuming kernel
    goes back where its memory was when it can).
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
    fitting = [u for u in usage if u.fits(spec)]
    if len(fitting) < spec.gpu_count:
        return None
    if placement == BINPACK:
        key = lambda u: (u.free_memory, u.free_sm, u.gpu.index)  # noqa: E731
    else:
        key = lambda u: (-u.free_memory, -u.free_sm, u.gpu.index)  # noqa: E731
    ordered = sorted(fitting, key=key)
    if prefer:
        ordered.sort(key=lambda u: u.gpu.uuid not in prefer)  # stable: preferred first
    return [u.gpu for u in ordered[: spec.gpu_count]]


def largest_free(usage: list[GPUUsage]) -> GPUUsage | None:
    """The GPU with the most free memory (what a refused user could still get)."""
    candidates = [u for u in usage if not u.exclusive]
    return max(candidates, key=lambda u: (u.free_memory, u.free_sm), default=None)
