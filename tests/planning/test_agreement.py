"""The simulator agrees with the live pool: real kernels on a declared pool under a short policy, a
scripted pattern of use, the trace recorded by the server extension and exported with the real CLI,
replayed by ``jupyter gpu-pool simulate``: the same kernels warned, culled and hibernated, for the same
reasons, each at most one culling pass from when it really happened, and the same refusals.  Idle rules,
GPU-idle and over-memory rules (GPU readings from the scripted telemetry source, NVML's stand-in), and
hibernations a user asked for (replayed when asked, no decision of the policy's)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from planning_helpers import GiB, jupyter, passes, simulate_json
from server_helpers import ScriptedReadings, body, execute, start_kernel, wait_until
from tornado.httpclient import HTTPClientError

from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.planning import tracefile
from jupyter_gpu_pool.planning.agreement import passes_apart
from jupyter_gpu_pool.planning.configuration import Configuration
from jupyter_gpu_pool.planning.costs import Cost, Costs
from jupyter_gpu_pool.planning.simulator import replay
from jupyter_gpu_pool.pool import HIBERNATED, RELEASED

pytestmark = [pytest.mark.usefixtures("ext"), pytest.mark.timeout(600)]

INTERVAL = 1.0  # the culler's pass (the extension fixture's cull_interval)
# Each rule says slice_at start: these kernels take their slice when started (and run no cell, some).
POLICY = [
    {"name": "whole", "slice_at": "start",
     "match": {"profile": "whole"}, "idle_timeout": 5, "gpu_idle_timeout": None, "warn": 2.5,
     "action": "shutdown", "max_hibernated": None},
    {"name": "small", "slice_at": "start",
     "match": {"profile": "small"}, "idle_timeout": 7, "gpu_idle_timeout": None, "warn": 2.5,
     "action": "hibernate", "max_hibernated": 6, "snooze": 4, "max_snoozes": 1},
]


def lease_of(pool_home, kernel_id: str):
    """The kernel's latest lease (a kernel started again, by a restart or a retried start, has more than one)."""
    leases = pool_home.ledger().leases(states=("active", "hibernated", "released"))
    return max((lease for lease in leases if lease.kernel_id == kernel_id), key=lambda lease: lease.created,
               default=None)


def live_decisions(pool_home) -> tuple[dict[str, list[tuple]], list[tuple[str, str]]]:
    """What the live pool decided, from its journal (not from the trace): per kernel, in order,
    (time, verb, reason, action); and the refused starts (kernel, reason)."""
    decisions: dict[str, list[tuple]] = {}
    refusals = []
    for e in reversed(pool_home.ledger().journal(limit=10_000)):
        policy = e.detail.get("source") == "policy"
        if e.kind == "refused" and not policy:
            refusals.append((e.kernel_id, e.reason))
        elif policy and e.kind in ("warned", "culled", "hibernated") and not e.detail.get("dry_run"):
            verb = "warn" if e.kind == "warned" else "act"  # an action is on record once done, beside when decided
            at = e.at if verb == "warn" else e.detail["decided"]
            decisions.setdefault(e.kernel_id, []).append((at, verb, e.reason, e.detail["action"]))
    return decisions, refusals


def replayed_by_kernel(result: dict) -> dict[str, list[tuple]]:
    found: dict[str, list[tuple]] = {}
    for d in result["decisions"]:
        found.setdefault(d["kernel"], []).append((d["t"], d["verb"], d["reason"], d["action"]))
    return found


def export_and_replay(tmp_path, *args: str) -> tuple[Path, dict]:
    """The pool's trace exported by ``jupyter gpu-pool trace export`` and its replay's --json (with
    --decisions and ``args``) by ``simulate``."""
    trace = tmp_path / "trace.jsonl"
    done = jupyter("trace", "export", "--since", "1h", "--output", str(trace))
    assert done.returncode == 0, done.stderr
    return trace, simulate_json("--trace", str(trace), "--decisions", *args)


