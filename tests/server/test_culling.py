"""The idle policy in a real jupyter_server with real kernels, short timeouts, events over the websocket."""

from __future__ import annotations

import asyncio
import datetime
import json
import time

import pytest
from server_helpers import (
    GatedHibernator,
    GiB,
    LedgerOnlyHibernator,
    ScriptedReadings,
    body,
    execute,
    kernel_ids,
    start_kernel,
    subscribe,
    wait_until,
)

from jupyter_gpu_pool.pool import HIBERNATED, RELEASED
from jupyter_gpu_pool.server_extension.culler import SERVER_CULLER_EXEMPT

pytestmark = pytest.mark.usefixtures("ext")

ME = ("gpu-pool", "api", "v1", "me")


def journal(pool_home, kernel_id: str) -> list:
    entries = pool_home.ledger().journal(limit=500)
    return [e for e in reversed(entries) if e.kernel_id == kernel_id]


def lease_of(pool_home, kernel_id: str):
    leases = pool_home.ledger().leases(states=("active", "hibernated", "released"))
    return next(lease for lease in leases if lease.kernel_id == kernel_id)


def my_kernel(me: dict, kernel_id: str) -> dict:
    return next(k for k in me["kernels"] if k["kernel_id"] == kernel_id)


async def gone(jp_fetch, kernel_id):
    return kernel_id not in await kernel_ids(jp_fetch)


@pytest.mark.policy(rules=[{"name": "short", "idle_timeout": 3, "gpu_idle_timeout": None, "warn": 1.5}])
@pytest.mark.extension(hibernator_class=None)
async def test_idle_kernel_is_warned_then_culled_and_its_lease_released(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)

    warned = await events.pool_action("warned", kid)
    assert warned["reason"] == "idle" and warned["user"] == "alice" and warned["profile"] == "small"
    assert warned["deadline"] >= time.time() + 0.5 and warned["dry_run"] is False
    warning = my_kernel(body(await jp_fetch(*ME)), kid)["warning"]
    # (the kernel's own start-up messages may still count as activity: a warning withdrawn and given again)
    assert warning["reason"] == "idle" and warning["deadline"] >= warned["deadline"]
    assert warning["action"] == "shutdown"  # the rule says hibernate, but no hibernator is installed
    assert kid in await kernel_ids(jp_fetch)

    seen = await events.through("culled", kid)
    culled = seen[-1]
    assert culled["reason"] == "idle" and "hibernation unavailable" in culled["message"]
    last_warning = ([e for e in seen if e["action"] == "warned"] or [warned])[-1]
    await wait_until(lambda: gone(jp_fetch, kid), what="the culled kernel to be gone")
    lease = await wait_until(lambda: (lease := lease_of(pool_home, kid)).state == RELEASED and lease,
                             what="the lease released")
    assert lease.reason == "culled: idle (rule 'short')"
    kinds = [(e.kind, e.reason) for e in journal(pool_home, kid)]
    assert ("warned", "idle") in kinds and ("culled", "idle") in kinds and ("released", lease.reason) in kinds
    culled_entry = next(e for e in journal(pool_home, kid) if e.kind == "culled")
    assert culled_entry.at >= last_warning["deadline"]  # acted on no sooner than it said
    assert culled_entry.detail["note"].startswith("hibernation unavailable (no hibernator is installed")
    recent = body(await jp_fetch(*ME))["recent"]
    assert any(r["kind"] == "culled" and r["kernel_id"] == kid and r["reason"] == "idle" for r in recent)
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": 2, "gpu_idle_timeout": None, "warn": 1, "action": "shutdown"}])
async def test_busy_kernel_is_not_culled(jp_fetch, jp_ws_fetch, ext, pool_home, tmp_path):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    done = tmp_path / "done"  # trains without printing a thing, until the test has watched long enough
    ws = await execute(jp_ws_fetch, kid, f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.05)")
    km = ext.serverapp.kernel_manager
    await wait_until(lambda: km.get_kernel(kid).execution_state == "busy", what="the kernel busy")
    busy_at = time.time()
    await asyncio.sleep(5)  # well past idle_timeout + warn
    assert kid in await kernel_ids(jp_fetch)
    await events.drain()
    assert "culled" not in events.pool_actions(kid)
    # (a warning given while the kernel was still starting is withdrawn once it is busy)
    assert not [e for e in journal(pool_home, kid) if e.kind == "warned" and e.at > busy_at + 0.5]
    # once the cell is done, the idle clock starts from its end
    done.touch()
    await events.pool_action("culled", kid, timeout=60)
    ws.close()
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": None, "max_busy": 2, "warn": 1,
                            "action": "shutdown"}])
