"""A kernel's GPU use as the idle policy reads it: since when it has held GPU memory without using the
GPU, and when it last used it above a threshold.

Pure: the telemetry sampler feeds it NVML readings, the planner's replay feeds it a trace's samples,
and the culler's facts read it alike either way (``pool.culling``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class GPUUse:
    held_since: float | None = None  # holding GPU memory continuously since
    utilization: float | None = None  # the latest reading's (None: no reading, or none had a figure)
    read: bool = False  # a reading was had at all
    above: dict[float, float] = field(default_factory=dict)  # threshold -> last time utilization reached it

    def record(self, at: float, memory_used: int | None, utilization: float | None,
               thresholds: tuple[float, ...]) -> None:
        """One reading: ``memory_used`` None means memory is held but NVML would not say how much."""
        self.read = True
        self.utilization = utilization
        holding = memory_used is None or memory_used > 0
        if holding and self.held_since is None:
            self.held_since = at
        elif not holding:
            self.held_since = None
        if utilization is not None:
            for t in thresholds:
                if utilization >= t:
                    self.above[t] = at

    def idle_since(self, threshold: float) -> float | None:
        """Since when the kernel has held GPU memory with utilization under ``threshold`` (None: no
        reading, holds no memory, or used the GPU in its latest reading)."""
        if not self.read or self.held_since is None or self.utilization is None or self.utilization >= threshold:
            return None
        return max(self.held_since, self.above.get(threshold, self.held_since))

    def last_active(self, threshold: float) -> float | None:
        """The last time the kernel's utilization reached ``threshold``."""
        return self.above.get(threshold)
