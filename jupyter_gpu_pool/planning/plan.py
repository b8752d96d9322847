"""A plan: one workload replayed under each configuration on each GPU count, and what a person asks
of it (the fewest GPUs that meet the wait goal, the difference two policies make, whether a replay
of a trace decides what the live pool decided)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .configuration import Configuration
from .costs import COSTS, Costs
from .metrics import PERCENTILE, Tally
from .simulator import replay
from .workload import Workload


@dataclass
class Outcome:
    """One configuration's replays, one per GPU count (None: the configured pool)."""

    config: Configuration
    tallies: dict[int, Tally] = field(default_factory=dict)

    def fewest(self, slo_wait: float) -> int | None:
        met = [n for n, t in sorted(self.tallies.items()) if t.meets(slo_wait)]
        return met[0] if met else None


def run(workload: Workload, configs: list[Configuration], counts: list[int | None], *, costs: Costs = COSTS,
        keep_decisions: bool = False, progress: Callable[[str, float], None] | None = None) -> list[Outcome]:
    """Every configuration on every GPU count; ``progress(label, virtual time)`` as replays go."""
    outcomes = []
    for config in configs:
        outcome = Outcome(config)
        for count in counts:
            gpus = config.pool_of(count)
            label = f"{config.name}, {len(gpus)} GPU(s)"
            tally = replay(workload, config, gpus, costs=costs, keep_decisions=keep_decisions,
                           progress=(lambda t, label=label: progress(label, t)) if progress else None)
            outcome.tallies[len(gpus)] = tally
        outcomes.append(outcome)
    return outcomes


def summary(workload: Workload, outcomes: list[Outcome], *, slo_wait: float, costs: Costs,
            decisions: bool = False) -> dict:
    """The plan as one JSON object."""
    out: dict = {
        "workload": {**workload.source, "sessions": len(workload.sessions), "hours": round(workload.hours, 3),
                     "start": workload.start, "end": workload.end, "culling_interval": workload.interval},
        "slo": {"wait_seconds": slo_wait, "percentile": PERCENTILE},
        "costs": {"hibernate": str(costs.hibernate), "resume": str(costs.resume)},
        "configurations": [],
    }
    for outcome in outcomes:
        c = outcome.config
        results = []
        for tally in outcome.tallies.values():
            row = tally.to_dict(slo_wait)
            if decisions:
                row["decisions"] = [d.to_dict() for d in tally.decisions]
                row["refused"] = [{"t": round(t, 3), "kernel": k, "reason": r, "what": w}
                                  for t, k, r, w in tally.refused_asks]
            results.append(row)
        out["configurations"].append({
            "name": c.name, "policy": c.policy.to_dict()["rules"], "dry_run": c.policy.dry_run,
            "profiles": {p.name: {"slice": p.slice.to_text(), "isolation": p.isolation} for p in c.profiles.values()},
            "placement": c.placement, "queue_timeout": c.queue_timeout,
            "gpu_model": {"name": c.pool_of(1)[0].name, "memory": c.pool_of(1)[0].memory},
            "results": results, "fewest_gpus": outcome.fewest(slo_wait)})
    out["fewest_gpus"] = outcomes[0].fewest(slo_wait) if outcomes else None
    if len(outcomes) == 2:  # two policies (or configurations) side by side
        out["comparison"] = compare(outcomes[0], outcomes[1])
    return out


def compare(first: Outcome, second: Outcome) -> dict:
    """What the second configuration changes against the first, per GPU count (second minus first)."""
    rows = []
    for n, a in first.tallies.items():
        b = second.tallies.get(n)
        if b is None:
            continue
        x, y = a.to_dict(), b.to_dict()
        rows.append({
            "gpus": n,
            "shut_down": y["shut_down"] - x["shut_down"],
            "hibernated": y["hibernated"] - x["hibernated"],
            "warnings": y["warnings"] - x["warnings"],
            "refusals": y["refusals"]["total"] - x["refusals"]["total"],
            "p95_wait_seconds": _diff(y["wait_seconds"]["p95"], x["wait_seconds"]["p95"]),
            "gpu_hours_held": round(y["gpu_hours"]["held"] - x["gpu_hours"]["held"], 3),
            "gpu_hours_busy": round(y["gpu_hours"]["busy"] - x["gpu_hours"]["busy"], 3),
        })
    return {"base": first.config.name, "proposed": second.config.name, "difference": rows}


def _diff(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)
