"""A kernel never inherits another's objects (issue 30): a GPUKernel made again under the name of one just
deleted gets a pod and a Secret of its own, never its predecessor's (still in its grace period, or waiting
for the garbage collector); an unschedulable pod is deleted once; and the operator writes only what changed
(no status write per look at a start, no quota status write per quota event)."""

from __future__ import annotations

import asyncio
import base64
import json

from kube_helpers import Kube, wait_until

from jupyter_gpu_pool.cluster.resources import (API_VERSION, CONNECTION_FILE, GROUP, KERNEL_KIND, KERNELS,
                                                LABEL_KERNEL, QUOTAS, VERSION, secret_name)

# A kernel that ignores SIGTERM: its pod, once deleted, stays terminating for its whole grace period (10 s).
STUBBORN = ["/bin/sh", "-c", "trap '' TERM; exec python -m ipykernel_launcher -f \"$0\"", "{connection_file}"]


async def _make(kube: Kube, name: str, profile: str = "small") -> dict:
    return await kube.custom.create_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, {
        "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": name},
        "spec": {"owner": "alice", "kernelId": name, "profile": profile, "launch": 1}})


async def _get(kube: Kube, name: str) -> dict | None:
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        return await kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


async def _phase(kube: Kube, name: str, phase: str) -> bool:
    return ((await _get(kube, name) or {}).get("status") or {}).get("phase") == phase


async def test_a_kernel_made_again_under_its_name_runs_its_own_pod_not_its_predecessors(cluster, operator_factory,
                                                                                       kube):
    """The first GPUKernel's pod is still terminating (its kernel ignores SIGTERM) when the second, of the same
    name, is made: the second runs a pod of its own at once, and never reads the first's ("being deleted",
    an exit code)."""
    await operator_factory(cluster, **{"GPUPoolOperator.kernel_command": STUBBORN})
    first = await _make(kube, "k-again")
    await wait_until(lambda: _phase(kube, "k-again", "Running"), timeout=30, what="the first kernel to run")
    old_pod = (await _get(kube, "k-again"))["status"]["pod"]
    await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, "k-again")

    async def terminating() -> bool:
        return any(p["metadata"]["name"] == old_pod and p["metadata"].get("deletionTimestamp")
                   for p in await kube.pods())

    await wait_until(terminating, timeout=10, what="the first kernel's pod to be terminating")
    second = await _make(kube, "k-again")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    seen = []

    async def running() -> bool:
        st = (await _get(kube, "k-again") or {}).get("status") or {}
        seen.append((st.get("phase"), st.get("reason"), st.get("pod")))
        return st.get("phase") == "Running"

    await wait_until(running, timeout=8, interval=0.1, what="the second kernel to run (before the first pod's grace "
                     "period ends)")
    pod_name = (await _get(kube, "k-again"))["status"]["pod"]
    [pod] = [p for p in await kube.pods() if p["metadata"]["name"] == pod_name]
    assert pod_name != old_pod and pod["metadata"]["ownerReferences"][0]["uid"] == second["metadata"]["uid"]
    assert not pod["metadata"].get("deletionTimestamp")
    assert all(phase in (None, "Starting", "Running") and reason != "PodDeleted" and name in (None, pod_name)
               for phase, reason, name in seen), seen
    assert any(p["metadata"]["name"] == old_pod for p in await kube.pods())  # the old one is still going: its own


async def test_a_secret_of_another_kernel_under_the_name_is_replaced_not_used(cluster, operator, kube):
    """A Secret named as the new kernel's but owned by another GPUKernel (as a predecessor's is until the
    garbage collector comes: here its owner is a live kernel, so no collector takes it meanwhile) is not the
    new kernel's: it is deleted and a Secret of its own, with a key of its own, is made before its pod."""
    other = await _make(kube, "k-someone-else", profile="no-such-profile")  # fails at once: it makes nothing
    planted_key = "0" * 64
    await kube.core.create_namespaced_secret(kube.namespace, {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": secret_name("k-new"), "labels": {LABEL_KERNEL: "k-new"},
                     "ownerReferences": [{"apiVersion": API_VERSION, "kind": KERNEL_KIND, "name": "k-someone-else",
                                          "uid": other["metadata"]["uid"], "controller": True}]},
        "stringData": {CONNECTION_FILE: json.dumps({"key": planted_key})}})
    new = await _make(kube, "k-new")
    await wait_until(lambda: _phase(kube, "k-new", "Running"), timeout=30, what="the new kernel to run")
    secret = await kube.core.read_namespaced_secret(secret_name("k-new"), kube.namespace)
    assert secret.metadata.owner_references[0].uid == new["metadata"]["uid"]
    assert json.loads(base64.b64decode(secret.data[CONNECTION_FILE]))["key"] != planted_key


