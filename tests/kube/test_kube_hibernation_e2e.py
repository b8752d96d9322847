"""Hibernation in the cluster end to end, with the real parts together: a real jupyter_server (its
``ClusterHibernation`` hook), the real operator (admission, accounting, the resume queue) and the real node
agent (operator/agent.py) moving the kernel pod's processes.  This machine has no GPU: the agent's CUDA
checkpoint calls go to the stand-in driver (cuda.h's state machine, tests/hibernation/hibernation_standin.py),
its NVML readings follow that driver (a checkpointed process holds no GPU memory), and it finds a pod's
processes in a /proc stand-in laid out as a node's kubelet does.  No test-only settling agent here: every
phase after the operator's admission is the real agent's write, and every free-memory reading the operator
queues on is the agent's own annotation on its Node.

The last test runs twice: so, and, marked ``gpu``, on the GPU machine with the real checkpoint driver and NVML
(the process kubelet runs the kernel pod as a local process there; only its cgroup file is the stand-in's).

Every test runs again, marked ``k8s``, on the cluster ``KUBECONFIG`` names, where the node stand-in allows it:
the agent runs here, so the kernel pods' processes must be processes of this machine (``GPU_POOL_TEST_NODE``
names a node whose kubelet runs its pods here: this machine, or the test cluster's kubelet under a real
control plane; the operator places the test's kernels there) and the cluster's sharing must hand a hibernated
kernel's memory back (``GPU_POOL_TEST_SHARING=hami``, its deviceMemoryScaling above 1, as the tests' operator
is told); else they are skipped, saying which.  They leave the node as they found it: uncordoned where they
drained it, its free-memory annotation as it was.  The first test writes the GPUPoolPolicy ``default``, which
is the admin's on a real cluster: it runs on the test cluster only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_standin import kernel, phase_of
from kube_helpers import GiB, Kube, fake_proc, pod_processes, wait_until
from test_kube_agent_hibernation import DriverNVML
from test_kube_server_hibernation import API, Cell, body, extension, jp_server_config  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hibernation"))
from hibernation_standin import STANDIN_GPUS, StandInDriver, StandInMemory  # noqa: E402

from jupyter_gpu_pool.cluster.resources import (ANNOTATION_GPU_FREE, HIBERNATED, RUNNING,  # noqa: E402
                                                kernel_name)
from jupyter_gpu_pool.devices import checkpoint as cp  # noqa: E402
from jupyter_gpu_pool.operator.agent import Agent  # noqa: E402

REAL_CLUSTER_TOO = True  # also run, marked k8s, on the cluster KUBECONFIG names (see above)
NODE = "gpu-node-1"
GPU0, GPU1 = STANDIN_GPUS[0].uuid, STANDIN_GPUS[1].uuid
S = cp.ProcessState


class Node:
    """The node's side: its GPUs, the /proc stand-in and the real agent on them.  ``machine``: ``standin`` (the
    stand-in GPUs, checkpoint driver and NVML) or ``gpu`` (this machine's GPUs, the real driver and NVML)."""

    def __init__(self, cluster, tmp_path: Path, machine: str = "standin", driver: StandInDriver | None = None,
                 name: str = NODE):
        self.cluster, self.tmp_path, self.machine, self.name = cluster, tmp_path, machine, name
        self.annotation: tuple[str | None] | None = None  # the Node's free-memory annotation before the agent's
        if machine == "gpu":
            from jupyter_gpu_pool.devices.nvml import NVMLMemory, discover
            from jupyter_gpu_pool.devices.telemetry import NVMLSource

            self.driver, self.source, self.memory = cp.driver(), NVMLSource(), NVMLMemory()
            self.gpus = [g.uuid for g in discover().gpus]
        else:
            self.driver = driver or StandInDriver()
            self.source, self.memory, self.gpus = DriverNVML(self.driver), StandInMemory(self.driver), [GPU0, GPU1]
        self.cgroups: dict[int, str | None] = {}
        self.stop = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.api = None

    @staticmethod
    def name_on(cluster) -> str:
        """The node the tests' kernels run on: the test cluster's, or on a real one ``GPU_POOL_TEST_NODE`` where
        the stand-in can work there (else the test is skipped, saying why)."""
        if cluster.local:
            return NODE
        name, sharing = os.environ.get("GPU_POOL_TEST_NODE", ""), os.environ.get("GPU_POOL_TEST_SHARING", "whole")
        if not name or sharing != "hami":
            pytest.skip("on a real cluster the node stand-in needs GPU_POOL_TEST_NODE (a node whose kernel pods' "
                        "processes are processes of this machine) and GPU_POOL_TEST_SHARING=hami (deviceMemoryScaling "
                        f"above 1, so a hibernation hands memory back); here: {name or 'unset'!r}, {sharing!r}")
        return name

    def operator_settings(self, **more) -> dict:
        """The tests' operator: HAMi oversubscribed (memory is handed back), and on a real cluster kernels placed on
        this node."""
        placed = {} if self.cluster.local else {"GPUPoolOperator.node_selector": {"kubernetes.io/hostname": self.name}}
        return {"GPUPoolOperator.hami_memory_scaling": 2.0, **placed, **more}

    async def start(self) -> Agent:
        self.api = await self.cluster.api()
        if not self.cluster.local:  # put back as it was when the test ends
            from kubernetes_asyncio import client

            found = await client.CoreV1Api(self.api).read_node(self.name)
            self.annotation = ((found.metadata.annotations or {}).get(ANNOTATION_GPU_FREE),)
        self.agent = Agent(self.name, self.api, self.source, self.gpus, proc_root=str(self.tmp_path / "proc"),
                           min_report=0.5, driver=self.driver, memory=self.memory, lock_timeout=1.0)
        self.task = asyncio.create_task(self.agent.run(0.3, self.stop))
        return self.agent

    async def adopt(self, kube: Kube, name: str) -> int:
        """The pid of the kernel's pod process, written into the /proc stand-in under its pod's cgroup."""
        [pod] = [p for p in await kube.pods() if p["metadata"]["labels"].get(
            "jupyter-gpu-pool.readthedocs.io/kernel") == name]
        [proc] = pod_processes(pod["metadata"]["name"], anywhere=not self.cluster.local)
        self.cgroups[proc.pid] = pod["metadata"]["uid"]
        fake_proc(self.tmp_path / "proc", self.cgroups)
        return proc.pid

    async def on_gpu(self, kube: Kube, name: str, device_bytes: int) -> int:
        """The kernel's pod process is a CUDA process holding ``device_bytes`` on the stand-in's GPU 0; its pid."""
        pid = await self.adopt(kube, name)
        self.driver.add(pid, device_bytes, (GPU0,))
        return pid

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            await asyncio.gather(*self.agent.moves.values(), return_exceptions=True)
        if self.api is not None:
            if self.annotation is not None:
                from kubernetes_asyncio import client

                await client.CoreV1Api(self.api).patch_node(
                    self.name, {"metadata": {"annotations": {ANNOTATION_GPU_FREE: self.annotation[0]}}})
            await self.api.close()


async def start_on_gpu(jp_fetch, kube: Kube, node) -> tuple[str, str, int]:
    """A small kernel pod holding 6 GiB of GPU 0, once the agent has read it: (kernel id, GPUKernel, pid)."""
    kid = body(await jp_fetch("api", "kernels", method="POST",
                              body=json.dumps({"name": "gpu-pool-kubernetes-small"})))["id"]
    name = kernel_name(kid)
    pid = await node.on_gpu(kube, name, 6 * GiB)
    await wait_until(lambda: _usage(kube, name), timeout=15, what="the agent's NVML reading of the kernel")
    return kid, name, pid


async def _free(kube: Kube, node: str = NODE) -> dict:
    annotations = (await kube.core.read_node(node)).metadata.annotations or {}
    return json.loads(annotations.get(ANNOTATION_GPU_FREE) or "{}").get("devices") or {}


async def _usage(kube: Kube, name: str) -> int:
    return int(((await kernel(kube, name)).get("status") or {}).get("usage", {}).get("memoryUsed") or 0)


@pytest.fixture
def policy_of_its_own(cluster):
    """A test that writes the GPUPoolPolicy ``default``: the admin's on a real cluster, so the test cluster only."""
    if not cluster.local:
        pytest.skip("it writes the GPUPoolPolicy 'default', which is the admin's on a real cluster")


@pytest.mark.usefixtures("policy_of_its_own")
@pytest.mark.slow
async def test_an_idle_kernel_is_warned_hibernated_by_the_real_agent_and_a_cell_resumes_it_after_the_queue(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node):
    await operator_factory(cluster, **node.operator_settings())
    ext = await extension(jp_serverapp)
    try:
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        assert await _usage(kube, name) == 6 * GiB
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")
        await Cell(ws, "x = 41").run()

        # the idle policy: warned, then hibernated (the operator admits, the real agent checkpoints)
        from test_kube_server_extension import set_policy

        await set_policy(kube, ext, [{"name": "quick", "idle_timeout": 3, "gpu_idle_timeout": None, "warn": 1,
                                      "action": "hibernate"}])

        async def warned():
            return next((e for e in body(await jp_fetch(*API, "me"))["recent"]
                         if e["kind"] == "warned" and e["kernel_id"] == kid), None)

        await wait_until(warned, timeout=30, what="the idle kernel to be warned")
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=40, what="the real agent to hibernate it")
        obj = await kernel(kube, name)
        assert obj["spec"]["hibernateReason"] == "idle"
        h = obj["status"]["hibernation"]
        assert h["bytes"] == 6 * GiB and h["devices"] == [GPU0] and h["checkpointSeconds"] >= 0
        assert node.driver.procs[pid].state == S.CHECKPOINTED
        assert ("cuCheckpointProcessCheckpoint", pid) in node.driver.calls
        await wait_until(lambda: _free_is(kube, node.name, GPU0, 80 * GiB), timeout=10,
                         what="the Node to show GPU 0 free")

        async def shown_hibernated():
            me = body(await jp_fetch(*API, "me"))
            [k] = me["kernels"]
            return k["state"] == "hibernated" and me["usage"]["memory"] == 0

        await wait_until(shown_hibernated, timeout=20, what="GET me to show it hibernated, its slice free")
        [gpu] = body(await jp_fetch(*API, "pool"))["gpus"]
        assert gpu["used_memory"] == 0  # the operator's accounting: the slice is free

        # no idle policy from here: a second kernel takes the room on GPU 0
        await set_policy(kube, ext, [])
        kid2 = body(await jp_fetch("api", "kernels", method="POST",
                                   body=json.dumps({"name": "gpu-pool-kubernetes-small"})))["id"]
        pid2 = await node.on_gpu(kube, kernel_name(kid2), 76 * GiB)
        await wait_until(lambda: _free_is(kube, node.name, GPU0, 4 * GiB), timeout=10,
                         what="the Node to show GPU 0 full")

        # the first user runs a cell: the resume waits with its position until room frees
        cell = Cell(ws, "print(x + 1)")
        running = asyncio.create_task(cell.run())
        await wait_until(lambda: _queued(kube, name), timeout=30, what="the resume to wait with its position")
        await wait_until(lambda: any("position 1 in its node's queue" in t for t in cell.texts()), timeout=20,
                         what="the cell to show its place in the queue")
        assert not running.done() and node.driver.procs[pid].state == S.CHECKPOINTED
        await jp_fetch("api", "kernels", kid2, method="DELETE")
        node.driver.procs.pop(pid2)  # its process is gone with its pod: its GPU memory with it
        await asyncio.wait_for(running, 60)
        assert "42\n" in cell.texts()  # its variables were kept
        obj = await kernel(kube, name)
        assert phase_of(obj) == RUNNING and obj["status"]["hibernation"]["restoreSeconds"] >= 0
        assert node.driver.procs[pid].state == S.RUNNING and node.driver.procs[pid].restored_on == (GPU0,)
        ws.close()
    finally:
        await ext.stop_extension()


