"""The trace file: what export writes reads back; bad input (malformed, truncated, a newer version, an
unknown kind or profile) gets an error naming the line; the events become the sessions a replay runs."""

from __future__ import annotations

import io
import json
import re

import pytest
from planning_helpers import NEVER_CULL, T0, GiB, configuration, jupyter

from jupyter_gpu_pool.planning import tracefile
from jupyter_gpu_pool.planning.agreement import agreement
from jupyter_gpu_pool.planning.configuration import PlanError
from jupyter_gpu_pool.planning.costs import HIBERNATE as COST
from jupyter_gpu_pool.planning.simulator import Replay, replay
from jupyter_gpu_pool.planning.workload import ACTIVE, BUSY, END, GPU, HIBERNATE, IDLE, NAMES, SNOOZE
from jupyter_gpu_pool.pool.trace import KINDS, MAX_LIST, MAX_TEXT, VERSION, TraceEvent, check, clipped


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
EVENTS.sort(key=lambda e: e.at)  # a trace is in time order


def text(events=EVENTS, **header) -> str:
    """The file export writes for ``events`` (in time order, as export reads them from the ledger)."""
    out = io.StringIO()
    tracefile.write(out, sorted(events, key=lambda e: e.at), since=T0, until=T0 + 3600, exported=T0 + 3600,
                    users="all")

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
    with pytest.raises(PlanError, match=r"^trace.jsonl line 2: profile 'gpu-80g' of kernel k1 is not a profile of "
                                        r"configuration 'test' \(its profiles: slice, whole\)"):
        Replay(workload, configuration(), configuration().pool_of(1))


def test_the_cli_names_the_file_and_line_of_an_unknown_profile(tmp_path, pool_home):
    trace = tmp_path / "a4.jsonl"
    trace.write_text(text([E(0, "start", p="small", g=[]), E(5, "start", kernel="k2", p="nope", g=[])]))
    done = jupyter("simulate", "--trace", str(trace), "--json", "--no-progress")
    assert done.returncode == 2 and done.stdout == ""
    assert f"{trace} line 3: profile 'nope' of kernel k2 is not a profile of configuration 'current'" in done.stderr


@pytest.mark.parametrize("line, message", [
    ('{"t": 5, "e": "gpu", "k": "k1", "mem": -5, "util": 10}', "'mem' of a 'gpu' event must be bytes held, 0 or more"),
    ('{"t": 5, "e": "gpu", "k": "k1", "mem": 10, "util": 500}',
     "'util' of a 'gpu' event must be a percentage from 0 to 100, not 500"),
    ('{"t": 5, "e": "gpu", "k": "k1", "mem": 10, "util": -1.5}', "'util' of a 'gpu' event must be a percentage"),
    ('{"t": 500, "e": "snooze", "k": "k1", "until": 499}',
     "'until' of a 'snooze' event must be a time no earlier than the event's 't' (500), not 499"),
    ('{"t": 5, "e": "restored", "k": "k1", "w": -2.0}', "'w' of a 'restored' event must be seconds, 0 or more"),
    ('{"t": 5, "e": "restored", "k": "k1", "w": 0.2, "r": "hint", "hold": -1}',
     "'hold' of a 'restored' event must be seconds, 0 or more"),
    ('{"t": 5, "e": "hibernated", "k": "k1", "bytes": -1}', "'bytes' of a 'hibernated' event must be bytes moved"),
])
def test_impossible_values_are_refused_naming_the_line(line, message):
    lines = text().splitlines(keepends=True)
    with pytest.raises(PlanError) as refused:
        read("".join(lines[:2] + [line + "\n"] + lines[2:]))
    assert str(refused.value).startswith(f"trace.jsonl line 3: {message}"), refused.value


def test_possible_values_at_the_edges_are_read():
    for raw in ({"t": 5, "e": "gpu", "k": "k1", "mem": 0, "util": 100}, {"t": 5, "e": "gpu", "k": "k1", "mem": None},
                {"t": 5, "e": "snooze", "k": "k1", "until": 5}, {"t": 5, "e": "restored", "k": "k1", "w": 0},
                {"t": 5, "e": "restored", "k": "k1", "w": 0, "r": "hint", "hold": 0}):
        assert check(raw).data == {k: v for k, v in raw.items() if k not in ("t", "e", "k")}