async def test_an_unschedulable_pod_is_deleted_once(cluster, operator, kube):
    """Its kernel fails at once (no grace by default) and its pod is deleted; the status write that follows
    brings the kernel back to the operator, which does not delete the pod again (before: a second DELETE,
    answered 404)."""
    mark = len(await cluster.audit())
    await _make(kube, "k-huge", profile="huge")  # 64 whole GPUs: no node has them
    await wait_until(lambda: _phase(kube, "k-huge", "Failed"), timeout=20, what="the launch to fail")

    async def pod_gone() -> bool:
        return not [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == "k-huge"]

    await wait_until(pod_gone, timeout=20, what="the pod to go")
    await asyncio.sleep(2)  # two sweeps: nothing more
    deletes = [c for c in (await cluster.audit())[mark:] if c["resource"] == "pods" and c["verb"] == "delete"]
    assert len(deletes) == 1, deletes


async def test_a_start_costs_a_few_writes_and_a_quota_one_status_write(cluster, operator, kube):
    """A kernel whose pod runs at once costs at most 6 operator writes (its status, Secret, NetworkPolicy, pod,
    and its status again), and ten quotas made at once one status write each."""
    mark = len(await cluster.audit())
    names = [f"group-{i}" for i in range(10)]
    for name in names:
        await kube.quota("group", name, members=["bob"], kernels=1)
    await _make(kube, "k-cheap")
    await wait_until(lambda: _phase(kube, "k-cheap", "Running"), timeout=30, what="the kernel to run")

    async def valid() -> bool:
        objs = [await kube.custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, f"group-{n}") for n in names]
        return all((o.get("status") or {}).get("valid") is True for o in objs)

    await wait_until(valid, timeout=20, what="the quotas' status")
    await asyncio.sleep(2)  # two sweeps: nothing more
    calls = [c for c in (await cluster.audit())[mark:] if c["verb"] in ("create", "patch", "update", "delete")]
    made = [c for c in calls if c["resource"] in ("pods", "secrets", "networkpolicies", "events")]  # only its own
    status = [c for c in calls if c["resource"] == "gpukernels/status" and c["name"] == "k-cheap"]
    assert len(made) == 3 and len(made) + len(status) <= 6, made + status
    quota_writes = [c for c in calls if c["resource"] == "gpuquotas/status"]
    assert len(quota_writes) == len(names), quota_writes


async def test_the_sweep_deletes_a_kernel_pod_whose_gpukernel_is_gone(cluster_factory, operator_factory):
    """The garbage collector is far behind (60 s here; after an API server restart it may never come): the
    operator's sweep deletes the pod of a GPUKernel that is gone, which would hold its GPU with no kernel to
    show for it."""
    from kube_helpers import install

    cluster = cluster_factory(gc_delay=60)
    await install(cluster)
    await operator_factory(cluster)
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        await _make(kube, "k-left")
        await wait_until(lambda: _phase(kube, "k-left", "Running"), timeout=30, what="the kernel to run")
        pod = (await _get(kube, "k-left"))["status"]["pod"]
        await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, "k-left")

        async def deleted() -> bool:
            return not [p for p in await kube.pods() if p["metadata"]["name"] == pod
                        and not p["metadata"].get("deletionTimestamp")]

        await wait_until(deleted, timeout=15, what="the sweep to delete the pod of the gone kernel")
    finally:
        await kube.close()
