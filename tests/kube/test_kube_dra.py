"""The ``dra`` sharing backend end to end on the test cluster, which serves resource.k8s.io/v1 (DeviceClasses
and a node's ResourceSlice as NVIDIA's DRA driver publishes them, the resource claim controller, and a
scheduler that allocates claims; see testcluster/dra.py): one ResourceClaimTemplate per profile, each
kernel's pod claims a device of its own from it, the kernel runs on that device, and a claim nothing can
satisfy is refused in plain words within seconds."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from kernel_helpers import run_code
from kube_helpers import HAMI_NODE, PROFILES, Kube, wait_until

from jupyter_gpu_pool.cluster.resources import LABEL_KERNEL, kernel_name
from jupyter_gpu_pool.kernel_provisioner import KernelStartRefused

GiB = 2**30
NVIDIA = {"nvidia.com/gpu.product": "Test-GPU-80GB", "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "2"}


def mig(index: int, profile: str, memory: str) -> dict:
    return {"name": f"gpu-1-mig-{index}", "attributes": {"type": "mig", "profile": profile, "productName": "Test-GPU",
                                                         "uuid": f"MIG-000{index}"}, "capacity": {"memory": memory}}


MIG_NODE = {  # one whole GPU, and one partitioned into two 1g.10gb and one 4g.40gb MIG devices
    "name": "dra-node-1", "labels": NVIDIA, "taints": HAMI_NODE["taints"],
    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
    "dra": [{"name": "gpu-0", "attributes": {"type": "gpu", "productName": "Test-GPU-80GB", "uuid": "GPU-0000"},
             "capacity": {"memory": "80Gi"}},
            mig(0, "1g.10gb", "10Gi"), mig(1, "1g.10gb", "10Gi"), mig(2, "4g.40gb", "40Gi")],
}
SHARES_NODE = {  # one GPU whose memory is shared by claims (the driver's consumableShares=memory)
    "name": "dra-node-1", "labels": NVIDIA, "taints": HAMI_NODE["taints"],
    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
    "dra": [{"name": "gpu-0", "attributes": {"type": "gpu", "productName": "Test-GPU-24GB", "uuid": "GPU-0000"},
             "capacity": {"memory": "24Gi"}, "allowMultipleAllocations": True,
             "requestPolicy": {"memory": {"default": "24Gi", "validRange": {"min": "1Mi", "max": "24Gi",
                                                                             "step": "1Mi"}}}}],
}
DRA_MIG = {"GPUPoolOperator.sharing": "dra", "GPUPoolOperator.gpu_memory": "80GiB",
           "GPUPoolOperator.mig_profiles": ["1g.10gb", "2g.20gb", "4g.40gb", "7g.80gb"]}


CONSUMABLE_CAPACITY = {"DRAConsumableCapacity": True}  # alpha in 1.34, off by default: dra_slices=shares needs it


async def dra_cluster(cluster_factory, operator_factory, configure_server, node: dict, gates: dict | None = None,
                      server: dict | None = None, **operator):
    from kube_helpers import install

    cluster = cluster_factory(nodes=[node], feature_gates=gates)
    await install(cluster)
    await operator_factory(cluster, **operator)
    configure_server(cluster, **(server or {}))
    return cluster


async def template_writes(cluster) -> list[tuple[str, str]]:
    """The operator's creates and deletes of ResourceClaimTemplates so far (verb, name: a create's, what it made)."""
    return [(c["verb"], c["name"] or "") for c in await cluster.audit()
            if c["resource"] == "resourceclaimtemplates" and c["verb"] in ("create", "delete")]


async def devices_of(km) -> list[str]:
    env = json.loads(await run_code(km, "import os, json; print(json.dumps(dict(os.environ)))"))
    return env.get("TESTCLUSTER_DRA_DEVICES", "").split(",")


async def refused_fast(km) -> KernelStartRefused:
    t0 = time.monotonic()
    with pytest.raises(KernelStartRefused) as refusal:
        await km.start_kernel()
    assert time.monotonic() - t0 < 10
    return refusal.value


async def test_a_claim_gets_a_device_the_kernel_runs_on_it_and_an_unsatisfiable_claim_is_refused(
        cluster_factory, operator_factory, configure_server, kube_sessions, managers):
    cluster = await dra_cluster(cluster_factory, operator_factory, configure_server, MIG_NODE, **DRA_MIG)
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        small = managers("gpu-pool-kubernetes-small")
        await small.start_kernel()
        [device] = await devices_of(small)
        assert device.startswith("gpu.nvidia.com/dra-node-1/gpu-1-mig-")  # a 1g.10gb MIG device, no more
        templates = await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{cluster.namespace}/resourceclaimtemplates")
        assert sorted(t["metadata"]["name"] for t in templates["items"]) == sorted(
            f"gpu-pool-{p}" for p in PROFILES)  # one per profile
        [pod] = [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) ==
                 kernel_name(small.kernel_id)]
        assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpu-pool-small"}]
        [kernel] = await kube.kernels()
        assert kernel["status"]["admitted"]["memory"] == 10 * GiB  # what the MIG device holds, against quotas
        assert kernel["status"]["gpu"] == {"sharing": "dra", "resources": {}, "claimTemplate": "gpu-pool-small"}

        whole = managers("gpu-pool-kubernetes-whole")
        await whole.start_kernel()
        assert await devices_of(whole) == ["gpu.nvidia.com/dra-node-1/gpu-0"]

        second = managers("gpu-pool-kubernetes-small")
        await second.start_kernel()
        third = managers("gpu-pool-kubernetes-small")  # both 1g.10gb devices are taken
        refusal = await refused_fast(third)
        assert refusal.status_code == 503 and refusal.pool_reason == "Unschedulable"
        message = str(refusal)
        assert message.startswith("Every GPU device for profile 'small' (a MIG 1g.10gb device") and \
            "is taken right now" in message and "cannot allocate all claims" in message
        assert "Try again in a few minutes" in message

        await second.shutdown_kernel()  # its pod goes, and its claim with it: the device is free again

        async def claims() -> int:
            listing = await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{cluster.namespace}/resourceclaims")
            return len(listing["items"])

        await wait_until(lambda: _equals(claims(), 2), timeout=20, what="the stopped kernel's claim to go")
        again = managers("gpu-pool-kubernetes-small")
        await again.start_kernel()
        assert "ok" in await run_code(again, "print('ok')")
    finally:
        await kube.close()


async def _equals(coro, value) -> bool:
    return await coro == value


SHARES = {"GPUPoolOperator.sharing": "dra", "GPUPoolOperator.dra_slices": "shares",
          "GPUPool.profiles": {"small": PROFILES["small"], "whole": PROFILES["whole"]}}


async def test_consumable_capacity_shares_one_gpu_between_kernels(cluster_factory, operator_factory,
                                                                  configure_server, kube_sessions, managers):
    cluster = await dra_cluster(cluster_factory, operator_factory, configure_server, SHARES_NODE,
                                gates=CONSUMABLE_CAPACITY, **SHARES)
    first, second = managers("gpu-pool-kubernetes-small"), managers("gpu-pool-kubernetes-small")
    await first.start_kernel()
    await second.start_kernel()
    assert await devices_of(first) == await devices_of(second) == ["gpu.nvidia.com/dra-node-1/gpu-0"]
    refusal = await refused_fast(managers("gpu-pool-kubernetes-small"))  # 24 GiB hold two 10 GiB shares
    assert refusal.pool_reason == "Unschedulable" and "cannot allocate all claims" in str(refusal)
    assert "is taken right now" in str(refusal)
    refusal = await refused_fast(managers("gpu-pool-kubernetes-whole"))  # the GPU is shared: not to be had whole
    assert refusal.pool_reason == "Unschedulable"

    # The API server stores the request's memory in canonical form (10Gi); the templates still settle:
    # sweep after sweep (every second here), none is deleted and made again.
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        template = await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{cluster.namespace}/"
                                  "resourceclaimtemplates/gpu-pool-small")
        request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        assert request["capacity"] == {"requests": {"memory": "10Gi"}}
    finally:
        await kube.close()
    writes = await template_writes(cluster)
    await asyncio.sleep(3.5)
    assert sorted(await template_writes(cluster)) == sorted(writes) == [("create", "gpu-pool-small"),
                                                                         ("create", "gpu-pool-whole")]


async def test_without_consumable_capacity_a_shares_profile_is_refused_in_words(
        cluster_factory, operator_factory, configure_server, kube_sessions, managers):
    """Kubernetes 1.34 as it comes (DRAConsumableCapacity off): the API server drops the capacity request
    from the template, so a claim would get the whole GPU while its kernel is counted as 10 GiB.  The
    operator refuses such kernels with the reason, says so once in an Event and its log, and leaves the
    templates alone sweep after sweep."""
    cluster = await dra_cluster(cluster_factory, operator_factory, configure_server, SHARES_NODE, **SHARES)
    refusal = await refused_fast(managers("gpu-pool-kubernetes-small"))
    message = str(refusal)
    assert refusal.pool_reason == "DeviceUnsupported" and refusal.status_code == 503
    assert "does not serve consumable capacity" in message and "DRAConsumableCapacity" in message
    assert "dra_slices" in message
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        pods = await kube.pods()
        assert pods == []  # no pod that would hold a whole GPU
        events = [e for e in (await kube.core.list_namespaced_event(cluster.namespace)).items
                  if e.involved_object.kind == "ResourceClaimTemplate"]
        assert [(e.reason, e.involved_object.name) for e in events] == [("DeviceUnsupported", "gpu-pool-small")]
    finally:
        await kube.close()
    await managers("gpu-pool-kubernetes-whole").start_kernel()  # whole GPUs need no capacity: they start
    writes = await template_writes(cluster)
    await asyncio.sleep(3.5)
    assert await template_writes(cluster) == writes


MID = {**PROFILES, "mid": {"slice": "15GiB"}}  # a MIG 2g.20gb device, which MIG_NODE does not have


async def test_a_claim_no_device_can_meet_is_told_apart_from_devices_all_taken(
        cluster_factory, operator_factory, configure_server, kube_sessions, managers):
    """'Try again in a few minutes' only where it can help: a MIG profile no node has, and a cluster whose
    DRA driver publishes no devices, are refused as what they are."""
    cluster = await dra_cluster(cluster_factory, operator_factory, configure_server, MIG_NODE,
                                server={"GPUPool.profiles": MID}, **{**DRA_MIG, "GPUPool.profiles": MID,
                                                                     "GPUPoolOperator.progress_interval": 0.5})
    refusal = await refused_fast(managers("gpu-pool-kubernetes-mid"))
    message = str(refusal)
    assert message.startswith("No node of the cluster has a MIG 2g.20gb device for profile 'mid'")
    assert "the nodes publish 2 × MIG 1g.10gb device, 1 × MIG 4g.40gb device, 1 × whole GPU (on 1 node)" in message
    assert "Waiting will not help" in message and "Try again" not in message
    refusal = await refused_fast(managers("gpu-pool-kubernetes-huge"))  # 64 GPUs: no node has as many
    assert str(refusal).startswith("No node of the cluster has 64 GPU(s) on one node for profile 'huge'")

    kube = Kube(await cluster.api(), cluster.namespace)
    try:  # the driver stops publishing its devices
        await kube.api.call_api("/apis/resource.k8s.io/v1/resourceslices/dra-node-1-gpu.nvidia.com", "DELETE",
                                response_types_map={}, auth_settings=["BearerToken"])
    finally:
        await kube.close()
    await asyncio.sleep(0.6)  # the operator's reading of the devices is at most progress_interval old
    refusal = await refused_fast(managers("gpu-pool-kubernetes-small"))
    assert "no node publishes devices of the DRA driver 'gpu.nvidia.com'" in str(refusal)
    assert "Waiting will not help" in str(refusal)


async def test_a_device_class_the_cluster_lacks_is_named(cluster_factory, operator_factory, configure_server,
                                                         kube_sessions, managers):
    await dra_cluster(cluster_factory, operator_factory, configure_server, MIG_NODE,
                      **{**DRA_MIG, "GPUPoolOperator.dra_mig_device_class": "mig.example.com"})
    refusal = await refused_fast(managers("gpu-pool-kubernetes-small"))
    message = str(refusal)
    assert "it has no DeviceClass 'mig.example.com'" in message and "Waiting will not help" in message
    assert refusal.pool_reason == "Unschedulable"
