"""Hibernation of cluster kernels through a real jupyter_server (``pool_backend = "kubernetes"``, its default
hook ``ClusterHibernation``): a user's Release GPU hibernates the kernel pod through its GPUKernel (the
operator admits, the test-only stand-in settles the agent's move), the slice is free in the pool view, and
a cell run on the sleeping kernel is held, shows its place in the node's queue, and runs once the node
has room; where the cluster cannot hand memory back, the policy shuts the kernel down and says why.
These are the server's and the operator's side (the stand-in writes the node's readings at will); the
same flow with the real node agent is tests/kube/test_kube_hibernation_e2e.py."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from agent_standin import SettlingAgent, ask, kernel, phase_of, report_free, report_usage
from kube_helpers import GiB, Kube, wait_until
from traitlets.config import Config

from jupyter_gpu_pool.cluster.resources import HIBERNATED, RUNNING, kernel_name
from jupyter_gpu_pool.server_extension.sleep.cluster import ClusterHibernation

NODE, GPU_A = "gpu-node-1", "GPU-aaaa"
API = ("gpu-pool", "api", "v1")


@pytest.fixture
def jp_server_config(server_config):
    return Config({
        "ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}},
        "KernelRestarter": {"time_to_dead": 0.5},  # jupyter_client's restarter looks every 0.5 s, not every 3 s
        "GPUPoolExtension": {"pool_backend": "kubernetes", "cull_interval": 0.3, "telemetry_interval": 0.2,
                             "hint_sleep_after": 3},
        "GPUPoolKubernetes": {"refresh_interval": 0.3},
    })


@pytest.fixture
async def agent(kube):
    a = SettlingAgent(kube).start()
    yield a
    await a.stop()


async def extension(jp_serverapp):
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    await asyncio.wait_for(app.backend.adopted, 30)
    return app


def body(response) -> dict:
    return json.loads(response.body.decode())


async def start(jp_fetch, kube: Kube) -> tuple[str, str]:
    kid = body(await jp_fetch("api", "kernels", method="POST",
                              body=json.dumps({"name": "gpu-pool-kubernetes-small"})))["id"]
    await report_usage(kube, kernel_name(kid), 6 * GiB, [GPU_A])
    return kid, kernel_name(kid)


class Cell:
    """A cell sent over the kernel's websocket as JupyterLab sends it (JSON protocol); what came back.
    ``silent``: an execute request a frontend sends for its own code, not a cell."""

    def __init__(self, ws, code: str, silent: bool = False):
        self.ws, self.code, self.silent, self.seen = ws, code, silent, []
        self.msg_id = uuid.uuid4().hex

    async def run(self) -> list[tuple[str, dict]]:
        header = {"msg_id": self.msg_id, "msg_type": "execute_request", "username": "alice",
                  "session": uuid.uuid4().hex, "date": "", "version": "5.3"}
        await self.ws.write_message(json.dumps({
            "header": header, "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": self.code, "silent": self.silent, "store_history": not self.silent,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        replied = idle = False
        while not (replied and idle):
            m = json.loads(await asyncio.wait_for(self.ws.read_message(), 90))
            if m["parent_header"].get("msg_id") != self.msg_id:
                continue
            self.seen.append((m["msg_type"], m["content"]))
            replied = replied or m["msg_type"] == "execute_reply"
            idle = idle or (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle")
        return self.seen

    def texts(self) -> list[str]:
        return [c["text"] if kind == "stream" else c["data"]["text/plain"] for kind, c in self.seen
                if kind in ("stream", "display_data", "update_display_data")]


@pytest.mark.slow
async def test_release_hibernates_a_cluster_kernel_and_a_cell_resumes_it_showing_its_place_in_the_queue(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, agent):
    await operator_factory(cluster, **{"GPUPoolOperator.hami_memory_scaling": 2.0})
    ext = await extension(jp_serverapp)
    try:
        assert isinstance(ext.hibernator, ClusterHibernation)  # the default hook of a cluster server
        await report_free(kube, NODE, {GPU_A: 2 * GiB})
        kid, name = await start(jp_fetch, kube)
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")
        await Cell(ws, "x = 41").run()

        r = await jp_fetch(*API, "kernels", kid, "release", method="POST", body="{}")
        assert r.code == 202 and body(r)["action"] == "hibernate"
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=30, what="the kernel to hibernate")
        obj = await kernel(kube, name)
        assert obj["spec"]["desiredState"] == "Hibernated" and obj["spec"]["hibernateReason"] == "user"

        async def shown_hibernated():
            me = body(await jp_fetch(*API, "me"))
            [k] = me["kernels"]
            return k["state"] == "hibernated" and me["usage"]["memory"] == 0 and me["usage"]["kernels"] == 1

        await wait_until(shown_hibernated, timeout=20, what="GET me to show it hibernated, its slice free")
        await asyncio.sleep(1.5)  # three of the restarter's looks (every 0.5 s here): a sleeping kernel is not dead
        obj = await kernel(kube, name)
        assert obj["spec"]["launch"] == 1 and phase_of(obj) == HIBERNATED
        assert kid in {k["id"] for k in body(await jp_fetch("api", "kernels"))}
        [node] = body(await jp_fetch(*API, "pool"))["gpus"]
        assert node["used_memory"] == 0

        cell = Cell(ws, "print(x + 1)")
        running = asyncio.create_task(cell.run())
        await wait_until(lambda: _queued(kube, name), timeout=30, what="the resume to wait with its position")
        await wait_until(lambda: any("position 1 in its node's queue" in t for t in cell.texts()), timeout=20,
                         what="the cell to show its place in the queue")
        assert any("6 GiB of GPU memory on its GPU (GPU-aaaa)" in t for t in cell.texts())
        assert not running.done()  # held while the node has no room
        await report_free(kube, NODE, {GPU_A: 30 * GiB})
        await asyncio.wait_for(running, 60)
        assert "42\n" in cell.texts()
        assert phase_of(await kernel(kube, name)) == RUNNING

        async def resumed_on_record():
            recent = body(await jp_fetch(*API, "me"))["recent"]
            return any(e["kind"] == "resumed" and e["kernel_id"] == kid for e in recent)

        await wait_until(resumed_on_record, timeout=20, what="the resume on record")
        ws.close()
    finally:
        await ext.stop_extension()


async def hint(jp_fetch, kid: str) -> tuple[int, dict]:
    r = await jp_fetch(*API, "kernels", kid, "hint", method="POST", body="{}")
    return r.code, body(r)


async def recent(jp_fetch, kid: str, kind: str) -> list[dict]:
    return [e for e in body(await jp_fetch(*API, "me"))["recent"] if e["kind"] == kind and e["kernel_id"] == kid]


async def test_a_hint_wakes_a_cluster_kernel_only_into_room_free_now_and_unused_it_sleeps_again_unwarned(
        cluster, operator_factory, jp_serverapp, jp_fetch, kube_sessions, kube, agent):
    """A hint (the user opened the notebook) asks the resume as a guess: with no room on the node now it is
    declined in words and nothing queues; with room the kernel wakes before any cell, and, no cell coming
    within hint_sleep_after, goes back to sleep with no warning."""
    await operator_factory(cluster, **{"GPUPoolOperator.hami_memory_scaling": 2.0})
    ext = await extension(jp_serverapp)
    try:
        await report_free(kube, NODE, {GPU_A: 2 * GiB})  # no room for its 6 GiB
        kid, name = await start(jp_fetch, kube)
        await jp_fetch(*API, "kernels", kid, "release", method="POST", body="{}")
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=30, what="the kernel to hibernate")

        code, answer = await hint(jp_fetch, kid)
        assert (code, answer["woken"], answer["reason"]) == (200, False, "no_room"), answer
        assert "not woken in advance" in answer["message"] and "GPU-aaaa" in answer["message"]
        obj = await kernel(kube, name)
        assert obj["spec"]["desiredState"] == "Hibernated" and "resumeHint" not in obj["spec"]  # withdrawn
        assert phase_of(obj) == HIBERNATED and obj["status"]["hibernation"].get("queuePosition") is None

        await report_free(kube, NODE, {GPU_A: 30 * GiB})
        code, answer = await hint(jp_fetch, kid)
        assert (code, answer["woken"]) == (202, True), answer
        await wait_until(lambda: _phase(kube, name, RUNNING), timeout=30, what="the kernel to wake before a cell")
        [resumed] = await wait_until(lambda: recent(jp_fetch, kid, "resumed"), timeout=20, what="the resume on record")
        assert resumed["reason"] == "hint"
        # no cell within hint_sleep_after (3 s here): back to sleep, calmly
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=30, what="the unused kernel to sleep again")
        async def unused_on_record():
            return [e for e in await recent(jp_fetch, kid, "hibernated") if e["reason"] == "hint_unused"]

        slept = await wait_until(unused_on_record, timeout=20, what="the sleep on record")
        assert len(slept) == 1 and "woken in advance" in slept[0]["message"]
        assert await recent(jp_fetch, kid, "warned") == []
    finally:
        await ext.stop_extension()


@pytest.mark.slow
async def test_a_hint_never_overtakes_a_waiting_resume_and_a_cell_under_it_makes_it_a_real_one(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, agent):
    await operator_factory(cluster, **{"GPUPoolOperator.hami_memory_scaling": 2.0})
    ext = await extension(jp_serverapp)
    try:
        await report_free(kube, NODE, {GPU_A: 2 * GiB})
        (a, name_a), (b, name_b) = await start(jp_fetch, kube), await start(jp_fetch, kube)
        ws = await jp_ws_fetch("api", "kernels", a, "channels")
        await Cell(ws, "x = 41").run()
        for kid in (a, b):
            await jp_fetch(*API, "kernels", kid, "release", method="POST", body="{}")
        for name in (name_a, name_b):
            await wait_until(lambda n=name: _phase(kube, n, HIBERNATED), timeout=30, what=f"{name} to hibernate")
        # b's user runs a cell: a real resume, waiting for room at position 1; a's hint does not get ahead of it
        await ask(kube, name_b, "Running")
        await wait_until(lambda: _queued(kube, name_b), timeout=30, what="b's resume to wait at position 1")
        code, answer = await hint(jp_fetch, a)
        assert (code, answer["woken"], answer["reason"]) == (200, False, "others_waiting"), answer
        obj = await kernel(kube, name_a)
        assert obj["spec"]["desiredState"] == "Hibernated" and obj["status"]["hibernation"].get("queuePosition") is None
        assert (await kernel(kube, name_b))["status"]["hibernation"]["queuePosition"] == 1
        await report_free(kube, NODE, {GPU_A: 9 * GiB})  # room for one 6 GiB kernel after the 1 GiB margin

        # once b has resumed, a's hint wakes it; a cell sent while that resume is under way makes it the cell's
        await wait_until(lambda: _phase(kube, name_b, RUNNING), timeout=30, what="b to resume")
        await report_free(kube, NODE, {GPU_A: 9 * GiB})
        agent.paused = True  # the node agent's restore takes its time
        code, answer = await hint(jp_fetch, a)
        assert (code, answer["woken"]) == (202, True), answer
        await wait_until(lambda: _phase(kube, name_a, "Resuming"), timeout=30, what="a's resume to be admitted")
        cell = Cell(ws, "print(x + 1)")
        running = asyncio.create_task(cell.run())
        await wait_until(lambda: _no_hint(kube, name_a), timeout=20, what="the cell to make the resume a real one")
        agent.paused = False
        await asyncio.wait_for(running, 60)
        assert "42\n" in cell.texts()
        [resumed] = await wait_until(lambda: recent(jp_fetch, a, "resumed"), timeout=20, what="the resume on record")
        assert resumed["reason"] == "cell"  # the cell's, though a hint started it
        await asyncio.sleep(5)  # past hint_sleep_after (3 s): a kernel its user used stays awake
        assert phase_of(await kernel(kube, name_a)) == RUNNING
        ws.close()
    finally:
        await ext.stop_extension()


async def test_the_policy_shuts_a_kernel_down_where_the_cluster_cannot_hibernate_and_says_why(
        cluster, operator_factory, jp_serverapp, jp_fetch, kube_sessions, kube, agent):
    """HAMi without memory scaling: the operator refuses; the idle policy's hibernate becomes a shutdown,
    on record with the operator's words."""
    await operator_factory(cluster)
    ext = await extension(jp_serverapp)
    try:
        from test_kube_server_extension import set_policy

        await set_policy(kube, ext, [{"name": "quick", "idle_timeout": 3, "gpu_idle_timeout": None, "warn": 1,
                                      "action": "hibernate"}])
        kid, name = await start(jp_fetch, kube)

        async def culled():
            return next((e for e in body(await jp_fetch(*API, "me"))["recent"]
                         if e["kind"] == "culled" and e["kernel_id"] == kid), None)

        entry = await wait_until(culled, timeout=60, what="the kernel to be shut down instead")
        assert "hibernation unavailable" in entry["message"]
        assert "HAMi without memory oversubscription" in entry["message"]
        assert agent.settled == []
    finally:
        await ext.stop_extension()