async def test_a_checkpoint_the_agent_undid_reaches_the_user_in_its_words_and_is_not_admitted_again(
        cluster, operator_factory, jp_serverapp, jp_fetch, kube_sessions, kube, node):
    """The agent's checkpoint fails and it puts the kernel back (Running, HibernationFailed): the operator
    keeps those words for the server (no reconcile overwrites them) and does not admit the same request
    again (the stand-in fails only one checkpoint: a second admission would hibernate the kernel).  The
    server's policy for a failed hibernation stands: the user's Release shuts the kernel down, saying why in
    the agent's words, and its slice is counted once, then not at all."""
    await operator_factory(cluster, **node.operator_settings())
    ext = await extension(jp_serverapp)
    try:
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        me = body(await jp_fetch(*API, "me"))
        assert me["usage"]["kernels"] == 1 and me["usage"]["memory"] > 0
        node.driver.fail_next("cuCheckpointProcessCheckpoint", pid, cp.CUDA_ERROR_NOT_PERMITTED)
        r = await jp_fetch(*API, "kernels", kid, "release", method="POST", body="{}")
        assert r.code == 202

        async def told():
            return [e for e in body(await jp_fetch(*API, "me"))["recent"] if e["kernel_id"] == kid
                    and "The checkpoint of this kernel failed" in (e.get("message") or "")]

        entries = await wait_until(told, timeout=40, what="the agent's words on record")
        assert any("the kernel runs on its GPU" in e["message"] for e in entries)
        assert "CUDA_ERROR_NOT_PERMITTED" in entries[0]["message"]
        checkpoints = [c for c in node.driver.calls if c == ("cuCheckpointProcessCheckpoint", pid)]
        assert len(checkpoints) == 1  # answered once: no second admission of the same request
        assert node.driver.procs[pid].state == S.RUNNING

        async def slice_free():
            me = body(await jp_fetch(*API, "me"))
            return me["usage"]["kernels"] == 0 and me["usage"]["memory"] == 0

        await wait_until(slice_free, timeout=30, what="the shut-down kernel's slice to be free")
        assert [c for c in node.driver.calls if c == ("cuCheckpointProcessCheckpoint", pid)] == checkpoints
    finally:
        await ext.stop_extension()


