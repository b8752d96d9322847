"""Hollow nodes (testcluster/hollow.py): GPU nodes whose kubelet marks bound pods Running, as a kubelet
reports them, without running anything, for driving the operator with many kernels; and the scheduler's
cache of waiting pods and node usage that keeps a pass cheap at that scale."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from kube_helpers import Kube, follow_pod, install, wait_until
from kubernetes_asyncio.client.exceptions import ApiException
from testcluster.hollow import hollow_nodes
from testcluster.scheduler import Scheduler
from testcluster.store import Store

NS = "jhub"


def gpu_pod(name: str, grace: int = 10, gpus: int = 1, memory_mib: int = 10240) -> dict:
    """A pod as the operator renders a kernel's under HAMi (the resources that matter to scheduling)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "kernel"}},
            "spec": {"terminationGracePeriodSeconds": grace,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "kernel", "image": "quay.io/jupyter/pytorch-notebook",
                                     "command": ["python", "-m", "ipykernel_launcher"],
                                     "resources": {"requests": {"cpu": "250m", "memory": "1Gi"},
                                                   "limits": {"nvidia.com/gpu": str(gpus),
                                                              "nvidia.com/gpumem": str(memory_mib)}}}]}}


@pytest.fixture
async def hollow(cluster_factory):
    cluster = cluster_factory(hollow_nodes=50, spread=True)
    await install(cluster)
    kube = Kube(await cluster.api(), NS)
    yield cluster, kube
    await kube.close()


async def _all_running(kube: Kube, count: int) -> list[dict] | None:
    pods = await kube.pods()
    return pods if len(pods) == count and all(p["status"]["phase"] == "Running" for p in pods) else None


async def test_hollow_nodes_mark_their_pods_running_as_a_kubelet_reports_them(hollow):
    """200 pods on 50 hollow GPU nodes: each Running with a pod IP of its own, every condition True, a ready,
    running container, the kubelet's Events; spread over the nodes by the scheduler (4 each); the nodes Ready
    with HAMi's GPU resources.  A deleted pod's name is free once the hollow kubelet has stopped it."""
    cluster, kube = hollow
    await asyncio.gather(*(kube.core.create_namespaced_pod(NS, gpu_pod(f"k-{i:03d}")) for i in range(200)))
    pods = await wait_until(lambda: _all_running(kube, 200), timeout=120, what="200 pods to run")
    assert len({p["status"]["podIP"] for p in pods}) == 200
    assert all(p["status"]["podIP"].startswith("10.") for p in pods)
    for p in pods:
        assert {c["type"]: c["status"] for c in p["status"]["conditions"]} == {
            "PodReadyToStartContainers": "True", "Initialized": "True", "Ready": "True", "ContainersReady": "True",
            "PodScheduled": "True"}
        [container] = p["status"]["containerStatuses"]
        assert container["ready"] and container["started"] and "running" in container["state"]
    assert set(Counter(p["spec"]["nodeName"] for p in pods).values()) == {4}
    nodes = (await kube.core.list_node()).items
    assert len(nodes) == 50 and all(n.status.allocatable["nvidia.com/gpumem"] == str(8 * 81920) for n in nodes)
    assert all(c.status == "True" for n in nodes for c in n.status.conditions if c.type == "Ready")
    events = (await kube.core.list_namespaced_event(NS, field_selector="involvedObject.name=k-007")).items
    assert sorted(e.reason for e in events) == ["Pulled", "Scheduled", "Started"]
    await kube.core.delete_namespaced_pod("k-007", NS)
    await wait_until(lambda: _created(kube, gpu_pod("k-007")), timeout=30, what="the name to be free again")


async def _created(kube: Kube, body: dict) -> bool:
    try:
        await kube.core.create_namespaced_pod(NS, body)
        return True
    except ApiException as e:
        assert e.status == 409
        return False


