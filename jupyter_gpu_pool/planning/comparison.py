"""Policies compared on one workload: when a kernel takes its slice (at start, at its first cell, or as
the admin's rules say), whether the resume hint runs and whether a kernel hibernates a set time after
each cell (``hibernate_after_cell``), each replayed on the same GPU counts, and one
row per policy of what it holds against what runs, the GPUs it needs for the wait goal, and the
resumes its users meet with the wait they feel (docs/planning.md, "Policies compared")."""

from __future__ import annotations

import dataclasses

from ..pool.rules import AT_START, DEFAULT_RULE, FIRST_CELL, HIBERNATE, Policy
from .configuration import Configuration, Hint, PlanError
from .plan import Outcome

CONFIGURED = "configured"  # the rules' own slice_at
BASES = (AT_START, FIRST_CELL, CONFIGURED)
HINT = "hint"
AFTER_CELL = "after-cell"
DEFAULT = "start,first-cell,first-cell+hint"


def parse_policies(text: str) -> list[str]:
    """``start,first-cell,first-cell+hint+after-cell``: the policies to compare, each checked."""
    names = [n.strip() for n in text.split(",")]
    for name in names:
        base, *extras = name.split("+")
        if base not in BASES or any(e not in (HINT, AFTER_CELL) for e in extras) or len(set(extras)) != len(extras):
            raise PlanError(f"--policies {text!r}: {name!r} is not a policy to compare; write names from "
                            f"{', '.join(BASES)}, each with +{HINT}, +{AFTER_CELL}, both or neither, such as "
                            f"{DEFAULT}")
    if len(set(names)) != len(names):
        raise PlanError(f"--policies {text!r}: name each policy once")
    return names


def variant(config: Configuration, name: str, hint: Hint, after_cell: float | None = None) -> Configuration:
    """``config`` under the policy ``name``: every rule (and the default) taking its slice at start or at
    first cell (``configured``: as each rule says), with the resume hint where the name has +hint, and
    with +after-cell every rule whose action is hibernate hibernating ``after_cell`` seconds after each
    cell (``hibernate_after_cell``); without it, start and first-cell turn after-cell off and configured
    keeps each rule's own."""
    base, *extras = name.split("+")
    policy = config.policy
    if base != CONFIGURED:
        rules = tuple(dataclasses.replace(r, slice_at=base, hibernate_after_cell=None) for r in policy.rules)
        policy = Policy(rules=(*rules, dataclasses.replace(DEFAULT_RULE, slice_at=base)), dry_run=policy.dry_run)
    if AFTER_CELL in extras:
        if after_cell is None:
            raise PlanError(f"--policies: {name!r} needs the time after each cell (--after-cell 20s)")
        if not any(r.action == HIBERNATE for r in policy.rules):
            raise PlanError(f"--policies: {name!r}: no rule of configuration {config.name!r} hibernates "
                            "(hibernate_after_cell needs action: hibernate); compare it under a configuration "
                            "whose rules hibernate")
        policy = Policy(rules=tuple(dataclasses.replace(r, hibernate_after_cell=after_cell)
                                    if r.action == HIBERNATE else r for r in policy.rules), dry_run=policy.dry_run)
    return config.with_policy(name, policy, hint if HINT in extras else None)


def rows(outcomes: list[Outcome], slo_wait: float) -> list[dict]:
    """One row per policy: the fewest GPUs meeting the wait goal, and at that count (else at the most GPUs
    replayed) GPU-hours held and busy, resumes per user-hour and the wait a resume's cell felt."""
    out = []
    for outcome in outcomes:
        fewest = outcome.fewest(slo_wait)
        at = fewest if fewest is not None else max(outcome.tallies)
        r = outcome.tallies[at].to_dict(slo_wait)
        hint = outcome.config.hint
        after = {r.hibernate_after_cell for r in outcome.config.policy.rules} - {None}
        out.append({
            "policy": outcome.config.name, "gpus_for_goal": fewest, "at_gpus": at,
            "hint": dataclasses.asdict(hint) if hint else None,
            "after_cell_seconds": sorted(after),
            "gpu_hours_held": r["gpu_hours"]["held"], "gpu_hours_busy": r["gpu_hours"]["busy"],
            "held_over_busy": r["gpu_hours"]["held_over_busy"],
            "wait_p95_seconds": r["wait_seconds"]["p95"],
            "started_without_slice": r["started_without_slice"],
            "resumes": r["resumed"], "resumes_per_user_hour": r["resumes_per_user_hour"],
            "hibernated_after_cell": r["hibernated_after_cell"],
            "resume_wait_seconds": {k: r["resume_delay_seconds"][k] for k in ("mean", "p95", "share_waited")},
            "resumed_cells": r["resume_delay_seconds"]["cells"],
            "resumed_cells_over_goal": r["resume_delay_seconds"]["cells_over_goal"],
            "hints": r["hints"],
        })
    return out