async def test_the_operator_keeps_the_agents_failure_and_admits_the_same_request_no_more(
        cluster, operator_factory, server_config, kube_sessions, kube, node):
    """The operator alone with the agent (no server to withdraw the request): the agent's checkpoint fails
    and it puts the kernel back (Running, HibernationFailed).  spec.desiredState still says Hibernated, at
    the same generation: the operator must neither admit it again (the stand-in fails one checkpoint only:
    a second admission would hibernate it) nor let its reconcile overwrite the agent's words; a new request
    (a new generation) is admitted."""
    from agent_standin import ask
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_gpu_pool.cluster.resources import HIBERNATION_FAILED

    await operator_factory(cluster, **node.operator_settings())
    await node.start()
    km = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
    await km.start_kernel()
    try:
        name = kernel_name(km.kernel_id)
        pid = await node.on_gpu(kube, name, 6 * GiB)
        await wait_until(lambda: _usage(kube, name), timeout=15, what="the agent's NVML reading of the kernel")
        node.driver.fail_next("cuCheckpointProcessCheckpoint", pid, cp.CUDA_ERROR_NOT_PERMITTED)
        await ask(kube, name, "Hibernated", "idle")

        async def failed():
            obj = await kernel(kube, name)
            return obj if obj["status"].get("reason") == HIBERNATION_FAILED else None

        obj = await wait_until(failed, timeout=20, what="the agent to undo the failed checkpoint")
        assert phase_of(obj) == RUNNING and "The checkpoint of this kernel failed" in obj["status"]["message"]
        await asyncio.sleep(3)  # the operator's reconciles (the server's heartbeat, the agent's readings)
        obj = await kernel(kube, name)
        assert [c for c in node.driver.calls if c == ("cuCheckpointProcessCheckpoint", pid)] == \
            [("cuCheckpointProcessCheckpoint", pid)]
        assert phase_of(obj) == RUNNING and obj["status"]["reason"] == HIBERNATION_FAILED
        assert "The checkpoint of this kernel failed" in obj["status"]["message"]
        assert node.driver.procs[pid].state == S.RUNNING

        await ask(kube, name, "Running", "user")
        await ask(kube, name, "Hibernated", "idle")  # asked anew: admitted, and this checkpoint works
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=20, what="the new request to hibernate it")
        assert node.driver.procs[pid].state == S.CHECKPOINTED
    finally:
        await km.shutdown_kernel(now=True)


