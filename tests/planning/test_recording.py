"""Recording the activity trace: what a real server writes (and never: code or output), switching it
off, retention, and who may record and export what through the pool service."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from planning_helpers import GiB, jupyter, passes, simulate_json
from server_helpers import ScriptedReadings, execute, start_kernel, wait_until

from jupyter_gpu_pool.config import GPUPool
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.pool import Inventory, LocalPool
from jupyter_gpu_pool.devices.nvml import Discovery
from jupyter_gpu_pool.planning import tracefile
from jupyter_gpu_pool.pool import RELEASED
from jupyter_gpu_pool.pool.gpus import parse_inventory
from jupyter_gpu_pool.pool.trace import MAX_LIST, MAX_TEXT, TraceEvent, clipped
from jupyter_gpu_pool.service.identity import Caller, Peer
from jupyter_gpu_pool.service.operations import MAX_TRACE_EVENTS
from jupyter_gpu_pool.service.server import PoolService

SECRET = "SECRET-7f3a"
SHORT = [{"name": "short", "slice_at": "start",
          "idle_timeout": 30, "gpu_idle_timeout": None, "warn": 27, "snooze": 20, "max_snoozes": 1}]


def exported(tmp_path) -> list[dict]:
    out = tmp_path / "trace.jsonl"
    done = jupyter("trace", "export", "--since", "2h", "--output", str(out))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["format"] == "jupyter-gpu-pool-trace" and lines[-1] == {"end": True, "events": len(lines) - 2}
    return lines[1:-1]


@pytest.mark.usefixtures("ext")
@pytest.mark.policy(rules=SHORT)
async def test_a_server_records_its_kernels_activity_and_never_their_code_or_output(jp_fetch, jp_ws_fetch, ext,
                                                                                    pool_home, tmp_path):
    ScriptedReadings.set(memory=3 * GiB, utilization=60.0)
    kid = await start_kernel(jp_fetch, "gpu-pool-small")
    ws = await execute(jp_ws_fetch, kid, f"import time; time.sleep(2.5); print('{SECRET}')")
    km = ext.serverapp.kernel_manager
    await wait_until(lambda: km.get_kernel(kid).execution_state == "busy", 60, what="busy")
    await wait_until(lambda: km.get_kernel(kid).execution_state == "idle", 60, what="idle again")
    ScriptedReadings.set(memory=3 * GiB, utilization=0.0)
    await wait_until(lambda: any(e.kind == "warned" and e.kernel_id == kid for e in pool_home.ledger().journal()),
                     120, what="warned")
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "snooze", method="POST",
                       body=json.dumps({"seconds": 10}))
    assert r.code == 200
    ws.close()
    await jp_fetch("api", "kernels", kid, method="DELETE")
    await wait_until(lambda: pool_home.ledger().get(_lease_id(pool_home, kid)).state == RELEASED, 60, what="released")
    await wait_until(lambda: _ended_in_trace(pool_home, kid), 60, what="the end on the trace")

    events = exported(tmp_path)
    text = json.dumps(events)
    assert SECRET not in text and "sleep" not in text and "print" not in text
    mine = [e for e in events if e["k"] == kid]
    kinds = [e["e"] for e in mine]
    for kind in ("start", "kernel", "busy", "idle", "gpu", "warn", "snooze", "end"):
        assert kind in kinds, (kind, kinds)
    assert kinds.index("start") < kinds.index("busy") < kinds.index("idle") < kinds.index("end")
    kernel = next(e for e in mine if e["e"] == "kernel")
    assert kernel["p"] == "small" and kernel["s"] == "gpu-pool-small" and kernel["u"] == "alice"
    assert kernel["declared"] is True and kernel["grid"][1] == 1.0
    readings = [(e["mem"], e["util"]) for e in mine if e["e"] == "gpu"]
    assert (3 * GiB, 60.0) in readings and readings[-1] == (3 * GiB, 0.0)  # the threshold crossed: written at once
    snooze = next(e for e in mine if e["e"] == "snooze")
    assert snooze["until"] == pytest.approx(snooze["t"] + 10, abs=0.5)
    busy, idle = (next(e["t"] for e in mine if e["e"] == k) for k in ("busy", "idle"))
    assert 2.0 <= idle - busy <= 4.0  # the cell's 2.5 s, as jupyter_server saw them


def _lease_id(pool_home, kid):
    return next(lease.id for lease in pool_home.ledger().leases(states=("active", "hibernated", "released"))
                if lease.kernel_id == kid)


def _ended_in_trace(pool_home, kid) -> bool:
    events, _ = pool_home.ledger().trace_export(limit=10_000)
    return any(e.kind == "end" and e.kernel_id == kid for e in events)


@pytest.mark.pool_settings(trace_recording=False)
@pytest.mark.extension(cull_interval=0.3)
async def test_with_recording_off_nothing_is_written(jp_fetch, ext, pool_home, tmp_path):
    kid = await start_kernel(jp_fetch, "gpu-pool-small")
    await wait_until(lambda: any(e.kind == "allocated" and e.kernel_id == kid for e in pool_home.ledger().journal()),
                     60)
    await jp_fetch("api", "kernels", kid, method="DELETE")
    await passes(ext, 5)  # passes go on, and write nothing
    assert pool_home.ledger().trace_export(limit=100) == ([], None)
    assert exported(tmp_path) == []


MANY_GROUPS = {f"lab{i:02d}": ["alice"] for i in range(70)}


@pytest.mark.usefixtures("ext")
@pytest.mark.pool_settings(group_members={"students": ["alice"], **MANY_GROUPS})
@pytest.mark.policy(rules=[{"name": "lab69", "slice_at": "start",
                            "match": {"group": "lab69"}, "idle_timeout": 3, "gpu_idle_timeout": None,
                            "warn": 1, "action": "shutdown"}])
async def test_a_user_in_71_groups_and_a_long_failure_message_are_recorded_as_a_trace_that_replays(
        jp_fetch, ext, pool_home, tmp_path, monkeypatch):
    """More groups than a trace event holds (the ones the policy names are kept) and a hibernator's
    failure message longer than a text field: the export is read and replayed, with the same decisions."""
    def broken(lease):
        raise RuntimeError("cuCheckpointProcessLock returned 999: " + "driver detail, " * 40)

    monkeypatch.setattr(ext.hibernator, "can_hibernate", broken)
    kid = await start_kernel(jp_fetch, "gpu-pool-small")
    await wait_until(lambda: _ended_in_trace(pool_home, kid), 120, what="culled by rule lab69, on the trace")

    events = exported(tmp_path)
    kernel = next(e for e in events if e["e"] == "kernel" and e["k"] == kid)
    start = next(e for e in events if e["e"] == "start" and e["k"] == kid)
    for event in (kernel, start):
        assert len(event["g"]) == MAX_LIST and "lab69" in event["g"], event["g"]
    assert kernel["why"].startswith("the hibernator failed: cuCheckpointProcessLock returned 999: driver detail")
    assert len(kernel["why"]) == MAX_TEXT and kernel["hib"] is False
    replay = simulate_json("--trace", str(tmp_path / "trace.jsonl"), "--decisions")
    [result] = replay["configurations"][0]["results"]
    assert [(d["verb"], d["reason"], d["action"]) for d in result["decisions"] if d["kernel"] == kid] == [
        ("warn", "idle", "shutdown"), ("act", "idle", "shutdown")]  # rule lab69 matched: its group was kept
    assert replay["recorded"]["agrees"], replay["recorded"]


@pytest.mark.policy(rules=[{"name": "lab", "slice_at": "first-cell", "idle_timeout": None, "gpu_idle_timeout": None,
                            "max_hibernated": None, "action": "hibernate"}])
@pytest.mark.extension(cull_interval=0.3)
async def test_a_first_cell_kernel_is_recorded_again_with_its_slice_declared_and_able_to_hibernate(
        jp_fetch, jp_ws_fetch, ext, pool_home, tmp_path):
    """A kernel seen before its first cell holds no GPU: its first ``kernel`` event says so (it cannot
    hibernate: nothing to move) and that the GPUs it can take, the pool's, are declared.  Once its first
    cell took a slice, the recorder writes it again, declared and able to hibernate, and the replay reads
    it so: a declared kernel, whose hibernations and resumes cost nothing."""
    kid = await start_kernel(jp_fetch, "gpu-pool-small")
    await wait_until(lambda: any(e.kind == "kernel" and e.kernel_id == kid
                                 for e in pool_home.ledger().trace_export(limit=10_000)[0]), 60, what="seen")
    tab = await execute(jp_ws_fetch, kid, "x = 1")  # its first cell takes a slice
    await wait_until(lambda: not _lease(pool_home, kid).awaits_first_cell, 60, what="its first slice")
    await wait_until(lambda: sum(e.kind == "kernel" and e.kernel_id == kid
                                 for e in pool_home.ledger().trace_export(limit=10_000)[0]) == 2, 60,
                     what="seen again with its slice")
    await passes(ext, 5)  # more passes: written twice only
    tab.close()
    await jp_fetch("api", "kernels", kid, method="DELETE")
    await wait_until(lambda: _ended_in_trace(pool_home, kid), 60, what="the end on the trace")

    events = [e for e in exported(tmp_path) if e["k"] == kid]
    kinds = [e["e"] for e in events]
    seen = [i for i, kind in enumerate(kinds) if kind == "kernel"]
    assert len(seen) == 2 and seen[0] < kinds.index("start") < seen[1], kinds  # again after its slice was taken
    first, again = (e for e in events if e["e"] == "kernel")
    assert (first["hib"], first["declared"]) == (False, True) and "holds no GPU" in first["why"]
    assert (again["hib"], again["why"], again["declared"]) == (True, None, True)
    assert {k: v for k, v in again.items() if k not in ("t", "hib", "why", "declared")} == \
        {k: v for k, v in first.items() if k not in ("t", "hib", "why", "declared")}

    trace = tmp_path / "trace.jsonl"
    [session] = tracefile.to_workload(tracefile.read(tracefile.lines_of(str(trace)), str(trace))).sessions
    assert (session.can_hibernate, session.why, session.declared) == (True, None, True)


def _lease(pool_home, kid):
    return next(lease for lease in pool_home.ledger().leases(states=("active", "hibernated", "released"))
                if lease.kernel_id == kid)


def test_old_events_go_after_the_retention(tmp_path):
    now = [1_700_000_000.0]
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=lambda: now[0])
    ledger.trace_record([TraceEvent(now[0] - 40 * 86400, "busy", "old", "alice"),
                         TraceEvent(now[0] - 5 * 86400, "busy", "recent", "alice")], keep=30 * 86400)
    assert [e.kernel_id for e in ledger.trace_export()[0]] == ["recent"]
    ledger.trace_record([TraceEvent(now[0] - 31 * 86400, "busy", "late", "alice")], keep=30 * 86400)
    now[0] += 7200  # pruned at most once an hour
    ledger.trace_record([TraceEvent(now[0], "idle", "recent", "alice")], keep=30 * 86400)
    assert [e.kernel_id for e in ledger.trace_export()[0]] == ["recent", "recent"]


def test_export_pages_in_time_order(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.trace_record([TraceEvent(1e9 + i % 3, "busy", f"k{i}", "alice") for i in range(7)])
    seen, after = [], None
    while True:
        page, after = ledger.trace_export(limit=3, after=after)
        seen += page
        if after is None:
            break
    assert [e.at for e in seen] == sorted(e.at for e in seen) and len({e.kernel_id for e in seen}) == 7


class _Service:
    """The pool service's request handler on a ledger of its own, as callers the service has identified."""

    def __init__(self, tmp_path, **settings):
        from traitlets.config import Config

        config = GPUPool(config=Config({"GPUPool": {"ledger_path": str(tmp_path / "ledger.sqlite"),
                                                    "gpu_discovery": "declared", **settings}})).check()
        gpus = parse_inventory([{"name": "GPU", "memory": "40GiB"}])
        self.pool = LocalPool(config, Inventory(gpus, Discovery(gpus=gpus), "declared"))
        self.service = PoolService(self.pool, identities=None)

    def ask(self, user: str, op: str, admin: bool = False, **args) -> dict:
        line = json.dumps({"id": 1, "op": op, "args": args}).encode() + b"\n"
        caller = Caller(user=user, groups=(), admin=admin, uid=1000)
        return asyncio.run(self.service.handle(caller, Peer(pid=1, uid=1000, gid=1000), line))


