"""Hibernation in the cluster, the operator's side: which hibernations it admits (per sharing backend, the
pod's host memory, the node's cap), how it counts a hibernated kernel (memory and SM share free on its
node, its kernel count kept), resumes admitted only into GPU memory the node's agent reads free (a queue
with positions until then), and faults: an operator restarted mid-move, a pod deleted while hibernated,
a GPUKernel edited by hand.

The node agent's moves (Hibernating -> Hibernated, Resuming -> Running) are made here by a test-only
stand-in (``agent_standin.SettlingAgent``), which writes what the agent writes and moves nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from agent_standin import SettlingAgent, ask, kernel, phase_of, report_free, report_usage
from kernel_helpers import run_code
from kube_helpers import GiB, Kube, wait_until
from kubernetes_asyncio.client.exceptions import ApiException

from jupyter_gpu_pool.cluster.kernels import as_lease
from jupyter_gpu_pool.cluster.resources import (API_VERSION, DESIRED_HIBERNATED, DESIRED_RUNNING, FAILED, GROUP,
                                                HIBERNATED, HIBERNATION_REFUSED, KERNEL_KIND, KERNELS, LABEL_LAUNCH,
                                                PREEMPTED, RUNNING, VERSION, WAITING_FOR_ROOM, kernel_name)
from jupyter_gpu_pool.operator import hibernation as sleep
from jupyter_gpu_pool.operator.plan import Write
from jupyter_gpu_pool.operator.sharing import Sharing
from jupyter_gpu_pool.pool import HIBERNATED as LEASE_HIBERNATED

NODE = "gpu-node-1"
GPU_A = "GPU-aaaa"
HIBERNATING_HAMI = {"GPUPoolOperator.hami_memory_scaling": 2.0}


# -- the decisions, pure ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sharing, scaling, hands_back, words", [
    (Sharing("time-slicing", gpu_memory=80 * GiB, replicas=4), 1.0, True, "no memory isolation"),
    (Sharing("time-slicing", gpu_memory=80 * GiB, replicas=1), 1.0, False, "keeps the only replica"),
    (Sharing("hami"), 2.0, True, "physically free"),
    (Sharing("hami"), 1.0, False, "keeps its nvidia.com/gpumem"),
    (Sharing("mps", gpu_memory=80 * GiB, replicas=4), 1.0, False, "cannot checkpoint an MPS client"),
    (Sharing("whole"), 1.0, False, "keeps its GPU at the scheduler"),
    (Sharing("dra", dra_slices="shares"), 1.0, False, "ResourceClaim keeps its device"),
])
def test_each_sharing_backend_says_whether_hibernation_hands_memory_back_and_why(sharing, scaling, hands_back,
                                                                                words):
    support = sleep.backend_support(sharing, scaling)
    assert support.hands_back is hands_back and words in support.why
    refusal = sleep.backend_refusal(sharing, scaling)
    assert (refusal is None) is hands_back
    if refusal:
        assert refusal.startswith("This cluster cannot hibernate kernels: ") and words in refusal
        assert "keeps running" in refusal


def test_mig_is_refused_naming_the_mig_instance():
    from jupyter_gpu_pool.operator.sharing import MigProfile

    refusal = sleep.backend_refusal(Sharing("mig", mig_profiles=(MigProfile.parse("1g.10gb"),)))
    assert "MIG instance" in refusal


def pod_with(request: str | None, limit: str | None) -> dict:
    resources = {}
    if request:
        resources["requests"] = {"memory": request}
    if limit:
        resources["limits"] = {"memory": limit}
    return {"spec": {"containers": [{"name": "kernel", "resources": resources}]}}


def test_a_pod_whose_memory_limit_cannot_hold_its_gpu_memory_is_refused_with_the_sizing_rule():
    assert sleep.host_memory_refusal(pod_with("1Gi", "16Gi"), 15 * GiB) is None  # 1 + 15 fits 16
    refusal = sleep.host_memory_refusal(pod_with("1Gi", "16Gi"), 16 * GiB)
    assert refusal is not None and "16 GiB" in refusal and "killed for running out of memory" in refusal
    assert "memory limit at least the request plus the profile's GPU memory" in refusal
    assert sleep.host_memory_refusal(pod_with("1Gi", None), 64 * GiB) is None  # no limit, no cgroup cap


def k8s_kernel(name: str, phase: str, node: str = NODE, moved: int = 0, used: int = 0, devices=(GPU_A,),
               asked_at: float = 0.0, hibernated_at: float = 0.0, resumed_at: float = 0.0) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "namespace": "ns"},
            "spec": {"owner": "ann", "kernelId": name, "profile": "small", "launch": 1,
                     "desiredState": DESIRED_RUNNING},
            "status": {"phase": phase, "node": node, "admitted": {"memory": 10 * GiB, "at": 1.0},
                       "usage": {"memoryUsed": used, "devices": list(devices)},
                       "hibernation": {"bytes": moved, "devices": list(devices), "requestedAt": asked_at,
                                       "hibernatedAt": hibernated_at, "resumedAt": resumed_at}}}


def test_the_nodes_cap_on_hibernated_memory_counts_every_hibernated_kernel_there():
    here = [k8s_kernel("a", HIBERNATED, moved=6 * GiB), k8s_kernel("b", "Hibernating", used=3 * GiB),
            k8s_kernel("c", RUNNING, used=20 * GiB), k8s_kernel("d", HIBERNATED, node="elsewhere", moved=30 * GiB)]
    me = k8s_kernel("me", RUNNING, used=4 * GiB)
    assert sleep.node_cap_refusal(me, here + [me], 13 * GiB, 4 * GiB, NODE) is None  # 6 + 3 + 4
    refusal = sleep.node_cap_refusal(me, here + [me], 12 * GiB, 4 * GiB, NODE)
    assert "already holds 9 GiB" in refusal and "cap of 12 GiB" in refusal
    assert sleep.node_cap_refusal(me, here, None, 4 * GiB, NODE) is None


def test_resumes_are_admitted_first_come_first_served_into_fresh_free_memory_on_their_own_gpu():
    now = 1000.0
    first = k8s_kernel("first", HIBERNATED, moved=6 * GiB, asked_at=10)
    second = k8s_kernel("second", HIBERNATED, moved=2 * GiB, asked_at=20)
    third = k8s_kernel("third", HIBERNATED, moved=1 * GiB, asked_at=30, devices=("GPU-bbbb",))
    waiters = sleep.resume_order([third, second, first], NODE)
    assert [k["metadata"]["name"] for k in waiters] == ["first", "second", "third"]
    fresh = sleep.FreeReading({GPU_A: 8 * GiB, "GPU-bbbb": 40 * GiB}, now - 1)
    # 8 GiB free less 1 GiB margin: the first (6) fits, the second (2) would need 1 more: it and all behind wait
    admitted, waiting = sleep.plan_resumes(waiters, waiters, fresh, now, 60, GiB)
    assert [k["metadata"]["name"] for k in admitted] == ["first"]
    assert {u: w.position for u, w in waiting.items()} == {"uid-second": 1, "uid-third": 2}
    assert "2 GiB of GPU memory on its GPU (GPU-aaaa)" in waiting["uid-second"].message
    assert "6 GiB for resumes ahead of it" in waiting["uid-second"].message
    # a resume admitted before (phase Resuming) is not in the reading yet: its bytes are held back
    resuming = k8s_kernel("resuming", "Resuming", moved=6 * GiB)
    admitted, waiting = sleep.plan_resumes(waiters, waiters + [resuming], fresh, now, 60, GiB)
    assert admitted == [] and waiting["uid-first"].position == 1
    # a stale reading is no room at all, whatever it says
    admitted, waiting = sleep.plan_resumes(waiters, waiters, sleep.FreeReading({GPU_A: 80 * GiB}, now - 61), now,
                                           60, GiB)
    assert admitted == [] and "over 60 s old" in waiting["uid-first"].message
    admitted, waiting = sleep.plan_resumes(waiters, waiters, None, now, 60, GiB)
    assert admitted == [] and "no reading yet" in waiting["uid-first"].message
    assert sleep.FreeReading.parse("not json") is None


def test_a_resume_asked_on_a_hint_never_joins_the_queue_and_is_answered_once_per_ask():
    real = k8s_kernel("real", HIBERNATED, moved=6 * GiB, asked_at=10)
    guess = k8s_kernel("guess", HIBERNATED, moved=1 * GiB)
    guess["spec"]["resumeHint"] = True
    guess["metadata"]["generation"] = 3
    assert sleep.resume_order([guess, real], NODE) == [real]  # no place for a guess, ahead or behind
    assert sleep.hinted_resumes([guess, real], NODE) == [guess]
    assert as_lease(guess).phase == "resuming"  # waking up, as the UI says it calmly
    guess["status"].update(reason="ResumeDeclined", observedGeneration=3)
    assert sleep.hinted_resumes([guess, real], NODE) == []  # answered: not decided again
    assert as_lease(guess).phase == ""  # declined: it sleeps on
    guess["metadata"]["generation"] = 4  # asked again (a new spec write)
    assert sleep.hinted_resumes([guess, real], NODE) == [guess]
    guess["spec"]["resumeHint"] = None  # a cell made it a real resume: it queues like any other
    assert sleep.hinted_resumes([guess], NODE) == [] and sleep.resume_order([guess], NODE) == [guess]


def test_a_hibernated_kernel_is_a_hibernated_lease_whose_waiting_resume_is_queued():
    obj = k8s_kernel("a", HIBERNATED, moved=6 * GiB)
    lease = as_lease(obj)
    assert lease.state == LEASE_HIBERNATED and lease.host_bytes == 6 * GiB and lease.gpus == ()
    assert lease.last_gpus == (GPU_A,) and lease.phase == "resuming"  # desired Running: asked back
    obj["status"]["hibernation"]["queuePosition"] = 1
    assert as_lease(obj).phase == "queued"  # and waiting for room on its node
    obj["spec"]["desiredState"] = DESIRED_HIBERNATED
    assert as_lease(obj).phase == ""


@pytest.mark.parametrize("setting, value, words", [
    ("hami_memory_scaling", 0.0, "must be above 0"),
    ("hibernated_memory_per_node", "lots", "hibernated_memory_per_node"),
    ("resume_margin", "-1GiB", "resume_margin"),
])
def test_bad_hibernation_settings_are_refused_naming_them(setting, value, words):
    from traitlets.config import Config

    from jupyter_gpu_pool.config import ConfigError, GPUPool
    from jupyter_gpu_pool.operator.settings import operator_config, operator_settings

    config = Config({"GPUPoolOperator": {setting: value}})
    with pytest.raises(ConfigError, match=words):
        operator_settings(operator_config(config), GPUPool(config=config))


# -- on the test cluster -------------------------------------------------------------------------------

@pytest.fixture
async def agent(kube):
    a = SettlingAgent(kube).start()
    yield a
    await a.stop()


@pytest.fixture
def kms(server_config, kube_sessions, managers):
    return lambda name="gpu-pool-kubernetes-small": managers(name)


async def phase_is(kube: Kube, name: str, phase: str, reason: str | None = None):
    obj = await kernel(kube, name)
    st = obj.get("status") or {}
    return st.get("phase") == phase and (reason is None or st.get("reason") == reason)


async def start(kms, kube: Kube, used: int = 6 * GiB, name: str = "gpu-pool-kubernetes-small"):
    km = kms(name)
    await km.start_kernel()
    k = kernel_name(km.kernel_id)
    await report_usage(kube, k, used, [GPU_A])
    return km, k


async def hibernate(kube: Kube, name: str) -> dict:
    await ask(kube, name, DESIRED_HIBERNATED)
    await wait_until(lambda: phase_is(kube, name, HIBERNATED), timeout=20, what=f"{name} to hibernate")
    return await kernel(kube, name)


@pytest.mark.slow
async def test_a_hibernated_kernels_memory_is_free_for_a_second_kernel_its_count_stays_and_it_resumes_when_room_frees(
        cluster, operator_factory, kms, kube, agent):
    """Quota 10 GiB and 2 kernels: the first kernel (10 GiB slice) hibernates; a second starts in its
    memory, a third is refused for the kernel count.  The first's resume waits for the quota, then for
    its GPU's free memory (position 1), and runs once the node's agent reads room, its variables kept."""
    await operator_factory(cluster, **HIBERNATING_HAMI)
    await kube.quota("user", cluster.user, memory="10GiB", kernels=2)
    await report_free(kube, NODE, {GPU_A: 2 * GiB})
    first, name = await start(kms, kube)
    await run_code(first, "x = 42")
    obj = await hibernate(kube, name)
    assert obj["status"]["hibernation"]["bytes"] == 6 * GiB and obj["status"]["hibernation"]["devices"] == [GPU_A]
    assert obj["status"]["hibernation"]["reason"] == "idle"

    second, _ = await start(kms, kube)  # 10 GiB: its quota's memory is free while the first sleeps
    third = kms()
    with pytest.raises(Exception, match="you hold 2 GPU kernels, as many as your quota allows"):  # the hibernated one still counts
        await third.start_kernel()

    await ask(kube, name, DESIRED_RUNNING)
    await wait_until(lambda: phase_is(kube, name, HIBERNATED, "QuotaExceeded"), timeout=20,
                     what="the resume to wait for the quota")
    assert "resume is waiting for your GPU quota: GPU memory 10 GiB of 10 GiB held" in \
        (await kernel(kube, name))["status"]["message"]
    await second.shutdown_kernel(now=True)
    await wait_until(lambda: phase_is(kube, name, HIBERNATED, WAITING_FOR_ROOM), timeout=20,
                     what="the resume to wait for room on its GPU")
    obj = await kernel(kube, name)
    assert obj["status"]["hibernation"]["queuePosition"] == 1
    assert "position 1 in the queue of node gpu-node-1" in obj["status"]["message"]
    assert "6 GiB of GPU memory on its GPU (GPU-aaaa)" in obj["status"]["message"]
    await report_free(kube, NODE, {GPU_A: 30 * GiB}, sampled_at=time.time() - 120)  # stale: no room still
    await wait_until(lambda: _message_has(kube, name, "over 60 s old"), timeout=20,
                     what="a stale reading to count as no room")
    before = await _status_writes(cluster, name)
    await asyncio.sleep(3)  # a waiting resume is written when its words change, not at every look
    assert await _status_writes(cluster, name) - before <= 1
    await report_free(kube, NODE, {GPU_A: 30 * GiB})
    await wait_until(lambda: phase_is(kube, name, RUNNING), timeout=20, what="the resume to be admitted and settled")
    obj = await kernel(kube, name)
    assert obj["status"]["hibernation"].get("queuePosition") is None
    assert (name, "Running") in agent.settled
    assert "42" in await run_code(first, "print(x)")


async def _status_writes(cluster, name: str) -> int:
    return sum(1 for a in await cluster.audit() if a["resource"] == "gpukernels/status" and a["name"] == name
               and a["verb"] == "patch")


async def _message_has(kube: Kube, name: str, words: str) -> bool:
    return words in ((await kernel(kube, name)).get("status") or {}).get("message", "")


async def test_hibernation_is_refused_with_the_reason_where_memory_cannot_be_handed_back(
        cluster, operator_factory, kms, kube, agent):
    """HAMi without memory scaling: refused, the kernel keeps running, the words say why for the backend."""
    await operator_factory(cluster)  # hami, deviceMemoryScaling 1
    km, name = await start(kms, kube)
    await ask(kube, name, DESIRED_HIBERNATED)
    await wait_until(lambda: phase_is(kube, name, RUNNING, HIBERNATION_REFUSED), timeout=20,
                     what="the refusal")
    obj = await kernel(kube, name)
    assert "keeps its nvidia.com/gpumem at the scheduler" in obj["status"]["message"]
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert agent.settled == []
    assert "alive" in await run_code(km, "print('alive')")


async def test_the_pods_host_memory_and_the_nodes_cap_refuse_a_hibernation(cluster, operator_factory, kms, kube,
                                                                           agent):
    await operator_factory(cluster, **HIBERNATING_HAMI, **{
        "GPUPoolOperator.hibernated_memory_per_node": "10GiB",
        "GPUPoolOperator.resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}}})
    km, big = await start(kms, kube, used=8 * GiB)  # 1 GiB used + 8 GiB checkpoint > the 8 GiB limit
    await ask(kube, big, DESIRED_HIBERNATED)
    await wait_until(lambda: phase_is(kube, big, RUNNING, HIBERNATION_REFUSED), timeout=20, what="the refusal")
    assert "pod's memory limit (8 GiB)" in (await kernel(kube, big))["status"]["message"]
    await km.shutdown_kernel(now=True)  # the node's two GPUs hold two kernel pods
    _, first = await start(kms, kube, used=6 * GiB)
    await hibernate(kube, first)
    _, second = await start(kms, kube, used=5 * GiB)  # 6 + 5 passes the node's 10 GiB
    await ask(kube, second, DESIRED_HIBERNATED)
    await wait_until(lambda: phase_is(kube, second, RUNNING, HIBERNATION_REFUSED), timeout=20, what="the refusal")
    assert "cap of 10 GiB" in (await kernel(kube, second))["status"]["message"]


@pytest.mark.slow
async def test_an_operator_restarted_mid_move_picks_up_from_the_status(cluster, operator_factory, kms, kube, agent):
    """Asked while the operator is down; restarted while the kernel sleeps (its pod not yet listed again,
    which is not its pod gone); down while a resume it admitted is settled by the agent."""
    op = await operator_factory(cluster, **HIBERNATING_HAMI)
    await report_free(kube, NODE, {GPU_A: 30 * GiB})
    km, name = await start(kms, kube)
    await run_code(km, "x = 'kept'")
    op.stop()
    await ask(kube, name, DESIRED_HIBERNATED)
    op = await operator_factory(cluster, **HIBERNATING_HAMI)
    await wait_until(lambda: phase_is(kube, name, HIBERNATED), timeout=30, what="the new operator to admit it")
    op.stop()
    op = await operator_factory(cluster, **HIBERNATING_HAMI)
    await asyncio.sleep(2)  # two sweeps of the new operator
    assert await phase_is(kube, name, HIBERNATED)
    agent.paused = True  # the agent is slow: the operator goes down with the resume admitted, unsettled
    await report_free(kube, NODE, {GPU_A: 30 * GiB})
    await ask(kube, name, DESIRED_RUNNING)
    await wait_until(lambda: phase_is(kube, name, "Resuming"), timeout=20, what="the resume to be admitted")
    op.stop()
    agent.paused = False
    await wait_until(lambda: phase_is(kube, name, RUNNING), timeout=20, what="the agent to settle it")
    await operator_factory(cluster, **HIBERNATING_HAMI)
    await asyncio.sleep(2)
    assert await phase_is(kube, name, RUNNING)
    assert "kept" in await run_code(km, "print(x)")


@pytest.mark.parametrize("moment", ["hibernating", "hibernated", "resuming"])
async def test_a_pod_deleted_while_hibernated_or_resuming_ends_the_kernel_with_its_slice_freed(
        cluster, operator_factory, kms, kube, agent, moment):
    """The process that held the kernel's memory is gone with its pod (deleted, its node drained): the
    kernel fails with words, no new empty pod stands in for it, and its memory and kernel count are free."""
    await operator_factory(cluster, **HIBERNATING_HAMI)
    await kube.quota("user", cluster.user, memory="10GiB", kernels=1)
    _, name = await start(kms, kube)
    if moment == "hibernating":  # admitted, and the pod goes before the agent's checkpoint settles
        agent.paused = True
        await ask(kube, name, DESIRED_HIBERNATED)
        await wait_until(lambda: phase_is(kube, name, "Hibernating"), timeout=20, what="the hibernation admitted")
    else:
        await hibernate(kube, name)
    if moment == "resuming":
        agent.paused = True  # the resume is admitted, and the pod goes before the agent restores it
        await report_free(kube, NODE, {GPU_A: 30 * GiB})
        await ask(kube, name, DESIRED_RUNNING)
        await wait_until(lambda: phase_is(kube, name, "Resuming"), timeout=20, what="the resume to be admitted")
    pod = (await kernel(kube, name))["status"]["pod"]
    await kube.core.delete_namespaced_pod(pod, cluster.namespace, grace_period_seconds=0)
    await wait_until(lambda: phase_is(kube, name, FAILED, PREEMPTED), timeout=20, what="the kernel to end")
    obj = await kernel(kube, name)
    assert f"while the kernel was {moment}" in obj["status"]["message"]
    assert "its variables are lost" in obj["status"]["message"]
    assert not [p for p in await kube.pods() if p["metadata"]["name"] == pod]  # no new, empty pod for it
    agent.paused = False
    await start(kms, kube)  # its memory and its kernel count are free: a new kernel fits the 1-kernel quota


async def test_a_hibernated_kernels_node_drained_ends_the_kernel_with_its_slice_freed(cluster, operator_factory, kms,
                                                                                      kube, agent, drain):
    """The node of a hibernated kernel is drained (cordoned, its pod evicted): the process that held the
    kernel's memory is gone, so the kernel fails with words, nothing starts a new, empty pod for it, and
    its memory and kernel count are free (a new kernel fits a quota of one once the node is back)."""
    await operator_factory(cluster, **HIBERNATING_HAMI)
    await kube.quota("user", cluster.user, memory="10GiB", kernels=1)
    _, name = await start(kms, kube)
    await hibernate(kube, name)
    pod = (await kernel(kube, name))["status"]["pod"]
    await drain(NODE, pod)
    assert (await kube.core.read_node(NODE)).spec.unschedulable is True
    await wait_until(lambda: phase_is(kube, name, FAILED, PREEMPTED), timeout=30, what="the kernel to end")
    message = (await kernel(kube, name))["status"]["message"]
    assert "while the kernel was hibernated" in message and "its GPU slice is free again" in message

    async def gone():  # an eviction deletes with the pod's grace period: it may end after the kernel's status
        return not [p for p in await kube.pods() if p["metadata"]["name"] == pod]

    await wait_until(gone, timeout=30, what="the evicted pod to be gone")
    assert not [p for p in await kube.pods() if p["metadata"]["labels"].get(
        "jupyter-gpu-pool.readthedocs.io/kernel") == name]  # no new, empty pod for it
    await kube.core.patch_node(NODE, {"spec": {"unschedulable": None}})
    assert not (await kube.core.read_node(NODE)).spec.unschedulable
    await start(kms, kube)  # its memory and its kernel count are free


async def test_a_gpukernel_edited_by_hand_cannot_name_another_pod_or_pid(cluster, kube):
    """The schema prunes fields it does not declare (a pid, a pod to act on) and refuses a desired state
    it does not know: nothing a user writes can point the agent at another process."""
    body = {"apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": "k-hand"},
            "spec": {"owner": "mallory", "kernelId": "hand", "profile": "small", "launch": 1,
                     "pod": "someone-elses-pod", "pid": 1, "desiredState": DESIRED_HIBERNATED}}
    made = await kube.custom.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS, body)
    assert "pod" not in made["spec"] and "pid" not in made["spec"]
    with pytest.raises(ApiException) as refused:
        await kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, KERNELS, "k-hand", {"spec": {"desiredState": "Frozen"}},
            _content_type="application/merge-patch+json")
    assert refused.value.status == 422
    with pytest.raises(ApiException) as stale:  # a write on an old resourceVersion: compare-and-set
        await kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, KERNELS, "k-hand",
            {"metadata": {"resourceVersion": "1"}, "spec": {"desiredState": DESIRED_RUNNING}},
            _content_type="application/merge-patch+json")
    assert stale.value.status == 409


@pytest.mark.slow
async def test_a_restarted_server_adopts_its_hibernated_kernel_and_keeps_it(cluster, operator_factory, server_config,
                                                                            kube_sessions, jp_serverapp, kube, agent):
    """A hibernated kernel's process lives on in its pod: a server started again adopts it (its heartbeat
    kept past the operator's timeout), and it resumes with its variables."""
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from jupyter_gpu_pool.cluster.session import KernelSession
    from jupyter_gpu_pool.server_extension.backends.adoption import adopt_kernels

    await operator_factory(cluster, **HIBERNATING_HAMI)
    first = jp_serverapp.kernel_manager
    kernel_id = await first.start_kernel(kernel_name="gpu-pool-kubernetes-small")
    name = kernel_name(kernel_id)
    await report_usage(kube, name, 6 * GiB, [GPU_A])
    await run_code(first.get_kernel(kernel_id), "x = 'asleep'")
    await hibernate(kube, name)
    km = first._kernels.pop(kernel_id)  # the first server dies: its watch and heartbeat stop
    km.stop_restarter()
    await KernelSession.close_all()

    second = AsyncMappingKernelManager(parent=jp_serverapp, kernel_spec_manager=jp_serverapp.kernel_spec_manager)
    assert await adopt_kernels(second) == [kernel_id]
    adopted = second.get_kernel(kernel_id)
    assert await adopted.is_alive()  # hibernated is not dead
    await asyncio.sleep(6)  # past the operator's heartbeat timeout (4 s): the new server keeps it
    assert await phase_is(kube, name, HIBERNATED)
    await report_free(kube, NODE, {GPU_A: 30 * GiB})
    await ask(kube, name, DESIRED_RUNNING)
    await wait_until(lambda: phase_is(kube, name, RUNNING), timeout=20, what="the resume")
    assert "asleep" in await run_code(adopted, "print(x)")
    await second.shutdown_kernel(kernel_id)


