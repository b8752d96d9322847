"""The precaution before killing a process the node agent restored (cuda-checkpoint issue 53: killing a
just-restored process hung a host on one driver), for every stop of a kernel pod the operator makes, grace
0 included.  The kubelet kills a pod's processes as its deletion begins, so the operator asks first: it
writes status.killPrecaution (compare-and-set), the node agent locks and checkpoints the restored processes
of that pod (found from the pod's cgroup) and answers, and only then is the pod deleted; bounded by
``GPUPoolOperator.kill_precaution_timeout``.  The real operator, the real agent and the stand-in driver, on
the test cluster, as in test_kube_hibernation_e2e.py."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from agent_standin import ask, kernel, phase_of
from kube_helpers import GiB, Kube, wait_until
from test_kube_hibernation_e2e import Node, _phase, _usage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hibernation"))
from hibernation_standin import StandInDriver  # noqa: E402

from jupyter_gpu_pool.cluster.resources import (GROUP, HIBERNATED, KERNELS, KILL_PRECAUTION_TIMED_OUT,  # noqa: E402
                                                RUNNING, VERSION, kernel_name)
from jupyter_gpu_pool.devices import checkpoint as cp  # noqa: E402

HAMI = {"GPUPoolOperator.hami_memory_scaling": 2.0}
MOVING_CALLS = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                "cuCheckpointProcessUnlock")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


@dataclass
class WitnessDriver(StandInDriver):
    """The stand-in driver, noting with each lock and checkpoint whether the process was alive then."""

    witnessed: list[tuple[str, int, bool]] = field(default_factory=list)

    def lock(self, pid: int, timeout: float) -> None:
        self.witnessed.append(("lock", pid, _alive(pid)))
        super().lock(pid, timeout)

    def checkpoint(self, pid: int) -> None:
        self.witnessed.append(("checkpoint", pid, _alive(pid)))
        super().checkpoint(pid)


@pytest.fixture
async def node(cluster, tmp_path):
    n = Node(cluster, tmp_path, driver=WitnessDriver())
    yield n
    await n.close()


async def _start(kube: Kube, node: Node):
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
    await km.start_kernel()
    name = kernel_name(km.kernel_id)
    await wait_until(lambda: _phase(kube, name, RUNNING), timeout=30, what="the kernel's pod to run")
    pid = await node.on_gpu(kube, name, 6 * GiB)
    return km, name, pid


async def _hibernate_and_resume(kube: Kube, name: str, node: Node, pid: int) -> str:
    """The real agent checkpoints the kernel and restores it; its pod's name."""
    await wait_until(lambda: _usage(kube, name), timeout=15, what="the agent's NVML reading of the kernel")
    await ask(kube, name, "Hibernated", "idle")
    await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=20, what="the agent's checkpoint")
    await ask(kube, name, "Running", "user")
    await wait_until(lambda: _phase(kube, name, RUNNING), timeout=20, what="the agent's restore")
    assert node.driver.procs[pid].restores == 1
    obj = await kernel(kube, name)
    assert obj["status"]["hibernation"]["pod"] == obj["status"]["pod"]  # the agent says which pod it resumed
    return obj["status"]["pod"]


async def _pod(kube: Kube, name: str) -> dict | None:
    return next((p for p in await kube.pods() if p["metadata"]["name"] == name), None)


async def _stop_agent(node: Node) -> None:
    node.stop.set()
    node.task.cancel()
    await asyncio.gather(node.task, return_exceptions=True)


