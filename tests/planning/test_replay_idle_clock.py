"""A resume its user asked for restarts the kernel's idle clock in the replay, as on the live server (the
residency model's restart_idle_clock: the culler's ``resumed``, ``pool.culling.kernel_facts(resumed=…)``);
a kernel a hint woke is not judged until a cell uses it, and goes back to sleep unwarned if none comes."""

from __future__ import annotations

import dataclasses

import pytest
from planning_helpers import T0, GiB, configuration, session, workload

from jupyter_gpu_pool.planning.configuration import Hint
from jupyter_gpu_pool.planning.costs import Cost, Costs
from jupyter_gpu_pool.planning.simulator import replay
from jupyter_gpu_pool.planning.workload import BUSY, END, IDLE

RESTORE = Costs(hibernate=Cost(1.0, 0.0), resume=Cost(2.0, 0.0))  # 1 s to hibernate, 2 s to restore
SLEEPY = [{"name": "sleep", "idle_timeout": "1m", "gpu_idle_timeout": None, "warn": "10s", "action": "hibernate",
           "slice_at": "start", "max_hibernated": None}]


def decisions(tally, after: float = 0.0) -> list[tuple[float, str, str]]:
    return [(round(d.at - T0, 1), d.verb, d.reason) for d in tally.decisions if d.at >= after]


@pytest.mark.parametrize("lead, hold, woken, slept", [
    (300.0, 120.0, 700.0, 820.0),  # its idle rule would have warned at 760 s
    (400.0, 300.0, 600.0, 900.0),  # a rule (a minute) shorter than the hold (five): not judged idle meanwhile
])
def test_a_hints_wake_is_left_alone_and_sleeps_again_unwarned_when_no_cell_uses_it(lead, hold, woken, slept):
    """The kernel a hint woke (its notebook opened ``lead`` seconds before its next cell at 1000 s) is not
    judged idle while nobody asked for it yet, and goes back to sleep at the hold's end, as the live server's
    ``hint_unused``, with no warning."""
    config = dataclasses.replace(configuration(policy=SLEEPY, gpus=1), hint=Hint(lead=lead, hold=hold))
    a = session("a", T0, [(10, BUSY, None), (15, IDLE, None), (1000, BUSY, None), (1005, IDLE, None),
                          (2000, END, None)], memory=4 * GiB)
    tally = replay(workload([a]), config, config.pool_of(1), costs=RESTORE, keep_decisions=True)
    assert tally.hints == 1 and tally.hints_unused == 1
    assert [d for d in decisions(tally, T0 + woken) if d[0] < 1000] == [(slept, "act", "hint_unused")]


@pytest.mark.parametrize("waited", [0.0, 103.0])
def test_a_resume_its_user_asked_for_restarts_the_idle_clock(waited):
    """A cell resumes the kernel (after ``waited`` seconds in the queue behind another's whole GPU): it is
    judged idle from its restore on, never warned at once for the idle time before it slept."""
    config = configuration(policy=[*SLEEPY[:1], {"name": "other", "match": {"user": ["b"]}, "idle_timeout": None,
                                                 "gpu_idle_timeout": None, "max_hibernated": None}],
                           profiles={"gpu": {"slice": "whole"}}, gpus=1, start_queue_timeout=10**6)
    config = dataclasses.replace(config, policy=dataclasses.replace(config.policy, rules=config.policy.rules[::-1]))
    a = session("a", T0, [(10, BUSY, None), (15, IDLE, None), (1000, BUSY, None), (1001, IDLE, None),
                          (1500, END, None)], profile="gpu", memory=4 * GiB)
    sessions = [a]
    if waited:  # b takes the GPU while a sleeps and gives it back 103 s after a's cell
        sessions.append(session("b", T0 + 500, [(0, BUSY, None), (500 + waited, END, None)], profile="gpu"))
    tally = replay(workload(sessions), config, config.pool_of(1), costs=RESTORE, keep_decisions=True)
    back = T0 + 1000 + waited + 2.0  # restored
    assert tally.resumed == 1 and tally.resume_delays == [pytest.approx(waited + 2.0)]
    [(warned, verb, _reason), *_] = [d for d in decisions(tally, back - 1) if d[2] == "idle"]
    # the cell it waited for ran then (1 s): warned a minute less the warning after that (at the next pass)
    assert verb == "warn" and back - T0 + 1 + 50 <= warned < back - T0 + 1 + 50 + 30