@pytest.mark.slow
async def test_a_hibernated_kernel_restarted_runs_a_new_pod_that_stays_awake(cluster, operator_factory, kms, kube,
                                                                             agent):
    """A restart asks for a new launch: a new, empty kernel, not one to hibernate at once because the old
    launch was asked to sleep."""
    await operator_factory(cluster, **HIBERNATING_HAMI)
    km, name = await start(kms, kube)
    await hibernate(kube, name)
    await km.restart_kernel(now=True)

    async def relaunched():
        obj = await kernel(kube, name)
        return phase_of(obj) == RUNNING and obj["status"]["launch"] == 2

    await wait_until(relaunched, timeout=30, what="the new launch to run")
    await asyncio.sleep(2)
    obj = await kernel(kube, name)
    assert phase_of(obj) == RUNNING and obj["spec"]["desiredState"] == DESIRED_RUNNING
    assert [phase for _, phase in agent.settled] == [HIBERNATED]  # only the first launch ever slept
    assert "fresh" in await run_code(km, "print('fresh')")


@pytest.mark.slow
async def test_a_resume_waiting_through_an_api_server_outage_is_admitted_once_it_is_back(cluster, operator_factory,
                                                                                        kms, kube, agent):
    """For 4 s every request about GPUKernels answers 503 (the operator's status writes, its watch, the
    agent's); the node's room is reported meanwhile. Once the API server answers again, the waiting
    resume is admitted and settled: nothing was lost, and nothing moved twice.  (The server's heartbeats
    fail too: the operator's heartbeat timeout is longer than the outage, as it is in a real cluster.)"""
    await operator_factory(cluster, **HIBERNATING_HAMI, **{"GPUPoolOperator.heartbeat_timeout": 30})
    await report_free(kube, NODE, {GPU_A: 2 * GiB})
    km, name = await start(kms, kube)
    await run_code(km, "x = 'through'")
    await hibernate(kube, name)
    await ask(kube, name, DESIRED_RUNNING)
    await wait_until(lambda: phase_is(kube, name, HIBERNATED, WAITING_FOR_ROOM), timeout=20, what="the wait")
    await cluster.fault(resources=["gpukernels"], status=503, seconds=4)
    await report_free(kube, NODE, {GPU_A: 30 * GiB})  # Nodes still answer
    await asyncio.sleep(4)
    await wait_until(lambda: phase_is(kube, name, RUNNING), timeout=40, what="the resume after the outage")
    assert [phase for _, phase in agent.settled] == [HIBERNATED, RUNNING]
    assert "through" in await run_code(km, "print(x)")