@pytest.mark.parametrize("how", ["stopped by its server", "its node drained"])
async def test_a_kernel_pod_ended_right_after_its_resume_is_checkpointed_again_before_its_kill(
        cluster, operator_factory, server_config, kube_sessions, kube, node, drain, how):
    """Killing a just-restored process hung a host on one driver (cuda-checkpoint issue 53): the operator
    admits a resume, the real agent restores the pod's process, and the pod is then stopped with a grace
    period, by its server (the provisioner's terminate: spec.stopped; the operator asks the agent through
    status.killPrecaution before it deletes the pod) or by a drain's eviction (the agent sees the pod
    terminating).  Either way the agent locks and checkpoints the restored process again
    (AgentApp.checkpoint_before_kill); then the pod is gone.  The grace-0 kill, the timeout and the
    refusals: test_kube_kill_precaution.py."""
    from agent_standin import ask
    from jupyter_client.manager import AsyncKernelManager

    await operator_factory(cluster, **node.operator_settings())
    await node.start()
    km = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
    await km.start_kernel()
    try:
        name = kernel_name(km.kernel_id)
        pid = await node.on_gpu(kube, name, 6 * GiB)
        await wait_until(lambda: _usage(kube, name), timeout=15, what="the agent's NVML reading of the kernel")
        await ask(kube, name, "Hibernated", "idle")
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=20, what="the agent's checkpoint")
        await ask(kube, name, "Running", "user")
        await wait_until(lambda: _phase(kube, name, RUNNING), timeout=20, what="the agent's restore")
        assert node.driver.procs[pid].restores == 1 and node.driver.procs[pid].checkpoints == 1
        restored_at = len(node.driver.calls)
        pod = (await kernel(kube, name))["status"]["pod"]
        if how == "stopped by its server":
            await km.provisioner.terminate()  # spec.stopped, with its grace: the operator deletes the pod
        else:
            await drain(node.name, pod)  # the node is uncordoned when the test ends (the drain fixture)
        await wait_until(lambda: node.driver.procs[pid].checkpoints == 2, timeout=15,
                         what="the restored process to be checkpointed again before its kill")
        moves = [c for c in node.driver.calls[restored_at:] if c[0] != "cuCheckpointProcessGetState"]
        assert moves == [("cuCheckpointProcessLock", pid), ("cuCheckpointProcessCheckpoint", pid)]

        async def pod_gone():
            return not [p for p in await kube.pods() if p["metadata"]["name"] == pod]

        await wait_until(pod_gone, timeout=30, what="the pod to go")
    finally:
        await km.shutdown_kernel(now=True)


