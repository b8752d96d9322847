"""GPU-hour budgets: how much GPU time a user may spend in a period (a teaching lab's weekly ration).

A slice costs its *share* of its GPU per hour while it is active: the larger of its memory share and
its SM share (a whole GPU costs 1 an hour, a 10 GiB slice of an 80 GiB GPU 0.125).  Hibernated time
is free: the GPU is given back.  A budget is per user, or per group: a group's budget applies to each
member on their own (``"students": {"gpu_hours": 10}`` gives every student 10 h), unless it is
``shared`` (the members together).  A user's own entry replaces the member budgets of their groups;
shared group budgets apply on top.  Periods are calendar days, weeks (from Monday) or months, in the
pool's time zone.

Pure: the store keeps the intervals (``Interval``) and asks :func:`refusal` before a start or a
resume; the culler asks :func:`standing` for the policy's warning at 90% and action at 100%.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from .entries import entry as checked_entry
from .errors import PoolError, describe_holdings
from .leases import Lease
from .units import format_clock

PERIODS = ("day", "week", "month")
WARN_AT = 0.9  # of the budget: the policy warns here, and acts at 1.0
_KEYS = {"gpu_hours", "period", "shared"}


@dataclass(frozen=True)
class Budget:
    gpu_hours: float
    period: str = "week"
    shared: bool = False  # a group's budget for all its members together


@dataclass(frozen=True)
class Interval:
    """A lease's active time: ``share`` of a GPU from ``start`` to ``end`` (None: still active)."""

    share: float
    start: float
    end: float | None = None


@dataclass(frozen=True)
class Scope:
    """One budget that applies to a user: their own, their group's per member, or a group's shared one."""

    name: str  # the user or group the budget is written for
    kind: str  # user, member, shared
    budget: Budget


def parse_budget(value, where: str) -> Budget:
    checked_entry(value, where, _KEYS, "{'gpu_hours': 10, 'period': 'week'}")
    hours = value.get("gpu_hours")
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not 0 <= hours < 1e7 or hours != hours:
        raise ValueError(f"{where}.gpu_hours must be a number of hours of 0 or more, not {hours!r}")
    period = value.get("period", "week")
    if period not in PERIODS:
        raise ValueError(f"{where}.period: {period!r} is not one of {', '.join(PERIODS)}")
    shared = value.get("shared", False)
    if not isinstance(shared, bool):
        raise ValueError(f"{where}.shared must be true or false, not {shared!r}")
    return Budget(float(hours), period, shared)


def parse_budgets(entries) -> dict[str, Budget]:
    """``{"students": {"gpu_hours": 10, "period": "week"}, "alice": {"gpu_hours": 40}}``."""
    if not isinstance(entries, dict):
        raise ValueError(f"must be a dict of user or group name to budget such as "
                         f"{{'students': {{'gpu_hours': 10, 'period': 'week'}}}}, not {entries!r}")
    return {name: parse_budget(value, f"[{name!r}]") for name, value in entries.items()}


def scopes(budgets: dict[str, Budget], user: str, groups: tuple[str, ...]) -> list[Scope]:
    """The budgets that apply to ``user`` (in their groups ``groups``)."""
    found = []
    own = budgets.get(user)
    if own is not None:
        found.append(Scope(user, "user", own))
    for group in groups:
        budget = budgets.get(group)
        if budget is None or group == user:
            continue
        if budget.shared:
            found.append(Scope(group, "shared", budget))
        elif own is None:
            found.append(Scope(group, "member", budget))
    return found


def period_bounds(now: float, period: str, tz: dt.tzinfo) -> tuple[float, float]:
    """The calendar period (in ``tz``) that ``now`` falls in, as Unix times [start, end)."""
    t = dt.datetime.fromtimestamp(now, tz)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + dt.timedelta(days=1)
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
        end = start + dt.timedelta(days=7)
    elif period == "month":
        start = day.replace(day=1)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"period {period!r} is not one of {', '.join(PERIODS)}")
    return start.timestamp(), end.timestamp()