# -- compare-and-set: the operator's status writes never overwrite a newer status ---------------------------

STALE_READS = {
    # what the operator read, what the world wrote between its read and its write (the server's ask, the
    # operator's own admission, the node agent's settle: each a status or spec write), and what must be kept
    "refusal": (
        {"phase": RUNNING, "usage": {"memoryUsed": 20 * GiB, "devices": [GPU_A]}},  # 20 GiB: the pod cannot hold it
        [{"usage": {"memoryUsed": 6 * GiB, "devices": [GPU_A]}},
         {"phase": "Hibernating", "hibernation": {"reason": "idle", "requestedAt": 1.0}},
         {"phase": HIBERNATED, "reason": "", "message": "Hibernated: 6 GiB of GPU memory moved to host RAM.",
          "hibernation": {"bytes": 6 * GiB, "hibernatedAt": 2.0, "message": "Hibernated: 6 GiB moved."}}],
        DESIRED_HIBERNATED, None),
    "stay asleep": (
        {"phase": HIBERNATED, "reason": WAITING_FOR_ROOM, "message": "Waiting to resume: position 1.",
         "hibernation": {"bytes": 6 * GiB, "queuePosition": 1, "reason": "idle"}},
        [{"phase": "Resuming", "reason": "", "hibernation": {"queuePosition": None}},
         {"phase": RUNNING, "reason": "", "message": "Resumed: 6 GiB back on the GPU in 1.0 s.",
          "hibernation": {"resumedAt": 3.0, "message": "Resumed: 6 GiB back on the GPU."}}],
        DESIRED_HIBERNATED, DESIRED_RUNNING),
}