@pytest.mark.slow
async def test_a_hint_has_the_real_agent_restore_a_kernel_pod_before_its_cell_runs(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node):
    """Its user opens the notebook: the hint's resume is admitted into the room the agent reads free, the real
    agent restores the pod's process, and the cell that follows finds it running, with its variables."""
    await operator_factory(cluster, **node.operator_settings())
    ext = await extension(jp_serverapp)
    try:
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")
        await Cell(ws, "x = 41").run()
        await jp_fetch(*API, "kernels", kid, "release", method="POST", body="{}")
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=40, what="the real agent to hibernate it")
        assert node.driver.procs[pid].state == S.CHECKPOINTED

        r = await jp_fetch(*API, "kernels", kid, "hint", method="POST", body="{}")
        assert r.code == 202 and body(r)["woken"] is True, body(r)
        await wait_until(lambda: _phase(kube, name, RUNNING), timeout=30, what="the agent to restore it before a cell")
        assert node.driver.procs[pid].state == S.RUNNING and node.driver.procs[pid].restored_on == (GPU0,)
        me = body(await jp_fetch(*API, "me"))
        assert [k["woken_on_hint"] for k in me["kernels"]] == [True]

        restores = [c for c in node.driver.calls if c == ("cuCheckpointProcessRestore", pid)]
        cell = Cell(ws, "print(x + 1)")
        await asyncio.wait_for(cell.run(), 30)
        assert "42\n" in cell.texts()  # its variables were kept
        assert [c for c in node.driver.calls if c == ("cuCheckpointProcessRestore", pid)] == restores  # no 2nd
        me = body(await jp_fetch(*API, "me"))
        assert [k["woken_on_hint"] for k in me["kernels"]] == [False]  # used: no longer a guess
        ws.close()
    finally:
        await ext.stop_extension()