@pytest.mark.parametrize("lock_seconds", [0, 6])
@pytest.mark.slow
async def test_a_resumed_kernel_killed_at_once_is_checkpointed_again_while_its_process_lives(
        cluster, operator_factory, server_config, kube_sessions, kube, node, lock_seconds):
    """shutdown_kernel(now=True): stopGraceSeconds 0, so the pod's deletion kills the process at once.  The
    operator asks the agent first: the restored process is locked and checkpointed while it still runs, then
    the pod is deleted and the process is gone.  A precaution slower (6 s) than jupyter_client's wait for a
    killed kernel (5 s) holds too: the provisioner deletes the GPUKernel (whose garbage collection would
    delete the pod) only once the agent has answered."""
    await operator_factory(cluster, **HAMI)
    await node.start()
    km, name, pid = await _start(kube, node)
    try:
        pod = await _hibernate_and_resume(kube, name, node, pid)
        restored_at, witnessed_at = len(node.driver.calls), len(node.driver.witnessed)
        node.driver.lock_delay = lock_seconds
        started = time.monotonic()
        await km.shutdown_kernel(now=True)
        await asyncio.sleep(0.5)  # a checkpoint still under way (it must not be) would show here
        assert node.driver.witnessed[witnessed_at:] == [("lock", pid, True), ("checkpoint", pid, True)]
        assert time.monotonic() - started >= lock_seconds
        moves = [c for c in node.driver.calls[restored_at:] if c[0] in MOVING_CALLS]
        assert moves == [("cuCheckpointProcessLock", pid), ("cuCheckpointProcessCheckpoint", pid)]
        assert node.driver.procs[pid].state == cp.ProcessState.CHECKPOINTED
        await wait_until(lambda: not _alive(pid), timeout=15, what="the pod's process to be killed")

        async def pod_gone():
            return await _pod(kube, pod) is None

        await wait_until(pod_gone, timeout=30, what="the pod to go")
    finally:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)



@pytest.mark.slow
async def test_a_resumed_kernel_whose_server_died_is_checkpointed_again_before_its_pod_is_deleted(
        cluster, operator_factory, server_config, kube_sessions, kube, node):
    """Nobody asks for this stop: the kernel's server is gone (its heartbeat stops, as a killed server's
    would), and the operator deletes the kernel (ServerGone).  It asks the agent first, so the process the
    agent restored is locked and checkpointed while it still runs, and only then is the pod deleted."""
    await operator_factory(cluster, **HAMI)  # heartbeat_timeout 4 s (the tests' operator)
    await node.start()
    km, name, pid = await _start(kube, node)
    try:
        pod = await _hibernate_and_resume(kube, name, node, pid)
        witnessed_at = len(node.driver.witnessed)
        km.provisioner.session.stop_heartbeat()  # the server dies; nothing of it asks for anything again

        async def gone():
            return await _pod(kube, pod) is None and not [k for k in await kube.kernels()
                                                          if k["metadata"]["name"] == name]

        await wait_until(gone, timeout=40, what="the orphaned kernel and its pod to be deleted")
        assert node.driver.witnessed[witnessed_at:] == [("lock", pid, True), ("checkpoint", pid, True)]
        assert node.driver.procs[pid].state == cp.ProcessState.CHECKPOINTED
        await wait_until(lambda: not _alive(pid), timeout=15, what="the pod's process to be killed")
        events = (await kube.core.list_namespaced_event(cluster.namespace)).items
        assert [e.reason for e in events if e.reason == "ServerGone"] == ["ServerGone"]
    finally:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)


async def test_a_never_resumed_kernels_stop_does_not_wait_for_the_agent(
        cluster, operator_factory, server_config, kube_sessions, kube, node):
    """No agent runs on the node at all, and the timeout is long: a kernel never resumed is stopped with
    grace 0 at once, with no request to the agent."""
    await operator_factory(cluster, **HAMI, **{"GPUPoolOperator.kill_precaution_timeout": 60})
    km, name, pid = await _start(kube, node)
    try:
        pod = (await kernel(kube, name))["status"]["pod"]
        started = time.monotonic()
        await km.provisioner.kill()  # spec.stopped, stopGraceSeconds 0

        async def stopped():
            return phase_of(await kernel(kube, name)) == "Stopped" and await _pod(kube, pod) is None

        await wait_until(stopped, timeout=20, what="the kernel to stop")
        elapsed = time.monotonic() - started
        assert elapsed < 10, f"the stop took {elapsed:.1f} s"
        assert "killPrecaution" not in (await kernel(kube, name))["status"]  # the agent was never asked
        assert not node.driver.calls
    finally:
        await km.shutdown_kernel(now=True)