def assert_same_decisions(live: dict, replayed: dict) -> None:
    """The same kernels, the same decisions in the same order, each at most one culling pass from when
    the live pool decided (a pass runs a few milliseconds after its scheduled time: passes are counted)."""
    assert set(replayed) == set(live), (replayed, live)
    for kernel, decisions in live.items():
        assert [x[1:] for x in replayed[kernel]] == [x[1:] for x in decisions], (kernel, replayed[kernel], decisions)
        for (t_live, *what), (t_replay, *_) in zip(decisions, replayed[kernel]):
            assert passes_apart(t_live, t_replay, INTERVAL) <= 1, (kernel, what, t_live, t_replay)


@pytest.mark.policy(rules=POLICY)
@pytest.mark.slow
async def test_a_replay_of_the_recorded_trace_decides_what_the_live_pool_decided(jp_fetch, jp_ws_fetch, ext,
                                                                                  pool_home, tmp_path):
    km = ext.serverapp.kernel_manager
    a = await start_kernel(jp_fetch, "gpu-pool-small")  # left idle: hibernated, then shut down hibernated
    b = await start_kernel(jp_fetch, "gpu-pool-small")  # runs a cell, is snoozed, hibernates, wakes for a cell
    c = await start_kernel(jp_fetch, "gpu-pool-whole")  # a whole GPU, idle: culled
    with pytest.raises(HTTPClientError):  # both GPUs are taken (small ones on GPU 0, c on GPU 1)
        await start_kernel(jp_fetch, "gpu-pool-whole")
    tab = await execute(jp_ws_fetch, b, "import time; time.sleep(3)")
    await wait_until(lambda: km.get_kernel(b).execution_state == "busy", 60, what="b busy")

    # c's whole GPU comes back when it is culled; a new whole kernel takes it
    await wait_until(lambda: (lease := lease_of(pool_home, c)) and lease.state == RELEASED, 120, what="c culled")
    e = await start_kernel(jp_fetch, "gpu-pool-whole")

    # b is warned for being idle: its user snoozes it once
    warned = await wait_until(lambda: [x for x in pool_home.ledger().journal()
                                       if x.kind == "warned" and x.kernel_id == b], 120, what="b warned")
    # A pass after the warning, as a user reads it first: a live pass that ran late can warn at an idle time the
    # replay's pass on the grid had not reached, and a snooze before the replay's next pass would then come before
    # its warning there (two runs on a loaded machine saw it).  Well before the deadline (2.5 s).
    await asyncio.sleep(max(0.0, warned[-1].at + INTERVAL + 0.1 - time.time()))
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", b, "snooze", method="POST", body=json.dumps({"seconds": 4}))
    assert r.code == 200 and body(r)["snoozed_until"] > time.time() + 3

    # b hibernates after its snooze; a cell run on it wakes it (the websocket's transparent resume)
    await wait_until(lambda: lease_of(pool_home, b).state == HIBERNATED, 120, what="b hibernated")
    tab.close()
    tab = await execute(jp_ws_fetch, b, "y = 2")
    await wait_until(lambda: lease_of(pool_home, b).state == "active" and not lease_of(pool_home, b).phase, 120,
                     what="b resumed")
    # a is shut down after max_hibernated; e is culled; b hibernates again, and its user shuts it down
    await wait_until(lambda: lease_of(pool_home, a).state == RELEASED, 120, what="a shut down")
    await wait_until(lambda: lease_of(pool_home, e).state == RELEASED, 120, what="e culled")
    await wait_until(lambda: lease_of(pool_home, b).state == HIBERNATED, 120, what="b hibernated again")
    tab.close()
    await jp_fetch("api", "kernels", b, method="DELETE")
    await wait_until(lambda: lease_of(pool_home, b).state == RELEASED, 60, what="b shut down by its user")
    await passes(ext)  # the last pass writes the trace

    live, refused = live_decisions(pool_home)
    assert [x[1:] for x in live[a]] == [("warn", "idle", "hibernate"), ("act", "idle", "hibernate"),
                                        ("warn", "max_hibernated", "shutdown"), ("act", "max_hibernated", "shutdown")]
    assert [x[1:] for x in live[c]][-2:] == [("warn", "idle", "shutdown"), ("act", "idle", "shutdown")]
    assert ("act", "idle", "hibernate") in [x[1:] for x in live[b]]
    assert len(refused) == 1 and refused[0][1] == "pool_exhausted"

    _, replay = export_and_replay(tmp_path)

    [config] = replay["configurations"]
    [result] = config["results"]
    assert result["gpus"] == 2  # the configured pool
    assert_same_decisions(live, replayed_by_kernel(result))
    assert sorted((x["kernel"], x["reason"]) for x in result["refused"]) == sorted(refused)
    assert replay["recorded"]["agrees"], replay["recorded"]