async def _phase(kube: Kube, name: str, phase: str) -> bool:
    return phase_of(await kernel(kube, name)) == phase


async def _free_is(kube: Kube, node: str, gpu: str, free: int) -> bool:
    return (await _free(kube, node)).get(gpu) == free


async def _queued(kube: Kube, name: str) -> bool:
    return ((await kernel(kube, name)).get("status") or {}).get("hibernation", {}).get("queuePosition") == 1


# -- the same path on a real GPU ------------------------------------------------------------------------

HOLD = 4  # GiB the kernel pod holds
# What the kernel holds, and its checksum (whether each value came back): real tensors on a GPU; on the stand-in,
# values in the process, and the stand-in driver is told what the process holds.
TENSORS = {"gpu": ("import torch\ntorch.manual_seed(0)\nx = torch.randn({gib} * 2**30 // 4, device='cuda')\n"
                   "torch.cuda.synchronize()"),
           "standin": "x = [float(i) for i in range(2**20)]"}
CHECKSUM = {"gpu": "print('checksum', repr(sum(float(c.sum()) for c in x.split(2**27))))",
            "standin": "print('checksum', repr(sum(x)))"}
# Another process (no kernel, no slice) takes all of the GPU's free memory but 1 GiB, then waits.
FILLER = ("import sys, torch\nfree, total = torch.cuda.mem_get_info()\n"
          "y = torch.empty(free - 2**30, dtype=torch.uint8, device='cuda')\ntorch.cuda.synchronize()\n"
          "print('filled', y.numel(), flush=True)\nsys.stdin.readline()\n")


def kernel_command() -> list[str]:
    """The kernel pod's command: this test's Python, finding the packages this test finds (on the GPU machine,
    scripts/gpu-check's wheels are on PYTHONPATH, which the process kubelet does not pass to a pod)."""
    extra = os.environ.get("PYTHONPATH", "")
    launch = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if not extra:
        return launch
    return ["/bin/sh", "-c", 'PYTHONPATH="$PYTHONPATH:$0" exec "$@"', extra, *launch]


async def hold_memory(node: Node, ws, pid: int) -> str:
    """The kernel pod's process holds ``HOLD`` GiB on the node's first GPU; the checksum of what it holds."""
    await Cell(ws, TENSORS[node.machine].format(gib=HOLD)).run()
    if node.machine != "gpu":
        node.driver.add(pid, HOLD * GiB, (node.gpus[0],))
    got = await Cell(ws, CHECKSUM[node.machine]).run()
    return next(c["text"] for kind, c in got if kind == "stream" and c["text"].startswith("checksum"))


