"""Hibernation on declared GPUs (the pool's inventory, not real GPUs: CI, Binder, ``jupyter gpu-pool lab``
without a GPU).  A kernel there holds no GPU memory, so hibernating it is exactly: keep the kernel
process and its variables, give the slice back, take a slice again before the next cell runs.

Nothing is stood in here but, in the first tests, the checkpoint driver at its ``Driver`` seam (to
prove it is never called); the server tests run the real driver binding, which on this machine has
no libcuda: a declared move that asked it anything would fail.  Real kernels, a real ledger, a real
jupyter_server, the real queue.
"""

from __future__ import annotations

import asyncio

import psutil
import pytest
from hibernation_standin import StandInDriver, StandInMemory
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from kernel_helpers import run_code, start_answering, wait_until
from server_hibernation_helpers import Server, body, extension_config, texts

from jupyter_gpu_pool.devices.checkpoint import DECLARED_NOTE
from jupyter_gpu_pool.hibernation import HibernationSettings, Hibernator, Kernels
from jupyter_gpu_pool.pools import pool_for
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, LeaseRequest, Profile, SliceSpec

GiB = 2**30
HIBERNATE = {"name": "demo", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
             "action": "hibernate"}


def fill_pool(pool, owner: str = "bob") -> list:
    """Another user takes every GPU of the declared pool (2 x 40 GiB): leases with no kernel, which
    reconcile leaves alone for its launch grace (120 s)."""
    full = Profile("full", SliceSpec.parse("40GiB"), "soft", "full")
    return [pool.ledger.allocate(LeaseRequest(owner=owner, kernel_id=f"blocker-{i}", profile=full),
                                 pool.settings.quotas) for i in range(2)]


# -- the hibernator on a declared pool -----------------------------------------------------------------


@pytest.fixture
async def declared(pool_home, tmp_path):
    """A hibernator over real kernels on the declared test pool, with a driver that records every call."""
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path))
    driver = StandInDriver()
    pool = pool_for()
    hibernator = Hibernator(pool, Kernels(manager), HibernationSettings(queue_poll=0.2), driver=driver,
                            memory=StandInMemory(driver))
    yield manager, hibernator, driver
    await manager.shutdown_all(now=True)


async def test_a_kernel_on_a_declared_gpu_hibernates_and_resumes_through_the_ledger_without_the_driver(declared):
    manager, hibernator, driver = declared
    kid, pid = await start_answering(manager, "gpu-pool-small")
    await run_code(manager.get_kernel(kid), "x = 42")
    lease = hibernator.ledger.by_kernel(kid)
    assert hibernator.can_hibernate(lease) == (True, None)
    assert hibernator.capability(lease).declared and hibernator.declared

    out = await hibernator.hibernate(kid, "idle")

    assert (out.action, out.bytes, out.pids, out.declared) == ("hibernated", 0, (), True)
    assert DECLARED_NOTE in out.message and out.to_dict()["declared"] is True
    hib = hibernator.ledger.by_kernel(kid)
    assert (hib.state, hib.phase, hib.host_bytes, hib.gpus, hib.last_gpus) == (HIBERNATED, "", 0, (), lease.gpus)
    assert all(u.memory == 0 for u in hibernator.ledger.snapshot().gpus)  # the slice is back in the pool
    assert hibernator.shown(kid) == "hibernated" and hibernator.asleep(kid)
    assert psutil.pid_exists(pid)

    back = await hibernator.resume(kid, "cell")

    assert (back.action, back.declared, back.gpus) == ("resumed", True, lease.gpus)
    assert DECLARED_NOTE in back.message
    assert hibernator.ledger.by_kernel(kid).state == ACTIVE and not hibernator.asleep(kid)
    assert "42" in await run_code(manager.get_kernel(kid), "print(x)")  # the same process, its variables kept
    assert manager.get_kernel(kid).provisioner.pid == pid
    assert driver.calls == []  # nothing was asked of the checkpoint driver
    assert [e.kind for e in hibernator.ledger.journal() if e.kernel_id == kid] == ["resumed", "hibernated",
                                                                                   "allocated"]  # newest first


