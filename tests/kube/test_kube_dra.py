"""The ``dra`` sharing backend end to end on the test cluster, which serves resource.k8s.io/v1 (DeviceClasses
and a node's ResourceSlice as NVIDIA's DRA driver publishes them, the resource claim controller, and a
scheduler that allocates claims; see testcluster/dra.py): one ResourceClaimTemplate per profile, each
kernel's pod claims a device of its own from it, the kernel runs on that device, and a claim nothing can
satisfy is refused in plain words within seconds."""

from __future__ import annotations

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


async def dra_cluster(cluster_factory, operator_factory, configure_server, node: dict, **operator):
    from kube_helpers import install

    cluster = cluster_factory(nodes=[node])
    await install(cluster)
    await operator_factory(cluster, **operator)
    configure_server(cluster)
    return cluster


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
        assert message.startswith("No GPU device for profile 'small' (a MIG 1g.10gb device") and \
            "cannot allocate all claims" in message

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


async def test_consumable_capacity_shares_one_gpu_between_kernels(cluster_factory, operator_factory,
                                                                  configure_server, kube_sessions, managers):
    await dra_cluster(cluster_factory, operator_factory, configure_server, SHARES_NODE,
                      **{"GPUPoolOperator.sharing": "dra", "GPUPoolOperator.dra_slices": "shares",
                         "GPUPool.profiles": {"small": PROFILES["small"], "whole": PROFILES["whole"]}})
    first, second = managers("gpu-pool-kubernetes-small"), managers("gpu-pool-kubernetes-small")
    await first.start_kernel()
    await second.start_kernel()
    assert await devices_of(first) == await devices_of(second) == ["gpu.nvidia.com/dra-node-1/gpu-0"]
    refusal = await refused_fast(managers("gpu-pool-kubernetes-small"))  # 24 GiB hold two 10 GiB shares
    assert refusal.pool_reason == "Unschedulable" and "cannot allocate all claims" in str(refusal)
    refusal = await refused_fast(managers("gpu-pool-kubernetes-whole"))  # the GPU is shared: not to be had whole
    assert refusal.pool_reason == "Unschedulable"