async def test_busy_kernel_past_max_busy_is_culled(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    ws = await execute(jp_ws_fetch, kid, "import time; time.sleep(120)")
    warned = await events.pool_action("warned", kid)
    assert warned["reason"] == "max_busy"
    culled = await events.pool_action("culled", kid)
    assert culled["reason"] == "max_busy"
    await wait_until(lambda: gone(jp_fetch, kid))
    assert (await wait_until(lambda: lease_of(pool_home, kid).state == RELEASED))
    ws.close()
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": 2, "gpu_idle_timeout": None, "warn": 1.5, "snooze": 6,
                            "max_snoozes": 1, "action": "shutdown"}])
async def test_snoozed_kernel_survives_its_snooze(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    # A kernel's start-up messages count as activity and, on a loaded machine, may come after a first
    # warning (which they rightly withdraw, giving snoozes back): settle it with a cell first, and take
    # the warning that follows the kernel's last activity.
    tab = await execute(jp_ws_fetch, kid, "pass")
    while json.loads(await tab.read_message())["header"]["msg_type"] != "execute_reply":
        pass
    tab.close()

    async def settled():
        model = body(await jp_fetch("api", "kernels", kid))
        return model["execution_state"] == "idle" and model["connections"] == 0 and model

    model = await wait_until(settled, what="the kernel idle after its cell, its tab closed")
    last = datetime.datetime.fromisoformat(model["last_activity"]).timestamp()
    await events.next(lambda e: e.get("action") == "warned" and e.get("kernel_id") == kid
                      and e["deadline"] >= last + 2 - 0.05)

    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "snooze", method="POST",
                       body=json.dumps({"seconds": 5}))
    snoozed = body(r)
    assert r.code == 200 and snoozed["kernel_id"] == kid
    assert snoozed["warning"] is None and "snooze" not in snoozed["actions"]
    until = snoozed["snoozed_until"]
    assert time.time() + 4 < until <= time.time() + 5.1
    event = await events.pool_action("snoozed", kid)
    assert event["reason"] == "user" and event["deadline"] == until
    events.received.clear()  # whatever came before the snooze

    with pytest.raises(Exception) as refused:  # one snooze only
        await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "snooze", method="POST", body="{}")
    assert refused.value.code == 409
    assert json.loads(refused.value.response.body)["reason"] == "no_snoozes_left"

    await asyncio.sleep(max(until - time.time() - 2, 0))
    assert kid in await kernel_ids(jp_fetch)  # survives its snooze (the journal shows when it went: below)
    seen = await events.through("culled", kid)
    assert [e["action"] for e in seen] == ["warned", "culled"]  # warned again, never acted on without warning
    assert seen[0]["deadline"] >= until - 0.01
    entries = [e for e in journal(pool_home, kid) if e.kind in ("warned", "snoozed", "culled")]
    assert [e.kind for e in entries][-3:] == ["snoozed", "warned", "culled"]
    assert [e.kind for e in entries].count("snoozed") == 1 and entries[-1].at >= until
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": 2, "warn": 1, "action": "shutdown"}])
async def test_gpu_idle_kernel_with_open_connection_is_culled(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    ScriptedReadings.set(memory=2 * GiB, utilization=0.0)  # holds GPU memory, does nothing with it
    kid = await start_kernel(jp_fetch)
    tab = await execute(jp_ws_fetch, kid, "x = 1")  # an open tab that ran a cell
    await wait_until(lambda: _connections(jp_fetch, kid), what="the connection counted")
    warned = await events.pool_action("warned", kid)
    assert warned["reason"] == "gpu_idle"
    culled = await events.pool_action("culled", kid)
    assert culled["reason"] == "gpu_idle" and "under 5% GPU use" in culled["message"]
    assert (await wait_until(lambda: lease_of(pool_home, kid).state == RELEASED))
    tab.close()
    events.close()


def _when(iso: str):
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


async def _connections(jp_fetch, kid) -> bool:
    kernels = body(await jp_fetch("api", "kernels"))
    return any(k["id"] == kid and k["connections"] >= 1 for k in kernels)


@pytest.mark.policy(rules=[{"idle_timeout": 2, "gpu_idle_timeout": 2, "warn": 1, "action": "shutdown"}])
async def test_gpu_use_keeps_the_kernel_and_the_server_active(jp_fetch, jp_ws_fetch, ext, pool_home):
    events = await subscribe(jp_ws_fetch)
    ScriptedReadings.set(memory=2 * GiB, utilization=80.0)  # training, printing nothing
    kid = await start_kernel(jp_fetch)
    await wait_until(lambda: ext.sampler.reading(kid) is not None, what="a reading")
    before = _when(body(await jp_fetch("api", "status"))["last_activity"])
    await asyncio.sleep(5)  # no request, no kernel message: only the GPU is busy
    after = _when(body(await jp_fetch("api", "status"))["last_activity"])
    assert (after - before).total_seconds() >= 3  # JupyterHub's idle culler sees the server active
    assert kid in await kernel_ids(jp_fetch)
    await events.drain()
    assert "culled" not in events.pool_actions(kid)
    assert not [e for e in journal(pool_home, kid) if e.kind == "warned" and e.at > time.time() - 4]
    k = my_kernel(body(await jp_fetch(*ME)), kid)
    assert k["utilization"]["current"] == 80.0 and k["memory_used"] == 2 * GiB
    assert len(k["utilization"]["samples"]) >= 5 and all(u == 80.0 for _, u in k["utilization"]["samples"])

    ScriptedReadings.set(memory=2 * GiB, utilization=0.0)  # the loop ended; the tab stays open
    culled = await events.pool_action("culled", kid)
    assert culled["reason"] in ("idle", "gpu_idle")
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": None, "over_memory_grace": 1.5,
                            "action": "shutdown"}])