async def test_a_resume_on_a_full_declared_pool_waits_in_the_queue_and_takes_the_first_slice_freed(declared):
    manager, hibernator, driver = declared
    kid = await manager.start_kernel(kernel_name="gpu-pool-small")
    await hibernator.hibernate(kid)
    blockers = fill_pool(hibernator.pool)

    task = hibernator.start_resume(kid)
    await wait_until(lambda: hibernator.queue_position(kid) == 1, what="queued at position 1")
    assert hibernator.ledger.by_kernel(kid).phase == "queued" and hibernator.shown(kid) == "queued"
    assert [w.kernel_id for w in hibernator.ledger.waiters()] == [kid]
    hibernator.ledger.release(blockers[1].id)
    out = await asyncio.wait_for(task, 60)

    assert out.declared and out.waited > 0 and out.gpus == blockers[1].gpus
    assert hibernator.ledger.by_kernel(kid).state == ACTIVE and hibernator.ledger.waiters() == []
    assert driver.calls == []


async def test_a_hibernated_kernel_on_a_declared_gpu_shuts_down_cleanly(declared):
    manager, hibernator, _driver = declared
    kid, pid = await start_answering(manager, "gpu-pool-small")
    lease_id = hibernator.ledger.by_kernel(kid).id
    await hibernator.hibernate(kid)
    await asyncio.wait_for(manager.shutdown_kernel(kid, now=True), 60)
    assert hibernator.ledger.get(lease_id).state == "released" and not psutil.pid_exists(pid)


# -- through a real jupyter_server --------------------------------------------------------------------


@pytest.fixture
def jp_server_config(pool_home, request):
    """A real jupyter_server with the pool extension and its default hibernation hook, on the declared
    test pool (2 x 40 GiB); the policy hibernates (tests set its timeouts with ``pool_settings``)."""
    settings = {"policy": [HIBERNATE], "unix_groups": False}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    pool_home.configure(**settings)
    return extension_config()


@pytest.fixture
def server(jp_fetch, ext) -> Server:
    return Server(jp_fetch, ext)


@pytest.mark.pool_settings(policy=[{**HIBERNATE, "idle_timeout": 3, "warn": 1.5}])
async def test_an_idle_kernel_is_warned_hibernated_and_a_cell_brings_it_back_with_its_variables(
        server, channels, events):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid)
    await ch.replies(await ch.execute("x = 42"))

    warned = await events.action("warned", kid)
    assert "hibernated" in warned["message"]
    hibernated = await events.action("hibernated", kid)
    assert hibernated["declared"] is True and hibernated["bytes"] == 0 and hibernated["reason"] == "idle"
    assert DECLARED_NOTE in hibernated["message"]
    assert server.lease(kid).state == HIBERNATED
    pool = await server.pool()
    assert all(g["slices"] == 0 and g["free_memory"] == 40 * GiB for g in pool["gpus"])  # its slice shows free
    me = await server.me_kernel(kid)
    assert me["state"] == "hibernated" and "resume" in me["actions"]
    assert psutil.pid_exists(pid)  # the kernel process lives on

    got = await ch.replies(await ch.execute("print(x)"))

    assert got[0][1] == "status" and got[0][2]["execution_state"] == "busy"
    notices = [t for t in texts(got) if t.startswith("Resuming")]
    assert notices and DECLARED_NOTE in notices[0]
    assert "42\n" in texts(got)
    assert next(c for _ch, k, c in got if k == "execute_reply")["status"] == "ok"
    resumed = await events.action("resumed", kid)
    assert resumed["declared"] is True and resumed["reason"] == "cell"
    assert server.ext.serverapp.kernel_manager.get_kernel(kid).provisioner.pid == pid  # not restarted
    journal = [e for e in server.ext.backend.pool.ledger.journal() if e.kernel_id == kid and e.kind == "hibernated"
               and e.detail.get("source") == "policy"]
    assert journal and journal[0].detail["declared"] is True


