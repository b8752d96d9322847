"""What one replay found, and what a person asks of it: waits (p50, p95, max, mean, P(wait > 0)),
refusals, kernels shut down (their state lost) against kernels hibernated, GPU-hours held against
busy, occupancy, and whether a wait goal is met; where users are in several groups, each group's
waits and Jain's fairness index over their means; where reservations are configured, their members'
waits at each window's start."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..pool.reservations import Reservation

PERCENTILE = 95.0
SLOWER = 1.1  # the resume goal: a cell that woke its kernel takes at most this much longer than on one awake
WINDOW_START = 1800.0  # a reservation's members' asks within this long of its window's start are "at class start"


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile of ``values`` (sorted or not; math.inf counts as the largest)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


@dataclass
class Decision:
    at: float
    kernel: str
    verb: str  # warn or act
    reason: str
    action: str
    dry_run: bool = False

    def to_dict(self) -> dict:
        return {"t": round(self.at, 3), "kernel": self.kernel, "verb": self.verb, "reason": self.reason,
                "action": self.action, **({"dry_run": True} if self.dry_run else {})}


@dataclass
class Tally:
    gpus: int
    start: float
    end: float
    keep_decisions: bool = False
    waits: list[float] = field(default_factory=list)  # seconds to a slice, each ask that got one
    waits_by_ask: Counter = field(default_factory=Counter)  # asks of each kind (start, restart, resume) served
    unserved_asks: int = 0  # asks that never got a slice (refused for good, or still waiting at the end)
    refusals: Counter = field(default_factory=Counter)  # by reason
    resume_delays: list[float] = field(default_factory=list)  # per resume, its cell's wait: queue, restore, less a hint
    resumed_cells: int = 0  # cells that waited for a resume, and ran to their end
    slow_cells: int = 0  # of those, cells that took more than SLOWER x what they took without the wait
    unsliced: int = 0  # kernels started without a slice (slice_at first-cell)
    hints: int = 0  # resumes started by a hint
    hints_unused: int = 0  # hinted kernels that ran no cell in time and hibernated again
    hints_skipped: int = 0  # hints that found no room, or someone waiting
    user_seconds: float = 0.0  # each session from its ask to its user's last event
    shut_down: int = 0  # kernels the policy shut down: their state is lost
    hibernated: int = 0
    after_cell: int = 0  # of those, hibernations by the rule's hibernate_after_cell (no warning)
    resumed: int = 0
    restarts: int = 0  # users who came back to a kernel that was shut down and started another
    hibernations_refused: int = 0  # a hibernation asked of a kernel running a cell: it runs on
    requested: int = 0  # hibernations (or, where it cannot, shutdowns) its user or an admin asked for
    snoozes: int = 0
    snoozes_refused: int = 0
    warnings: int = 0
    peak_host_bytes: int = 0  # the most GPU memory moved to host RAM by one hibernation
    held_seconds: float = 0.0  # GPU-seconds held by active slices
    busy_seconds: float = 0.0  # GPU-seconds of slices running cells
    peak_held: float = 0.0  # GPUs' worth held at once
    timeline: list[tuple[float, float, float, int, int]] = field(default_factory=list)  # t, held, busy, queued, asleep
    decisions: list[Decision] = field(default_factory=list)
    refused_asks: list[tuple[float, str, str, str]] = field(default_factory=list)  # t, kernel, reason, what
    reservations: tuple[Reservation, ...] = ()  # the configuration's (their members' waits at each window's start)
    classes: dict = field(default_factory=dict)  # the workload's timetabled windows: name -> (group, starts)
    asks: list[tuple[float, float, str, tuple[str, ...]]] = field(default_factory=list)  # asked, wait, user, groups

    # -- recording -----------------------------------------------------------------------------

    def served(self, kernel: str, wait: float, what: str, session=None, at: float | None = None) -> None:
        self.waits.append(max(wait, 0.0))
        self.waits_by_ask[what] += 1
        if session is not None:
            self.asks.append((at, max(wait, 0.0), session.user, session.groups))

    def unserved(self, kernel: str, waited: float, what: str, session=None, at: float | None = None) -> None:
        self.unserved_asks += 1
        if session is not None:
            self.asks.append((at, math.inf, session.user, session.groups))

    def refused(self, kernel: str, at: float, reason: str, what: str) -> None:
        self.refusals[reason] += 1
        if self.keep_decisions:
            self.refused_asks.append((at, kernel, reason, what))

    def resume_delay(self, seconds: float) -> None:
        self.resume_delays.append(seconds)

    def resumed_cell(self, run: float, waited: float) -> None:
        """A cell that waited ``waited`` for its kernel's resume ran ``run`` seconds."""
        self.resumed_cells += 1
        if run + waited > SLOWER * run:
            self.slow_cells += 1

    def decision(self, at: float, kernel: str, verb: str, reason: str | None, action: str | None,
                 dry_run: bool) -> None:
        if verb == "warn":
            self.warnings += 1
        if self.keep_decisions:
            self.decisions.append(Decision(at, kernel, verb, reason or "", action or "", dry_run))

    def busy(self, gpu_seconds: float) -> None:
        self.busy_seconds += gpu_seconds

    def host_bytes(self, moved: int) -> None:
        self.peak_host_bytes = max(self.peak_host_bytes, moved)

    def sample(self, at: float, held: float, busy: float, queued: int, asleep: int) -> None:
        """The pool now, for the report's occupancy plot."""
        self.timeline.append((at, held, busy, queued, asleep))

    def close(self, held_seconds: float, peak_held: float) -> None:
        self.held_seconds, self.peak_held = held_seconds, peak_held

    # -- reading --------------------------------------------------------------------------------

    @property
    def all_waits(self) -> list[float]:
        """Every ask's wait, an ask that never got a slice counting as endless."""
        return self.waits + [math.inf] * self.unserved_asks

    @property
    def share_waited(self) -> float:
        """P(wait > 0): the share of asks that waited at all, an ask never served counting as one that did."""
        asks = len(self.waits) + self.unserved_asks
        return round((sum(1 for w in self.waits if w > 0) + self.unserved_asks) / asks, 6) if asks else 0.0

    def wait(self, q: float) -> float:
        return percentile(self.all_waits, q)

    def meets(self, slo_wait: float, q: float = PERCENTILE) -> bool:
        return self.wait(q) <= slo_wait

    def to_dict(self, slo_wait: float | None = None) -> dict:
        hours = (self.end - self.start) / 3600
        out = {
            "gpus": self.gpus,
            "wait_seconds": {"p50": _num(self.wait(50)), "p95": _num(self.wait(95)), "max": _num(self.wait(100)),
                             "mean": round(math.fsum(self.waits) / len(self.waits), 3) if self.waits else None,
                             "share_waited": self.share_waited,
                             "asks": len(self.waits) + self.unserved_asks, "never_served": self.unserved_asks,
                             **{f"{what}s": n for what, n in sorted(self.waits_by_ask.items())}},
            "refusals": {"total": sum(self.refusals.values()), **dict(sorted(self.refusals.items()))},
            "shut_down": self.shut_down,
            "hibernated": self.hibernated,
            "hibernated_after_cell": self.after_cell,
            "resumed": self.resumed,
            "restarts": self.restarts,
            "warnings": self.warnings,
            "snoozes": self.snoozes,
            "resume_delay_seconds": {"p50": _num(percentile(self.resume_delays, 50)),
                                     "p95": _num(percentile(self.resume_delays, 95)),
                                     "max": _num(percentile(self.resume_delays, 100)),
                                     "mean": round(math.fsum(self.resume_delays) / len(self.resume_delays), 3)
                                     if self.resume_delays else None,
                                     "share_waited": round(sum(1 for d in self.resume_delays if d > 0)
                                                           / len(self.resume_delays), 6) if self.resume_delays
                                     else 0.0,
                                     "cells": self.resumed_cells, "cells_over_goal": self.slow_cells},
            "gpu_hours": {"held": round(self.held_seconds / 3600, 3), "busy": round(self.busy_seconds / 3600, 3),
                          "held_over_busy": round(self.held_seconds / self.busy_seconds, 3)
                          if self.busy_seconds else None},
            "user_hours": round(self.user_seconds / 3600, 3),
            "resumes_per_user_hour": round(self.resumed / (self.user_seconds / 3600), 3) if self.user_seconds else 0.0,
            "started_without_slice": self.unsliced,
            "hints": {"resumed": self.hints, "unused": self.hints_unused, "skipped": self.hints_skipped},
            "occupancy": {"peak": round(self.peak_held / self.gpus, 4),
                          "mean": round(self.held_seconds / 3600 / hours / self.gpus, 4) if hours else 0.0},
            "peak_gpus_held": round(self.peak_held, 3),
            "peak_host_bytes_per_kernel": self.peak_host_bytes,
        }
        if self.hibernations_refused:
            out["hibernations_refused_busy"] = self.hibernations_refused
        if self.requested:  # (counted in hibernated or shut_down too)
            out["requested_by_users"] = self.requested
        if slo_wait is not None:
            out["meets_slo"] = self.meets(slo_wait)
        out.update(self.sharing())
        return out

    def sharing(self) -> dict:
        """Each group's waits and Jain's fairness index over their means (where asks come from more than one
        group: a user counts in their first group), and each reservation's members' waits at its windows' starts."""
        out: dict = {}
        by_group: dict[str, list[float]] = defaultdict(list)
        for _at, wait, _user, groups in self.asks:
            by_group[groups[0] if groups else ""].append(wait)
        if len(by_group) > 1:
            out["groups"] = {g: _waits(w) for g, w in sorted(by_group.items())}
            out["fairness"] = jain([out["groups"][g]["mean"] or 0.0 for g in sorted(by_group)])
        if self.classes:
            out["classes"] = {name: _waits(self.start_waits(lambda user, groups, g=group: g in groups, starts))
                              for name, (group, starts) in self.classes.items()}
        if self.reservations:
            out["reservations"] = {r.name: _waits(self.start_waits(
                r.member, [b for b, _e in r.window.occurrences(self.start, self.end)])) for r in self.reservations}
        return out

    def start_waits(self, member, starts, span: float = WINDOW_START) -> list[float]:
        """The waits of the asks of ``member(user, groups)`` made within ``span`` of one of ``starts``."""
        return [wait for at, wait, user, groups in self.asks
                if member(user, groups) and any(b <= at < b + span for b in starts)]


def jain(values: list[float]) -> float | None:
    """Jain's fairness index of ``values``: 1 when all are equal, 1/n when one holds everything (None: none;
    all zero counts as equal)."""
    if not values:
        return None
    square = sum(v * v for v in values)
    return 1.0 if square == 0 else round(sum(values) ** 2 / (len(values) * square), 4)


def _waits(waits: list[float]) -> dict:
    """Asks, mean (over those served), p95 (null: never) and the share never served."""
    served = [w for w in waits if not math.isinf(w)]
    return {"asks": len(waits), "mean": round(math.fsum(served) / len(served), 3) if served else None,
            "p95": _num(percentile(waits, PERCENTILE)) if waits else None,
            "never_served": len(waits) - len(served)}


def _num(value: float) -> float | None:
    """JSON has no infinity: a wait that never ended is null."""
    return None if math.isinf(value) else round(value, 3)