def share_of(lease: Lease, gpu_memory: int) -> float:
    """What the lease's slice costs per hour: its share of its GPU(s), the larger of memory and SMs."""
    if lease.whole:
        return float(lease.gpu_count)
    memory = lease.memory / gpu_memory if gpu_memory else 1.0
    return min(1.0, max(memory, (lease.sm_percent or 0) / 100))


def hours_spent(intervals: list[Interval], start: float, now: float) -> float:
    """GPU-hours of ``intervals`` between ``start`` and ``now``."""
    seconds = 0.0
    for i in intervals:
        begin, end = max(i.start, start), min(i.end if i.end is not None else now, now)
        if end > begin:
            seconds += i.share * (end - begin)
    return seconds / 3600


@dataclass(frozen=True)
class Standing:
    """Where one user stands against their tightest budget now."""

    scope: Scope
    spent: float  # GPU-hours this period
    rate: float  # GPU-hours per hour their active slices cost now
    period_end: float
    now: float
    period_start: float = 0.0

    @property
    def limit(self) -> float:
        return self.scope.budget.gpu_hours

    @property
    def left(self) -> float:
        return max(self.limit - self.spent, 0.0)

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.limit

    def reaches(self, fraction: float) -> float | None:
        """When the spending reaches ``fraction`` of the budget at the current rate: a time past when it
        has (the same time, pass after pass, as long as the rate holds), None when it will not within
        this period."""
        target = fraction * self.limit
        if self.rate <= 0:
            return self.period_start if self.spent >= target else None
        at = self.now + (target - self.spent) / self.rate * 3600
        return at if at < self.period_end else None

    def to_dict(self) -> dict:
        return {"scope": self.scope.name, "kind": self.scope.kind, "period": self.scope.budget.period,
                "gpu_hours": self.limit, "used_hours": round(self.spent, 4), "rate": round(self.rate, 4),
                "resets_at": self.period_end}


@dataclass(frozen=True)
class BudgetBook:
    """The admin's budgets, and the time zone their periods are counted in."""

    budgets: dict[str, Budget] = field(default_factory=dict)
    tz: dt.tzinfo = dt.timezone.utc

    def scopes(self, user: str, groups: tuple[str, ...]) -> list[Scope]:
        return scopes(self.budgets, user, groups)

    def standing(self, user: str, groups: tuple[str, ...], spent_of, rate_of, now: float) -> Standing | None:
        """The user's tightest budget (the one with the least left), or None when none applies.

        ``spent_of(scope, start)`` gives the GPU-hours spent in the scope since ``start``; ``rate_of(scope)``
        what its active slices cost per hour now (a store answers both from its intervals)."""
        worst: Standing | None = None
        for scope in self.scopes(user, groups):
            start, end = period_bounds(now, scope.budget.period, self.tz)
            s = Standing(scope, spent_of(scope, start), rate_of(scope), end, now, start)
            if worst is None or (s.left, s.period_end) < (worst.left, worst.period_end):
                worst = s
        return worst


NO_BUDGETS = BudgetBook()


class BudgetExceeded(PoolError):
    """The user's GPU time for the period is used up: nothing starts or resumes until it resets."""

    reason = "budget_exceeded"

    def __init__(self, *, owner: str, profile: str, standing: Standing, holdings: list[Lease], now: float,
                 launcher_name: str = ""):
        self.owner, self.profile, self.standing = owner, profile, standing
        self.launcher_name = launcher_name or profile  # what the user clicked in the launcher
        scope = standing.scope
        whose = {"user": "Your", "member": f"As a member of group {scope.name!r}, your",
                 "shared": f"The shared (group {scope.name!r})"}[scope.kind]
        resets = dt.datetime.fromtimestamp(standing.period_end).strftime("%a %d %b") + \
            f" at {format_clock(standing.period_end)}"
        super().__init__(
            f"GPU time used up: {whose} budget of {standing.limit:g} GPU-hours per {scope.budget.period} is spent "
            f"({standing.spent:.1f} h used), so the kernel '{self.launcher_name}' cannot start or resume until "
            f"it resets on {resets}. {describe_holdings(holdings, now)} "
            f"Save your work; ask your admin if you need more GPU time this {scope.budget.period}.")

    def to_dict(self) -> dict:
        return {**super().to_dict(), **self.standing.to_dict(), "launcher_name": self.launcher_name}
