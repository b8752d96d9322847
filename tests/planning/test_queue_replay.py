"""A replay with a long queue: the waits are the FIFO queue's, the quick "no room" answers change
nothing, and the work grows with the events, not with the queue's length times the events."""

from __future__ import annotations

import heapq
import random

import pytest
from planning_helpers import NEVER_CULL, T0, configuration, session, workload

from jupyter_gpu_pool.planning.simulator import Replay
from jupyter_gpu_pool.planning.synthetic import Lab
from jupyter_gpu_pool.planning.virtual_pool import VirtualPool
from jupyter_gpu_pool.planning.workload import END

WHOLE = {"gpu": {"slice": "whole"}}


def mmc(n: int, servers: int, load: float, mean: float = 600.0, seed: int = 1) -> list[tuple[float, float]]:
    """(arrival, length) of ``n`` sessions of an M/M/c queue at ``load``."""
    rng, t, out = random.Random(seed), T0, []
    for _ in range(n):
        t += rng.expovariate(load * servers / mean)
        out.append((t, rng.expovariate(1 / mean)))
    return out


def fifo_waits(sessions: list[tuple[float, float]], servers: int, horizon: float) -> tuple[list[float], int]:
    """Each session's wait on ``servers`` servers, first come first served, worked out on its own; the
    ones that would start after ``horizon`` never got a server."""
    free, waits, never = [T0] * servers, [], 0
    for arrival, length in sessions:
        start = max(arrival, heapq.heappop(free))
        heapq.heappush(free, start + length)
        if start > horizon:
            never += 1
        else:
            waits.append(start - arrival)
    return waits, never


def mmc_workload(sessions, horizon):
    w = workload([session(f"k{i}", at, [(length, END, None)], profile="gpu", user=f"u{i % 7}")
                  for i, (at, length) in enumerate(sessions)])
    w.end = horizon
    return w


@pytest.mark.parametrize("load", [0.9, 1.3])
def test_every_wait_in_a_long_queue_is_the_fifo_queues(load):
    sessions = mmc(3000, servers=3, load=load)
    horizon = sessions[-1][0] + 3600
    config = configuration(profiles=WHOLE, policy=NEVER_CULL, gpus=3, start_queue_timeout=10**8)
    tally = Replay(mmc_workload(sessions, horizon), config, config.pool_of(3)).run()
    waits, never = fifo_waits(sessions, 3, horizon)
    assert tally.unserved_asks == never
    assert sorted(tally.waits) == pytest.approx(sorted(waits), abs=1e-6)
    if load > 1:
        assert never > 100 and max(point[3] for point in tally.timeline) > 300  # a queue of hundreds


def test_the_asks_grow_with_the_sessions_not_with_the_queue_times_the_sessions(monkeypatch):
    asks = []
    real = VirtualPool.ask
    monkeypatch.setattr(VirtualPool, "ask", lambda self, *a, **kw: asks.append(1) or real(self, *a, **kw))
    sessions = mmc(3000, servers=3, load=1.3)
    config = configuration(profiles=WHOLE, policy=NEVER_CULL, gpus=3, start_queue_timeout=10**8)
    Replay(mmc_workload(sessions, sessions[-1][0] + 3600), config, config.pool_of(3)).run()
    assert len(asks) <= 2 * len(sessions)  # each waiter asked again on every slice given back: ~800,000


SIZES = {"small": {"slice": "10GiB"}, "big": {"slice": "30GiB"}, "whole": {"slice": "whole"}}
ODD = range(1, 40, 2)