@pytest.mark.parametrize("case", list(STALE_READS))
async def test_an_operator_write_on_a_stale_read_is_refused_read_again_and_the_agents_settle_kept(cluster, kube,
                                                                                                  case):
    """The operator read a kernel; before its write, the world moved on: the node agent settled a move (and
    for a resume, its server asked again and the operator admitted it).  The operator's decision on the old
    read (a refusal of the hibernation; "stay hibernated" clearing a queue place) is written with the
    resourceVersion it read, so the API server refuses it (409) and nothing is overwritten: the agent's
    phase and words stand, and the operator holds the kernel as it is now."""
    from jupyter_gpu_pool.config import GPUPool
    from jupyter_gpu_pool.operator.controller import Controller
    from jupyter_gpu_pool.operator.settings import GPUPoolOperator, operator_settings
    from kube_helpers import PROFILES

    read_status, world, asked, asked_later = STALE_READS[case]
    ns, name = cluster.namespace, "k-stale"
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, KERNELS, {
        "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": name},
        "spec": {"owner": cluster.user, "kernelId": "stale", "profile": "small", "launch": 1, "desiredState": asked}})
    read = await kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, KERNELS, name,
        {"status": {"launch": 1, "pod": "k-stale-1", "node": NODE, "admitted": {"memory": 10 * GiB, "at": 1.0},
                    **read_status}}, _content_type="application/merge-patch+json")
    if asked_later:
        await ask(kube, name, asked_later)
    for write in world:
        await kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, KERNELS, name, {"status": write},
                                                                _content_type="application/merge-patch+json")
    now = await kernel(kube, name)

    settings = operator_settings(GPUPoolOperator(hami_memory_scaling=2.0), GPUPool(profiles=PROFILES).check())
    api = await cluster.api()
    controller = Controller(settings, api)
    try:
        controller.cache.remember(read)  # its watch has not delivered the newer versions yet
        before = await _status_writes(cluster, name)
        decided = _decide_on(read, settings)
        assert any(isinstance(a, Write) and a.compare for a in decided.actions)  # it would write, on that version
        await controller.carry_out(read, decided)
        after = await kernel(kube, name)
        assert after["metadata"]["resourceVersion"] == now["metadata"]["resourceVersion"]  # nothing written
        assert after["status"] == now["status"]
        assert after["status"]["reason"] == "" and after["status"]["message"] == world[-1]["message"]
        kept = controller.cache.kernels[(ns, name)]
        assert kept["metadata"]["resourceVersion"] == now["metadata"]["resourceVersion"]
        assert await _status_writes(cluster, name) - before == 2  # the write refused (409), and the read again
    finally:
        await controller.stop()
        await api.close()