async def _phase(kube: Kube, name: str, phase: str) -> bool:
    return phase_of(await kernel(kube, name)) == phase


async def _no_hint(kube: Kube, name: str) -> bool:
    obj = await kernel(kube, name)
    return obj["spec"].get("desiredState") == "Running" and not obj["spec"].get("resumeHint")


async def _queued(kube: Kube, name: str) -> bool:
    return ((await kernel(kube, name)).get("status") or {}).get("hibernation", {}).get("queuePosition") == 1


@pytest.mark.parametrize("sharing, can, words", [
    ("mps", False, "cannot checkpoint an MPS client"),
    ("whole", False, "keeps its GPU at the scheduler"),
    ("mig", False, "MIG instance"),
    ("dra", False, "ResourceClaim"),
    ("hami", True, None),  # the operator's settings decide: the server asks, and hears its answer
    ("time-slicing", True, None),
])
def test_the_server_knows_from_a_kernels_sharing_backend_where_it_can_never_hibernate(sharing, can, words):
    """The culler asks every pass, without I/O: a backend no setting can make hand memory back is refused
    at once (the policy shuts such kernels down, saying why), and so is a kernel the operator refused for
    good (its pod's host memory); a refusal for now (the node's cap) is not remembered."""
    from types import SimpleNamespace

    from jupyter_gpu_pool.cluster.hibernation import HOST_MEMORY, NODE_CAP
    from jupyter_gpu_pool.cluster.kernels import as_lease

    obj = {"metadata": {"name": "k-abc", "uid": "u"}, "spec": {"owner": "alice", "kernelId": "abc", "profile": "small"},
           "status": {"phase": RUNNING, "admitted": {"memory": GiB}, "gpu": {"sharing": sharing}}}
    session = SimpleNamespace(kernels={"k-abc": obj}, listeners=[])
    backend = SimpleNamespace(session=session, settings=SimpleNamespace(hibernation=None))
    hook = ClusterHibernation(SimpleNamespace(backend=backend, recorder=None, hint_sleep_after=60,
                                              serverapp=SimpleNamespace(kernel_manager=None)))
    ok, why = hook.can_hibernate(as_lease(obj))
    assert ok is can and (words is None and why is None or words in why)
    if can:
        obj["status"].update(reason="HibernationRefused", message="its pod's memory limit …",
                             hibernation={"reason": NODE_CAP})
        assert hook.can_hibernate(as_lease(obj)) == (True, None)
        obj["status"]["hibernation"]["reason"] = HOST_MEMORY
        assert hook.can_hibernate(as_lease(obj)) == (False, "its pod's memory limit …")
