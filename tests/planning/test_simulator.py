"""The replay: sanity (exclusive GPUs need one per concurrent student; a policy that never culls never
frees a slice), the queue's rules, quotas, budgets, hibernation and resume costs, restarts, the same
allocation decisions as the SQLite ledger, and skipping quiet passes changing nothing."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from planning_helpers import NEVER_CULL, T0, GiB, configuration, session, workload

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.planning.costs import HIBERNATE, MEASURED_HIBERNATE, MEASURED_RESUME, RESUME, Cost, Costs
from jupyter_gpu_pool.planning.simulator import Replay, replay
from jupyter_gpu_pool.planning.synthetic import Hub, Lab
from jupyter_gpu_pool.planning.virtual_pool import VirtualPool
from jupyter_gpu_pool.planning.workload import BUSY, END, IDLE
from jupyter_gpu_pool.pool import LeaseRequest, PoolError
from jupyter_gpu_pool.pool.allocation import Ask

WHOLE = {"gpu": {"slice": "whole"}}
HIBERNATE_IDLE = [{"name": "idle", "idle_timeout": 60, "gpu_idle_timeout": None, "warn": 30, "action": "hibernate",
                   "slice_at": "start"}]
SHUTDOWN_IDLE = [{"name": "idle", "idle_timeout": 60, "gpu_idle_timeout": None, "warn": 30, "action": "shutdown",
                  "slice_at": "start"}]


def concurrency(w) -> int:
    """The most sessions alive at once (arrival to the user's end)."""
    edges = []
    for s in w.sessions:
        end = next(t for t, code, _ in s.activity() if code == END)
        edges += [(s.arrival, 1), (end, -1)]
    alive = peak = 0
    for _, step in sorted(edges):
        alive += step
        peak = max(peak, alive)
    return peak


def test_with_exclusive_whole_gpus_zero_wait_needs_a_gpu_per_concurrent_student():
    config = configuration(profiles=WHOLE, policy=NEVER_CULL)
    lab = Lab(students=12, hours=1, forget=0.0, seed=3).workload()
    peak = concurrency(lab)
    assert 8 <= peak <= 12
    enough = replay(lab, config, config.pool_of(peak))
    assert enough.wait(100) == 0.0 and enough.unserved_asks == 0 and enough.refusals.total() == 0
    short = replay(lab, config, config.pool_of(peak - 1))
    assert short.wait(100) > 0 and short.refusals["pool_exhausted"] > 0
    assert short.shut_down == short.hibernated == 0


def test_a_policy_that_never_culls_never_frees_a_slice():
    config = configuration(policy=NEVER_CULL, gpus=1)  # 8 slices of 10 GiB on one 80 GiB GPU
    lab = Lab(students=12, hours=2, profile="slice", forget=1.0, seed=1).workload()  # nobody shuts down
    tally = replay(lab, config, config.pool_of(1), keep_decisions=True)
    assert tally.shut_down == tally.hibernated == tally.warnings == 0 and tally.decisions == []
    assert len(tally.waits) == 8 and tally.unserved_asks == 4  # the first eight hold theirs to the end
    held = [h for _, h, *_ in tally.timeline]
    assert held == sorted(held) and held[-1] == 1.0  # occupancy only ever grows
    assert tally.held_seconds == pytest.approx(sum(0.125 * (lab.end - s.arrival)
                                                   for s in sorted(lab.sessions, key=lambda s: s.arrival)[:8]))


def test_starts_wait_in_the_queue_in_the_order_they_came():
    config = configuration(profiles=WHOLE, policy=NEVER_CULL, gpus=1, start_queue_timeout=3600)
    w = workload([session("a", T0, [(100, END, None)], profile="gpu"),
                  session("b", T0 + 10, [(300, END, None)], profile="gpu"),
                  session("c", T0 + 20, [(30, END, None)], profile="gpu")])
    tally = replay(w, config, config.pool_of(1))
    assert tally.waits == [0.0, 90.0, 380.0]  # b when a ends, c when b ends (its end moved by its wait)
    assert tally.refusals.total() == 0 and tally.unserved_asks == 0


def test_a_start_refused_at_once_when_the_queue_is_off_and_a_recorded_user_goes_without():
    config = configuration(profiles=WHOLE, policy=NEVER_CULL, gpus=1)  # start_queue_timeout 0
    w = workload([session("a", T0, [(100, END, None)], profile="gpu"), session("b", T0 + 10, profile="gpu")])
    tally = replay(w, config, config.pool_of(1), keep_decisions=True)
    assert tally.refused_asks == [(T0 + 10, "b", "pool_exhausted", "start")] and tally.unserved_asks == 1
    assert math.isinf(tally.wait(100))


def test_a_quota_refuses_as_the_ledger_does():
    config = configuration(policy=NEVER_CULL, default_user_quota={"kernels": 1})
    w = workload([session("a1", T0, user="alice"), session("a2", T0 + 5, user="alice"), session("b1", T0 + 6)])
    tally = replay(w, config, config.pool_of(1), keep_decisions=True)
    assert tally.refused_asks == [(T0 + 5, "a2", "quota_exceeded", "start")]


def test_a_hibernation_holds_the_slice_for_the_checkpoint_then_gives_it_back():
    config = configuration(profiles=WHOLE, policy=HIBERNATE_IDLE, gpus=1, start_queue_timeout=3600)
    w = workload([session("a", T0, profile="gpu", memory=4 * GiB),
                  session("b", T0 + 10, [(30, BUSY, None), (40, IDLE, None)], profile="gpu")], interval=30)
    tally = replay(w, config, config.pool_of(1), keep_decisions=True)
    assert [(d.at - T0, d.kernel, d.verb, d.action) for d in tally.decisions][:2] == [
        (30, "a", "warn", "hibernate"), (60, "a", "act", "hibernate")]
    assert tally.shut_down == 0  # (b hibernates too, once idle)
    assert tally.waits[1] == pytest.approx(60 + HIBERNATE.seconds(4 * GiB) - 10)  # b: once a's 4 GiB are moved


@pytest.mark.parametrize("every_pass", [False, True])
def test_a_warned_kernel_is_acted_on_at_its_deadline_not_at_the_next_pass(every_pass):
    """As the live culler's timer: warned at the pass of 45 s (idle 60 s, warned 30 s ahead), so its deadline
    is 75 s; the slice comes back then, not at the pass of 90 s, and the waiting start takes it then."""
    config = configuration(profiles=WHOLE, policy=SHUTDOWN_IDLE, gpus=1, start_queue_timeout=3600)
    w = workload([session("a", T0, profile="gpu"), session("b", T0 + 10, profile="gpu")], interval=45)
    tally = Replay(w, config, config.pool_of(1), keep_decisions=True, every_pass=every_pass).run()
    assert [(d.at - T0, d.kernel, d.verb) for d in tally.decisions][:2] == [(45, "a", "warn"), (75, "a", "act")]
    assert tally.waits[1] == pytest.approx(75 - 10)  # b started at a's deadline


def test_a_cell_on_a_hibernated_kernel_resumes_it_after_its_restore():
    config = configuration(profiles=WHOLE, policy=HIBERNATE_IDLE, gpus=1)
    w = workload([session("a", T0, [(200, BUSY, None), (210, IDLE, None)], profile="gpu", memory=4 * GiB)],
                 interval=30)
    tally = replay(w, config, config.pool_of(1), costs=Costs())
    assert tally.hibernated == 2 and tally.resumed == 1  # idle again after its cell: hibernated again
    assert tally.resume_delays == [pytest.approx(RESUME.seconds(4 * GiB))]
    assert tally.busy_seconds == pytest.approx(10.0)  # the cell ran its 10 s once the memory was back


def test_a_kernel_shut_down_is_restarted_when_its_user_comes_back_and_its_state_is_lost():
    config = configuration(profiles=WHOLE, policy=SHUTDOWN_IDLE, gpus=1)
    w = workload([session("a", T0, [(200, BUSY, None), (210, IDLE, None), (250, END, None)], profile="gpu")],
                 interval=30)
    tally = replay(w, config, config.pool_of(1))
    assert tally.shut_down == 1 and tally.restarts == 1 and tally.hibernated == 0
    assert tally.waits_by_ask == {"start": 1, "restart": 1}


def test_an_mps_slice_cannot_hibernate_and_is_shut_down_instead():
    config = configuration(profiles={"mps": {"slice": "20GiB,50%", "isolation": "mps"}}, policy=HIBERNATE_IDLE)
    tally = replay(workload([session("a", T0, profile="mps")], interval=30), config, config.pool_of(1),
                   keep_decisions=True)
    assert [(d.verb, d.action) for d in tally.decisions] == [("warn", "shutdown"), ("act", "shutdown")]
    assert tally.shut_down == 1


def test_a_spent_budget_is_acted_on_and_refuses_the_next_start():
    config = configuration(profiles=WHOLE, policy=NEVER_CULL, gpus=2,
                           budgets={"students": {"gpu_hours": 0.05, "period": "week"}})  # 180 s of a whole GPU
    w = workload([session("a", T0, profile="gpu", user="alice", memory=GiB),
                  session("a2", T0 + 600, profile="gpu", user="alice")], interval=30)
    tally = replay(w, config, config.pool_of(2), keep_decisions=True)
    budget = [(d.at - T0, d.verb) for d in tally.decisions if d.reason == "budget"]
    assert budget[0] == (180, "warn") and budget[1][1] == "act"  # warned at 90% on a pass, acted on at 100%
    assert tally.hibernated == 1
    assert tally.refused_asks == [(T0 + 600, "a2", "budget_exceeded", "start")]


def test_the_virtual_pool_grants_and_refuses_as_the_sqlite_ledger_does(tmp_path):
    """Both stores call the same allocation decision: the same asks get the same GPUs and refusals."""
    config = configuration(profiles={"small": {"slice": "10GiB"}, "half": {"slice": "20GiB,50%", "isolation": "mps"},
                                     "whole": {"slice": "whole"}}, memory="40GiB", placement="binpack",
                           default_user_quota={"memory": "60GiB"})
    gpus = config.pool_of(2)
    virtual = VirtualPool(config, gpus)
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=lambda: T0)
    ledger.sync_gpus(gpus)
    asks = [("alice", "small"), ("bob", "whole"), ("alice", "half"), ("carol", "small"), ("bob", "half"),
            ("alice", "small"), ("dave", "whole"), ("alice", "whole"), ("carol", "half"), ("erin", "small")]
    held = {}
    for i, (user, profile) in enumerate(asks):
        ask = Ask(owner=user, kernel_id=f"k{i}", profile=config.profiles[profile])
        grant = virtual.ask(ask, T0)
        try:
            lease = ledger.allocate(LeaseRequest(owner=user, kernel_id=f"k{i}", profile=config.profiles[profile]),
                                    config.quotas, placement=config.placement)
        except PoolError as refusal:
            assert isinstance(grant, PoolError) and grant.reason == refusal.reason, (i, grant, refusal)
            continue
        assert not isinstance(grant, PoolError), (i, grant)
        assert tuple(g.uuid for g in grant.gpus) == lease.gpus, i
        held[f"k{i}"] = (virtual.take(ask, grant, T0), lease)
        if i == 4:  # give some back, in both
            for kid in ("k1", "k2"):
                mine, theirs = held.pop(kid)
                virtual.release(mine, T0)
                ledger.release(theirs.id)
    assert ledger.overcommitted() == []