async def test_soft_kernel_over_its_memory_is_warned_then_dealt_with(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    ScriptedReadings.set(memory=12 * GiB, utilization=50.0)  # the slice is 10 GiB
    kid = await start_kernel(jp_fetch)
    warned = await events.pool_action("warned", kid)
    assert warned["reason"] == "over_memory" and "12 GiB" in warned["message"]
    with pytest.raises(Exception) as refused:
        await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "snooze", method="POST", body="{}")
    assert refused.value.code == 409 and json.loads(refused.value.response.body)["reason"] == "over_memory"
    culled = await events.pool_action("culled", kid)
    assert culled["reason"] == "over_memory"
    assert (await wait_until(lambda: lease_of(pool_home, kid).state == RELEASED))
    events.close()


@pytest.mark.policy(rules=[{"name": "trial", "idle_timeout": 1, "gpu_idle_timeout": None, "warn": 0.5,
                            "action": "shutdown"}], dry_run=True)
async def test_dry_run_decides_and_reports_without_acting(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    warned = await events.pool_action("warned", kid)
    culled = await events.pool_action("culled", kid)
    assert warned["dry_run"] is True and culled["dry_run"] is True
    await asyncio.sleep(2)  # several more passes
    assert kid in await kernel_ids(jp_fetch)
    assert lease_of(pool_home, kid).state == "active"
    assert my_kernel(body(await jp_fetch(*ME)), kid)["warning"] is None  # users are not warned in a dry run
    entries = [e for e in journal(pool_home, kid) if e.kind in ("warned", "culled")]
    # Reported once per idle spell, not at every pass (a pass every 0.3 s: 6 in those 2 s).  Once, where the
    # kernel stayed idle; a CI run on a loaded machine saw a second spell (warned, culled) within the 2 s.
    kinds = [e.kind for e in entries]
    assert 1 <= kinds.count("culled") <= 2 and kinds.count("warned") == kinds.count("culled"), kinds
    assert entries[-1].kind == "culled"
    assert all(e.detail["dry_run"] and e.detail["rule"] == "trial" for e in entries)
    pool = body(await jp_fetch("gpu-pool", "api", "v1", "pool", headers={"Authorization": "token root-token"}))
    assert pool["policy"]["dry_run"] is True
    assert {(d["kind"], d["dry_run"]) for d in pool["decisions"] if d["kernel_id"] == kid} == {
        ("warned", True), ("culled", True)}
    assert not any(r["kernel_id"] == kid for r in body(await jp_fetch(*ME))["recent"])  # not the user's news
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": 600, "gpu_idle_timeout": None, "warn": 1, "pressure_factor": 0.002,
                            "action": "shutdown"}])