GPU_RULES = [
    {"name": "soft", "slice_at": "start",
     "match": {"profile": "small"}, "idle_timeout": None, "gpu_idle_timeout": 4, "warn": 2,
     "over_memory_grace": 2, "action": "shutdown", "max_hibernated": None},
    {"name": "whole", "slice_at": "start",
     "match": {"profile": "whole"}, "idle_timeout": None, "gpu_idle_timeout": 4, "warn": 2,
     "action": "shutdown", "max_hibernated": None},
]


@pytest.mark.policy(rules=GPU_RULES)
@pytest.mark.slow
async def test_a_replay_decides_gpu_idle_and_over_memory_as_the_live_pool_did(jp_fetch, ext, pool_home, tmp_path):
    """GPU readings from the scripted telemetry source (NVML's stand-in), read by the live sampler every
    0.5 s: a kernel on a 10 GiB soft slice goes to 12 GiB (over its slice: warned, then shut down after the
    grace), a whole-GPU kernel stops using its GPU while holding memory (GPU-idle: warned, then shut down).
    The recorded readings replayed through the same rules give the same decisions, each within a pass."""
    ScriptedReadings.set(memory=2 * GiB, utilization=60.0)  # both hold 2 GiB and use their GPU
    a = await start_kernel(jp_fetch, "gpu-pool-small")
    b = await start_kernel(jp_fetch, "gpu-pool-whole")
    await wait_until(lambda: ext.sampler.reading(a) is not None and ext.sampler.reading(b) is not None, 60,
                     what="readings of both")
    await passes(ext, 3)  # passes judge both active; nothing is due

    ScriptedReadings.set(memory=12 * GiB, utilization=60.0)  # a is over its 10 GiB; b's 40 GiB GPU is not
    await wait_until(lambda: lease_of(pool_home, a).state == RELEASED, 120, what="a shut down for its memory")
    assert lease_of(pool_home, b).state == "active"
    ScriptedReadings.set(memory=12 * GiB, utilization=0.0)  # b's loop ended: memory held, GPU idle
    await wait_until(lambda: lease_of(pool_home, b).state == RELEASED, 120, what="b shut down, GPU idle")
    await passes(ext)  # the last pass writes the trace

    live, _ = live_decisions(pool_home)
    assert [x[1:] for x in live[a]] == [("warn", "over_memory", "shutdown"), ("act", "over_memory", "shutdown")]
    assert [x[1:] for x in live[b]] == [("warn", "gpu_idle", "shutdown"), ("act", "gpu_idle", "shutdown")]

    _, replay = export_and_replay(tmp_path)
    [result] = replay["configurations"][0]["results"]
    assert_same_decisions(live, replayed_by_kernel(result))
    assert result["shut_down"] == 2 and replay["recorded"]["agrees"], replay["recorded"]


@pytest.mark.policy(rules=[{"name": "keep", "slice_at": "start",
                            "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
                            "action": "hibernate"}])