def test_a_clipped_event_is_one_a_reader_accepts_and_keeps_the_groups_that_matter():
    groups = [f"g{i:03d}" for i in range(MAX_LIST + 6)]
    long = "the hibernator failed: " + "x" * 400
    event = TraceEvent(T0, "kernel", "k1", "alice", {"p": "slice", "g": groups, "why": long, "hib": False})
    with pytest.raises(Exception, match="'g' must be a list of at most 64"):
        check(event.to_dict())
    fitted = clipped(event, first=lambda g: g in ("g068", "g069"))
    assert check(fitted.to_dict()) == fitted
    assert fitted.data["g"][:2] == ["g068", "g069"] and fitted.data["g"][2:] == groups[:MAX_LIST - 2]
    assert len(fitted.data["why"]) == MAX_TEXT and fitted.data["why"].startswith("the hibernator failed: xxx")
    small = TraceEvent(T0, "busy", "k1", "alice")
    assert clipped(small) is small


def test_a_hibernation_its_user_asked_for_is_replayed_when_asked_and_is_no_policy_decision():
    """Release GPU at T0+60 (an "act" with reason user): the replay hibernates the kernel then and its
    slice is free from the checkpoint on; an admin's request likewise; neither is compared as a decision."""
    trace = read(text([
        E(0, "start", p="slice", g=["students"]), E(1, "kernel", p="slice", hib=True, declared=False),
        E(5, "busy"), E(10, "idle"), E(60, "act", r="user", a="hibernate", dry=False, rule="lab"),
        E(63, "hibernated", bytes=0),
        E(100, "start", kernel="k2", owner="bob", p="slice"), E(700, "act", kernel="k2", owner="bob", r="admin",
                                                                a="hibernate", dry=False)]))
    workload = tracefile.to_workload(trace)
    assert workload.recorded["decisions"] == []
    mine = {s.id: list(s.activity()) for s in workload.sessions}
    assert (T0 + 60, HIBERNATE, "user") in mine["k1"] and (T0 + 700, HIBERNATE, "admin") in mine["k2"]
    config = configuration(policy=NEVER_CULL, gpus=1)  # 8 slices of 10 GiB on one 80 GiB GPU
    tally = replay(workload, config, config.pool_of(1), keep_decisions=True)
    assert tally.hibernated == 2 and tally.to_dict()["requested_by_users"] == 2 and tally.shut_down == 0
    checkpoint = COST.seconds(10 * GiB)  # no reading: its slice's 10 GiB is what moves
    assert tally.held_seconds == pytest.approx(0.125 * (60 + checkpoint) + 0.125 * (600 + checkpoint))
    assert tally.decisions == [] and agreement(workload.recorded["decisions"], [], 30.0)["agrees"]


def test_a_requested_hibernation_waits_for_a_running_cell_and_falls_back_to_a_shutdown():
    """The hibernator refuses a kernel running a cell (it runs on); a kernel that cannot hibernate (an MPS
    slice) is shut down instead, as Release GPU does live."""
    events = [E(0, "start", p="slice"), E(50, "busy"), E(60, "act", r="user", a="hibernate", dry=False),
              E(0, "start", kernel="k2", p="mps"), E(60, "act", kernel="k2", r="user", a="hibernate", dry=False)]
    workload = tracefile.to_workload(read(text(events)))
    config = configuration(policy=NEVER_CULL, profiles={"slice": {"slice": "10GiB"},
                                                        "mps": {"slice": "10GiB,50%", "isolation": "mps"}})
    tally = replay(workload, config, config.pool_of(1))
    assert tally.hibernated == 0 and tally.hibernations_refused == 1
    assert tally.shut_down == 1 and tally.requested == 1


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


# -- a strict reader: one clear error naming the file and line, quoting at most a short prefix ---------------

HUGE = "x" * 5_000_000  # a field of megabytes is named, never echoed back


def _with(lines: list[str], at: int, *extra: str) -> str:
    """The trace with ``extra`` lines put in before line ``at`` (1-based), the closing line's count kept true."""
    lines = lines[: at - 1] + [x + "\n" for x in extra] + lines[at - 1:]
    closing = json.loads(lines[-1])
    lines[-1] = json.dumps({**closing, "events": closing["events"] + len(extra)}) + "\n"
    return "".join(lines)


def _line(**raw) -> str:
    return json.dumps({"t": T0 + 35, "e": "busy", "k": "k1", "u": "alice", **raw})