@pytest.mark.parametrize("make, config", [
    (lambda: Lab(students=30, hours=2, profile="slice", seed=5).workload(),
     dict(policy=[{"idle_timeout": "5m", "gpu_idle_timeout": "4m", "warn": "1m", "action": "hibernate",
                   "max_hibernated": "20m", "pressure_factor": 0.5, "snooze": "10m"}], gpus=2)),
    (lambda: Hub(users=40, days=2, profile="slice", seed=2).workload(),
     dict(policy=[{"idle_timeout": "30m", "gpu_idle_timeout": "20m", "warn": "5m", "action": "shutdown"}], gpus=1,
          start_queue_timeout=120)),
])
def test_skipping_the_passes_that_cannot_change_a_kernel_changes_nothing(make, config):
    """The replay skips a kernel's passes until policy.quiet_until (and re-judges a kernel as it comes into or
    out of the reclaim's choice for the queue's waiters); judging every pass gives the same."""
    w, c = make(), configuration(**config)
    fast = Replay(w, c, c.pool_of(len(c.gpus)), keep_decisions=True).run()
    slow = Replay(w, c, c.pool_of(len(c.gpus)), keep_decisions=True, every_pass=True).run()
    assert fast.decisions and fast.decisions == slow.decisions
    assert any(d.reason == "pressure" for d in fast.decisions)  # kernels chosen for waiters, and released
    assert fast.to_dict() == slow.to_dict()


