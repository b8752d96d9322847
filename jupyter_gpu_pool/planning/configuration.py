"""The admin's settings as a replay uses them: profiles, quotas, budgets, the idle policy, placement,
the start queue's timeout, reservations and the queue's order, and the pool's GPUs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..pool import GPU, PoolError, Profile, QuotaBook
from ..pool.budgets import BudgetBook
from ..pool.gpus import DECLARED
from ..pool.rules import Policy
from ..pool.sharing import Sharing
from ..pool.units import parse_size

DEFAULT_GPU = GPU(uuid="PLAN-0", name="NVIDIA H100 80GB HBM3 (planned)", memory=parse_size("80GiB"), sm_count=132,
                  source=DECLARED)


@dataclass(frozen=True)
class Hint:
    """The resume hint as a replay models it: the user opens the notebook of a hibernated kernel (or starts
    editing a cell in it) ``lead`` seconds before the cell that needs it, and its resume starts then if
    the pool has room now and nobody waits in the queue; a kernel so resumed that runs no cell within
    ``hold`` seconds of the hint hibernates again (no warning: nothing was used).  A trace records no
    focus or typing, so ``lead`` is an assumption (docs/planning.md, "Policies compared")."""

    lead: float = 3.0
    hold: float = 60.0


class PlanError(PoolError):
    """Input the planner cannot replay (a bad trace, an unknown profile, a bad option): the message
    names the file and line, or the option, and says what to do."""

    reason = "bad_plan"


@dataclass(frozen=True)
class Configuration:
    name: str
    profiles: dict[str, Profile]
    quotas: QuotaBook
    budgets: BudgetBook
    policy: Policy
    placement: str
    queue_timeout: float  # GPUPool.start_queue_timeout: 0 refuses a start at once when the pool is full
    gpus: tuple[GPU, ...]  # the pool as configured
    default_profile: str
    hint: Hint | None = None  # the resume hint, in the replay (None: a resume starts at the cell)
    sharing: Sharing = Sharing()  # reservations and the queue's order (default: first come, first served)

    @classmethod
    def of(cls, name: str, settings, gpus: list[GPU]) -> Configuration:
        """From loaded settings (``config.GPUPool``) and the pool's GPUs."""
        return cls(name=name, profiles=dict(settings.profiles), quotas=settings.quotas, budgets=settings.budget_book,
                   policy=settings.idle_policy, placement=settings.placement,
                   queue_timeout=settings.start_queue_timeout, gpus=tuple(gpus),
                   default_profile=settings.default_profile or next(iter(settings.profiles)), sharing=settings.sharing)

    def with_policy(self, name: str, policy: Policy, hint: Hint | None = None) -> Configuration:
        return dataclasses.replace(self, name=name, policy=policy, hint=hint)

    def pool_of(self, count: int | None) -> list[GPU]:
        """``count`` GPUs like the configured pool's first (the configured pool itself for None)."""
        if count is None:
            return list(self.gpus)
        model = self.gpus[0] if self.gpus else DEFAULT_GPU
        return [dataclasses.replace(model, uuid=f"PLAN-{i}", index=i, source=DECLARED) for i in range(count)]

    def profile(self, name: str | None) -> Profile:
        name = name or self.default_profile
        if name not in self.profiles:
            raise PlanError(f"{name!r} is not a profile of configuration {self.name!r}; its profiles are "
                            f"{', '.join(self.profiles)}")
        return self.profiles[name]