async def test_with_pid1_a_hollow_pod_takes_its_whole_grace_period(cluster_factory):
    """``--pid1`` on a hollow node: a deleted pod stays Terminating for its grace period (its name taken:
    409), then ends killed (exit code 137) and is removed."""
    cluster = cluster_factory(hollow_nodes=1, pid1=True)
    await install(cluster)
    kube = Kube(await cluster.api(), NS)
    try:
        await kube.core.create_namespaced_pod(NS, gpu_pod("k-1", grace=2))
        await wait_until(lambda: _all_running(kube, 1), timeout=30, what="the pod to run")
        events: list[dict] = []
        follow = asyncio.create_task(follow_pod(cluster.url, NS, "k-1", events))
        await kube.core.delete_namespaced_pod("k-1", NS)
        with pytest.raises(ApiException) as taken:
            await kube.core.create_namespaced_pod(NS, gpu_pod("k-1"))
        assert taken.value.status == 409 and json.loads(taken.value.body)["reason"] == "AlreadyExists"
        await asyncio.wait_for(follow, 30)
        removed = events[-1]["object"]
        assert events[-1]["type"] == "DELETED"
        assert removed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    finally:
        await kube.close()


async def test_the_scheduler_counts_what_its_watch_says_is_placed_and_freed():
    """The scheduler's cache follows its watch: a node full with one pod leaves the next one waiting
    (Unschedulable, in the real scheduler's words, said once); the first pod deleted, the waiting one is bound
    there; a pod that ended holds nothing."""
    store = Store()
    nodes = hollow_nodes(1, gpus=1, split=1)
    store.create(store.kind("", "v1", "nodes"), None, {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": nodes[0]["name"]},
        "spec": {"taints": nodes[0]["taints"]}, "status": {"allocatable": nodes[0]["allocatable"]}})
    store.create(store.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": NS}})
    pods = store.kind("", "v1", "pods")
    scheduler = Scheduler(store)
    running = asyncio.create_task(scheduler.run())
    try:
        store.create(pods, NS, gpu_pod("first"))
        await wait_until(lambda: store.get(pods, NS, "first")["spec"].get("nodeName"), timeout=10)
        store.create(pods, NS, gpu_pod("second"))
        await wait_until(lambda: _condition(store, "second"), timeout=10)
        assert "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in _condition(store, "second")
        scheduler.schedule_once()  # a retry pass finds the same: no second report
        assert len(store.list(store.kind("", "v1", "events"), NS, field_selector="reason=FailedScheduling")[0]) == 1
        store.delete(pods, NS, "first", {"gracePeriodSeconds": 0})
        await wait_until(lambda: store.get(pods, NS, "second")["spec"].get("nodeName"), timeout=10)
        store.patch(pods, NS, "second", "application/merge-patch+json", {"status": {"phase": "Succeeded"}}, "status")
        store.create(pods, NS, gpu_pod("third"))
        await wait_until(lambda: store.get(pods, NS, "third")["spec"].get("nodeName"), timeout=10)
    finally:
        running.cancel()


def _condition(store: Store, name: str) -> str | None:
    pod = store.get(store.kind("", "v1", "pods"), NS, name)
    return next((c.get("message") for c in pod["status"].get("conditions") or []
                 if c["type"] == "PodScheduled" and c["status"] == "False"), None)


async def test_the_audit_log_says_when_and_can_be_followed_by_client(cluster, kube):
    """``GET /testcluster/audit?user=...&since=N``: one client's requests from the Nth on, each with its time."""
    mark = len(await cluster.audit())
    for who in ("operator", "agent"):
        api = await _client(cluster, who)
        async with api:
            from kubernetes_asyncio import client

            await client.CoreV1Api(api).list_namespaced_pod(NS)
    mine = await cluster.audit(user="operator", since=mark)
    assert [(c["user"], c["verb"], c["resource"]) for c in mine] == [("operator", "list", "pods")]
    assert mine[0]["at"] > 0 and len(await cluster.audit(since=mark)) == 2


async def _client(cluster, identity: str):
    from jupyter_gpu_pool.cluster.client import api_client

    return await api_client(cluster.kubeconfig_for(identity))