async def test_a_cell_on_a_full_declared_pool_waits_with_its_place_shown_and_runs_when_a_slice_frees(
        server, channels, events):
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await ch.replies(await ch.execute("x = 42"))
    await server.hibernate(kid)
    blockers = fill_pool(server.ext.backend.pool)

    seen: list = []
    cell = asyncio.ensure_future(ch.replies(await ch.execute("print(x)"), timeout=120, seen=seen))
    await wait_until(lambda: server.lease(kid).phase == "queued", what="queued")
    me = await server.me()
    mine = next(k for k in me["kernels"] if k["kernel_id"] == kid)
    assert mine["state"] == "queued" and mine["queue_position"] == 1
    assert me["queue"] == [{**me["queue"][0], "position": 1, "kernel_id": kid, "for": "resume"}]
    await wait_until(lambda: any("position 1 in the queue" in t for t in texts(seen)), what="the place shown")
    assert not cell.done()  # the cell waits: no slice is free

    server.ext.backend.pool.ledger.release(blockers[0].id)
    got = await asyncio.wait_for(cell, 120)

    assert "42\n" in texts(got) and next(c for _ch, k, c in got if k == "execute_reply")["status"] == "ok"
    assert server.lease(kid).state == "active" and server.lease(kid).gpus == blockers[0].gpus
    assert (await events.action("resumed", kid))["declared"] is True


async def test_release_on_a_declared_gpu_hibernates_where_the_rule_says_hibernate(server, events):
    kid, pid = await server.gpu_kernel()
    before = await server.me_kernel(kid)
    assert before["can_hibernate"] is True and before["release_action"] == "hibernate"

    r = await server.post(kid, "release")

    assert r.code == 202 and body(r) == {"action": "hibernate", "kernel_id": kid}
    hibernated = await events.action("hibernated", kid)
    assert hibernated["reason"] == "user" and hibernated["declared"] is True
    await wait_until(lambda: server.lease(kid).state == HIBERNATED, what="hibernated")
    assert kid in server.ext.serverapp.kernel_manager and psutil.pid_exists(pid)
    assert "released" not in events.actions(kid)

    r = await server.post(kid, "resume")
    assert r.code == 202 and body(r)["state"] in ("resuming", "active")
    assert (await events.action("resumed", kid))["declared"] is True
    await wait_until(lambda: server.lease(kid).state == ACTIVE and not server.lease(kid).phase, what="active")

    mps, _ = await server.gpu_kernel(profile="half")  # an MPS profile cannot hibernate, declared or not
    half = await server.me_kernel(mps)
    assert half["can_hibernate"] is False and half["release_action"] == "shutdown"
    assert body(await server.post(mps, "release"))["action"] == "shutdown"


# The reclaim scene: candidates after 1.2 s idle (60 s x 0.02) under pressure; the warning comes 2 s ahead.
RECLAIM = {**HIBERNATE, "idle_timeout": 60, "pressure_factor": 0.02, "warn": 2}