async def test_a_waiter_the_room_left_cannot_serve_reclaims_an_idle_kernel(jp_fetch, jp_ws_fetch, pool_home):
    """Someone waiting is no reason to take a kernel back while the room left serves them; where it cannot,
    an idle kernel (idle past 600 s x 0.002) is warned for them, with the rule's warning time, and its own
    idle clock never moved."""
    from jupyter_gpu_pool.pool import LeaseRequest, Profile, QuotaBook, SliceSpec

    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)  # 10 GiB on GPU 0 of 2 x 40 GiB
    ledger = pool_home.ledger()
    blocker = ledger.allocate(LeaseRequest(owner="dave", kernel_id="daves-kernel",  # all of GPU 1's 40 GiB
                                           profile=Profile("p", SliceSpec.parse("40GiB"), "soft", "p")), QuotaBook())
    assert blocker.gpus != lease_of(pool_home, kid).gpus
    waiter = ledger.enqueue("carol", "carols-kernel", "small", SliceSpec.parse("10GiB"))
    await asyncio.sleep(3)  # passes: GPU 0 has room for carol's 10 GiB
    assert not [e for e in journal(pool_home, kid) if e.kind == "warned"]
    assert my_kernel(body(await jp_fetch(*ME)), kid)["next_action"]["at"] > time.time() + 500
    ledger.dequeue(waiter.id)
    waiter = ledger.enqueue("carol", "carols-kernel", "whole", SliceSpec(whole=True))  # only GPU 0, emptied, serves
    started = time.time()
    warned = await events.pool_action("warned", kid, timeout=15)
    assert warned["reason"] == "pressure" and time.time() - started < 12
    assert warned["message"].startswith("Someone is waiting for a GPU slice")
    assert warned["deadline"] - time.time() > 0.5  # ~1 s ahead (the rule's warn), less the event's trip
    culled = await events.pool_action("culled", kid, timeout=15)
    assert culled["reason"] == "pressure"
    ledger.dequeue(waiter.id)
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": None}])
@pytest.mark.server(MappingKernelManager={"cull_idle_timeout": 1, "cull_interval": 1})
async def test_server_culler_leaves_pool_kernels_to_the_policy(jp_fetch, ext):
    pool_kid = await start_kernel(jp_fetch)
    plain_kid = await start_kernel(jp_fetch, "python3")
    await wait_until(lambda: gone(jp_fetch, plain_kid), timeout=60, what="jupyter_server culling the plain kernel")
    await asyncio.sleep(3)
    assert pool_kid in await kernel_ids(jp_fetch)
    spec = ext.serverapp.kernel_manager.get_kernel(pool_kid).kernel_spec
    assert spec.metadata["cull_idle_timeout"] == SERVER_CULLER_EXEMPT


@pytest.mark.policy(rules=[{"idle_timeout": 2, "gpu_idle_timeout": None, "warn": 1, "max_hibernated": 2,
                            "action": "hibernate"}])
@pytest.mark.extension(hibernator_class=LedgerOnlyHibernator)
async def test_hibernation_hook_then_max_hibernated_shuts_down(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    warned = await events.pool_action("warned", kid)
    assert "hibernated" in warned["message"]
    hibernated = await events.pool_action("hibernated", kid)
    assert hibernated["reason"] == "idle" and hibernated["duration"] == 0.01 and hibernated["bytes"] == 0
    assert LedgerOnlyHibernator.calls == [(kid, "idle")]
    assert lease_of(pool_home, kid).state == HIBERNATED
    k = my_kernel(body(await jp_fetch(*ME)), kid)
    assert k["state"] == "hibernated" and "resume" in k["actions"] and "release" not in k["actions"]
    assert k["gpus"] and k["memory_used"] is None
    warned = await events.pool_action("warned", kid)  # a hibernated kernel holds no GPU: never "GPU idle"
    assert warned["reason"] == "max_hibernated" and warned["deadline"] > time.time()
    culled = await events.pool_action("culled", kid)
    assert culled["reason"] == "max_hibernated"
    assert (await wait_until(lambda: lease_of(pool_home, kid).state == RELEASED))
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": 1, "gpu_idle_timeout": None, "warn": 0.5, "action": "hibernate"}])
@pytest.mark.extension(hibernator_class=GatedHibernator, cull_concurrency=2)
async def test_the_policy_carries_out_at_most_cull_concurrency_actions_at_once(jp_fetch, ext, pool_home):
    kids = [await start_kernel(jp_fetch) for _ in range(3)]
    context = ext.server_context
    # All three are decided (each shows as under way, so no pass decides it again) ...
    await wait_until(lambda: all(context.busy(kid) for kid in kids), 30, what="all three kernels due")
    passes = ext.culler.passes
    await wait_until(lambda: ext.culler.passes >= passes + 3, what="three more passes")
    # ... but only two hibernate while the gate holds them; the third waits its turn.
    assert GatedHibernator.in_flight == 2 and len(GatedHibernator.calls) == 0
    GatedHibernator.gate.set()
    await wait_until(lambda: all(lease_of(pool_home, kid).state == HIBERNATED for kid in kids), 30,
                     what="all three hibernated")
    assert GatedHibernator.most_in_flight == 2 and sorted(k for k, _ in GatedHibernator.calls) == sorted(kids)


@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": None, "action": "shutdown"}])
async def test_release_gives_the_slice_back_now(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "release", method="POST", body="{}")
    assert r.code == 202 and body(r) == {"action": "shutdown", "kernel_id": kid}
    released = await events.pool_action("released", kid)
    assert released["reason"] == "user"
    await wait_until(lambda: gone(jp_fetch, kid))
    lease = await wait_until(lambda: (lease := lease_of(pool_home, kid)).state == RELEASED and lease)
    assert lease.reason == "released by its user"
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": None}])
@pytest.mark.extension(hibernator_class=LedgerOnlyHibernator)
async def test_release_hibernates_where_the_rule_and_kernel_allow(jp_fetch, pool_home):
    kid = await start_kernel(jp_fetch)
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "release", method="POST", body="{}")
    assert body(r)["action"] == "hibernate"
    await wait_until(lambda: lease_of(pool_home, kid).state == HIBERNATED)
    assert kid in await kernel_ids(jp_fetch)  # the kernel lives on, without its slice
    half = await start_kernel(jp_fetch, "gpu-pool-half")  # MPS clients cannot hibernate: shut down
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", half, "release", method="POST", body="{}")
    assert body(r)["action"] == "shutdown"
    await wait_until(lambda: gone(jp_fetch, half))