@pytest.mark.slow
async def test_the_stop_completes_after_the_timeout_when_the_agent_is_down(
        cluster, operator_factory, server_config, kube_sessions, kube, node):
    """The agent resumed the kernel, then went down: the operator's request is never answered, and after
    kill_precaution_timeout the pod is deleted anyway, with a Warning Event saying so."""
    op = await operator_factory(cluster, **HAMI, **{"GPUPoolOperator.kill_precaution_timeout": 4})
    await node.start()
    km, name, pid = await _start(kube, node)
    try:
        pod = await _hibernate_and_resume(kube, name, node, pid)
        await _stop_agent(node)
        started = time.monotonic()
        await km.provisioner.kill()

        async def asked():
            return ((await kernel(kube, name))["status"].get("killPrecaution") or {}).get("pod") == pod

        await wait_until(asked, timeout=10, what="the operator to ask the agent")
        await asyncio.sleep(max(0.0, 2.5 - (time.monotonic() - started)))
        waiting = await _pod(kube, pod)
        assert waiting is not None and not waiting["metadata"].get("deletionTimestamp")  # not yet deleted
        assert _alive(pid)

        async def stopped():
            return phase_of(await kernel(kube, name)) == "Stopped" and await _pod(kube, pod) is None

        await wait_until(stopped, timeout=30, what="the stop to complete after the timeout")
        assert time.monotonic() - started >= 4
        assert (await kernel(kube, name))["status"]["killPrecaution"].get("answeredAt") is None
        events = (await kube.core.list_namespaced_event(kube.namespace)).items
        [warning] = [e for e in events if e.reason == KILL_PRECAUTION_TIMED_OUT and e.involved_object.name == name]
        assert warning.type == "Warning" and "did not answer within 4 s" in warning.message
        assert f"its pod {pod} is deleted anyway" in op.logs()
        assert node.driver.procs[pid].state == cp.ProcessState.RUNNING  # nobody checkpointed it
    finally:
        await km.shutdown_kernel(now=True)


async def test_a_request_edited_by_hand_for_another_pod_changes_nothing_for_that_pod(
        cluster, operator_factory, server_config, kube_sessions, kube, node):
    """Kernel A's status edited to ask the precaution for kernel B's pod (B resumed, running): the agent
    refuses (B's pod is not A's own), touches none of B's processes, and B's own stop later still gets it."""
    await operator_factory(cluster, **HAMI)
    await node.start()
    km_a, name_a, pid_a = await _start(kube, node)
    km_b, name_b, pid_b = await _start(kube, node)
    try:
        pod_b = await _hibernate_and_resume(kube, name_b, node, pid_b)
        calls_at = len(node.driver.calls)
        await kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, kube.namespace, KERNELS, name_a,
            {"status": {"killPrecaution": {"pod": pod_b, "requestedAt": time.time()}}},
            _content_type="application/merge-patch+json")

        async def answered():
            asked = (await kernel(kube, name_a))["status"].get("killPrecaution") or {}
            return asked if asked.get("answeredAt") is not None else None

        answer = await wait_until(answered, timeout=15, what="the agent to answer the edited request")
        assert answer["message"].startswith("Refused:") and "not this kernel's own pod" in answer["message"]
        await asyncio.sleep(1)
        assert not [c for c in node.driver.calls[calls_at:] if c[0] in MOVING_CALLS]
        assert node.driver.procs[pid_b].state == cp.ProcessState.RUNNING and _alive(pid_b)
        pod = await _pod(kube, pod_b)
        assert pod is not None and not pod["metadata"].get("deletionTimestamp")
        assert phase_of(await kernel(kube, name_b)) == RUNNING and _alive(pid_a)

        witnessed_at = len(node.driver.witnessed)  # B's own stop still gets the precaution
        await km_b.shutdown_kernel(now=True)
        assert node.driver.witnessed[witnessed_at:] == [("lock", pid_b, True), ("checkpoint", pid_b, True)]
    finally:
        for km in (km_a, km_b):
            if km.has_kernel:
                await km.shutdown_kernel(now=True)

