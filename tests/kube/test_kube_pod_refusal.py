"""The API server refuses a kernel's pod (a ResourceQuota of 0 GPUs in the kernels' namespace): the
operator backs off instead of looping (on a real control plane it made 705 pod creates and 704 status
patches in 20 s), writes the kernel's status only when it changes, and carries the quota's reason to
the user; once the quota allows it, the kernel starts."""

from __future__ import annotations

import asyncio

import pytest
from kube_helpers import Kube, OperatorProcess, install, operator_ready, wait_until

from jupyter_gpu_pool.cluster.resources import API_VERSION, GROUP, KERNEL_KIND, KERNELS, LABEL_KERNEL, VERSION

SWEEP = 4.0  # the operator's reconcile_interval: the back-off's cap


async def _status(kube: Kube, name: str) -> dict:
    obj = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)
    return obj.get("status") or {}


@pytest.mark.slow
async def test_a_refused_pod_is_retried_with_back_off_and_the_user_reads_the_quotas_reason(cluster_factory, tmp_path):
    cluster = cluster_factory()
    await install(cluster)
    op = OperatorProcess(cluster, tmp_path, {"GPUPoolOperator.heartbeat_timeout": 120.0,
                                             "GPUPoolOperator.reconcile_interval": SWEEP,
                                             "GPUPoolOperator.api_retry_first": 1.0},
                         kubeconfig=cluster.kubeconfig_for("operator")).start()
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        await operator_ready(cluster)
        await kube.core.create_namespaced_resource_quota(cluster.namespace, {
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}})
        mark = len(await cluster.audit())
        await kube.custom.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS, {
            "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": "k-refused"},
            "spec": {"owner": "alice", "kernelId": "k-refused", "profile": "small", "launch": 1}})

        async def refused() -> bool:
            return "exceeded quota: no-gpus" in ((await _status(kube, "k-refused")).get("message") or "")

        await wait_until(refused, timeout=30, what="the quota's reason in the kernel's status")
        seen = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS,
                                                              "k-refused")
        await asyncio.sleep(2.5 * SWEEP)  # tries at about 0, 1, 3, 7, 11 s: the cap is the sweep's interval
        after = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS,
                                                               "k-refused")
        calls = [c for c in (await cluster.audit())[mark:] if c["user"] == "operator"]
        creates = [c for c in calls if c["resource"] == "pods" and c["verb"] == "create"]
        patches = [c for c in calls if c["resource"] == "gpukernels/status" and c["verb"] == "patch"]
        # Over about 12 s: at most one try per back-off step (before the fix: hundreds of each).
        assert 3 <= len(creates) <= 7, creates
        assert len(patches) <= len(creates) + 3, patches
        # Nothing changed, so nothing was written: no new resourceVersion, startedAt kept, no watch event.
        assert after["metadata"]["resourceVersion"] == seen["metadata"]["resourceVersion"]
        st = after["status"]
        assert st["phase"] == "Starting" and st["reason"] == "PodRefused"
        pod = f"k-refused-1-{seen['metadata']['uid'][:8]}"  # its launch's, of this GPUKernel object
        assert st["message"].startswith(f'The cluster refused the kernel\'s pod: pods "{pod}" is forbidden: '
                                        'exceeded quota: no-gpus, requested: requests.nvidia.com/gpu=1, '
                                        'used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=0.')
        assert "Ask your admin to raise the namespace's ResourceQuota" in st["message"]
        events = (await kube.core.list_namespaced_event(cluster.namespace)).items
        assert len([e for e in events if e.reason == "PodRefused"]) == 1  # one Event per new refusal

        # The admin lifts the quota: the next try (within the cap) makes the pod.
        await kube.core.delete_namespaced_resource_quota("no-gpus", cluster.namespace)

        async def made() -> bool:
            return any(p["metadata"]["labels"].get(LABEL_KERNEL) == "k-refused" for p in await kube.pods())

        await wait_until(made, timeout=SWEEP + 10, what="the kernel's pod once the quota is gone")
        await wait_until(lambda: _not_refused(kube), timeout=10, what="the refusal's words to go")
    finally:
        await kube.close()
        op.stop()


async def _not_refused(kube: Kube) -> bool:
    return (await _status(kube, "k-refused")).get("reason") != "PodRefused"