@pytest.mark.pool_settings(policy=[RECLAIM])
@pytest.mark.slow
async def test_a_queued_resume_reclaims_one_idle_kernel_hibernated_and_never_the_mps_one(server, channels, events):
    """The pool full, a hibernated kernel's cell queued at #1, the user's other idle kernels (a whole GPU, an
    MPS one, two 10 GiB ones): exactly one 10 GiB kernel is warned (pressure, the rule's warning time) and
    hibernated; the MPS kernel keeps running with its variables; no deadline moves earlier without a new
    warning; the cell runs.  A refused start before that is no waiter: nothing is warned for it."""
    from jupyter_gpu_pool.pool import PoolExhausted

    whole, _ = await server.gpu_kernel(profile="whole")  # GPU 0
    mps, mps_pid = await server.gpu_kernel(profile="half")  # GPU 1: 20 GiB
    x, _ = await server.gpu_kernel()  # GPU 1: 30 GiB
    queued, _ = await server.gpu_kernel()  # GPU 1: 40 GiB
    ch = await channels(queued)
    await ch.replies(await ch.execute("y = 7"))
    mps_ch = await channels(mps)
    await mps_ch.replies(await mps_ch.execute("x = 42"))
    await server.hibernate(queued)
    y, _ = await server.gpu_kernel()  # GPU 1 full again: the pool is full
    others = {whole, mps, x, y}
    pool = server.ext.backend.pool
    assert {server.lease(k).gpus for k in others} == {server.lease(whole).gpus, server.lease(mps).gpus}

    shown: dict[str, list[tuple[float | None, float | None]]] = {k: [] for k in others}

    async def watch() -> None:  # each card's deadline as GET me shows it: (warned at, deadline)
        while True:
            for k in (await server.me())["kernels"]:
                if k["kernel_id"] in shown:
                    w, nxt = k.get("warning"), k.get("next_action")
                    deadline = w["deadline"] if w else (nxt["at"] if nxt else None)
                    warned_at = next((e.at for e in pool.ledger.journal() if e.kind == "warned"
                                      and e.kernel_id == k["kernel_id"]), None) if w else None
                    shown[k["kernel_id"]].append((warned_at, deadline))
            await asyncio.sleep(0.2)

    watcher = asyncio.ensure_future(watch())
    try:
        with pytest.raises(PoolExhausted):  # a refused start: it leaves no place in the queue
            pool.ledger.allocate(LeaseRequest(owner=pool.ledger.by_kernel(x).owner, kernel_id="refused",
                                              profile=Profile("small", SliceSpec.parse("10GiB"), "soft", "small")),
                                 pool.settings.quotas)
        await asyncio.sleep(3)  # ten passes, every kernel idle long enough to be a candidate
        assert not [e for e in pool.ledger.journal() if e.kind == "warned"]

        seen: list = []
        cell = asyncio.ensure_future(ch.replies(await ch.execute("print(y)"), timeout=120, seen=seen))
        await wait_until(lambda: server.lease(queued).phase == "queued", what="queued")
        got = await asyncio.wait_for(cell, 120)
        assert "7\n" in texts(got) and next(c for _ch, k, c in got if k == "execute_reply")["status"] == "ok"
        await asyncio.sleep(2)  # more passes: nothing more is reclaimed once the waiter is served
    finally:
        watcher.cancel()

    journal = [e for e in reversed(pool.ledger.journal())  # (newest first)
               if e.kernel_id in others and e.detail.get("source") == "policy"]
    assert [e.kind for e in journal] == ["warned", "hibernated"], [(e.kind, e.kernel_id) for e in journal]
    warned, hibernated = journal
    assert warned.kernel_id == hibernated.kernel_id and warned.kernel_id in (x, y)
    assert warned.reason == "pressure" and warned.detail["action"] == "hibernate"
    assert warned.detail["message"].startswith("Someone is waiting for a GPU slice")
    # the deadline is the pass's time + the rule's 2 s (the journal's time is a few ms later); acted on after it
    assert warned.detail["deadline"] - warned.at >= 1.95 and hibernated.at - warned.at >= 2
    assert hibernated.at >= warned.detail["deadline"]
    assert (await events.action("warned", warned.kernel_id))["reason"] == "pressure"
    assert server.lease(warned.kernel_id).state == HIBERNATED
    for k in others - {warned.kernel_id}:
        assert server.lease(k).state == ACTIVE, k
    assert psutil.pid_exists(mps_pid) and "42\n" in texts(await mps_ch.replies(await mps_ch.execute("print(x)")))
    for k, seq in shown.items():  # a deadline earlier than the last one shown comes with a new warning
        for (was_warned, before), (now_warned, after) in zip(seq, seq[1:]):
            if before is not None and after is not None and after < before - 0.5:
                assert now_warned is not None and now_warned != was_warned, (k, seq)