async def test_a_hibernation_its_user_asked_for_is_replayed_when_they_asked(jp_fetch, jp_ws_fetch, ext, pool_home,
                                                                            tmp_path):
    """Release GPU on an idle kernel, then a cell that wakes it: the replay hibernates it when its user
    asked (the policy never would) and resumes it for the cell; neither is a decision of the policy's."""
    kid = await start_kernel(jp_fetch, "gpu-pool-small")
    tab = await execute(jp_ws_fetch, kid, "x = 1")
    km = ext.serverapp.kernel_manager
    await wait_until(lambda: any(e.kind == "allocated" for e in pool_home.ledger().journal()), 60)
    await passes(ext)
    await wait_until(lambda: km.get_kernel(kid).execution_state == "idle", 60, what="idle")
    asked = time.time()
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "release", method="POST", body="{}")
    assert r.code == 202 and body(r)["action"] == "hibernate"
    await wait_until(lambda: lease_of(pool_home, kid).state == HIBERNATED, 60, what="hibernated at its user's request")
    await passes(ext)
    tab.close()
    tab = await execute(jp_ws_fetch, kid, "y = 2")  # wakes it
    await wait_until(lambda: lease_of(pool_home, kid).state == "active" and not lease_of(pool_home, kid).phase, 60,
                     what="resumed")
    await passes(ext, 3)
    tab.close()
    await jp_fetch("api", "kernels", kid, method="DELETE")
    await wait_until(lambda: lease_of(pool_home, kid).state == RELEASED, 60, what="shut down by its user")
    await passes(ext)

    trace, replay = export_and_replay(tmp_path)
    [request] = [e for e in map(json.loads, trace.read_text().splitlines()[1:-1]) if e["e"] == "act"]
    assert (request["r"], request["a"]) == ("user", "hibernate") and asked <= request["t"] <= asked + INTERVAL
    [result] = replay["configurations"][0]["results"]
    assert result["hibernated"] == 1 and result["requested_by_users"] == 1 and result["resumed"] == 1
    assert result["decisions"] == [] and result["shut_down"] == 0
    assert replay["recorded"]["agrees"] and replay["recorded"]["matched"] == 0, replay["recorded"]


RECLAIM_POLICY = [  # candidates for a waiter after 3 s idle (60 s × 0.05); warned 2 s ahead
    {"name": "small", "slice_at": "start",
     "match": {"profile": "small"}, "idle_timeout": 60, "pressure_factor": 0.05, "warn": 2,
     "gpu_idle_timeout": None, "action": "hibernate", "max_hibernated": None},
    {"name": "whole", "slice_at": "start",
     "match": {"profile": "whole"}, "idle_timeout": 600, "pressure_factor": 0.005, "warn": 2,
     "gpu_idle_timeout": None, "action": "hibernate", "max_hibernated": None},
]


@pytest.mark.policy(rules=RECLAIM_POLICY)
@pytest.mark.pool_settings(start_queue_timeout=120)
@pytest.mark.slow
async def test_a_replay_reclaims_for_a_waiter_what_the_live_pool_reclaimed(jp_fetch, ext, pool_home, tmp_path):
    """The pool full of idle kernels (a whole GPU; four 10 GiB slices on the other), all candidates, and a
    start that queues for 10 GiB: the live culler takes back one 10 GiB kernel, the longest idle (warned,
    reason pressure, then hibernated; not the whole GPU), and the start gets its slice.  The replay of the
    recorded trace chooses the same kernel (pool.reclaim), the same decisions within a pass, nobody else."""
    whole = await start_kernel(jp_fetch, "gpu-pool-whole")
    small = [await start_kernel(jp_fetch, "gpu-pool-small") for _ in range(4)]
    assert len({lease_of(pool_home, k).gpus for k in small}) == 1  # GPU 0 (or 1) full, the whole GPU the other
    await asyncio.sleep(4)  # all idle long enough to be candidates; nobody waits: nothing is warned
    assert not [e for e in pool_home.ledger().journal() if e.kind == "warned"]

    waiter = await asyncio.wait_for(start_kernel(jp_fetch, "gpu-pool-small"), 60)  # queued, then served
    await passes(ext, 3)  # more passes: nothing more is taken back once it is served
    for kid in (whole, *small, waiter):
        await jp_fetch("api", "kernels", kid, method="DELETE")
    await passes(ext)  # the last pass writes the trace

    live, refused = live_decisions(pool_home)
    [taken] = live  # one kernel, a 10 GiB one (which: the longest idle by jupyter_server's last activity)
    assert taken in small and refused == []
    assert [x[1:] for x in live[taken]] == [("warn", "pressure", "hibernate"), ("act", "pressure", "hibernate")]

    _, replay = export_and_replay(tmp_path)
    [result] = replay["configurations"][0]["results"]
    assert_same_decisions(live, replayed_by_kernel(result))
    assert result["hibernated"] == 1 and result["shut_down"] == 0
    assert replay["recorded"]["agrees"], replay["recorded"]