def _decide_on(read: dict, settings):
    """The operator's decision on a kernel as it read it: a running one asked to hibernate goes to the
    hibernation admission (its pod's memory limit, 16 GiB, cannot hold 20 GiB); a hibernated one asked to stay
    so, with a place in the queue, to the plan (its pod runs)."""
    from jupyter_gpu_pool.operator import hibernation_admission
    from jupyter_gpu_pool.operator.plan import Facts, Plan, plan

    if read["status"]["phase"] == RUNNING:
        return Plan(hibernation_admission.plan_hibernation(read, pod_with("1Gi", "16Gi"), [read], None, settings,
                                                           time.time()))
    pod = {**pod_with("1Gi", "16Gi"), "metadata": {"name": "k-stale-1", "namespace": read["metadata"]["namespace"],
                                                   "uid": "uid-of-its-pod", "labels": {LABEL_LAUNCH: "1"}}}
    pod["spec"]["nodeName"] = NODE
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "kernel", "state": {"running": {}}}]}
    return plan(Facts(kernel=read, settings=settings, now=time.time(), pods={"k-stale-1": pod}))


async def test_the_same_operator_write_on_a_current_read_is_made(cluster, kube):
    """The control for the test above: on a read that is current, the refusal is written (so it is the
    version, not the decision, that kept the stale write out)."""
    from jupyter_gpu_pool.config import GPUPool
    from jupyter_gpu_pool.operator.controller import Controller
    from jupyter_gpu_pool.operator.settings import GPUPoolOperator, operator_settings
    from kube_helpers import PROFILES

    ns, name = cluster.namespace, "k-current"
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, KERNELS, {
        "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": name},
        "spec": {"owner": cluster.user, "kernelId": "current", "profile": "small", "launch": 1,
                 "desiredState": DESIRED_HIBERNATED}})
    read = await kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, KERNELS, name,
        {"status": {"launch": 1, "pod": "k-current-1", "node": NODE, "admitted": {"memory": 10 * GiB, "at": 1.0},
                    **STALE_READS["refusal"][0]}}, _content_type="application/merge-patch+json")
    settings = operator_settings(GPUPoolOperator(hami_memory_scaling=2.0), GPUPool(profiles=PROFILES).check())
    api = await cluster.api()
    controller = Controller(settings, api)
    try:
        controller.cache.remember(read)
        await controller.carry_out(read, _decide_on(read, settings))
        after = await kernel(kube, name)
        assert after["status"]["phase"] == RUNNING and after["status"]["reason"] == HIBERNATION_REFUSED
        assert "cannot hold it" in after["status"]["message"]
    finally:
        await controller.stop()
        await api.close()