def test_a_seed_makes_the_same_synthetic_lab_and_another_seed_another():
    config = configuration(policy=HIBERNATE_IDLE)
    one, again, other = (replay(Lab(students=20, seed=s).workload(), config, config.pool_of(2)).to_dict()
                         for s in (7, 7, 8))
    assert one == again and one != other


@pytest.mark.parametrize("cost, measured", [(HIBERNATE, MEASURED_HIBERNATE), (RESUME, MEASURED_RESUME)])
def test_the_default_costs_are_the_least_squares_lines_through_the_measurements(cost, measured):
    """No other line (a thousandth of a second either way, in either figure) fits the measurements better."""
    def misfit(c: Cost) -> float:
        return sum((c.seconds(gib * GiB) - seconds) ** 2 for gib, seconds in measured)

    for fixed in (-0.001, 0, 0.001):
        for per_gib in (-0.001, 0, 0.001):
            assert misfit(cost) <= misfit(Cost(cost.fixed + fixed, cost.per_gib + per_gib)), (fixed, per_gib)


def test_the_default_costs_follow_the_measured_hibernation_path_of_the_benchmarks_table():
    """The points the defaults are fitted to are the H100 table of docs/benchmarks.md ("Hibernation against
    restarting and rebuilding": the product's own path, scripts/gpu-check), every measured row of it: a new
    measurement moves the planner."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    section = text.split("\n## Hibernation against restarting and rebuilding\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (\d+) GiB \| ([\d.]+) s \| ([\d.]+) s \|", section, re.M)
    assert len(rows) >= 3
    assert MEASURED_HIBERNATE == tuple((int(gib), float(h)) for gib, h, _ in rows)
    assert MEASURED_RESUME == tuple((int(gib), float(r)) for gib, _, r in rows)
