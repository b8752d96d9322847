"""The node agent: process -> cgroup -> pod, each kernel pod's GPU use into its GPUKernel's status and
into Prometheus.

This machine has no GPU, so NVML's per-process readings come from a scripted source (the same
readings come from ``NVMLSource`` on a GPU node: see the ``gpu`` test at the end), and the
kernels' processes, which run in no container here, get their cgroup files from a /proc stand-in
written the way a node's kubelet lays them out (cgroupfs and systemd drivers).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from jupyter_client.manager import AsyncKernelManager
from kube_helpers import GiB, Kube, ScriptedNVML, fake_proc, pod_processes, wait_until
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jupyter_gpu_pool.devices.telemetry import ProcessReading
from jupyter_gpu_pool.operator.agent import Agent, AgentMetrics, pod_uid_from_cgroup, usage_by_pod
from jupyter_gpu_pool.cluster.resources import kernel_name

UID = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"


@pytest.mark.parametrize("cgroup, uid", [
    (f"12:memory:/kubepods/burstable/pod{UID}/8a1f0e2b3c4d\n11:cpu:/kubepods/burstable/pod{UID}/8a1f", UID),
    (f"0::/kubepods/pod{UID}/0123abcd", UID),  # guaranteed QoS, cgroup v2, cgroupfs driver
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     "cri-containerd-0123abcd.scope", UID),  # systemd driver: underscores
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
     "crio-0123abcd.scope", UID),
    ("0::/user.slice/user-1000.slice/session-3.scope", None),  # not a pod
    ("0::/system.slice/containerd.service", None),
    ("", None),
])
def test_a_process_cgroup_names_its_pod(cgroup, uid):
    assert pod_uid_from_cgroup(cgroup) == uid


def test_a_pods_processes_are_summed_like_a_kernels_process_tree(tmp_path):
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    proc = fake_proc(tmp_path, {10: a, 11: a, 20: b, 30: None})
    per_gpu = {"GPU-0": {10: ProcessReading(2 * GiB, 30.0), 11: ProcessReading(1 * GiB, 80.0),
                         20: ProcessReading(4 * GiB, 10.0), 30: ProcessReading(8 * GiB, 90.0)},
               "GPU-1": {11: ProcessReading(1 * GiB, 50.0), 20: ProcessReading(None, 5.0), 99: ProcessReading(1, 1)}}
    usage = usage_by_pod(per_gpu, proc)
    assert set(usage) == {a, b}  # the host's own process (30) and a vanished pid (99) belong to no pod
    assert usage[a].memory_used == 4 * GiB and usage[a].utilization == 100.0  # 30 + 80 on GPU-0, capped
    assert usage[a].devices == ("GPU-0", "GPU-1")
    assert usage[b].memory_used is None and usage[b].utilization == 10.0  # NVML would not say on GPU-1


async def test_the_agent_reports_a_kernel_pods_gpu_use_where_its_server_reads_it(cluster, operator, server_config,
                                                                                  kube_sessions, tmp_path):
    km = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
    await km.start_kernel()
    kube = Kube(await cluster.api())
    try:
        [pod] = await kube.pods()
        [kernel_proc] = pod_processes(pod["metadata"]["name"])
        proc = fake_proc(tmp_path / "proc", {kernel_proc.pid: pod["metadata"]["uid"]})
        nvml = ScriptedNVML()
        nvml.readings = {"GPU-aaaa": {kernel_proc.pid: ProcessReading(3 * GiB, 37.0)}}
        api = await cluster.api()
        metrics = AgentMetrics()
        agent = Agent("gpu-node-1", api, nvml, ["GPU-aaaa"], proc_root=proc, metrics=metrics)
        watcher = asyncio.create_task(agent.watch_pods())
        try:
            await wait_until(lambda: agent.pods, timeout=10, what="the agent to see the kernel pod")
            usage = await agent.sample_once()
            assert usage[pod["metadata"]["uid"]].memory_used == 3 * GiB
            session = km.provisioner.session
            name = kernel_name(km.kernel_id)
            seen = await wait_until(lambda: (session.kernels[name].get("status") or {}).get("usage"), timeout=10,
                                    what="the server to see the usage through its watch")
            assert seen["memoryUsed"] == 3 * GiB and seen["utilization"] == 37.0 and seen["devices"] == ["GPU-aaaa"]
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
                       for s in family.samples}
            labels = (("kernel", name), ("namespace", "jhub"), ("pod", pod["metadata"]["name"]))
            assert samples[("gpu_pool_kernel_gpu_memory_bytes", labels)] == 3 * GiB
            assert samples[("gpu_pool_kernel_gpu_utilization_percent", labels)] == 37.0
            assert samples[("gpu_pool_node_gpu_utilization_percent", (("gpu", "GPU-aaaa"), ("node", "gpu-node-1")))] == 55
            nvml.readings = {}  # the kernel let go of the GPU
            await agent.sample_once()
            await wait_until(lambda: session.kernels[name]["status"]["usage"]["memoryUsed"] == 0, timeout=10)
        finally:
            watcher.cancel()
            await api.close()
    finally:
        await km.shutdown_kernel(now=True)
        await kube.close()


async def test_the_agent_writes_its_own_node_only(cluster_factory):
    """RBAC lets every agent patch any Node (a DaemonSet's ClusterRole cannot name each pod's own node), so
    the code keeps it to its own: with two GPU nodes, the agent of gpu-node-1 writes its reading there and
    nowhere else, a write naming gpu-node-2 (or another annotation) is refused before any request, and an
    agent without a valid node name does not start."""
    import json

    from kube_helpers import HAMI_NODE, ScriptedMemory, install
    from kubernetes_asyncio import client

    from jupyter_gpu_pool.cluster.client import api_client
    from jupyter_gpu_pool.cluster.resources import ANNOTATION_GPU_FREE
    from jupyter_gpu_pool.operator.agent import NotOwnNode, OwnNode

    cluster = cluster_factory(nodes=[HAMI_NODE, {**HAMI_NODE, "name": "gpu-node-2"}])
    await install(cluster)
    api = await api_client(cluster.kubeconfig_for("agent"))
    kube = Kube(await cluster.api())
    try:
        agent = Agent("gpu-node-1", api, ScriptedNVML(), ["GPU-aaaa"], memory=ScriptedMemory({"GPU-aaaa": 30 * GiB}))
        await agent.report_free(force=True)
        for node, annotations in (("gpu-node-2", {ANNOTATION_GPU_FREE: "{}"}),
                                  ("gpu-node-1", {"node.alpha.kubernetes.io/ttl": "0"}),
                                  ("gpu-node-1", {ANNOTATION_GPU_FREE: "{}", "other": "x"})):
            with pytest.raises(NotOwnNode):
                await agent.own_node.annotate(node, annotations)
        for bad in ("", "Gpu_Node!", "a" * 254):
            with pytest.raises(ValueError, match="its own node's name"):
                Agent(bad, api, ScriptedNVML(), ["GPU-aaaa"])
            with pytest.raises(ValueError):
                OwnNode(client.CoreV1Api(api), bad)

        writes = [(c["verb"], c["name"]) for c in await cluster.audit()
                  if c["user"] == "agent" and c["resource"].startswith("nodes")]
        assert writes == [("patch", "gpu-node-1")]  # its reading, on its own node; nothing else was sent
        own, other = (await kube.core.read_node("gpu-node-1")), (await kube.core.read_node("gpu-node-2"))
        assert json.loads(own.metadata.annotations[ANNOTATION_GPU_FREE])["devices"] == {"GPU-aaaa": 30 * GiB}
        assert ANNOTATION_GPU_FREE not in (other.metadata.annotations or {})
    finally:
        await api.close()
        await kube.close()


@pytest.mark.gpu
def test_nvml_per_process_readings_map_to_no_pod_outside_kubernetes():
    """On a GPU machine: a CUDA process of this test shows in NVML's per-process readings, and its
    cgroup (not a pod's) maps to no pod, so the agent would not misattribute it."""
    import subprocess
    import sys
    import time

    from jupyter_gpu_pool.devices.nvml import discover
    from jupyter_gpu_pool.devices.telemetry import NVMLSource

    holder = subprocess.Popen([sys.executable, "-c", "import torch, time; x = torch.ones(2**28, device='cuda');"
                               " print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        time.sleep(1)
        source = NVMLSource()
        per_gpu = source.read({g.uuid for g in discover().gpus})
        assert any(holder.pid in procs and procs[holder.pid].memory >= 2**30 for procs in per_gpu.values())
        assert usage_by_pod(per_gpu) == {}
    finally:
        holder.kill()