FIRST_CELL_POLICY = [{"name": "lab", "slice_at": "first-cell", "idle_timeout": 4, "gpu_idle_timeout": None,
                      "warn": 1.5, "action": "hibernate", "max_hibernated": None}]
FREE = Costs(hibernate=Cost(0.0, 0.0), resume=Cost(0.0, 0.0))  # declared GPUs: nothing is moved


def live_held(pool_home, kernel_id: str, share: float) -> float:
    """GPU-seconds the live pool held for the kernel, from its journal: each span from its slice taken
    (allocated, resumed) to its slice given back (hibernated, released)."""
    held, since = 0.0, None
    for e in sorted((e for e in pool_home.ledger().journal(limit=10_000) if e.kernel_id == kernel_id),
                    key=lambda e: e.seq):
        if e.kind in ("allocated", "resumed") and since is None:
            since = e.at
        elif e.kind in ("hibernated", "released") and since is not None:
            held, since = held + (e.at - since) * share, None
    return held


@pytest.mark.policy(rules=FIRST_CELL_POLICY)
@pytest.mark.slow
async def test_a_replay_of_first_cell_kernels_holds_what_the_live_pool_held(jp_fetch, jp_ws_fetch, ext, pool_home,
                                                                            tmp_path):
    """slice_at first-cell, live and replayed: a kernel opened and never run holds nothing in either; a
    kernel's first cell takes its slice in both (an ask of a first cell), it is hibernated for being idle
    and a cell wakes it; the same decisions within a pass, and the same GPU-seconds held."""
    reader = await start_kernel(jp_fetch, "gpu-pool-small")  # opened to read: never runs a cell
    worker = await start_kernel(jp_fetch, "gpu-pool-small")
    await asyncio.sleep(4 * INTERVAL)  # longer than the idle timeout: a kernel without a slice is not judged
    assert lease_of(pool_home, reader).awaits_first_cell and lease_of(pool_home, worker).awaits_first_cell
    tab = await execute(jp_ws_fetch, worker, "x = 1")  # its first cell takes a slice
    await wait_until(lambda: not lease_of(pool_home, worker).awaits_first_cell, 60, what="worker's first slice")
    await wait_until(lambda: lease_of(pool_home, worker).state == HIBERNATED, 120, what="worker hibernated")
    tab.close()
    await asyncio.sleep(2 * INTERVAL)
    tab = await execute(jp_ws_fetch, worker, "y = 2")  # wakes it
    await wait_until(lambda: lease_of(pool_home, worker).state == "active" and not lease_of(pool_home, worker).phase,
                     60, what="worker resumed")
    await asyncio.sleep(INTERVAL)
    tab.close()
    for kid in (reader, worker):
        await jp_fetch("api", "kernels", kid, method="DELETE")
    await wait_until(lambda: lease_of(pool_home, worker).state == RELEASED, 60, what="worker shut down")
    await passes(ext)  # the last pass writes the trace

    live, refused = live_decisions(pool_home)
    assert list(live) == [worker] and refused == []
    assert [x[1:] for x in live[worker]] == [("warn", "idle", "hibernate"), ("act", "idle", "hibernate")]
    assert not [e for e in pool_home.ledger().journal() if e.kernel_id == reader and e.kind == "allocated"]
    share = 10 / 40  # a 10 GiB slice of a 40 GiB GPU
    held = live_held(pool_home, worker, share)
    assert held > 0

    trace, result = export_and_replay(tmp_path, "--hibernate-cost", "0,0", "--resume-cost", "0,0")
    [config] = result["configurations"]
    [r] = config["results"]
    assert r["started_without_slice"] == 2, r
    assert r["wait_seconds"].get("first-cells") == 1, (r, trace.read_text())
    assert "starts" not in r["wait_seconds"]  # neither took a slice at start
    assert (r["hibernated"], r["resumed"], r["shut_down"]) == (1, 1, 0)
    assert_same_decisions(live, replayed_by_kernel(r))
    assert result["recorded"]["agrees"], result["recorded"]

    # GPU-seconds held: the worker's, within a culling pass of the live pool's; the reader's, none
    workload = tracefile.to_workload(tracefile.read(tracefile.lines_of(str(trace)), str(trace)))
    settings = load_settings()
    plan = Configuration.of("live", settings, settings.declared)
    tally = replay(workload, plan, plan.gpus, costs=FREE)
    assert tally.unsliced == 2
    assert tally.held_seconds == pytest.approx(held, abs=2 * INTERVAL * share)
    at_start = replay(workload, plan.with_policy("start", type(plan.policy)(rules=tuple(
        r.__class__(**{**r.__dict__, "slice_at": "start"}) for r in plan.policy.rules))), plan.gpus, costs=FREE)
    assert at_start.held_seconds > tally.held_seconds + 4 * INTERVAL * share  # the reader held from its start


