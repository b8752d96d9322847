"""The server extension, unchanged, on the cluster (``pool_backend = "kubernetes"``): ``me`` and ``pool``
read the cluster, the culler culls a kernel pod and frees its slice, the node agent's readings are the
UI's, and a server killed and started again adopts its running kernel, variables intact."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import pytest
from kube_helpers import FAST, GiB, Kube, ScriptedNVML, fake_proc, pod_processes, wait_until
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

from jupyter_gpu_pool.devices.telemetry import ProcessReading
from jupyter_gpu_pool.operator.agent import Agent
from jupyter_gpu_pool.cluster.resources import GROUP, KERNELS, LABEL_KERNEL, POLICIES, VERSION, kernel_name

NS = "jhub"
ME = ("gpu-pool", "api", "v1", "me")
POOL = ("gpu-pool", "api", "v1", "pool")


@pytest.fixture
def jp_server_config(server_config):
    return Config({
        "ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}},
        "GPUPoolExtension": {"pool_backend": "kubernetes", "cull_interval": 0.3, "telemetry_interval": 0.2,
                             "hibernator_class": None},
        "GPUPoolKubernetes": {"refresh_interval": 0.3},
    })


@pytest.fixture
async def ext(operator, jp_serverapp, kube_sessions):
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    await asyncio.wait_for(app.backend.adopted, 30)
    yield app
    await app.stop_extension()


@pytest.fixture
async def patient_ext(cluster, operator_factory, jp_serverapp, kube_sessions):
    """The extension, with an operator that lets a pod wait for room (as with a cluster autoscaler)."""
    await operator_factory(cluster, **{"GPUPoolOperator.unschedulable_grace": 300,
                                       "GPUPoolOperator.progress_interval": 0.5})
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    await asyncio.wait_for(app.backend.adopted, 30)
    yield app
    await app.stop_extension()


@pytest.fixture
async def kube(cluster):
    k = Kube(await cluster.api())
    yield k
    await k.close()


def body(response) -> dict:
    return json.loads(response.body.decode())


async def start(jp_fetch, profile: str = "small") -> str:
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": f"gpu-pool-kubernetes-{profile}"}))
    return body(r)["id"]


async def set_policy(kube: Kube, ext, rules: list[dict]) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        await kube.custom.patch_cluster_custom_object(GROUP, VERSION, POLICIES, "default", {"spec": {"rules": rules}},
                                                      _content_type="application/merge-patch+json")
    except ApiException as e:
        if e.status != 404:
            raise
        await kube.custom.create_cluster_custom_object(GROUP, VERSION, POLICIES, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUPoolPolicy", "metadata": {"name": "default"},
            "spec": {"rules": rules}})
    await wait_until(lambda: [r.name for r in ext.backend.policy.rules] == [r["name"] for r in rules], timeout=20,
                     what="the server to read the cluster's policy")


async def test_me_and_pool_read_the_cluster(ext, jp_fetch, kube):
    await kube.quota("default", memory="30GiB", kernels=3)
    await kube.quota("group", "ml", members=["alice"], kernels=10)
    await wait_until(lambda: ext.backend.user_quota("alice").kernels == 3, timeout=20, what="quotas read")
    kid = await start(jp_fetch)
    me = body(await jp_fetch(*ME))
    assert me["user"] == "alice" and me["pool"]["enabled"] and "Kubernetes cluster: 1 GPU node(s)" in me["pool"]["note"]
    assert me["quota"] == {"memory": 30 * GiB, "sm_percent": None, "kernels": 3}
    assert me["usage"] == {"memory": 10 * GiB, "sm_percent": 0, "kernels": 1}
    assert me["groups"] == [{"name": "ml", "quota": {"memory": None, "sm_percent": None, "kernels": 10},
                             "usage": {"memory": 10 * GiB, "sm_percent": 0, "kernels": 1}}]
    [kernel] = me["kernels"]
    assert kernel["kernel_id"] == kid and kernel["profile"] == "small" and kernel["state"] == "active"
    assert kernel["gpus"] == [{"uuid": "node/gpu-node-1", "label": "GPU 0 · 2 × Test-GPU-40GB · 80 GiB (detected)",
                               "source": "detected"}]
    assert kernel["memory_limit"] == 10 * GiB and kernel["here"] is True
    pool = body(await jp_fetch(*POOL))
    [node] = pool["gpus"]
    assert node["node"] == "gpu-node-1" and node["memory"] == 80 * GiB and node["used_memory"] == 10 * GiB
    assert [lease["kernel_id"] for lease in pool["leases"]] == [kid]


@pytest.mark.slow
async def test_culling_deletes_the_pod_and_frees_the_slice(ext, jp_fetch, kube):
    await kube.quota("default", kernels=1)
    await wait_until(lambda: ext.backend.user_quota("alice").kernels == 1, timeout=20, what="quota read")
    await set_policy(kube, ext, [{"name": "quick", "idle_timeout": 4, "gpu_idle_timeout": None, "warn": 1,
                                  "action": "shutdown"}])
    kid = await start(jp_fetch)
    with pytest.raises(HTTPClientError) as refused:  # the slice is held: a second kernel is over the quota
        await start(jp_fetch)
    assert refused.value.code == 403
    [gk] = [k for k in await kube.kernels() if k["metadata"]["name"] == kernel_name(kid)]
    pod = gk["status"]["pod"]
    assert pod in {p["metadata"]["name"] for p in await kube.pods()}

    async def culled():
        recent = body(await jp_fetch(*ME))["recent"]
        return any(r["kind"] == "culled" and r["kernel_id"] == kid and r["reason"] == "idle" for r in recent)

    await wait_until(culled, timeout=60, what="the idle kernel to be culled")
    ids = {k["id"] for k in body(await jp_fetch("api", "kernels"))}
    assert kid not in ids

    async def nothing_left():
        kernels = [k for k in await kube.kernels() if k["spec"]["kernelId"] == kid]
        pods = [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == kernel_name(kid)]
        return not kernels and not pods

    await wait_until(nothing_left, timeout=20, what="the culled kernel's GPUKernel and pod to go")
    await wait_until(lambda: not pod_processes(pod), timeout=10, what="its process to stop")
    me = body(await jp_fetch(*ME))
    assert me["usage"] == {"memory": 0, "sm_percent": 0, "kernels": 0}
    assert body(await jp_fetch(*POOL))["gpus"][0]["used_memory"] == 0
    again = await start(jp_fetch)  # the slice, and the quota, are free again
    assert again in {k["id"] for k in body(await jp_fetch("api", "kernels"))}


async def test_the_ui_sees_the_node_agents_readings(ext, jp_fetch, cluster, tmp_path):
    kid = await start(jp_fetch)
    kube = Kube(await cluster.api())
    try:
        [pod] = [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == kernel_name(kid)]
        [proc] = pod_processes(pod["metadata"]["name"])
        nvml = ScriptedNVML({"GPU-aaaa": {proc.pid: ProcessReading(3 * GiB, 42.0)}})
        agent = Agent("gpu-node-1", kube.api, nvml, ["GPU-aaaa"],
                      proc_root=fake_proc(tmp_path / "proc", {proc.pid: pod["metadata"]["uid"]}))
        watcher = asyncio.create_task(agent.watch_pods())
        try:
            await wait_until(lambda: agent.pods, timeout=10)
            await agent.sample_once()

            async def reading():
                [k] = body(await jp_fetch(*ME))["kernels"]
                return k if k["memory_used"] is not None else None

            kernel = await wait_until(reading, timeout=20, what="the reading in the user's view")
            assert kernel["memory_used"] == 3 * GiB and kernel["utilization"]["current"] == 42.0
        finally:
            watcher.cancel()
    finally:
        await kube.close()


@pytest.mark.slow
async def test_a_server_killed_and_started_again_adopts_its_kernel(cluster, operator_factory, servers, kube):
    # A heartbeat timeout longer than a server's restart on a loaded machine (the tests' usual 4 s is not):
    # the kernel must outlive its dead server's restart, and the restarted server must then keep it alive.
    operator = await operator_factory(cluster, **{"GPUPoolOperator.heartbeat_timeout": 15.0})
    first = servers(extension=True)
    await first.ready()
    kid = (await first.request("POST", "api/kernels", {"name": "gpu-pool-kubernetes-small"}))["id"]
    assert await first.execute(kid, "x = 42; print('set')") == "set\n"
    first.kill()
    second = servers(extension=True)  # the same server id: its kernels are its own
    await second.ready()

    async def adopted():
        return kid in {k["id"] for k in await second.request("GET", "api/kernels")}

    await wait_until(adopted, timeout=30, what="the second server to adopt the kernel")
    assert "42" in await second.execute(kid, "print(x)")
    # Only the new server can renew the heartbeat now.  An operator with the usual 4 s timeout takes over (it
    # times a heartbeat from its own first sight of it): past that timeout the new server's beats keep the kernel.
    operator.stop()
    await operator_factory(cluster)
    await asyncio.sleep(FAST["GPUPoolOperator.heartbeat_timeout"] + 2)
    assert [k["spec"]["kernelId"] for k in await kube.kernels()] == [kid]
    await second.request("DELETE", f"api/kernels/{kid}")
    await wait_until(lambda: _no_kernels(kube), timeout=20, what="the kernel's objects to go")


async def _no_kernels(kube: Kube) -> bool:
    return not await kube.kernels()


__all__ = ["uuid", "KERNELS"]


@pytest.mark.slow
async def test_a_starting_kernels_progress_reaches_me(patient_ext, jp_fetch, kube):
    """While a kernel's pod waits (here for a node with 64 GPUs), GET me says what it waits for, in the
    operator's words and with fresh numbers; once a kernel runs, its progress is null."""
    waiting = asyncio.create_task(start(jp_fetch, "huge"))

    async def progress(at_least: int = 0):
        kernels = body(await jp_fetch(*ME))["kernels"]
        text = kernels[0]["progress"] if kernels else None
        seconds = re.search(r"(\d+) s so far", text or "")
        return text if seconds and int(seconds.group(1)) >= at_least else None

    try:
        first = await wait_until(progress, timeout=20, what="GET me to show the start's progress")
        assert first.startswith("Waiting for a GPU slice (64 whole GPU(s)) to be free") and "Insufficient" in first
        later = await wait_until(lambda: progress(at_least=int(re.search(r"(\d+) s so far", first).group(1)) + 2),
                                 timeout=20, what="the progress to count on")
        assert later != first
        [starting] = body(await jp_fetch(*ME))["kernels"]
        assert starting["profile"] == "huge" and starting["here"] is False  # the server has no kernel yet
        [gk] = await kube.kernels()
        await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, gk["metadata"]["name"])
        with pytest.raises(HTTPClientError):
            await waiting
    finally:
        waiting.cancel()
    kid = await start(jp_fetch)
    [running] = body(await jp_fetch(*ME))["kernels"]
    assert running["kernel_id"] == kid and running["progress"] is None