def test_through_the_service_users_record_and_export_their_own_and_admins_all(tmp_path):
    box = _Service(tmp_path)
    t = time.time()
    alice = [{"t": t + i, "e": "busy", "k": "ka", "u": "alice"} for i in range(3)]
    assert box.ask("alice", "trace_record", events=alice)["result"] == 3
    assert box.ask("bob", "trace_record", events=[{"t": t, "e": "idle", "k": "kb"}])["result"] == 1  # u: his
    refused = box.ask("bob", "trace_record", events=[{"t": t, "e": "idle", "k": "ka", "u": "alice"}])
    assert refused["error"]["reason"] == "not_yours"
    bad = box.ask("alice", "trace_record", events=[alice[0], {"t": -1, "e": "busy", "k": "ka"}])
    assert bad["error"]["reason"] == "bad_request" and "events[1]: 't' must be a time" in bad["error"]["message"]
    batch = [{"t": t, "e": "busy", "k": "ka"}] * (MAX_TRACE_EVENTS + 1)
    too_many = box.ask("alice", "trace_record", events=batch)
    assert too_many["error"]["reason"] == "bad_request" and \
        f"at most {MAX_TRACE_EVENTS} trace events" in too_many["error"]["message"]
    assert len(box.pool.ledger.trace_export()[0]) == 4  # the refused requests wrote nothing

    def owners(user, admin=False, **args):
        reply = box.ask(user, "trace_export", admin=admin, **args)
        return sorted({e["u"] for e in reply["result"]["events"]})

    assert owners("alice") == ["alice"] and owners("bob") == ["bob"]
    assert box.ask("bob", "trace_export", owner="alice")["error"]["reason"] == "not_yours"
    assert owners("root", admin=True) == ["alice", "bob"] and owners("root", admin=True, owner="bob") == ["bob"]
    page = box.ask("alice", "trace_export", limit=2)["result"]
    assert len(page["events"]) == 2 and page["next"] is not None
    rest = box.ask("alice", "trace_export", after=page["next"])["result"]
    assert len(rest["events"]) == 1 and rest["next"] is None
    assert box.ask("alice", "trace_export", after=["x", 1])["error"]["reason"] == "bad_request"


