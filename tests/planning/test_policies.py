"""When a kernel takes its slice (slice_at: at start or at its first cell) and the resume hint, in the
replay; held never below busy; and `simulate --policies`, its table and its JSON."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planning_helpers import T0, GiB, configuration, jupyter, session, simulate_json, workload

from jupyter_gpu_pool.planning import tracefile
from jupyter_gpu_pool.planning.comparison import variant
from jupyter_gpu_pool.planning.configuration import Hint
from jupyter_gpu_pool.planning.costs import Cost, Costs
from jupyter_gpu_pool.planning.simulator import replay
from jupyter_gpu_pool.planning.workload import ACTIVE, BUSY, END, HIBERNATE, IDLE
from jupyter_gpu_pool.pool.trace import TraceEvent

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "jupyter_gpu_pool/planning/examples/lab-slices-sleep.json"
SLICE = 0.125  # a 10 GiB slice of an 80 GiB GPU
NEVER = {"idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None}
RESTORE = Costs(hibernate=Cost(1.0, 0.0), resume=Cost(2.0, 0.0))  # 1 s to hibernate, 2 s to restore


def sleepy(slice_at: str = "start") -> list[dict]:
    """Hibernate after a minute idle (warned 10 s before)."""
    return [{"name": "sleep", "idle_timeout": "1m", "gpu_idle_timeout": None, "warn": "10s", "action": "hibernate",
             "slice_at": slice_at}]


@pytest.mark.parametrize("slice_at, events, held", [
    # a kernel opened to read and shut down: at first cell it never held anything
    ("first-cell", [(600, END, None)], 0.0),
    ("start", [(600, END, None)], 600 * SLICE),
    # a kernel that runs no cell and is never shut down holds nothing to the horizon
    ("first-cell", [], 0.0),
    ("start", [], 3600 * SLICE),
    # one that runs a cell holds from its first cell on
    ("first-cell", [(100, BUSY, None), (110, IDLE, None), (200, END, None)], 100 * SLICE),
    ("start", [(100, BUSY, None), (110, IDLE, None), (200, END, None)], 200 * SLICE),
])
def test_a_first_cell_kernel_holds_nothing_until_its_first_cell(slice_at, events, held):
    config = configuration(policy=[{"name": "never", **NEVER, "slice_at": slice_at}], gpus=1)
    tally = replay(workload([session("a", T0, events)]), config, config.pool_of(1))
    assert tally.held_seconds == pytest.approx(held)
    assert tally.unsliced == (1 if slice_at == "first-cell" else 0)
    ran = any(code == BUSY for _, code, _ in events)
    assert tally.busy_seconds == pytest.approx(10 * SLICE if ran else 0.0)
    asks = dict(tally.waits_by_ask)
    assert asks == ({"first-cell": 1} if ran else {}) if slice_at == "first-cell" else asks == {"start": 1}


def test_the_rule_for_each_kernel_says_when_it_takes_its_slice():
    config = configuration(policy=[{"name": "tas", "match": {"user": ["tas"]}, **NEVER, "slice_at": "start"},
                                   {"name": "others", **NEVER, "slice_at": "first-cell"}], gpus=1)
    w = workload([session("tas", T0, [(600, END, None)]), session("student", T0, [(600, END, None)])])
    tally = replay(w, config, config.pool_of(1))
    assert tally.held_seconds == pytest.approx(600 * SLICE)  # the TA's kernel only
    assert tally.unsliced == 1


def test_a_first_cell_waits_in_the_queue_as_a_resume_does_even_with_the_start_queue_off():
    config = configuration(profiles={"gpu": {"slice": "whole"}}, gpus=1,
                           policy=[{"name": "never", **NEVER, "slice_at": "first-cell"}])  # start_queue_timeout 0
    w = workload([session("a", T0, [(0, BUSY, None), (5, IDLE, None), (100, END, None)], profile="gpu"),
                  session("b", T0, [(10, BUSY, None), (15, IDLE, None), (50, END, None)], profile="gpu")])
    tally = replay(w, config, config.pool_of(1))
    assert tally.waits == [0.0, 90.0] and tally.refusals.total() == 0 and tally.unserved_asks == 0
    assert tally.busy_seconds == pytest.approx(10.0)  # b's cell ran its 5 s once it had the GPU


def asleep_then_cell(memory=4 * GiB, cell_at=1000.0):
    """A kernel that runs a cell, sleeps (idle a minute), and runs another at ``cell_at``."""
    return session("a", T0, [(10, BUSY, None), (15, IDLE, None), (cell_at, BUSY, None), (cell_at + 5, IDLE, None),
                             (cell_at + 50, END, None)], memory=memory)


@pytest.mark.parametrize("lead, felt", [(None, 2.0), (0.0, 2.0), (0.5, 1.5), (1.5, 0.5), (2.0, 0.0), (3.0, 0.0)])
def test_a_hint_cuts_the_wait_a_resume_makes_its_cell_feel_by_its_lead(lead, felt):
    config = dataclasses.replace(configuration(policy=sleepy(), gpus=1),
                                 hint=Hint(lead=lead, hold=60.0) if lead is not None else None)
    tally = replay(workload([asleep_then_cell()]), config, config.pool_of(1), costs=RESTORE)
    assert tally.resumed == 1 and tally.resume_delays == [pytest.approx(felt)]
    assert tally.hints == (1 if lead else 0) and tally.hints_unused == 0  # (a lead of 0: the cell comes first)
    assert tally.resumed_cells == 1 and tally.slow_cells == (1 if felt > 0.5 else 0)  # a 5 s cell: 1.1x is 0.5 s
    assert tally.busy_seconds == pytest.approx(5 * SLICE * 2)


def test_no_hint_when_the_pool_is_full():
    config = dataclasses.replace(
        configuration(profiles={"gpu": {"slice": "whole"}}, gpus=1, start_queue_timeout=10**6,
                      policy=[{"name": "a", "match": {"user": ["a"]}, **sleepy()[0]}, {"name": "b", **NEVER,
                                                                                      "slice_at": "start"}]),
        hint=Hint(lead=3.0, hold=60.0))
    w = workload([session("a", T0, [(10, BUSY, None), (15, IDLE, None), (1000, BUSY, None), (1005, IDLE, None)],
                          profile="gpu", memory=4 * GiB),
                  session("b", T0 + 300, [(0, BUSY, None), (5, IDLE, None), (1000, END, None)], profile="gpu")])
    tally = replay(w, config, config.pool_of(1), costs=RESTORE)
    assert tally.hints == 0 and tally.hints_skipped == 1
    # a's cell waited in the queue for b's end (T0 + 1300), then for the whole restore
    assert tally.resume_delays == [pytest.approx(300 + 2.0)]


def test_no_hint_when_someone_waits_even_where_there_is_room():
    config = dataclasses.replace(
        configuration(gpus=1, start_queue_timeout=10**6,
                      policy=[{"name": "a", "match": {"user": ["a"]}, **sleepy()[0]}, {"name": "others", **NEVER,
                                                                                      "slice_at": "start"}]),
        hint=Hint(lead=3.0, hold=60.0))
    w = workload([asleep_then_cell(),
                  session("x", T0 + 300, [(0, BUSY, None), (3000, IDLE, None)]),  # holds a slice, busy
                  session("w", T0 + 900, profile="whole")])  # waits for the whole GPU from T0 + 900
    tally = replay(w, config, config.pool_of(1), costs=RESTORE)
    assert tally.hints == 0 and tally.hints_skipped == 1
    assert tally.resume_delays and tally.resume_delays[0] >= 2.0  # no head start: the whole restore, at least


def test_a_hinted_kernel_that_runs_no_cell_in_time_sleeps_again():
    config = dataclasses.replace(configuration(policy=sleepy(), gpus=1), hint=Hint(lead=100.0, hold=30.0))
    tally = replay(workload([asleep_then_cell()]), config, config.pool_of(1), costs=RESTORE, keep_decisions=True)
    assert tally.hints == 1 and tally.hints_unused == 1
    assert tally.hibernated == 2  # after its first cell, and after the unused hint (it ends 45 s after its last)
    assert tally.resumed == 2 and tally.resume_delays == [pytest.approx(2.0)]  # its cell got no head start
    assert tally.warnings == 1  # the policy warned before the first hibernation only; the hint's went unwarned
    # held: 65 s (T0 .. its hibernation) + 1 s checkpoint, the hint's 30 s + 1 s, the cell's 2 s restore + ...
    assert tally.held_seconds > (30 + 1) * SLICE


def test_an_unused_hint_s_sleep_is_on_record_as_the_live_server_s_hint_unused_dry_run_policy_or_not():
    """The live server journals it (reason hint_unused, no warning) and its trace has it as an ``act``: the
    replay puts it among its decisions, so that a replay compares it.  It is the hint's, not the policy's:
    a dry-run policy (which only records its own) does not stop it.  Here the user released the kernel
    (Release GPU at 20 s), a hint woke it 100 s before its next cell, and no cell came within 30 s."""
    released = session("a", T0, [(10, BUSY, None), (15, IDLE, None), (20, HIBERNATE, "user"), (1000, BUSY, None),
                                 (1005, IDLE, None), (1050, END, None)], memory=4 * GiB)
    for dry_run in (False, True):
        config = dataclasses.replace(configuration(policy=sleepy(), gpus=1, policy_dry_run=dry_run),
                                     hint=Hint(lead=100.0, hold=30.0))
        tally = replay(workload([released]), config, config.pool_of(1), costs=RESTORE, keep_decisions=True)
        assert tally.hints == 1 and tally.hints_unused == 1 and tally.hibernated == 2, dry_run
        assert [(round(d.at - T0, 3), d.verb, d.reason, d.action, d.dry_run) for d in tally.decisions] == [
            (930.0, "act", "hint_unused", "hibernate", False)], dry_run  # the user's release is no decision


events_strategy = st.lists(st.tuples(st.floats(0, 3000), st.floats(0, 300), st.floats(0, 600)), max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernels=st.lists(st.tuples(st.floats(0, 1800), events_strategy, st.booleans(), st.sampled_from(
           ["slice", "whole"])), min_size=1, max_size=6),
       slice_at=st.sampled_from(["start", "first-cell"]), hint=st.sampled_from([None, 0.0, 3.0, 120.0]),
       gpus=st.integers(1, 2), after_cell=st.sampled_from([None, 1.0, 5.0, 60.0]))
def test_a_pool_never_holds_less_than_what_runs(kernels, slice_at, hint, gpus, after_cell):
    rules = [{**sleepy(slice_at)[0], "hibernate_after_cell": after_cell}]
    config = dataclasses.replace(configuration(policy=rules, gpus=gpus, start_queue_timeout=120),
                                 hint=Hint(lead=hint, hold=30.0) if hint is not None else None)
    sessions = []
    for i, (arrival, cells, ends, profile) in enumerate(kernels):
        t, events = 0.0, []
        for pause, run, _ in cells:
            t += pause
            events += [(t, BUSY, None), (t + run, IDLE, None)]
            t += run
        if ends:
            events.append((t + 10, END, None))
        sessions.append(session(f"k{i}", T0 + arrival, events, profile=profile, memory=2 * GiB))
    tally = replay(workload(sessions, hours=2), config, config.pool_of(gpus))
    assert tally.held_seconds >= tally.busy_seconds - 1e-6
    if slice_at == "first-cell" and not any(cells for _, cells, _, _ in kernels):
        assert tally.held_seconds == 0.0  # nobody ran a cell: nothing was held


LAB = ("--synthetic", "lab", "--students", "12", "--hours", "1", "--gpus", "1-3", "--config", str(EXAMPLE))


def test_simulate_compares_policies_on_the_same_lab():
    result = simulate_json(*LAB, "--policies", "start,first-cell,first-cell+hint", "--hint-lead", "3s")
    rows = {r["policy"]: r for r in result["policies"]}
    assert list(rows) == ["start", "first-cell", "first-cell+hint"]
    assert [c["name"] for c in result["configurations"]] == list(rows)
    for name, r in rows.items():
        config = next(c for c in result["configurations"] if c["name"] == name)
        assert r["gpus_for_goal"] == config["fewest_gpus"]
        at = next(x for x in config["results"] if x["gpus"] == r["at_gpus"])
        assert r["gpu_hours_held"] == at["gpu_hours"]["held"] >= r["gpu_hours_busy"] == at["gpu_hours"]["busy"] > 0
        assert r["held_over_busy"] == pytest.approx(r["gpu_hours_held"] / r["gpu_hours_busy"], rel=1e-2)
        assert r["resumes"] > 0 and r["resumes_per_user_hour"] > 0
        assert all(p["slice_at"] == name.split("+")[0] for p in config["policy"])
    assert rows["start"]["started_without_slice"] == 0 and rows["first-cell"]["started_without_slice"] == 12
    assert rows["start"]["hint"] is None and rows["first-cell+hint"]["hint"] == {"lead": 3.0, "hold": 60.0}
    hinted, plain = rows["first-cell+hint"], rows["first-cell"]
    assert hinted["hints"]["resumed"] > 0 and plain["hints"]["resumed"] == 0
    # 1 to 6 GiB restore in 0.55 to 1.58 s: a 3 s lead leaves most cells nothing to wait for
    assert hinted["resume_wait_seconds"]["mean"] < plain["resume_wait_seconds"]["mean"]
    assert hinted["resume_wait_seconds"]["share_waited"] < 0.5 <= plain["resume_wait_seconds"]["share_waited"]


def test_simulate_prints_the_policy_table():
    done = jupyter("simulate", *LAB, "--policies", "start,first-cell+hint", "--no-progress")
    assert done.returncode == 0, done.stderr
    table = done.stdout.split("Policies compared")[1].splitlines()
    assert "GPU-h held" in table[1] and "held/busy" in table[1] and "resume wait mean" in table[1]
    assert table[2].split()[0] == "start" and table[3].split()[0] == "first-cell+hint"
    result = simulate_json(*LAB, "--policies", "start,first-cell+hint")
    for line, row in zip(table[2:4], result["policies"]):
        assert f"{row['gpu_hours_held']:.2f}" in line and f"{row['held_over_busy']:.2f}x" in line


@pytest.mark.parametrize("args, says", [
    (("--policies", "first-cell,soon"), "'soon' is not a policy to compare"),
    (("--policies", "start+hints"), "'start+hints' is not a policy to compare"),
    (("--policies", "start,start"), "name each policy once"),
    (("--policies", "start", "--compare-policy", str(EXAMPLE)), "--policies compares policies under one"),
    (("--policies", "start+hint", "--hint-lead", "soon"), "--hint-lead 'soon'"),
])
def test_bad_policies_get_a_clear_error(args, says):
    done = jupyter("simulate", *LAB, *args, "--json", "--no-progress")
    assert done.returncode != 0 and says in done.stderr and not done.stdout
    assert "Traceback" not in done.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.stdout)


def test_a_variant_keeps_every_rule_but_when_the_slice_is_taken():
    config = configuration(policy=sleepy("start"))
    hinted = variant(config, "first-cell+hint", Hint(lead=3.0))
    assert [r.slice_at for r in hinted.policy.rules] == ["first-cell", "first-cell"]  # the rule, then the default
    assert dataclasses.replace(hinted.policy.rules[0], slice_at="start") == config.policy.rules[0]
    assert hinted.hint == Hint(lead=3.0) and variant(config, "configured", Hint()).hint is None
    assert variant(config, "configured", Hint()).policy is config.policy


def test_simulate_compares_policies_on_a_recorded_trace(tmp_path):
    """A trace in the export's format: k1 starts at 30 s and runs cells at 40 s and 2,603 s; k3 is opened at 60 s
    to read, runs nothing, and is shut down at 500 s (before the policy would hibernate it)."""
    def event(dt, kind, kernel, **data):
        return TraceEvent(T0 + dt, kind, kernel, "alice", data)

    events = [event(30, "start", "k1", p="slice", g=["students"]), event(40, "busy", "k1"), event(50, "idle", "k1"),
              event(60, "start", "k3", p="slice", g=["students"]), event(500, "end", "k3", r="shutdown"),
              event(2603, "busy", "k1"), event(2610, "idle", "k1"), event(3000, "end", "k1", r="shutdown")]
    trace = tmp_path / "trace.jsonl"
    with trace.open("w", encoding="utf-8") as out:
        tracefile.write(out, events, since=T0, until=T0 + 3600, exported=T0 + 3600, users="all")
    config = tmp_path / "pool.json"
    config.write_text(json.dumps({"GPUPool": {
        "inventory": [{"name": "NVIDIA H100 80GB HBM3", "memory": "80GiB", "count": 1}],
        "profiles": {"slice": {"slice": "10GiB"}}, "default_profile": "slice",
        "policy": [{"name": "lab", "idle_timeout": "10m", "gpu_idle_timeout": None, "warn": "1m",
                    "action": "hibernate"}]}}))
    result = simulate_json("--trace", str(trace), "--config", str(config), "--policies", "start,first-cell")
    start, first = result["policies"]
    assert (start["started_without_slice"], first["started_without_slice"]) == (0, 2)
    assert start["resumes"] == first["resumes"] == 1  # k1 hibernated after 10 min idle, resumed at its last cell
    # first-cell holds neither k3's 440 s nor k1's 10 s before its first cell, of a 10 GiB slice of 80 GiB
    assert start["gpu_hours_held"] - first["gpu_hours_held"] == pytest.approx(450 * SLICE / 3600, abs=0.001)
    assert start["gpu_hours_busy"] == first["gpu_hours_busy"] == pytest.approx(17 * SLICE / 3600, abs=0.001)


@pytest.mark.parametrize("cell", ["busy", "active"])
def test_a_trace_of_a_first_cell_kernel_keeps_its_user_time(tmp_path, cell):
    """As the live pool records a kernel started without a slice: its start-up (active at 1.9 s), the culler
    sees it at 2 s (holding nothing, so "cannot hibernate"), a completion at 30 s, its first cell takes a
    slice at 60 s (its `start`) and runs (busy at 60.1 s, idle at 65 s; a quick cell is one `active`).  The
    replay keeps the 58 s before the first cell as the user's (no pool delay to take out), takes no use
    before the start for a cell, and asks the profile whether it can hibernate, not the kernel seen
    without a slice."""
    def event(dt, kind, **data):
        return TraceEvent(T0 + dt, kind, "k1", "alice", data)

    ran = [event(60.1, "busy"), event(65, "idle")] if cell == "busy" else [event(60.1, "active")]
    events = [event(1.9, "active"),
              event(2, "kernel", p="slice", g=["students"], s="gpu-pool-slice", hib=False,
                    why="This kernel holds no GPU right now, so there is nothing to hibernate.", declared=True,
                    grid=[T0, 30.0]),
              event(30, "active"), event(60, "start", p="slice", g=["students"]), *ran,
              event(3000, "end", r="shutdown")]
    trace = tmp_path / "trace.jsonl"
    with trace.open("w", encoding="utf-8") as out:
        tracefile.write(out, events, since=T0, until=T0 + 3600, exported=T0 + 3600, users="all")
    w = tracefile.to_workload(tracefile.read(tracefile.lines_of(str(trace)), str(trace)))
    [s] = w.sessions
    assert s.arrival == T0 + 1.9 and s.can_hibernate is None
    used = [(60.1, BUSY), (65.0, IDLE)] if cell == "busy" else [(60.1, ACTIVE)]
    assert [(round(t - T0, 3), code) for t, code, _ in s.activity()] == [*used, (3000.0, END)]
    for slice_at, held in (("first-cell", 3000 - 60.1), ("start", 3000 - 1.9)):
        config = configuration(policy=[{"name": "never", **NEVER, "slice_at": slice_at}], gpus=1)
        tally = replay(w, config, config.pool_of(1))
        assert tally.held_seconds == pytest.approx(held * SLICE)
    config = configuration(policy=sleepy("first-cell"), gpus=1)
    tally = replay(w, config, config.pool_of(1))
    assert tally.hibernated == 1 and tally.shut_down == 0  # the profile can hibernate: not shut down instead


RECORDED = EXAMPLE.parent / "lab-recorded.trace.jsonl"  # benchmarks/record_trace.py: 3 users, about 2 minutes


def test_the_recorded_example_trace_replays_as_it_was_recorded_and_compares_after_cell():
    """The trace in the repository, recorded live under lab-recorded.json (first-cell, hibernated after 20 s
    idle) on declared GPUs: replayed with what declared GPUs cost (nothing moved), the same decisions as
    the record, four kernels started without a slice, one never ran a cell; under +after-cell less is held;
    and as its kernels are recorded declared, the default costs charge them nothing either."""
    config = str(EXAMPLE.parent / "lab-recorded.json")
    free = ("--hibernate-cost", "0,0", "--resume-cost", "0,0")
    result = simulate_json("--trace", str(RECORDED), "--config", config, *free)
    assert result["recorded"]["agrees"] and result["recorded"]["matched"] == 8, result["recorded"]
    [r] = result["configurations"][0]["results"]
    assert r["started_without_slice"] == 4 and r["wait_seconds"]["first-cells"] == 3
    assert (r["hibernated"], r["resumed"], r["shut_down"]) == (4, 3, 0)
    compare = ("--policies", "start,first-cell,first-cell+after-cell", "--after-cell", "2s")
    rows = {x["policy"]: x for x in simulate_json("--trace", str(RECORDED), "--config", config, *free, *compare)[
        "policies"]}
    assert rows["first-cell+after-cell"]["hibernated_after_cell"] > 0
    held = {name: row["held_over_busy"] for name, row in rows.items()}
    assert held["start"] > held["first-cell"] > held["first-cell+after-cell"] >= 1.0
    # its kernel events say declared (the first-cell ones too): the default costs charge nothing either
    costed = {x["policy"]: x for x in simulate_json("--trace", str(RECORDED), "--config", config, *compare)[
        "policies"]}
    assert {name: row["held_over_busy"] for name, row in costed.items()} == held
    assert all(row["resume_wait_seconds"]["mean"] == 0.0 for row in costed.values())