AFTER_CELL_POLICY = [{"name": "cells", "slice_at": "first-cell", "idle_timeout": None, "gpu_idle_timeout": None,
                      "max_hibernated": None, "action": "hibernate", "hibernate_after_cell": "2s"}]


async def cell(ws, code: str) -> None:
    """Run ``code`` on the kernel's open websocket as JupyterLab runs a cell, and wait for its reply (a
    hibernated kernel is resumed first)."""
    msg_id = uuid.uuid4().hex
    await ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "alice", "session": uuid.uuid4().hex,
                   "date": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    while True:
        raw = await asyncio.wait_for(ws.read_message(), 60)
        assert raw is not None, "the kernel's websocket closed"
        if isinstance(raw, str):
            msg = json.loads(raw)
            if msg.get("msg_type") == "execute_reply" and msg["parent_header"].get("msg_id") == msg_id:
                assert msg["content"]["status"] == "ok", msg["content"]
                return


@pytest.mark.policy(rules=AFTER_CELL_POLICY)
@pytest.mark.slow
async def test_a_replay_hibernates_after_cells_where_the_live_pool_did(jp_fetch, jp_ws_fetch, ext, pool_home,
                                                                       tmp_path):
    """hibernate_after_cell: 2s, first-cell slices on declared GPUs, replayed with the default costs: one
    kernel runs cells with pauses longer than 2 s (it sleeps after each; its next cell wakes it) and shorter
    (it stays awake), another runs two cells 1 s apart and is shut down within 2 s of the last (it never
    sleeps).  The replay hibernates the same kernel after the same cells, each within a culling pass of the
    live server, and charges no checkpoint or restore (its kernels are recorded declared)."""
    a = await start_kernel(jp_fetch, "gpu-pool-small")
    b = await start_kernel(jp_fetch, "gpu-pool-small")
    await passes(ext)  # both seen without a slice
    tab = await jp_ws_fetch("api", "kernels", a, "channels")
    await cell(tab, "x = 1")  # takes its slice
    await wait_until(lambda: lease_of(pool_home, a).state == HIBERNATED and not lease_of(pool_home, a).phase, 30,
                     what="a asleep after its first cell")
    await asyncio.sleep(2 * INTERVAL)  # a pause longer than 2 s
    await cell(tab, "import time; time.sleep(0.5)")  # wakes it
    for _ in range(2):  # pauses shorter than 2 s: it stays on its GPU
        await asyncio.sleep(1.0)
        assert lease_of(pool_home, a).state == "active"
        await cell(tab, "time.sleep(0.3)")
    await wait_until(lambda: lease_of(pool_home, a).state == HIBERNATED and not lease_of(pool_home, a).phase, 30,
                     what="a asleep after its last cell")
    await asyncio.sleep(2 * INTERVAL)
    other = await jp_ws_fetch("api", "kernels", b, "channels")
    await cell(other, "y = 1")
    await asyncio.sleep(1.0)
    await cell(other, "y += 1")
    await asyncio.sleep(0.5)
    other.close()
    await jp_fetch("api", "kernels", b, method="DELETE")  # within 2 s of its last cell
    tab.close()
    await jp_fetch("api", "kernels", a, method="DELETE")
    await wait_until(lambda: all(lease_of(pool_home, k).state == RELEASED for k in (a, b)), 60, what="shut down")
    await passes(ext)  # the last pass writes the trace

    live, refused = live_decisions(pool_home)
    assert list(live) == [a] and refused == []
    assert [x[1:] for x in live[a]] == [("act", "after_cell", "hibernate")] * 2

    trace, replay = export_and_replay(tmp_path)  # the default costs: a declared kernel's cost nothing
    [r] = replay["configurations"][0]["results"]
    assert_same_decisions(live, replayed_by_kernel(r))
    assert (r["hibernated"], r["hibernated_after_cell"], r["resumed"], r["shut_down"]) == (2, 2, 1, 0), r
    assert r["resume_delay_seconds"]["max"] == 0.0, r  # nothing moved: no restore to wait for
    assert replay["recorded"]["agrees"], replay["recorded"]


