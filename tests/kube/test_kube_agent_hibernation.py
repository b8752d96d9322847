"""The node agent's part of hibernation in the cluster: it moves a kernel pod's CUDA processes when the
operator sets the GPUKernel's phase, and settles the phase by compare-and-set.

On the test cluster with the process kubelet (a kernel pod is a real ipykernel process) and a real
operator that starts it; then the operator is stopped and each test writes the phases the operator
admits (Running -> Hibernating, Hibernated -> Resuming), standing in for its admission.  This
machine has no GPU: the CUDA checkpoint calls are the stand-in driver's (cuda.h's state machine,
tests/hibernation/hibernation_standin.py), NVML's readings follow it (a checkpointed process holds
no GPU memory), and the kernel's processes get their cgroup files from a /proc stand-in written as a
node's kubelet lays them out.  Every status and Node write goes through the test API server, which
validates (and prunes) it against the CRD's schema and Kubernetes' own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from jupyter_client.manager import AsyncKernelManager
from kube_helpers import GiB, Kube, OperatorProcess, ScriptedNVML, fake_proc, operator_ready, pod_processes, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hibernation"))
from hibernation_standin import STANDIN_GPUS, StandInDriver, StandInMemory  # noqa: E402

from jupyter_gpu_pool.cluster.resources import (ANNOTATION_GPU_FREE, GROUP, HIBERNATED, HIBERNATING,  # noqa: E402
                                                HIBERNATION_FAILED, HIBERNATION_REFUSED, KERNELS, RESUMING, RUNNING,
                                                VERSION, kernel_name)
from jupyter_gpu_pool.devices import checkpoint as cp  # noqa: E402
from jupyter_gpu_pool.devices.telemetry import ProcessReading  # noqa: E402
from jupyter_gpu_pool.operator.agent import Agent, pids_of_pod  # noqa: E402

NODE = "gpu-node-1"
GPU0, GPU1 = STANDIN_GPUS[0].uuid, STANDIN_GPUS[1].uuid
GPUS = [GPU0, GPU1]
S = cp.ProcessState


class DriverNVML(ScriptedNVML):
    """NVML's per-process readings on the stand-in machine: what each process holds on its GPUs, as the
    stand-in driver has it (a checkpointed process holds nothing, as measured on the H100)."""

    def __init__(self, driver: StandInDriver):
        super().__init__()
        self.driver = driver

    def read(self, gpu_uuids):
        return {g: {pid: ProcessReading(p.device_bytes // len(p.gpus), 0.0) for pid, p in self.driver.procs.items()
                    if g in p.gpus and p.state != S.CHECKPOINTED} for g in gpu_uuids}


class Rig:
    """One kernel pod on the test cluster, its processes known to the stand-in driver, and an agent."""

    def __init__(self, cluster, kube: Kube, tmp_path: Path, operator: OperatorProcess):
        self.cluster, self.kube, self.tmp_path, self.operator = cluster, kube, tmp_path, operator
        self.driver = StandInDriver()
        self.memory = StandInMemory(self.driver)
        self.kms: list[AsyncKernelManager] = []
        self.pods: dict[str, dict] = {}  # kernel name -> its pod
        self.cgroups: dict[int, str | None] = {}
        self.workers: list[subprocess.Popen] = []
        self.agent: Agent | None = None
        self.task: asyncio.Task | None = None
        self.stop = asyncio.Event()
        self.apis = []
        # a process of the host on GPU 0, in no pod: the agent must never touch it
        self.host = self._worker()
        self.driver.add(self.host.pid, 4 * GiB, (GPU0,))
        self.cgroups[self.host.pid] = None

    def _worker(self) -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "600"])
        self.workers.append(proc)
        return proc

    async def kernel(self) -> tuple[str, list[int]]:
        """Start a kernel through the provisioner and the operator; its ipykernel (6 GiB on GPU 0) and a CUDA
        worker it started (2 GiB) are the stand-in driver's processes of its pod.  Returns its name and pids."""
        km = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
        await km.start_kernel()
        self.kms.append(km)
        name = kernel_name(km.kernel_id)
        [pod] = [p for p in await self.kube.pods() if p["metadata"]["labels"].get(
            "jupyter-gpu-pool.readthedocs.io/kernel") == name]
        self.pods[name] = pod
        [kernel_proc] = pod_processes(pod["metadata"]["name"])
        worker = self._worker()
        self.driver.add(kernel_proc.pid, 6 * GiB, (GPU0,))
        self.driver.add(worker.pid, 2 * GiB, (GPU0,))
        self.cgroups.update({kernel_proc.pid: pod["metadata"]["uid"], worker.pid: pod["metadata"]["uid"]})
        fake_proc(self.tmp_path / "proc", self.cgroups)
        return name, [kernel_proc.pid, worker.pid]

    async def start_agent(self, **kwargs) -> Agent:
        api = await self.cluster.api()
        self.apis.append(api)
        self.stop = asyncio.Event()
        kwargs = {"lock_timeout": 1.0, **kwargs}
        self.agent = Agent(NODE, api, DriverNVML(self.driver), GPUS, proc_root=str(self.tmp_path / "proc"),
                           min_report=1.0, driver=self.driver, memory=self.memory, **kwargs)
        self.task = asyncio.create_task(self.agent.run(0.3, self.stop))
        return self.agent

    async def stop_agent(self) -> None:
        """The agent's process ends where it stands (its task cancelled; a driver call in flight completes, as
        one in a killed process's thread would have)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            for move in list(self.agent.moves.values()):
                move.cancel()
            await asyncio.gather(*self.agent.moves.values(), return_exceptions=True)
        self.task = None

    async def get(self, name: str) -> dict:
        return await self.kube.custom.get_namespaced_custom_object(GROUP, VERSION, self.cluster.namespace, KERNELS,
                                                                   name)

    async def set_phase(self, name: str, phase: str, **status) -> dict:
        """What the operator does when it admits a move: the phase, written with the resourceVersion read (its
        server's heartbeat changes the object every 0.5 s: a conflict is read again)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        for _ in range(20):
            kernel = await self.get(name)
            try:
                return await self.kube.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, self.cluster.namespace, KERNELS, name,
                    {"metadata": {"resourceVersion": kernel["metadata"]["resourceVersion"]},
                     "status": {"phase": phase, **status}}, _content_type="application/merge-patch+json")
            except ApiException as e:
                if e.status != 409:
                    raise
        raise AssertionError(f"could not set kernel {name}'s phase: 20 conflicts in a row")

    async def settled(self, name: str, phase: str, timeout: float = 20) -> dict:
        """The kernel once its phase is ``phase`` (a read the API server answers 503, a fault of the test, is
        read again)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        async def reached():
            try:
                kernel = await self.get(name)
            except ApiException as e:
                if e.status != 503:
                    raise
                return None
            return kernel if kernel["status"].get("phase") == phase else None

        return await wait_until(reached, timeout=timeout, what=f"kernel {name} to settle {phase}")

    def states(self, pids: list[int]) -> list[S]:
        return [self.driver.procs[pid].state for pid in pids]

    def touched(self, pids: list[int]) -> list[tuple[str, int]]:
        moves = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                 "cuCheckpointProcessUnlock")
        return [(call, pid) for call, pid in self.driver.calls if pid in pids and call in moves]

    async def close(self) -> None:
        """The kernels are stopped as a user's are, all at once: by the operator (the tests stop it: it is back for
        this, else each kernel's stop waits out jupyter_client's 5 s for a pod no one deletes) and with the agent
        still up (a restored pod's kill waits for the agent's checkpoint), its driver no longer slowed by the test;
        then the agent and the workers."""
        self.driver.lock_delay = 0.0
        if self.kms and self.operator.proc.poll() is not None:
            self.operator.start()
            await operator_ready(self.cluster)
        await asyncio.gather(*(km.shutdown_kernel(now=True) for km in self.kms))
        self.stop.set()
        await self.stop_agent()
        for proc in self.workers:
            proc.kill()
            proc.wait()
        for api in self.apis:
            await api.close()


@pytest.fixture
async def rig(cluster, operator, server_config, kube_sessions, tmp_path):
    kube = Kube(await cluster.api())
    rig = Rig(cluster, kube, tmp_path, operator)
    try:
        yield rig
    finally:
        await rig.close()
        await kube.close()


async def test_a_kernel_set_hibernating_is_checkpointed_and_resumed_on_the_same_gpu(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()  # from here the test admits the moves
    await rig.start_agent()
    node_free = await wait_until(lambda: _node_free(rig), timeout=10, what="the agent's reading on its Node")
    assert node_free["devices"] == {GPU0: 80 * GiB - 12 * GiB, GPU1: 80 * GiB}  # NVML's free memory, per GPU

    # a pid written into the resource (where a user's server may write): the agent reads none
    await rig.kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, rig.cluster.namespace, KERNELS, name,
        {"metadata": {"annotations": {"jupyter-gpu-pool.readthedocs.io/pid": str(rig.host.pid)}},
         "spec": {"pid": rig.host.pid}}, _content_type="application/merge-patch+json")
    await rig.set_phase(name, HIBERNATING, hibernation={"requestedAt": 1.0})
    kernel = await rig.settled(name, HIBERNATED)
    h = kernel["status"]["hibernation"]
    assert h["bytes"] == 8 * GiB  # what NVML saw the pod's two processes hold before the checkpoint
    assert h["devices"] == [GPU0] and h["checkpointSeconds"] >= 0 and h["hibernatedAt"] > 1.0
    assert h["requestedAt"] == 1.0  # the operator's own field is kept
    assert h["reason"] == "" and "8 GiB of GPU memory moved to host RAM" in h["message"]
    assert kernel["status"]["reason"] == "" and kernel["status"]["message"] == h["message"]
    assert rig.states(pids) == [S.CHECKPOINTED, S.CHECKPOINTED]
    locks = [pid for call, pid in rig.touched(pids) if call == "cuCheckpointProcessLock"]
    first_checkpoint = rig.driver.calls.index(("cuCheckpointProcessCheckpoint", pids[0]))
    assert sorted(locks) == pids and all(rig.driver.calls.index(("cuCheckpointProcessLock", p)) < first_checkpoint
                                         for p in pids)  # every process locked before any is checkpointed
    assert rig.touched([rig.host.pid]) == []  # the host's own process on the same GPU: never touched
    await wait_until(lambda: _free_is(rig, GPU0, 80 * GiB - 4 * GiB), timeout=10,
                     what="the Node's reading to show the freed memory")

    await rig.set_phase(name, RESUMING)
    kernel = await rig.settled(name, RUNNING)
    h = kernel["status"]["hibernation"]
    assert h["devices"] == [GPU0] and h["restoreSeconds"] >= 0 and h["resumedAt"] >= h["hibernatedAt"]
    assert h["bytes"] == 8 * GiB and "Resumed: 8 GiB back on the GPU" in h["message"]
    assert rig.states(pids) == [S.RUNNING, S.RUNNING]
    assert all(rig.driver.procs[p].restored_on == (GPU0,) for p in pids)  # the GPU the state came from
    await wait_until(lambda: _free_is(rig, GPU0, 80 * GiB - 12 * GiB), timeout=10)
    client = rig.kms[0].client()  # the kernel process itself never stopped: its variables are there
    client.start_channels()
    try:
        reply = await client.execute("x = 41 + 1", reply=True, timeout=30)
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()


async def test_a_kernel_whose_status_names_another_kernels_pod_is_refused_and_nothing_is_touched(rig, operator):
    mine, my_pids = await rig.kernel()
    other, other_pids = await rig.kernel()
    operator.stop()
    await rig.start_agent()
    other_pod = rig.pods[other]["metadata"]["name"]
    # edited by hand: kernel "mine" now names the other kernel's pod (on this node, a kernel pod, running)
    await rig.set_phase(mine, HIBERNATING, pod=other_pod)
    kernel = await rig.settled(mine, RUNNING)
    assert kernel["status"]["reason"] == HIBERNATION_REFUSED
    message = kernel["status"]["message"]
    assert f"names pod {other_pod}, which is not this kernel's own pod" in message
    assert "labelled for another kernel" in message and "this kernel does not own it" in message
    assert "nothing was touched" in message and kernel["status"]["hibernation"]["reason"] == HIBERNATION_REFUSED
    assert rig.touched(my_pids + other_pids + [rig.host.pid]) == []
    assert rig.states(my_pids + other_pids) == [S.RUNNING] * 4


async def test_a_busy_kernels_hibernation_is_refused_and_it_runs_on_untouched(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    rig.driver.busy_for(pids[1], 30)  # the worker's GPU work outlasts the lock's timeout
    await rig.start_agent(lock_timeout=0.5)
    await rig.set_phase(name, HIBERNATING)
    kernel = await rig.settled(name, RUNNING)
    assert kernel["status"]["reason"] == HIBERNATION_REFUSED
    assert "did not finish within 0.5 s" in kernel["status"]["message"]
    assert rig.states(pids) == [S.RUNNING, S.RUNNING]
    assert ("cuCheckpointProcessUnlock", pids[0]) in rig.driver.calls  # the one locked first was let go
    assert not [c for c in rig.touched(pids) if c[0] == "cuCheckpointProcessCheckpoint"]


async def test_a_failed_checkpoint_is_undone_and_the_kernel_runs_on(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    rig.driver.fail_next("cuCheckpointProcessCheckpoint", pids[1], cp.CUDA_ERROR_NOT_PERMITTED)
    await rig.start_agent()
    await rig.set_phase(name, HIBERNATING)
    kernel = await rig.settled(name, RUNNING)
    assert kernel["status"]["reason"] == HIBERNATION_FAILED
    assert "put back as it was and the kernel runs on its GPU" in kernel["status"]["message"]
    assert rig.states(pids) == [S.RUNNING, S.RUNNING]  # the first, checkpointed, was restored and unlocked


async def test_a_failed_restore_leaves_the_kernel_hibernated(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    await rig.start_agent()
    await rig.set_phase(name, HIBERNATING)
    await rig.settled(name, HIBERNATED)
    rig.driver.fail_next("cuCheckpointProcessRestore", pids[1], cp.CUDA_ERROR_INVALID_VALUE)
    await rig.set_phase(name, RESUMING)
    kernel = await rig.settled(name, HIBERNATED)
    assert kernel["status"]["reason"] == HIBERNATION_FAILED and "hibernated as before" in kernel["status"]["message"]
    assert rig.states(pids) == [S.CHECKPOINTED, S.CHECKPOINTED]  # the one restored was checkpointed again


@pytest.mark.parametrize("phase, left, settles, ends", [
    (HIBERNATING, (S.LOCKED, S.RUNNING), HIBERNATED, S.CHECKPOINTED),  # died between two locks: finished
    (HIBERNATING, (S.CHECKPOINTED, S.LOCKED), HIBERNATED, S.CHECKPOINTED),  # died between two checkpoints
    (RESUMING, (S.LOCKED, S.CHECKPOINTED), RUNNING, S.RUNNING),  # died between two restores
    (RESUMING, (S.RUNNING, S.LOCKED), RUNNING, S.RUNNING),  # died between two unlocks
])
@pytest.mark.slow
async def test_an_agent_restarted_mid_move_finishes_it_from_the_processes_real_states(rig, operator, phase, left,
                                                                                    settles, ends):
    name, pids = await rig.kernel()
    operator.stop()
    await rig.set_phase(name, phase)
    for pid, state in zip(pids, left):  # where the previous agent left them
        rig.driver.procs[pid].state = state
        if state == S.CHECKPOINTED:
            rig.driver.procs[pid].host_bytes = rig.driver.procs[pid].device_bytes
    await rig.start_agent()  # finds the kernel mid-move at its start
    kernel = await rig.settled(name, settles)
    assert rig.states(pids) == [ends, ends]
    assert kernel["status"]["reason"] == ""


@pytest.mark.slow
async def test_an_agent_killed_mid_checkpoint_leaves_it_to_the_next_one(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    rig.driver.lock_delay = 1.0
    await rig.start_agent()
    await rig.set_phase(name, HIBERNATING)
    await wait_until(lambda: ("cuCheckpointProcessLock", pids[0]) in rig.driver.calls, timeout=10)
    await rig.stop_agent()  # killed while locking: the locks in flight complete, nothing is checkpointed
    await wait_until(lambda: rig.states(pids) == [S.LOCKED, S.LOCKED], timeout=10)
    await asyncio.sleep(0.5)
    assert rig.states(pids) == [S.LOCKED, S.LOCKED]
    assert (await rig.get(name))["status"]["phase"] == HIBERNATING
    rig.driver.lock_delay = 0.0
    await rig.start_agent()
    await rig.settled(name, HIBERNATED)
    assert rig.states(pids) == [S.CHECKPOINTED, S.CHECKPOINTED]


async def test_a_move_that_can_be_neither_finished_nor_undone_fails_the_kernel(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    await rig.set_phase(name, HIBERNATING)
    rig.driver.procs[pids[0]].state = S.CHECKPOINTED  # a previous agent checkpointed one
    rig.driver.fail_next("cuCheckpointProcessCheckpoint", pids[1], cp.CUDA_ERROR_NOT_PERMITTED)
    rig.driver.fail_next("cuCheckpointProcessRestore", pids[0], cp.CUDA_ERROR_INVALID_VALUE)
    await rig.start_agent()
    kernel = await rig.settled(name, "Failed")
    assert kernel["status"]["reason"] == HIBERNATION_FAILED
    assert "could not be undone: its processes were left 1 checkpointed, 1 running" in kernel["status"]["message"]
    assert rig.states(pids) == [S.CHECKPOINTED, S.RUNNING]  # as the message says; the operator deletes the pod


@pytest.mark.slow
async def test_a_settle_re_reads_on_a_conflict_and_never_overwrites_anothers_move(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    rig.driver.lock_delay = 1.0
    await rig.start_agent()
    # 1. the object changes under the move (its server's heartbeat, an annotation): the settle, refused with
    #    409 on the version it read, reads again, finds the phase still Hibernating and settles
    await rig.set_phase(name, HIBERNATING)
    await wait_until(lambda: ("cuCheckpointProcessLock", pids[0]) in rig.driver.calls, timeout=10)
    await rig.kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, rig.cluster.namespace, KERNELS, name, {"metadata": {"annotations": {"example.org/note": "x"}}},
        _content_type="application/merge-patch+json")
    kernel = await rig.settled(name, HIBERNATED)
    assert kernel["metadata"]["annotations"]["example.org/note"] == "x"
    rig.driver.lock_delay = 0.0
    # 2. someone else moves the phase during a resume (back to Hibernated): the agent does not write Running
    #    over it, and puts the processes back to what that phase counts (checkpointed: no GPU memory held).
    #    The restores wait for that write, so it lands during the resume however slowly the machine answers.
    rig.driver.calls.clear()
    slow_restore, moved = rig.driver.restore, threading.Event()

    def restore(pid, pairs=None):
        slow_restore(pid, pairs)
        assert moved.wait(30), "the test's own phase write never came"

    rig.driver.restore = restore
    await rig.set_phase(name, RESUMING)
    await wait_until(lambda: ("cuCheckpointProcessRestore", pids[0]) in rig.driver.calls, timeout=10)
    await rig.set_phase(name, HIBERNATED, reason="Test", message="moved by someone else")
    moved.set()
    await wait_until(lambda: not rig.agent.moves, timeout=10, what="the agent's move to end")
    kernel = await rig.get(name)
    assert (kernel["status"]["phase"], kernel["status"]["message"]) == (HIBERNATED, "moved by someone else")
    assert rig.states(pids) == [S.CHECKPOINTED, S.CHECKPOINTED]


@pytest.mark.slow
async def test_a_move_whose_settle_meets_the_api_server_down_settles_once_it_is_back(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    rig.driver.lock_delay = 1.0
    await rig.start_agent()
    await rig.set_phase(name, HIBERNATING)
    await wait_until(lambda: ("cuCheckpointProcessLock", pids[0]) in rig.driver.calls, timeout=10)
    await rig.cluster.fault(resources=["gpukernels"], status=503, seconds=4)  # the settle is refused
    await wait_until(lambda: rig.states(pids) == [S.CHECKPOINTED, S.CHECKPOINTED], timeout=10)
    kernel = await rig.settled(name, HIBERNATED)  # once the fault is over: a later pass, from the real states
    h = kernel["status"]["hibernation"]
    assert h["bytes"] == 8 * GiB and h["devices"] == [GPU0]  # what was measured before the checkpoint
    assert rig.states(pids) == [S.CHECKPOINTED, S.CHECKPOINTED]
    assert [c for c in rig.touched(pids) if c[0] == "cuCheckpointProcessCheckpoint"] == [
        ("cuCheckpointProcessCheckpoint", pids[0]), ("cuCheckpointProcessCheckpoint", pids[1])]  # once each


@pytest.mark.slow
async def test_a_pod_deleted_while_hibernated_is_left_to_the_operator(rig, operator):
    name, pids = await rig.kernel()
    operator.stop()
    await rig.start_agent()
    await rig.set_phase(name, HIBERNATING)
    await rig.settled(name, HIBERNATED)
    pod = rig.pods[name]["metadata"]["name"]
    await rig.kube.core.delete_namespaced_pod(pod, rig.cluster.namespace, grace_period_seconds=0)
    await wait_until(lambda: not rig.agent.pods, timeout=10, what="the agent to see the pod gone")
    rig.driver.calls.clear()
    await rig.set_phase(name, RESUMING)
    await asyncio.sleep(1.5)  # several of the agent's passes
    kernel = await rig.get(name)
    assert kernel["status"]["phase"] == RESUMING and kernel["status"].get("reason") != HIBERNATION_FAILED
    assert rig.touched(pids) == []  # nothing restored into a pod that is gone; the operator frees the slice


async def _resumed_by_the_agent(rig: Rig, operator) -> tuple[list[int], str]:
    """A kernel the agent hibernated and resumed (the test admits the moves): its processes and its pod."""
    name, pids = await rig.kernel()
    operator.stop()
    await rig.start_agent()
    await rig.set_phase(name, HIBERNATING)
    await rig.settled(name, HIBERNATED)
    await rig.set_phase(name, RESUMING)
    await rig.settled(name, RUNNING)
    return pids, rig.pods[name]["metadata"]["name"]


# A kernel's process as in a container, where it is PID 1: the kubelet's SIGTERM, which it has no handler for,
# does not end it, so the agent has the grace period (without pid1 the test cluster's kubelet ends it at once,
# and the test would be a race between the kubelet's signal and the agent's watch).
@pytest.mark.cluster_options(pid1=True)
@pytest.mark.slow
async def test_a_resumed_pod_is_checkpointed_again_before_its_kill(rig, operator):
    pids, pod = await _resumed_by_the_agent(rig, operator)
    # Once the kubelet kills the processes no second checkpoint can come: the agent's comes within the grace
    # period (30 s, so that a loaded machine's slow watch still shows the order, not the load).
    await rig.kube.core.delete_namespaced_pod(pod, rig.cluster.namespace, grace_period_seconds=30)
    await wait_until(lambda: all(rig.driver.procs[p].checkpoints == 2 for p in pids), timeout=30,
                     what="the restored processes to be checkpointed before the kill (cuda-checkpoint issue 53)")


@pytest.mark.cluster_options(pid1=True)
async def test_a_resumed_pods_deletion_missed_by_the_watch_is_seen_on_the_relist_and_checkpointed_first(rig, operator):
    """The agent's pod watch is down (quiet, not knowing it) while the pod's deletion begins: no MODIFIED event
    carries the deletionTimestamp, and the listing that follows the watch's 410 is where the agent learns it."""
    pids, pod = await _resumed_by_the_agent(rig, operator)
    await rig.cluster.fault(stall=["pods"])
    await rig.kube.core.delete_namespaced_pod(pod, rig.cluster.namespace, grace_period_seconds=30)
    await asyncio.sleep(1.0)
    assert all(rig.driver.procs[p].checkpoints == 1 for p in pids)  # the watch is quiet: nothing seen yet
    await rig.cluster.fault(resume=True)
    await wait_until(lambda: all(rig.driver.procs[p].checkpoints == 2 for p in pids), timeout=30,
                     what="the restored processes to be checkpointed once the re-list shows the deletion")


def test_a_pods_processes_are_found_from_their_cgroups_only(tmp_path):
    a, b = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "2c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
    proc = fake_proc(tmp_path, {30: a, 10: a, 20: b, 40: None})
    (tmp_path / "self").mkdir()  # /proc's non-pid entries are skipped
    assert pids_of_pod(a, proc) == [10, 30] and pids_of_pod(b, proc) == [20]
    assert pids_of_pod("3c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", proc) == []


async def _node_free(rig: Rig) -> dict | None:
    node = await rig.kube.core.read_node(NODE)
    text = (node.metadata.annotations or {}).get(ANNOTATION_GPU_FREE)
    return json.loads(text) if text else None


async def _free_is(rig: Rig, gpu: str, value: int) -> bool:
    reading = await _node_free(rig)
    return bool(reading) and reading["devices"].get(gpu) == value and reading["sampledAt"] > 0
