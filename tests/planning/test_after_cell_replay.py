"""A rule's hibernate_after_cell in the replay: a kernel hibernates that long after each cell ends when no
cell started since, without a warning; the checkpoint holds its slice, its next cell (or the hint) resumes
it; and `simulate --policies ...+after-cell --after-cell T`, its rows and its errors."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from planning_helpers import T0, GiB, configuration, jupyter, session, simulate_json, workload

from jupyter_gpu_pool.planning.comparison import variant
from jupyter_gpu_pool.planning.configuration import Hint, PlanError
from jupyter_gpu_pool.planning.costs import Cost, Costs
from jupyter_gpu_pool.planning.simulator import replay
from jupyter_gpu_pool.planning.workload import ACTIVE, BUSY, END, IDLE

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "jupyter_gpu_pool/planning/examples/lab-slices-sleep.json"
SLICE = 0.125  # a 10 GiB slice of an 80 GiB GPU
RESTORE = Costs(hibernate=Cost(1.0, 0.0), resume=Cost(2.0, 0.0))  # 1 s to hibernate, 2 s to restore


def after_cell(seconds: float | None, *, slice_at: str = "first-cell", dry_run: bool = False, **extra):
    """No idle rule: only hibernate_after_cell hibernates."""
    rule = {"name": "cells", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
            "action": "hibernate", "slice_at": slice_at, "hibernate_after_cell": seconds, **extra}
    return configuration(policy=[rule], policy_dry_run=dry_run, gpus=1)


def two_cells(second_at: float = 100.0, *, run: float = 5.0):
    """A cell at 10 s (5 s), another at ``second_at`` (``run`` s), the kernel shut down at 200 s."""
    return session("a", T0, [(10, BUSY, None), (15, IDLE, None), (second_at, BUSY, None),
                             (second_at + run, IDLE, None), (200, END, None)], memory=4 * GiB)


def test_a_kernel_holds_its_slice_only_while_its_cells_run_and_the_after_cell_time():
    config = after_cell(20.0)
    tally = replay(workload([two_cells()]), config, config.pool_of(1), costs=RESTORE, keep_decisions=True)
    # first cell at 10 takes the slice; idle at 15, hibernated at 35, checkpoint done at 36;
    # the cell at 100 resumes it (restore 2 s), runs 102..107; hibernated at 127, done at 128
    assert tally.held_seconds == pytest.approx(((36 - 10) + (128 - 100)) * SLICE)
    assert tally.busy_seconds == pytest.approx(10 * SLICE)
    assert (tally.hibernated, tally.after_cell, tally.resumed) == (2, 2, 1)
    assert tally.resume_delays == [pytest.approx(2.0)] and tally.slow_cells == 1  # 2 s on a 5 s cell: over 1.1x
    assert tally.warnings == 0  # no warning: the kernel loses nothing
    assert [(round(d.at - T0, 3), d.verb, d.reason, d.action) for d in tally.decisions] == [
        (35.0, "act", "after_cell", "hibernate"), (127.0, "act", "after_cell", "hibernate")]
    off = after_cell(None)
    plain = replay(workload([two_cells()]), off, off.pool_of(1), costs=RESTORE)
    assert plain.held_seconds == pytest.approx((200 - 10) * SLICE) and plain.hibernated == 0


def test_a_cell_within_the_after_cell_time_keeps_the_kernel_awake():
    config = after_cell(20.0)
    tally = replay(workload([two_cells(second_at=30.0)]), config, config.pool_of(1), costs=RESTORE)
    # idle at 15, a cell at 30 (before 35), idle at 35: hibernated at 55 only
    assert (tally.hibernated, tally.resumed) == (1, 0)
    assert tally.held_seconds == pytest.approx((56 - 10) * SLICE)


def test_a_kernel_running_a_long_cell_is_never_hibernated_under_it():
    config = after_cell(20.0)
    tally = replay(workload([two_cells(second_at=30.0, run=120.0)]), config, config.pool_of(1), costs=RESTORE)
    assert tally.hibernations_refused == 0 and tally.hibernated == 1  # only 20 s after the long cell ended
    assert tally.held_seconds == pytest.approx((150 + 20 + 1 - 10) * SLICE)
    assert tally.busy_seconds == pytest.approx(125 * SLICE)


def test_other_use_counts_as_a_cell():
    """A quick cell or a completion (``active``) restarts the after-cell time and wakes a hibernated kernel."""
    config = after_cell(20.0)
    s = session("a", T0, [(10, BUSY, None), (15, IDLE, None), (30, ACTIVE, None), (100, ACTIVE, None),
                          (200, END, None)], memory=4 * GiB)
    tally = replay(workload([s]), config, config.pool_of(1), costs=RESTORE)
    # hibernated 50 s (20 s after the use at 30), resumed by the use at 100 (there at 102), hibernated at 122
    assert (tally.hibernated, tally.resumed) == (2, 1)
    assert tally.held_seconds == pytest.approx(((51 - 10) + (123 - 100)) * SLICE)


def test_a_cell_that_comes_during_the_checkpoint_waits_for_it_and_then_the_restore():
    config = after_cell(1.0)
    slow = Costs(hibernate=Cost(5.0, 0.0), resume=Cost(2.0, 0.0))
    tally = replay(workload([two_cells(second_at=18.0)]), config, config.pool_of(1), costs=slow)
    # idle at 15, hibernating 16..21; the cell at 18 waits 3 s for the checkpoint and 2 s for the restore
    assert tally.resume_delays == [pytest.approx(5.0)]
    assert tally.busy_seconds == pytest.approx(10 * SLICE)


@pytest.mark.parametrize("lead, felt", [(None, 2.0), (1.0, 1.0), (3.0, 0.0)])
def test_the_hint_resumes_a_kernel_after_cell_hibernated_ahead_of_its_cell(lead, felt):
    config = dataclasses.replace(after_cell(20.0), hint=Hint(lead=lead, hold=60.0) if lead is not None else None)
    tally = replay(workload([two_cells()]), config, config.pool_of(1), costs=RESTORE)
    assert tally.resume_delays == [pytest.approx(felt)] and tally.hints == (1 if lead else 0)
    # the hinted resume holds its slice from the hint: lead seconds earlier, and the cell runs at once
    start = 100 - (lead or 0)
    ended = 100 + felt + 5
    assert tally.held_seconds == pytest.approx(((36 - 10) + (ended + 21 - start)) * SLICE)


def test_a_dry_run_policy_records_the_after_cell_hibernation_and_holds_on():
    config = after_cell(20.0, dry_run=True)
    tally = replay(workload([two_cells()]), config, config.pool_of(1), costs=RESTORE, keep_decisions=True)
    assert tally.hibernated == 0 and tally.after_cell == 0
    assert [(d.reason, d.dry_run) for d in tally.decisions] == [("after_cell", True), ("after_cell", True)]
    assert tally.held_seconds == pytest.approx((200 - 10) * SLICE)


def test_a_variant_sets_the_after_cell_time_on_each_hibernating_rule():
    config = configuration(policy=[
        {"name": "tas", "match": {"user": ["ta"]}, "idle_timeout": "1h", "action": "shutdown"},
        {"name": "lab", "idle_timeout": "1m", "warn": "10s", "action": "hibernate", "hibernate_after_cell": "2m"}])
    sleepy = variant(config, "first-cell+after-cell", Hint(), 10.0)
    assert [r.hibernate_after_cell for r in sleepy.policy.rules] == [None, 10.0, 10.0]  # the rules, the default
    assert [r.hibernate_after_cell for r in variant(config, "first-cell", Hint()).policy.rules] == [None] * 3
    assert variant(config, "configured", Hint()).policy is config.policy  # each rule's own (the lab's 2 minutes)
    assert variant(config, "configured+after-cell", Hint(), 5.0).policy.rules[1].hibernate_after_cell == 5.0
    assert sleepy.hint is None and variant(config, "start+after-cell+hint", Hint(), 10.0).hint == Hint()
    only_shutdown = configuration(policy=[{"name": "x", "idle_timeout": "1h", "action": "shutdown"}])
    with pytest.raises(PlanError, match="no rule of configuration 'test' hibernates"):
        variant(only_shutdown, "configured+after-cell", Hint(), 10.0)


LAB = ("--synthetic", "lab", "--students", "12", "--hours", "1", "--gpus", "1-3", "--config", str(EXAMPLE))


def test_simulate_compares_after_cell_on_the_same_lab():
    result = simulate_json(*LAB, "--policies", "first-cell+hint,first-cell+hint+after-cell", "--after-cell", "10s")
    hinted, after = result["policies"]
    assert after["policy"] == "first-cell+hint+after-cell" and after["after_cell_seconds"] == [10.0]
    assert hinted["after_cell_seconds"] == [] and hinted["hibernated_after_cell"] == 0
    assert after["hibernated_after_cell"] > 0 and after["resumes"] > hinted["resumes"]
    config = next(c for c in result["configurations"] if c["name"] == after["policy"])
    assert all(p["hibernate_after_cell"] == 10.0 for p in config["policy"])
    # the same cells run; what is held over them shrinks toward them
    assert after["gpu_hours_busy"] == pytest.approx(hinted["gpu_hours_busy"], rel=0.02)
    assert after["gpu_hours_busy"] <= after["gpu_hours_held"] < hinted["gpu_hours_held"]
    assert after["held_over_busy"] < hinted["held_over_busy"]


@pytest.mark.parametrize("args, says", [
    (("--policies", "first-cell+after-cell+after-cell"), "is not a policy to compare"),
    (("--policies", "first-cell+after"), "'first-cell+after' is not a policy to compare"),
    (("--policies", "first-cell+after-cell", "--after-cell", "soon"), "--after-cell 'soon'"),
    (("--policies", "first-cell+after-cell", "--after-cell", "0"), "--after-cell '0'"),  # as the rule: above 0
])
def test_bad_after_cell_options_get_a_clear_error(args, says):
    done = jupyter("simulate", *LAB, *args, "--json", "--no-progress")
    assert done.returncode != 0 and says in done.stderr and not done.stdout
    assert "Traceback" not in done.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.stdout)
