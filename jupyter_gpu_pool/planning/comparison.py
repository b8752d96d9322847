"""Policies compared on one workload: when a kernel takes its slice (at start, at its first cell, or as
the admin's rules say) and whether the resume hint runs, each replayed on the same GPU counts, and one
row per policy of what it holds against what runs, the GPUs it needs for the wait goal, and the
resumes its users meet with the wait they feel (docs/planning.md, "Policies compared")."""

from __future__ import annotations

import dataclasses

from ..pool.rules import AT_START, DEFAULT_RULE, FIRST_CELL, Policy
from .configuration import Configuration, Hint, PlanError
from .plan import Outcome

CONFIGURED = "configured"  # the rules' own slice_at
BASES = (AT_START, FIRST_CELL, CONFIGURED)
HINT = "hint"
DEFAULT = "start,first-cell,first-cell+hint"


def parse_policies(text: str) -> list[str]:
    """``start,first-cell,first-cell+hint``: the policies to compare, each checked."""
    names = [n.strip() for n in text.split(",")]
    for name in names:
        base, plus, extra = name.partition("+")
        if base not in BASES or (plus and extra != HINT):
            raise PlanError(f"--policies {text!r}: {name!r} is not a policy to compare; write names from "
                            f"{', '.join(BASES)}, each with +hint or without, such as {DEFAULT}")
    if len(set(names)) != len(names):
        raise PlanError(f"--policies {text!r}: name each policy once")
    return names


def variant(config: Configuration, name: str, hint: Hint) -> Configuration:
    """``config`` under the policy ``name``: every rule (and the default) taking its slice at start or at
    first cell (``configured``: as each rule says), with the resume hint where the name ends in +hint."""
    base, plus, _ = name.partition("+")
    policy = config.policy
    if base != CONFIGURED:
        rules = tuple(dataclasses.replace(r, slice_at=base) for r in policy.rules)
        policy = Policy(rules=(*rules, dataclasses.replace(DEFAULT_RULE, slice_at=base)), dry_run=policy.dry_run)
    return config.with_policy(name, policy, hint if plus else None)


def rows(outcomes: list[Outcome], slo_wait: float) -> list[dict]:
    """One row per policy: the fewest GPUs meeting the wait goal, and at that count (else at the most GPUs
    replayed) GPU-hours held and busy, resumes per user-hour and the wait a resume's cell felt."""
    out = []
    for outcome in outcomes:
        fewest = outcome.fewest(slo_wait)
        at = fewest if fewest is not None else max(outcome.tallies)
        r = outcome.tallies[at].to_dict(slo_wait)
        hint = outcome.config.hint
        out.append({
            "policy": outcome.config.name, "gpus_for_goal": fewest, "at_gpus": at,
            "hint": dataclasses.asdict(hint) if hint else None,
            "gpu_hours_held": r["gpu_hours"]["held"], "gpu_hours_busy": r["gpu_hours"]["busy"],
            "held_over_busy": r["gpu_hours"]["held_over_busy"],
            "wait_p95_seconds": r["wait_seconds"]["p95"],
            "started_without_slice": r["started_without_slice"],
            "resumes": r["resumed"], "resumes_per_user_hour": r["resumes_per_user_hour"],
            "resume_wait_seconds": {k: r["resume_delay_seconds"][k] for k in ("mean", "p95", "share_waited")},
            "resumed_cells": r["resume_delay_seconds"]["cells"],
            "resumed_cells_over_goal": r["resume_delay_seconds"]["cells_over_goal"],
            "hints": r["hints"],
        })
    return out
