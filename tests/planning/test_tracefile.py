"""The trace file: what export writes reads back; bad input (malformed, truncated, a newer version, an
unknown kind or profile) gets an error naming the line; the events become the sessions a replay runs."""

from __future__ import annotations

import io
import json

import pytest
from planning_helpers import T0, configuration, jupyter

from jupyter_gpu_pool.planning import tracefile
from jupyter_gpu_pool.planning.configuration import PlanError
from jupyter_gpu_pool.planning.simulator import Replay
from jupyter_gpu_pool.planning.workload import ACTIVE, BUSY, END, GPU, IDLE, SNOOZE
from jupyter_gpu_pool.pool.trace import VERSION, TraceEvent


def E(dt: float, kind: str, kernel: str = "k1", owner: str = "alice", **data) -> TraceEvent:
    return TraceEvent(T0 + dt, kind, kernel, owner, data)


EVENTS = [
    E(0, "queued", p="slice", a="start"),
    E(30, "start", p="slice", g=["students"]),
    E(31, "kernel", p="slice", g=["students"], s="gpu-pool-slice", hib=True, why=None, declared=False,
      grid=[T0 + 1, 30.0]),
    E(40, "busy"),
    E(41, "gpu", mem=2 * 2**30, util=80.0),
    E(50, "idle"),
    E(400, "warn", r="idle", a="hibernate", d=T0 + 700, dry=False),
    E(410, "snooze", until=T0 + 1010),
    E(2000, "act", r="idle", a="hibernate", dry=False, rule="lab"),
    E(2004, "hibernated", bytes=2 * 2**30),
    E(2600, "resumed"),
    E(2602, "restored", w=5.0),
    E(2603, "busy"),
    E(2610, "idle"),
    E(3000, "end", r="shutdown"),
    E(100, "refused", kernel="k2", owner="bob", p="whole", r="pool_exhausted", a="start"),
]


def text(events=EVENTS, **header) -> str:
    out = io.StringIO()
    tracefile.write(out, events, since=T0, until=T0 + 3600, exported=T0 + 3600, users="all")
    lines = out.getvalue().splitlines(keepends=True)
    if header:
        lines[0] = json.dumps({**json.loads(lines[0]), **header}) + "\n"
    return "".join(lines)


def read(body: str):
    return tracefile.read(io.StringIO(body), name="trace.jsonl")


def test_what_export_writes_reads_back_event_for_event():
    trace = read(text())
    assert trace.header["version"] == VERSION and trace.header["since"] == T0
    assert [e for _, e in trace.events] == [tracefile.check(e.to_dict()) for e in EVENTS]
    assert [line for line, _ in trace.events] == list(range(2, 2 + len(EVENTS)))


@pytest.mark.parametrize("change, message", [
    (lambda lines: lines[:3] + ["{not json\n"] + lines[3:], r"trace.jsonl line 4 is not JSON"),
    (lambda lines: lines[:-1], r"ends at line 17 without its closing line: the trace is truncated"),
    (lambda lines: lines[:-2] + [lines[-2].rstrip("\n")[:20]], r"line 17 is cut short .*truncated"),
    (lambda lines: lines[:5] + lines[6:], r"line 17: the closing line counts 16 events but the trace has 15"),
    (lambda lines: lines[:2] + ['{"t": "yesterday", "e": "busy", "k": "k1"}\n'] + lines[2:],
     r"line 3: 't' must be a time in Unix seconds, not 'yesterday'"),
    (lambda lines: lines[:2] + ['{"t": 5, "e": "teleport", "k": "k1"}\n'] + lines[2:],
     r"line 3: 'e': 'teleport' is not an event kind this version reads"),
    (lambda lines: lines[:2] + ['{"t": 5, "e": "start", "k": "k1", "p": 7}\n'] + lines[2:],
     r"line 3: 'p' of a 'start' event must be text, not 7"),
    (lambda lines: lines[:2] + ['{"t": 5, "e": "busy"}\n'] + lines[2:], r"line 3: a 'busy' event needs 'k'"),
    (lambda lines: ['{"hello": 1}\n'] + lines[1:], r"line 1 is not a jupyter-gpu-pool trace header"),
    (lambda lines: lines + [lines[0]], r"line 19: there is more after the closing line \(line 18\)"),
    (lambda lines: [], r"trace.jsonl is empty"),
])
def test_bad_input_gets_an_error_naming_the_line(change, message):
    lines = text().splitlines(keepends=True)
    with pytest.raises(PlanError, match=message):
        read("".join(change(lines)))


