"""Fair share: when more wait than fit, which group goes next.  Pure.

Each waiter belongs to one *share group*: the first of its groups that the admin gave a weight, in the
order the weights are written (a user in none counts with everyone else in none, :data:`OTHERS`).  A
group's recent use is the GPU memory its active slices held over time, in GiB-seconds, each second
counted less as it ages: half as much after ``half_life`` (:func:`decayed`, and the same sum kept as it
goes by :class:`Decaying`).  A group's *ratio* is its share of the use of the groups in the running
(those waiting or with recent use) over its share of their weights: under 1 it used less than its share.

The queue's order: the lowest of ratio − waited/``aging`` first, then arrival.  Waiting lowers a
waiter's key by one whole share every ``aging`` seconds, so no one waits forever: a ratio is at most
(the weights of every group) / (the least weight), and a waiter is ahead of everyone who came more than
``aging`` times that after it.  Within a group, arrival order (the same ratio, and the earlier has waited
longer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .units import parse_seconds

FIFO = "fifo"
FAIR = "fair"
QUEUE_ORDERS = (FIFO, FAIR)
OTHERS = "(others)"  # the share group of users in no weighted group
GiB = 2**30


@dataclass(frozen=True)
class FairShare:
    """The admin's fair-share settings: group weights (in the order written), the use's half-life, and
    how fast waiting raises a waiter (seconds per share)."""

    weights: Mapping[str, float] = field(default_factory=dict)
    half_life: float = 86400.0
    aging: float = 1800.0
    others_weight: float = 1.0

    def group_of(self, groups: Iterable[str]) -> str:
        """The share group of a user in ``groups``: the first weighted one, in the weights' order."""
        mine = set(groups)
        return next((g for g in self.weights if g in mine), OTHERS)

    def weight(self, group: str) -> float:
        return self.weights.get(group, self.others_weight)

    @property
    def bound(self) -> float:
        """The largest ratio a group can have: every weight over the least one."""
        weights = [*self.weights.values(), self.others_weight]
        return sum(weights) / min(weights)


def parse_weights(value) -> dict[str, float]:
    """``{"ml101": 2, "research": 1}``: a positive weight per group."""
    if not isinstance(value, dict):
        raise ValueError(f"must be a dict of group name to weight such as {{'ml101': 2, 'research': 1}}, not {value!r}")
    for group in value:
        if not isinstance(group, str) or not group.strip():
            raise ValueError(f"group names must be non-empty text, not {group!r}")
    return {g: parse_weight(w, f"[{g!r}] ") for g, w in value.items()}


def parse_weight(weight, where: str = "") -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < 1e9:
        raise ValueError(f"{where}must be a weight above 0, such as 1 or 2.5, not {weight!r}")
    return float(weight)


def parse_half_life(value) -> float:
    return parse_seconds(value, zero_allowed=False)


def decayed(intervals: Iterable[tuple[int, float, float | None]], now: float, half_life: float) -> float:
    """GiB-seconds of ``intervals`` (bytes held, from, to; None: still held) up to ``now``, each second
    weighted 2^-(age/half_life)."""
    rate = math.log(2) / half_life
    total = 0.0
    for memory, start, end in intervals:
        end = now if end is None else min(end, now)
        if end <= start:
            continue
        total += memory / GiB * (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))) / rate
    return total


@dataclass
class Decaying:
    """The same sum as :func:`decayed`, kept as slices come and go (the planner's): ``value`` at ``at``,
    and the bytes held since."""

    half_life: float
    value: float = 0.0
    held: int = 0
    at: float = 0.0

    def at_time(self, now: float) -> float:
        rate = math.log(2) / self.half_life
        fade = math.exp(-rate * (now - self.at))
        return self.value * fade + self.held / GiB * (1 - fade) / rate

    def change(self, now: float, memory: int) -> None:
        """``memory`` more bytes held from ``now`` (fewer where negative)."""
        self.value, self.at = self.at_time(now), now
        self.held += memory


def ratios(use: Mapping[str, float], waiting: Iterable[str], fair: FairShare) -> dict[str, float]:
    """Each group in the running's use over its weighted share (0 for all where none used anything)."""
    running = {g for g, u in use.items() if u > 0} | set(waiting)
    total_use = sum(use.get(g, 0.0) for g in running)
    total_weight = sum(fair.weight(g) for g in running)
    if total_use <= 0:
        return {g: 0.0 for g in running}
    return {g: (use.get(g, 0.0) / total_use) / (fair.weight(g) / total_weight) for g in running}


def key(ratio: float, waited: float, fair: FairShare) -> float:
    """A waiter's place: lower goes first."""
    return ratio - waited / fair.aging


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def why(position: int, group: str, ratio: float, ahead: list[tuple[str, float, bool]]) -> str:
    """What a waiter reads: "3rd: your group has used more than its share lately; 2 ahead are from groups
    under theirs".  ``ahead``: (share group, ratio, went first for a reservation) of each waiter ahead."""
    whose, their = (("users in no group with a share have", "their") if group == OTHERS else
                    (f"group {group!r} has", "its"))
    if ratio > 1.05:
        standing = f"{whose} used more than {their} share lately ({ratio:.1f}x)"
    elif ratio < 0.95:
        standing = f"{whose} used less than {their} share lately"
    else:
        standing = f"{whose} used about {their} share lately"
    reserved = sum(1 for _g, _r, res in ahead if res)
    under = sum(1 for g, r, res in ahead if not res and g != group and r < ratio)
    mine = sum(1 for g, _r, res in ahead if not res and g == group)
    longer = len(ahead) - reserved - under - mine
    parts = [(n, text) for n, text in ((under, "from groups under their share"),
                                       (mine, "from your group, who came earlier"), (longer, "waiting longer"),
                                       (reserved, "going first into room reserved for them")) if n]
    if len(parts) == 1:
        n, text = parts[0]
        return f"{ordinal(position)} in the queue: {standing}; {n} ahead {'is' if n == 1 else 'are'} {text}"
    listed = ", ".join(f"{n} {text}" for n, text in parts)
    return f"{ordinal(position)} in the queue: {standing}" + (f"; {len(ahead)} ahead: {listed}" if parts else "")
