"""The planner replays reservations and fair share from the configuration, through the same core the
live pool decides with: non-members' kernels in the reserved room are warned and hibernated before the
window (reason ``reserved``), members start at once at the window, a non-member borrowing during it is
taken back when a member asks, a fair queue serves the group under its share first, and the report gives
each group's waits, Jain's index and the class's waits at its start."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from planning_helpers import GiB, configuration, session, simulate_json, workload

from jupyter_gpu_pool.planning.metrics import jain
from jupyter_gpu_pool.planning.simulator import replay
from jupyter_gpu_pool.planning.synthetic import EPOCH, Week
from jupyter_gpu_pool.planning.workload import BUSY, END, GPU, IDLE, Workload

EXAMPLES = Path(__file__).resolve().parents[2] / "jupyter_gpu_pool" / "planning" / "examples"
RULE = [{"name": "idle", "idle_timeout": "1h", "gpu_idle_timeout": None, "warn": "2m", "action": "hibernate",
         "slice_at": "start"}]
START = EPOCH + 86400 + 9 * 3600  # Tuesday 2 January 2024, 09:00 UTC
LAB = {"name": "lab", "groups": ["class"], "days": ["tue"], "start": "10:00", "end": "11:00", "timezone": "UTC",
       "memory": "80GiB"}


def cells(every: float, until: float, gib: int = 8):
    """A cell of 5 s every ``every`` seconds (a kernel in use: never idle for its rule)."""
    t = 30.0
    while t < until:
        yield (t, BUSY, None)
        yield (t, GPU, (gib * GiB, 50.0))
        yield (t + 5, IDLE, None)
        t += every


def class_and_research(reservation: bool) -> tuple:
    config = configuration(gpus=2, policy=RULE, reservations=[LAB] if reservation else [], start_queue_timeout="2h",
                           profiles={"slice": {"slice": "10GiB"}, "big": {"slice": "40GiB"}})
    # two researchers hold 40 GiB each of one GPU from 09:00, working all morning; the other GPU is free
    sessions = [session(f"r{i}", START + i, list(cells(300, 3 * 3600)), user=f"r{i}", groups=("research",),
                        profile="big") for i in range(2)]
    # a third researcher comes at 09:55 and would take the free GPU's room
    sessions.append(session("late", START + 55 * 60, list(cells(300, 2 * 3600)), user="late",
                            groups=("research",), profile="big"))
    # eight students at 10:00 want 10 GiB each
    sessions += [session(f"s{i}", START + 3600 + i, [*cells(120, 3000, gib=4), (3000, END, None)], user=f"s{i}",
                         groups=("class",)) for i in range(8)]
    return config, Workload(sessions, START, START + 3 * 3600, interval=30.0)


def test_a_reservation_keeps_its_room_so_the_class_starts_at_once_and_the_research_waits():
    config, week = class_and_research(reservation=False)
    plain = replay(week, config, config.gpus, keep_decisions=True)
    config, week = class_and_research(reservation=True)
    kept = replay(week, config, config.gpus, keep_decisions=True)
    students = lambda t: [wait for at, wait, user, _g in t.asks if user.startswith("s")]  # noqa: E731
    late = lambda t: next(wait for at, wait, user, _g in t.asks if user == "late")  # noqa: E731
    # without it, the late researcher takes the free GPU at 09:55 and students wait for room an hour or more
    assert late(plain) == 0 and max(students(plain)) > 600
    # with it, the students start at once and the late researcher waits until they leave (10:50): it is
    # kept from the room from the lead time on, and there is nothing to borrow while they use it all
    assert max(students(kept)) == 0 and late(kept) >= 55 * 60
    assert kept.to_dict()["reservations"]["lab"]["p95"] == 0.0


def test_non_members_kernels_in_the_room_are_warned_and_hibernated_before_the_window():
    config = configuration(gpus=1, policy=RULE, reservations=[{**LAB, "memory": "40GiB"}],
                           profiles={"big": {"slice": "40GiB"}})
    # two researchers hold the whole GPU from 09:00, a cell every 5 minutes (never idle an hour)
    sessions = [session(f"r{i}", START + i, list(cells(300, 3 * 3600)), user=f"r{i}", groups=("research",),
                        profile="big") for i in range(2)]
    tally = replay(Workload(sessions, START, START + 3 * 3600, interval=30.0), config, config.gpus,
                   keep_decisions=True)
    reserved = [d for d in tally.decisions if d.reason == "reserved"]
    [acted] = [d for d in reserved if d.verb == "act"]  # the least that makes the room: one kernel
    warned = next(d for d in reserved if d.verb == "warn" and d.kernel == acted.kernel)
    assert START + 50 * 60 <= reserved[0].at < START + 51 * 60  # from the lead time (10 minutes before 10:00)
    assert acted.at - warned.at >= 120 and acted.at < START + 3600  # the rule's warning time, before the window
    assert acted.action == "hibernate" and tally.hibernated == 1 and tally.shut_down == 0
    # (a kernel running a cell at a pass is no candidate: the choice may move to the other one, warned anew)


def test_a_fair_queue_serves_the_group_under_its_share_first():
    policy = [{"name": "never", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
               "slice_at": "start"}]
    # one 10 GiB GPU: heavy (group a) holds it 09:00-10:00, hold (group c) asks at 09:59:50 and holds it
    # 10:00-10:20; a2 (group a) asks at 10:01, b1 (group b) at 10:02: who gets it at 10:20?
    sessions = [session("heavy", START, [(3600, END, None)], user="heavy", groups=("a",)),
                session("hold", START + 3590, [(1200, END, None)], user="hold", groups=("c",)),
                session("a2", START + 3660, [(600, END, None)], user="a2", groups=("a",)),
                session("b1", START + 3720, [(600, END, None)], user="b1", groups=("b",))]

    def order(queue_order):
        config = configuration(gpus=1, memory="10GiB", policy=policy, queue_order=queue_order,
                               start_queue_timeout="1h", fair_share_weights={"a": 1, "b": 1, "c": 1})
        tally = replay(Workload(sessions, START, START + 7200, interval=30.0), config, config.gpus)
        served = sorted((at + wait, user) for at, wait, user, _g in tally.asks if user in ("a2", "b1"))
        assert len(served) == 2 and served[0][0] == START + 4800  # when hold leaves (its 20 minutes from 10:00)
        return [user for _t, user in served]

    assert order("fifo") == ["a2", "b1"]
    assert order("fair") == ["b1", "a2"]  # group a used the GPU for an hour: b goes first


def test_jains_index_is_one_for_equal_waits_and_one_over_n_when_one_group_waits():
    assert jain([5.0, 5.0, 5.0]) == 1.0 and jain([0.0, 0.0]) == 1.0
    assert jain([9.0, 0.0, 0.0]) == round(1 / 3, 4)


def test_the_synthetic_week_has_a_class_twice_a_week_and_a_research_group_in_between():
    week = Week(students=40, researchers=12).workload()
    tuesday = EPOCH + 86400 + 10 * 3600
    classes = [s for s in week.sessions if s.groups == ("ml101",)]
    assert len(classes) == 80 and {dt.datetime.utcfromtimestamp(s.arrival).strftime("%a %H")
                                    for s in classes} == {"Tue 10", "Thu 10"}
    research = [s for s in week.sessions if s.groups == ("research",)]
    assert research and all(dt.datetime.utcfromtimestamp(s.arrival).weekday() < 5 for s in research)
    assert week.classes == {"class ml101": ("ml101", (tuesday, tuesday + 2 * 86400))}


def test_simulate_replays_the_configurations_reservation_and_fair_queue_and_reports_each_group():
    plan = simulate_json("--synthetic", "week", "--days", "3", "--researchers", "8", "--research-profile", "research",
                         "--config", str(EXAMPLES / "class-week.json"),
                         "--config", str(EXAMPLES / "class-week-fair-reserved.json"))
    plain, shared = (c["results"][0] for c in plan["configurations"])
    assert set(plain["groups"]) == set(shared["groups"]) == {"ml101", "research"}
    assert 0 < plain["fairness"] <= 1 and "reservations" not in plain
    assert shared["reservations"]["ML 101 lab"]["asks"] == shared["classes"]["class ml101"]["asks"] > 0
    assert shared["classes"]["class ml101"]["p95"] <= plain["classes"]["class ml101"]["p95"]