# The slice taken at start: a first cell's wait for its slice (seconds on a loaded machine) is the first-cell
# test's; the trace samples it as a use that ended at the request, which would start the replay's after-cell
# wait before the live one (see the note in docs/planning.md).
HINT_POLICY = [{**AFTER_CELL_POLICY[0], "slice_at": "start"}]


@pytest.mark.policy(rules=HINT_POLICY)
@pytest.mark.extension(hint_sleep_after=2.5)
@pytest.mark.slow
async def test_a_replay_wakes_a_kernel_on_its_recorded_hint_and_puts_it_back_to_sleep_unused(
        jp_fetch, jp_ws_fetch, ext, pool_home, tmp_path):
    """A kernel asleep after its cell; its user opens its notebook (a hint: POST .../hint) and runs no cell,
    so it sleeps again after hint_sleep_after (2.5 s, hint_unused); a later cell wakes it and it sleeps after
    it.  The trace says which resume a hint started and its hold: the replay wakes the kernel then (no cell,
    nobody waited) and puts it back to sleep unused, the same decisions within a pass."""
    a = await start_kernel(jp_fetch, "gpu-pool-small")
    tab = await jp_ws_fetch("api", "kernels", a, "channels")
    await cell(tab, "x = 1")
    await wait_until(lambda: lease_of(pool_home, a).state == HIBERNATED and not lease_of(pool_home, a).phase, 30,
                     what="asleep after its cell")
    await asyncio.sleep(2 * INTERVAL)
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", a, "hint", method="POST", body="{}")
    assert r.code == 202 and body(r)["woken"] is True
    await wait_until(lambda: any(e.kind == "hibernated" and e.reason == "hint_unused"
                                 for e in pool_home.ledger().journal()), 30, what="asleep again, unused")
    await asyncio.sleep(2 * INTERVAL)
    await cell(tab, "y = 2")  # wakes it
    await wait_until(lambda: len([e for e in pool_home.ledger().journal() if e.kind == "hibernated"
                                  and e.detail.get("source") == "policy"]) == 3, 30, what="asleep after the cell")
    tab.close()
    await jp_fetch("api", "kernels", a, method="DELETE")
    await wait_until(lambda: lease_of(pool_home, a).state == RELEASED, 60, what="shut down")
    await passes(ext)  # the last pass writes the trace

    live, _ = live_decisions(pool_home)
    assert [x[1:] for x in live[a]] == [("act", "after_cell", "hibernate"), ("act", "hint_unused", "hibernate"),
                                        ("act", "after_cell", "hibernate")]
    trace, replay = export_and_replay(tmp_path)
    [hint] = [e for e in map(json.loads, trace.read_text().splitlines()[1:-1])
              if e["e"] == "restored" and e.get("r") == "hint"]
    assert hint["hold"] == 2.5
    [r] = replay["configurations"][0]["results"]
    assert_same_decisions(live, replayed_by_kernel(r))
    assert r["hints"] == {"resumed": 1, "unused": 1, "skipped": 0} and r["resumed"] == 2, r
    assert r["resume_delay_seconds"]["max"] == 0.0  # declared: nothing to restore, for the cell or the hint
    assert replay["recorded"]["agrees"], replay["recorded"]