BAD = [  # each puts its line in as line 5 (between the kernel event at +31 s and the first cell at +40 s)
    pytest.param(lambda lines: _with(lines, 5, _line(k=HUGE)).encode(),
                 r"^trace.jsonl line 5: 'k' must be a non-empty name of at most 256 characters, not 'x{40}'… "
                 r"\(5,000,000 characters\)$", id="long-k"),
    pytest.param(lambda lines: _with(lines, 5, _line(u=HUGE)).encode(),
                 r"^trace.jsonl line 5: 'u' must be a non-empty name of at most 256 characters, not 'x{40}'… "
                 r"\(5,000,000 characters\)$", id="long-u"),
    pytest.param(lambda lines: _with(lines, 5, _line(e="start", p=[HUGE] * 3)).encode(),
                 r"^trace.jsonl line 5: 'p' of a 'start' event must be text, not \['x+\.\.\.x+… \(\d+ characters\)$",
                 id="long-list"),
    pytest.param(lambda lines: _with(lines, 5, _line(k="k1NOTUTF8")).encode().replace(b"NOTUTF8", b"\xff\xfe"),
                 r"^trace.jsonl line 5: byte 0xff at column 42 is not UTF-8 text; a trace is UTF-8 JSON lines",
                 id="not-utf8"),
    pytest.param(lambda lines: _with(lines, 5, json.dumps({"t": T0 + 35, "e": "busy", "k": "k1"})).encode(),
                 r"^trace.jsonl line 5: a 'busy' event needs 'u', the kernel's user \(every event names it\); export the "
                 r"trace again$", id="no-u"),
    pytest.param(lambda lines: _with(lines, 5, _line(t=T0 + 5)).encode(),
                 r"^trace.jsonl line 5: its time \(1700000005.000\) is before line 4's \(1700000031.000\); a "
                 r"trace's events are in time order", id="out-of-order"),
    pytest.param(lambda lines: _with(lines, 2, json.dumps({"t": T0 - 10, "e": "end", "k": "k1", "u": "alice",
                                                          "r": "shutdown"})).encode(),
                 r"^trace.jsonl line 4: kernel 'k1' starts at 1700000030.000, after its lease ended \(line 2, at "
                 r"1699999990.000\): an end before its start; correct the times, or export the trace again$", id="end-before-start"),
    pytest.param(lambda lines: ("".join(lines[:-1]) + json.dumps({"end": True, "events": HUGE}) + "\n").encode(),
                 r"^trace.jsonl line 18: the closing line counts 'x{40}'… \(5,000,000 characters\) events", id="count"),
]


@pytest.mark.parametrize("make, message", BAD)
def test_a_bad_trace_gets_one_error_naming_its_line_and_quoting_a_short_prefix(make, message):
    body = make(text().splitlines(keepends=True))
    with pytest.raises(PlanError) as refused:
        tracefile.read(io.BytesIO(body), name="trace.jsonl")
    assert len(str(refused.value)) < 400, str(refused.value)[:400]
    assert re.search(message, str(refused.value)), str(refused.value)


@pytest.mark.parametrize("make, message", BAD)
def test_the_cli_refuses_each_bad_trace_with_one_line_naming_the_file_and_line(tmp_path, make, message):
    bad = tmp_path / "trace.jsonl"
    bad.write_bytes(make(text().splitlines(keepends=True)))
    done = jupyter("simulate", "--trace", str(bad), "--gpus", "1", "--json", "--no-progress")
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr and len(done.stderr) < 500, done.stderr[:500]
    assert re.search(message.replace("^trace.jsonl", "^" + re.escape(str(bad))), done.stderr.strip()), done.stderr


def test_an_end_of_a_lease_begun_before_the_trace_is_read():
    """An export from --since starts in the middle of some leases: their ends are fine (without a start
    of the same kernel after them)."""
    trace = read(text([E(-10, "end", kernel="k0", r="shutdown"), *EVENTS]))
    assert ("k0", "end") in {(e.kernel_id, e.kind) for _, e in trace.events}
    assert "k0" not in {s.id for s in tracefile.to_workload(trace).sessions}


def test_every_kind_of_event_has_its_handler():
    assert set(tracefile._HANDLERS) == set(KINDS)


def test_a_resume_a_hint_started_is_read_as_the_hint_with_its_hold_not_as_a_cell_its_user_waited_for():
    """A cell's resume (``restored``) is a use at its start, and what follows moves back by its wait; a
    hint's (``r`` hint) is the hint, with the server's hold, and nothing moves: nobody waited for it."""
    events = [E(0, "start", p="slice", g=["students"]), E(10, "busy"), E(12, "idle"),
              E(100, "act", r="after_cell", a="hibernate", dry=False, rule="lab"),
              E(201, "restored", w=1.0, r="hint", hold=2.5), E(300, "act", r="hint_unused", a="hibernate", dry=False),
              E(402, "restored", w=2.0), E(403, "busy"), E(405, "idle"), E(900, "end", r="shutdown")]
    workload = tracefile.to_workload(read(text(events)))
    [session] = workload.sessions
    assert [(round(t - T0, 3), NAMES[code], value) for t, code, value in session.activity()] == [
        (10, "busy", None), (12, "idle", None), (200, "hint", 2.5), (400, "active", None), (401, "busy", None),
        (403, "idle", None), (898, "end", None)]
    assert [(d["reason"], d["action"]) for d in workload.recorded["decisions"]] == [
        ("after_cell", "hibernate"), ("hint_unused", "hibernate")]