class Filler:
    """Another process on the node's first GPU taking all of its free memory but 1 GiB (on the stand-in: a
    process the stand-in driver is told holds it)."""

    def __init__(self, node: Node):
        self.node = node
        self.proc: subprocess.Popen | None = None

    async def __aenter__(self) -> int:
        gpu = self.node.gpus[0]
        if self.node.machine == "gpu":
            self.proc = subprocess.Popen([sys.executable, "-c", FILLER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
            line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 120)
            assert line.startswith("filled"), line
            return int(line.split()[1])
        self.proc = subprocess.Popen(["sleep", "600"])
        taken = self.node.memory.free(gpu) - GiB
        self.node.driver.add(self.proc.pid, taken, (gpu,))
        return taken

    async def __aexit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.node.machine != "gpu":
            self.node.driver.procs.pop(self.proc.pid)  # its memory went with it


@pytest.mark.parametrize("node", ["standin", pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
async def test_a_kernel_pods_gpu_memory_goes_to_host_memory_for_another_process_and_comes_back_intact(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node, record_property):
    """The whole cluster path: the user's Release (the server), the operator's admission, the agent's checkpoint
    of the pod's processes (found through the pod's cgroup), NVML showing its memory gone, another process
    using that memory, and a cell that resumes the kernel with every value as it was."""
    await operator_factory(cluster, **node.operator_settings(**{"GPUPoolOperator.kernel_command": kernel_command()}))
    ext = await extension(jp_serverapp)
    try:
        await node.start()
        kid = body(await jp_fetch("api", "kernels", method="POST",
                                  body=json.dumps({"name": "gpu-pool-kubernetes-small"})))["id"]
        name = kernel_name(kid)
        pid = await node.adopt(kube, name)
        gpu = node.gpus[0]
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")
        before = await hold_memory(node, ws, pid)
        await wait_until(lambda: _usage_at_least(kube, name, HOLD * GiB), timeout=30,
                         what="the agent's NVML reading of the kernel's memory")
        free_before = node.memory.free(gpu)

        asked = time.monotonic()
        r = await jp_fetch(*API, "kernels", kid, "release", method="POST", body="{}")
        assert r.code == 202 and body(r)["action"] == "hibernate", body(r)
        await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=120, what="the real agent to hibernate it")
        record_property("hibernate_request_to_status_s", round(time.monotonic() - asked, 2))

        h = (await kernel(kube, name))["status"]["hibernation"]
        record_property("moved_gib", round(h["bytes"] / GiB, 2))
        record_property("checkpoint_s", h["checkpointSeconds"])
        assert h["bytes"] >= HOLD * GiB and h["devices"] == [gpu]
        assert node.driver.state(pid) == S.CHECKPOINTED
        assert not (node.memory.of_processes([pid]) or {}).get(pid)  # NVML lists none of its memory
        assert node.memory.free(gpu) >= free_before + HOLD * GiB - GiB // 4

        async with Filler(node) as taken:  # another process takes the memory the kernel gave back
            assert taken > free_before, (taken, free_before)
        record_property("other_process_gib", round(taken / GiB, 2))

        asked = time.monotonic()
        cell = Cell(ws, CHECKSUM[node.machine])
        await asyncio.wait_for(cell.run(), 300)
        record_property("resume_cell_s", round(time.monotonic() - asked, 2))
        assert before in cell.texts()  # every value as it was
        obj = await kernel(kube, name)
        assert phase_of(obj) == RUNNING and obj["status"]["hibernation"]["restoreSeconds"] >= 0
        record_property("restore_s", obj["status"]["hibernation"]["restoreSeconds"])
        assert node.driver.state(pid) == S.RUNNING
        assert (node.memory.of_processes([pid]) or {}).get(pid, 0) >= HOLD * GiB  # back on its GPU
        ws.close()
    finally:
        await ext.stop_extension()


async def _usage_at_least(kube: Kube, name: str, memory: int) -> bool:
    return await _usage(kube, name) >= memory
