"""What hibernating and resuming a kernel costs in time, as a replay charges it.

The defaults are the least-squares lines (fixed seconds + seconds per GiB, nothing imposed) through hand
measurements on an H100 (driver 580, PyTorch; docs/architecture.md, "Checkpoint time against memory
held"): lock + checkpoint took 1.9 s for 1 GiB, 4.7 s for 4 GiB, 13.1 s for 16 GiB and 17.8 s for 32 GiB;
restore + unlock 0.5 s, 1.1 s, 3.0 s and 6.1 s.  That gives 2.62 s + 0.51 s/GiB to hibernate (off by up
to 2.3 s at a point: the checkpoint grows more slowly than a line past 16 GiB) and 0.31 s + 0.18 s/GiB
(about 5.6 GiB/s) to resume.  A kernel on declared GPUs moves nothing and costs nothing, as the
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


# (GiB moved, seconds): the measurements above
MEASURED_HIBERNATE = ((1, 1.9), (4, 4.7), (16, 13.1), (32, 17.8))
MEASURED_RESUME = ((1, 0.5), (4, 1.1), (16, 3.0), (32, 6.1))


def fit(points) -> Cost:
    """The least-squares line through (GiB, seconds) points."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))
    return Cost(mean_y - slope * mean_x, slope)


HIBERNATE = fit(MEASURED_HIBERNATE)  # 2.624 s + 0.5095 s/GiB
RESUME = fit(MEASURED_RESUME)  # 0.3063 s + 0.1788 s/GiB


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