@pytest.mark.parametrize("settings, other", [
    # slices of three sizes, half the students under a quota, hibernation and resumes in the queue
    (dict(profiles=SIZES, user_quotas={f"student{i:03d}": {"memory": "20GiB"} for i in ODD}, gpus=2,
          start_queue_timeout=600,
          policy=[{"idle_timeout": "5m", "gpu_idle_timeout": None, "warn": "1m", "action": "hibernate",
                  "slice_at": "start"}]),
     "quota_exceeded"),
    # half the students on a budget, culling
    (dict(profiles=SIZES, budgets={f"student{i:03d}": {"gpu_hours": 0.1, "period": "day"} for i in ODD}, gpus=1,
          start_queue_timeout=900,
          policy=[{"idle_timeout": "10m", "gpu_idle_timeout": None, "warn": "1m", "action": "shutdown",
                  "slice_at": "start"}]),
     "budget_exceeded"),
])
def test_passing_over_waiters_that_fit_nowhere_changes_nothing(monkeypatch, settings, other):
    """The replay answers "no room" itself for a start that fits nowhere and only room can refuse; asking
    the pool's allocation for every waiter, as before, gives the same replay."""
    config = configuration(**settings)
    sizes = ("small", "big", "whole")
    lab = Lab(students=40, hours=2, seed=3).workload()
    for i, s in enumerate(lab.sessions):
        s.profile = sizes[i % 3]
    quick = Replay(lab, config, config.pool_of(len(config.gpus)), keep_decisions=True).run()
    refusals = quick.to_dict()["refusals"]
    assert refusals["pool_exhausted"] > 0 and refusals[other] > 0 and max(quick.waits) > 0
    monkeypatch.setattr(VirtualPool, "only_room_refuses", lambda self, owner, groups: False)
    asked = Replay(lab, config, config.pool_of(len(config.gpus)), keep_decisions=True).run()
    assert quick.decisions == asked.decisions
    assert quick.to_dict() == asked.to_dict()
    assert quick.refused_asks == asked.refused_asks


def test_the_json_gives_the_mean_wait_and_the_share_that_waited_as_an_independent_count_does(tmp_path, pool_home):
    """A small M/M/2 trace through the command: the mean over the asks served and P(wait > 0) (an ask
    still waiting at the trace's ``until`` counts as never served, so as one that waited)."""
    import io
    import json

    from planning_helpers import simulate_json

    from jupyter_gpu_pool.planning.tracefile import write
    from jupyter_gpu_pool.pool.trace import TraceEvent

    sessions = mmc(60, servers=2, load=1.1, seed=4)
    horizon = sessions[-1][0] + 300
    events = sorted([TraceEvent(at, "start", f"k{i}", "u", {"p": "gpu"}) for i, (at, _) in enumerate(sessions)]
                    + [TraceEvent(at + length, "end", f"k{i}", "u", {})
                       for i, (at, length) in enumerate(sessions) if at + length <= horizon],
                    key=lambda e: e.at)
    out = io.StringIO()
    write(out, events, since=T0, until=horizon, exported=horizon, users="all")
    trace, config = tmp_path / "mm2.jsonl", tmp_path / "whole.json"
    trace.write_text(out.getvalue())
    config.write_text(json.dumps({"GPUPool": {"profiles": WHOLE, "default_profile": "gpu", "policy": NEVER_CULL}}))
    row = simulate_json("--trace", str(trace), "--config", str(config), "--gpus", "2",
                        "--queue-timeout", "1000d")["configurations"][0]["results"][0]["wait_seconds"]

    # Rounded to the trace's milliseconds, as the file carries them: the same sessions the command read.
    rounded = [(round(at, 3), round(at + length, 3) - round(at, 3)) for at, length in sessions]
    waits, never = fifo_waits(rounded, 2, horizon)
    assert never > 0 and 0 < sum(w > 0 for w in waits) < len(waits)  # some waited, some did not, some never got one
    assert row["asks"] == len(sessions) and row["never_served"] == never
    assert row["mean"] == pytest.approx(sum(waits) / len(waits), abs=1e-3)
    assert row["share_waited"] == pytest.approx((sum(w > 0 for w in waits) + never) / len(sessions), abs=1e-6)