@pytest.mark.pool_settings(default_user_quota={"kernels": 1})
async def test_quota_refusals_and_queueing_are_events(jp_fetch, jp_ws_fetch, ext, pool_home):
    from tornado.httpclient import HTTPClientError

    from jupyter_gpu_pool.pool import SliceSpec

    events = await subscribe(jp_ws_fetch)
    await wait_until(lambda: ext.culler.passes >= 1, what="the first pass")
    await start_kernel(jp_fetch)
    with pytest.raises(HTTPClientError) as refused:
        await start_kernel(jp_fetch)  # a second kernel passes alice's quota of one
    assert refused.value.code == 403
    event = await events.next(lambda e: e.get("action") == "refused")
    assert event["reason"] == "quota_exceeded" and event["user"] == "alice" and "GPU quota exceeded" in event["message"]
    recent = body(await jp_fetch(*ME))["recent"]
    assert any(r["kind"] == "refused" and r["reason"] == "quota_exceeded" for r in recent)

    waiter = pool_home.ledger().enqueue("alice", "waiting-kernel", "whole", SliceSpec(whole=True))
    queued = await events.pool_action("queued", "waiting-kernel")
    assert "position 1" in queued["message"]
    pool_home.ledger().dequeue(waiter.id)
    events.close()


# A 10 GiB slice of a 40 GiB GPU costs 0.25 GPU-hours an hour: this budget lasts about 5 s of it.
TINY_BUDGET = {"alice": {"gpu_hours": 0.25 * 5 / 3600, "period": "day"}}


@pytest.mark.policy(rules=[{"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "warn": 1,
                            "action": "shutdown"}])
@pytest.mark.pool_settings(budgets=TINY_BUDGET)
async def test_a_kernel_is_warned_at_90_percent_of_the_budget_and_acted_on_at_100(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    me = body(await jp_fetch(*ME))
    assert me["budget"]["gpu_hours"] == pytest.approx(0.25 * 5 / 3600) and me["budget"]["period"] == "day"
    warned = await events.pool_action("warned", kid, timeout=30)
    assert warned["reason"] == "budget" and "GPU hours budgeted today are used" in warned["message"]
    assert "save your work" in warned["message"]
    busy = await execute(jp_ws_fetch, kid, "import time; time.sleep(30)")  # a busy kernel is no exception
    culled = await events.pool_action("culled", kid, timeout=30)
    assert culled["reason"] == "budget"
    lease = await wait_until(lambda: (lease := lease_of(pool_home, kid)).state == RELEASED and lease)
    assert lease.reason == "culled: budget (rule 'lab')"
    spent = body(await jp_fetch(*ME))["budget"]
    assert spent["used_hours"] >= spent["gpu_hours"] * 0.99
    from tornado.httpclient import HTTPClientError

    with pytest.raises(HTTPClientError) as refused:  # nothing starts until the budget resets
        await start_kernel(jp_fetch)
    reply = json.loads(refused.value.response.body)
    assert refused.value.code == 403 and reply["message"].startswith("GPU time used up") and "resets on" in reply["message"]
    busy.close()
    events.close()
