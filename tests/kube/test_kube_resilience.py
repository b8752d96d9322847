"""Faults of the API server lose nothing: every watch loop of the product (the node agent's, the
operator's kernel-pod watch and kopf's, the servers' GPUKernel watch) survives the API server dying
mid-stream, and comes back, with back-off, when it does; kopf's watches survive failures longer than any
finite back-off; a list that gets no answer times out; and what is deleted while the operator's watches
are down is forgotten all the same."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from jupyter_client.manager import AsyncKernelManager
from kernel_helpers import run_code
from kube_helpers import Kube, ScriptedNVML, wait_until

from jupyter_gpu_pool.cluster.resources import (API_VERSION, GROUP, KERNEL_COMPONENT, KERNEL_KIND, KERNELS,
                                                LABEL_COMPONENT, LABEL_KERNEL, LABEL_PART_OF, PART_OF, VERSION)
from jupyter_gpu_pool.cluster.session import KernelSession
from jupyter_gpu_pool.cluster.watch import Backoff, list_all
from jupyter_gpu_pool.operator.agent import Agent


def kernel_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {LABEL_COMPONENT: KERNEL_COMPONENT, LABEL_PART_OF: PART_OF,
                                                  LABEL_KERNEL: name}},
            "spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "kernel", "image": "quay.io/jupyter/base-notebook",
                                     "command": ["python", "-c", "import time; time.sleep(60)"]}]}}


def test_backoff_doubles_to_its_cap_with_jitter_and_resets():
    b = Backoff(first=1.0, cap=8.0)
    waits = [b.next() for _ in range(6)]
    for wait, nominal in zip(waits, [1, 2, 4, 8, 8, 8]):
        assert 0.8 * nominal <= wait <= 1.2 * nominal
    b.reset()
    assert b.next() <= 1.2


async def test_every_watch_survives_the_api_server_dying_mid_stream(cluster_factory, operator_factory,
                                                                    server_config, kube_sessions, caplog):
    from kube_helpers import install

    caplog.set_level(logging.WARNING, "jupyter_gpu_pool")
    cluster = cluster_factory()
    await install(cluster)
    await operator_factory(cluster)
    first = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
    await first.start_kernel()  # the server's GPUKernel watch is up, and the operator's watches
    session = first.provisioner.session
    api = await cluster.api()
    agent = Agent("gpu-node-1", api, ScriptedNVML(), ["GPU-aaaa"])
    agent_watch = asyncio.create_task(agent.watch_pods())
    try:
        await wait_until(lambda: agent.pods, timeout=10, what="the agent to see the first kernel's pod")

        cluster.crash()  # SIGKILL while every watch stream is open
        await asyncio.sleep(1.5)  # the watchers find the server gone, and retry (back-off)
        cluster.start()  # the same address; a fresh state (a test server keeps none)
        await install(cluster)

        kube = Kube(await cluster.api(), cluster.namespace)
        try:
            await kube.core.create_namespaced_pod(cluster.namespace, kernel_pod("after-the-crash"))
            await wait_until(lambda: any(p["metadata"]["name"] == "after-the-crash" for p in agent.pods.values()),
                             timeout=30, what="the agent's watch to come back and see a new pod")
            assert not agent_watch.done()

            second = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
            await second.start_kernel()  # kopf, the operator's pod watch and the server's watch all came back
            try:
                assert "back" in await run_code(second, "print('back')")
                assert second.provisioner.session is session  # the same watch, resumed
            finally:
                await second.shutdown_kernel(now=True)
        finally:
            await kube.close()
        watch_logs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("watching ")]
        assert any("retrying in" in m for m in watch_logs), watch_logs
    finally:
        agent_watch.cancel()
        await asyncio.gather(agent_watch, return_exceptions=True)
        await api.close()
        first.provisioner.pod = ""  # its pod went with the crashed server's state
        await KernelSession.close_all()


# -- kopf's own watches: a failure longer than any finite back-off -----------------------------------------

def test_kopfs_api_backoffs_never_run_out():
    from collections.abc import Sized
    from itertools import islice

    from jupyter_gpu_pool.operator.handlers import EndlessBackoffs

    backoffs = EndlessBackoffs(1.0, 30.0)
    assert not isinstance(backoffs, Sized)  # kopf counts no last attempt for an iterable without a length
    assert list(islice(backoffs, 9)) == [1, 2, 4, 8, 16, 30, 30, 30, 30]
    assert len(list(islice(backoffs, 10_000))) == 10_000  # it does not run out
    assert next(iter(backoffs)) == 1  # each request starts the schedule afresh


async def test_kopfs_watches_survive_the_api_server_failing_longer_than_finite_backoffs(
        cluster_factory, operator_factory):
    """For 4 s every request for GPUKernels and GPUQuotas answers 503 (their watch streams cut at once).
    With the retry schedule shrunk to 0.05 s doubling to 0.2 s, a finite schedule of kopf's default length
    (8 retries) would give up within 1.5 s and its watches would stop for good; they come back."""
    from kube_helpers import install

    cluster = cluster_factory()
    await install(cluster)
    op = await operator_factory(cluster, **{"GPUPoolOperator.api_retry_first": 0.05,
                                            "GPUPoolOperator.api_retry_max": 0.2})
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        await cluster.fault(resources=["gpukernels", "gpuquotas"], status=503, seconds=4)
        await asyncio.sleep(4.5)
        await kube.quota("user", "alice", kernels=1)
        await wait_until(lambda: _quota_valid(kube, "user-alice"), timeout=20,
                         what="the operator's quota watch to be back after the failures")
        tries = r"Request attempt #(\d+)(?:/\d+)? failed; will retry: GET \S+gpukernels"
        retries = [int(n) for n in re.findall(tries, op.logs())]
        assert retries and max(retries) > 9, "kopf was not retried past its default 8 back-offs"
        assert "escalating" not in op.logs()

        await kube.custom.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS, {
            "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": "k-after-the-failures"},
            "spec": {"owner": "alice", "kernelId": "after-the-failures", "profile": "small", "launch": 1}})
        await wait_until(lambda: _admitted(kube, "k-after-the-failures"), timeout=20,
                         what="the operator's kernel watch to be back after the failures")
    finally:
        await kube.close()


async def _quota_valid(kube: Kube, name: str) -> bool:
    from jupyter_gpu_pool.cluster.resources import QUOTAS

    return bool((await kube.custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)).get("status", {})
                .get("valid"))


async def _admitted(kube: Kube, name: str) -> bool:
    obj = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)
    return bool((obj.get("status") or {}).get("admitted"))


async def test_a_list_that_gets_no_answer_times_out(cluster_factory):
    """A half-open connection: the API server never answers the list.  list_all gives up after its
    request timeout (and list_and_watch retries), rather than waiting forever."""
    cluster = cluster_factory()
    api = await cluster.api()
    try:
        from kubernetes_asyncio import client

        await cluster.fault(resources=["pods"], verbs=["list"], hang=True, seconds=20)
        core = client.CoreV1Api(api)
        t0 = time.monotonic()
        with pytest.raises((asyncio.TimeoutError, TimeoutError)):
            await asyncio.wait_for(list_all(core.list_namespaced_pod, "default", request_timeout=0.5), 10)
        assert time.monotonic() - t0 < 3
    finally:
        await api.close()


# -- objects deleted while the operator's watch was down ----------------------------------------------------

async def test_what_was_deleted_while_the_operators_watch_was_down_is_forgotten(cluster_factory, tmp_path):
    """The operator's GPUKernel and GPUQuota watches go quiet; a kernel and a quota are deleted; the watches
    then meet a 410 and list afresh, which says nothing of what is gone.  The operator forgets both all the
    same: no pod is made again for the deleted kernel (nor an Event, nor a delete of it), and the deleted
    quota limits no one."""
    from kube_helpers import OperatorProcess, install, operator_ready

    cluster = cluster_factory()
    await install(cluster)
    op = OperatorProcess(cluster, tmp_path, {"GPUPoolOperator.heartbeat_timeout": 60.0},
                         kubeconfig=cluster.kubeconfig_for("operator")).start()
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        await operator_ready(cluster)
        await kube.quota("user", "alice", kernels=1)
        await wait_until(lambda: _quota_valid(kube, "user-alice"), timeout=20, what="the quota to be read")
        await _gpu_kernel(kube, "k-deleted-unseen")
        await wait_until(lambda: _running(kube, "k-deleted-unseen"), timeout=30, what="the kernel to run")

        await cluster.fault(stall=["gpukernels", "gpuquotas"])  # the operator's watches hear nothing more
        deleted_at = len(await cluster.audit())
        await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS,
                                                          "k-deleted-unseen")
        await kube.custom.delete_cluster_custom_object(GROUP, VERSION, "gpuquotas", "user-alice")
        kube.quotas.remove("user-alice")
        await asyncio.sleep(1.0)
        await cluster.fault(resume=True)  # a 410: kopf lists afresh, and hears of no deletion
        await asyncio.sleep(3.0)  # several sweeps (reconcile_interval 1 s); the pod garbage collected

        after = [c for c in (await cluster.audit())[deleted_at:] if c["user"] == "operator"]
        made = [c for c in after if c["resource"] == "pods" and c["verb"] == "create"]
        assert made == [], "a pod was made for a kernel that is gone"
        assert not [c for c in after if c["resource"] == "gpukernels" and c["verb"] == "delete"]
        pods = [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == "k-deleted-unseen"]
        assert pods == []
        events = (await kube.core.list_namespaced_event(cluster.namespace)).items
        assert not [e for e in events if e.reason == "ServerGone"]

        # The deleted quota (one kernel at most) no longer applies: alice has none, so two kernels start.
        for name in ("k-after-1", "k-after-2"):
            await _gpu_kernel(kube, name)
        for name in ("k-after-1", "k-after-2"):
            await wait_until(lambda n=name: _admitted(kube, n), timeout=20, what=f"{name} to be admitted")
        assert "gone (deleted while a watch was down)" in op.logs()
    finally:
        await kube.close()
        op.stop()


async def _gpu_kernel(kube: Kube, name: str) -> None:
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, {
        "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": name},
        "spec": {"owner": "alice", "kernelId": name, "profile": "small", "launch": 1}})


async def _phase(kube: Kube, name: str, phase: str) -> bool:
    obj = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)
    return (obj.get("status") or {}).get("phase") == phase


async def _running(kube: Kube, name: str) -> bool:
    return await _phase(kube, name, "Running")


async def test_the_operator_forgets_what_it_kept_about_things_that_are_gone(cluster_factory):
    """Start stories of pods that are gone, nodes read long ago, empty pod lists of unknown kernels and the
    uids of deleted kernels (once no late event can bring one back) are dropped by the sweep."""
    from jupyter_gpu_pool.config import GPUPool
    from jupyter_gpu_pool.operator.controller import Controller
    from jupyter_gpu_pool.operator.settings import GPUPoolOperator, operator_settings
    from kube_helpers import PROFILES, install

    cluster = cluster_factory()
    await install(cluster)
    settings = operator_settings(GPUPoolOperator(progress_interval=5.0, reconcile_interval=1.0),
                                 GPUPool(profiles=PROFILES).check())
    now = [1000.0]
    api = await cluster.api()
    controller = Controller(settings, api, clock=lambda: now[0])
    try:
        controller.stories.events["uid-of-a-gone-pod"] = (now[0], [])
        controller.stories.nodes["gpu-node-1"] = (now[0] - 10, None)
        controller.cache.pods["uid-of-an-unknown-kernel"] = {}
        controller.cache.gone["uid-of-a-deleted-kernel"] = now[0]
        controller.cache.deleting.add("uid-of-a-pod-gone-unseen")
        await controller.sweep()
        assert "uid-of-a-deleted-kernel" in controller.cache.gone  # a late event may still come: kept a while
        now[0] += 61
        await controller.sweep()
        assert controller.stories.events == {} and controller.stories.nodes == {} and controller.cache.gone == {}
        assert "uid-of-an-unknown-kernel" not in controller.cache.pods and controller.cache.deleting == set()
    finally:
        await controller.stop()
        await api.close()


async def test_a_kernel_deleted_while_it_is_admitted_is_let_go_quietly(cluster_factory):
    """The status write of an admission finds no object (deleted with nobody watching): the admission
    ends with nothing to start, and the kernel is remembered as gone, instead of a crash in the handler."""
    from jupyter_gpu_pool.config import GPUPool
    from jupyter_gpu_pool.operator.controller import Controller
    from jupyter_gpu_pool.operator.settings import GPUPoolOperator, operator_settings
    from kube_helpers import PROFILES, install

    cluster = cluster_factory()
    await install(cluster)
    settings = operator_settings(GPUPoolOperator(), GPUPool(profiles=PROFILES).check())
    api = await cluster.api()
    controller = Controller(settings, api)
    profile = sorted(settings.pool.profiles)[0]
    ghost = {"apiVersion": "gpupool.jupyter.org/v1alpha1", "kind": "GPUKernel",
             "metadata": {"name": "k-ghost", "namespace": "jhub", "uid": "uid-of-a-ghost", "generation": 1},
             "spec": {"owner": "alice", "profile": profile, "launch": 1}, "status": {}}
    try:
        controller.cache.listed = True  # as after its first listing (which would have forgotten the ghost)
        controller.cache.remember(ghost)
        await controller.reconcile(("jhub", "k-ghost"))  # admitted, counted, and its status write finds no object
        assert "uid-of-a-ghost" in controller.cache.gone and ("jhub", "k-ghost") not in controller.cache.kernels
        assert controller.cache.holding("alice", (), None) == ()  # its admission no longer counts
        assert [c for c in await cluster.audit() if c["resource"] in ("pods", "secrets")] == []  # nothing made
    finally:
        await controller.stop()
        await api.close()
