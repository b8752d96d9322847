"""What hibernating and resuming a kernel costs in time, as a replay charges it.

The defaults are the least-squares lines (fixed seconds + seconds per GiB, nothing imposed) through the
product's own hibernation path measured on an H100 by ``scripts/gpu-check`` (2026-11-26, driver
580.159.04, CUDA 13.0; docs/benchmarks.md, "Hibernation against restarting and rebuilding"): the
Hibernator's hibernate (cache release, lock, checkpoint) took 1.11 s for 1 GiB, 2.98 s for 4 GiB and
9.26 s for 16 GiB; its resume (restore, unlock) 0.48 s, 1.26 s and 3.63 s.  That gives 0.687 s +
0.538 s/GiB to hibernate and 0.345 s + 0.206 s/GiB (about 4.8 GiB/s) to resume.  They are preferred to
the earlier hand measurements (driver 580, PyTorch; docs/architecture.md, "Checkpoint time against
memory held": lock + checkpoint 1.9, 4.7, 13.1 and 17.8 s at 1, 4, 16 and 32 GiB, restore + unlock 0.5,
1.1, 3.0 and 6.1 s, so 2.62 s + 0.51 s/GiB and 0.31 s + 0.18 s/GiB) because they time what the product
does, end to end, on the same driver.  Their limits: three points, 1 to 16 GiB; the 32 GiB hand point
(17.8 s) suggests the checkpoint grows more slowly than a line past 16 GiB, so the line (17.9 s at
32 GiB) is pessimistic there.  A kernel on declared GPUs moves nothing and costs nothing, as the
hibernator treats it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class Cost:
    """``fixed`` seconds plus ``per_gib`` seconds for each GiB moved."""

    fixed: float
    per_gib: float

    def seconds(self, moved: int) -> float:
        return self.fixed + self.per_gib * moved / GiB

    def __str__(self) -> str:
        return f"{self.fixed:g},{self.per_gib:g}"


# (GiB moved, seconds): the product-path measurements above, which the defaults follow
MEASURED_HIBERNATE = ((1, 1.11), (4, 2.98), (16, 9.26))
MEASURED_RESUME = ((1, 0.48), (4, 1.26), (16, 3.63))


def fit(points) -> Cost:
    """The least-squares line through (GiB, seconds) points."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))
    return Cost(mean_y - slope * mean_x, slope)


HIBERNATE = fit(MEASURED_HIBERNATE)  # 0.6867 s + 0.5376 s/GiB
RESUME = fit(MEASURED_RESUME)  # 0.345 s + 0.2064 s/GiB


@dataclass(frozen=True)
class Costs:
    hibernate: Cost = HIBERNATE
    resume: Cost = RESUME


COSTS = Costs()  # the measured defaults


def parse_cost(text: str, what: str) -> Cost:
    """``"1.5,0.55"``: fixed seconds, then seconds per GiB moved; ValueError saying what to write."""
    parts = text.split(",") if isinstance(text, str) else []
    try:
        fixed, per_gib = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{what} cost {text!r}: write fixed seconds and seconds per GiB, such as "
                         f"'{HIBERNATE if what == 'hibernate' else RESUME}'") from None
    if not all(math.isfinite(v) and v >= 0 for v in (fixed, per_gib)):
        raise ValueError(f"{what} cost {text!r}: both figures must be 0 or more")
    return Cost(fixed, per_gib)