def test_the_service_takes_what_the_recorder_clips_where_it_refuses_the_whole_batch_unclipped(tmp_path):
    box = _Service(tmp_path)
    t = time.time()
    long = TraceEvent(t, "kernel", "ka", "alice", {"p": "small", "g": [f"g{i:02d}" for i in range(70)],
                                                   "why": "the hibernator failed: " + "x" * 300, "hib": False})
    batch = [TraceEvent(t, "busy", "ka", "alice"), long]
    refused = box.ask("alice", "trace_record", events=[e.to_dict() for e in batch])
    assert refused["error"]["reason"] == "bad_request" and "events[1]" in refused["error"]["message"]
    assert box.ask("alice", "trace_record", events=[clipped(e).to_dict() for e in batch])["result"] == 2
    kept = box.pool.ledger.trace_export()[0][1]
    assert len(kept.data["g"]) == MAX_LIST and len(kept.data["why"]) == MAX_TEXT


def test_the_service_keeps_no_trace_where_its_admin_turned_recording_off(tmp_path):
    box = _Service(tmp_path, trace_recording=False)
    assert box.ask("alice", "trace_record", events=[{"t": 1e9, "e": "busy", "k": "ka"}])["result"] == 0
    assert box.pool.ledger.trace_export() == ([], None)