def test_a_trace_from_a_newer_version_is_refused_with_what_to_do():
    with pytest.raises(PlanError, match=rf"line 1: this trace is format version {VERSION + 1}, newer than the "
                                        rf"version this jupyter-gpu-pool reads \({VERSION}\); upgrade"):
        read(text(version=VERSION + 1))


def test_an_unknown_profile_is_refused_naming_the_line_that_introduced_it():
    workload = tracefile.to_workload(read(text([E(0, "start", p="gpu-80g", g=[]), E(5, "busy")])))
    with pytest.raises(PlanError, match=r"line 2: profile 'gpu-80g' of kernel k1 is not a profile of configuration "
                                        r"'test' \(its profiles: slice, whole\)"):
        Replay(workload, configuration(), configuration().pool_of(1))


def test_the_cli_refuses_a_bad_trace_with_the_line_and_prints_nothing_else(tmp_path):
    bad = tmp_path / "trace.jsonl"
    bad.write_text(text()[:-30])  # cut in the middle of the last event line
    done = jupyter("simulate", "--trace", str(bad), "--json", "--no-progress")
    assert done.returncode == 2 and done.stdout == ""
    assert f"{bad} line 17 is cut short" in done.stderr and "export it again" in done.stderr


def test_events_become_sessions_in_user_time():
    workload = tracefile.to_workload(read(text()))
    assert workload.interval == 30.0 and workload.start == T0 and workload.end == T0 + 3600
    k1, k2 = sorted(workload.sessions, key=lambda s: s.id)
    # the session began when the user asked (its place in the queue), and the pool's delays are taken out
    assert k1.arrival == T0 and k1.profile == "slice" and k1.groups == ("students",)
    assert k1.kernelspec == "gpu-pool-slice" and k1.can_hibernate is True and k1.grid == (T0 + 1, 30.0)
    activity = list(k1.activity())
    assert activity[:4] == [(T0 + 10, BUSY, None), (T0 + 11, GPU, (2 * 2**30, 80.0)), (T0 + 20, IDLE, None),
                            (T0 + 380, SNOOZE, 600.0)]
    # the live wake (its resume took 5 s): the user's use, at the time it began, and later events move back by it
    assert activity[4:] == [(T0 + 2567, ACTIVE, None), (T0 + 2568, BUSY, None), (T0 + 2575, IDLE, None),
                            (T0 + 2965, END, None)]
    assert list(k1.activity()) == activity  # afresh for every replay
    # a refused start is asked once and holds nothing: the user's retry is a kernel of its own
    assert k2.once and k2.arrival == T0 + 100 and k2.profile == "whole" and list(k2.activity()) == []
    assert workload.recorded["refusals"] == [{"t": T0 + 100, "kernel": "k2", "reason": "pool_exhausted",
                                              "what": "start"}]
    assert [(d["verb"], d["reason"], d["action"]) for d in workload.recorded["decisions"]] == [
        ("warn", "idle", "hibernate"), ("act", "idle", "hibernate")]


def test_a_kernel_the_live_policy_shut_down_has_no_end_of_its_own():
    """The replayed policy decides when it goes; without any culling it would have stayed."""
    workload = tracefile.to_workload(read(text([
        E(0, "start", p="slice"), E(10, "active"), E(900, "act", r="idle", a="shutdown", dry=False),
        E(901, "end", r="culled: idle (rule 'lab')"),
        E(1000, "start", kernel="k3", p="slice"), E(1200, "act", kernel="k3", r="idle", a="shutdown", dry=True),
        E(1300, "end", kernel="k3", r="shutdown")])))
    culled, user_ended = sorted(workload.sessions, key=lambda s: s.id)
    assert END not in [code for _, code, _ in culled.activity()]
    assert (T0 + 1300, END, None) in list(user_ended.activity())  # a dry run's "act" ended nothing
