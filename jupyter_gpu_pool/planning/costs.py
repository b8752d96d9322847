"""What hibernating and resuming a kernel costs in time, as a replay charges it.

The defaults are fitted to hand measurements on an H100 (driver 580, PyTorch; docs/architecture.md,
"Checkpoint time against memory held"): lock + checkpoint took 1.9 s for 1 GiB, 4.7 s for 4 GiB, 13.1 s
for 16 GiB and 17.8 s for 32 GiB; restore + unlock 0.5 s, 1.1 s, 3.0 s and 6.1 s.  A least-squares line
through those points with the fixed costs seen for small kernels gives 1.5 s + 0.55 s/GiB to hibernate
and 0.3 s + 0.18 s/GiB (about 5.5 GiB/s) to resume.  A kernel on declared GPUs moves nothing and costs
nothing, as the hibernator treats it.
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


HIBERNATE = Cost(1.5, 0.55)
RESUME = Cost(0.3, 0.18)


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
