"""What the test cluster models of an object's name outliving its owner, as a real cluster has it (issue 30):
a pod in its grace period or a dependent the garbage collector has not reached yet still holds its name
(a POST of that name answers 409 AlreadyExists); the garbage collector acts after a delay; a container's
process, as its PID 1, ignores a SIGTERM it has no handler for (the pod takes its whole grace period and is
killed, 137); an API server restarts with its state kept."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest
from kube_helpers import Kube, follow_pod, wait_until
from kubernetes_asyncio.client.exceptions import ApiException
from test_kube_testcluster import NS, gk, secret, store_with_crds
from testcluster.errors import ApiError

from jupyter_gpu_pool.cluster.resources import GROUP, KERNELS, VERSION

MERGE = "application/merge-patch+json"
IMAGE = "quay.io/jupyter/base-notebook"
NO_HANDLER = "import time; print('up', flush=True); time.sleep(120)"  # as ipykernel: no SIGTERM handler
HANDLER = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); print('up', flush=True); "
           "time.sleep(120)")


def pod(name: str, code: str = NO_HANDLER, grace: int = 3) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "c", "image": IMAGE, "command": [sys.executable, "-c", code]}]}}


def test_a_terminating_pod_still_holds_its_name():
    """A bound pod deleted with a grace period is Terminating until its kubelet has stopped it; meanwhile a
    POST of a pod of that name answers 409 AlreadyExists, as a real API server does, and once the kubelet is
    done the name is free."""
    store = store_with_crds()
    pods = store.kind("", "v1", "pods")
    store.create(pods, NS, pod("kernel-1"))
    store.patch(pods, NS, "kernel-1", "application/merge-patch+json", {"spec": {"nodeName": "gpu-node-1"}})
    store.patch(pods, NS, "kernel-1", "application/merge-patch+json", {"status": {"phase": "Running"}}, "status")
    terminating = store.delete(pods, NS, "kernel-1")
    assert terminating["metadata"]["deletionTimestamp"] and terminating["metadata"]["deletionGracePeriodSeconds"] == 3
    with pytest.raises(ApiError) as taken:
        store.create(pods, NS, pod("kernel-1"))
    assert (taken.value.code, taken.value.reason) == (409, "AlreadyExists")
    assert store.get(pods, NS, "kernel-1")["metadata"]["uid"] == terminating["metadata"]["uid"]  # untouched
    store.finish_pod_deletion(terminating)
    again = store.create(pods, NS, pod("kernel-1"))
    assert again["metadata"]["uid"] != terminating["metadata"]["uid"]


def test_the_garbage_collector_acts_only_its_delay_after_the_owner_went():
    """With a delay, a Secret whose GPUKernel was deleted stays (and holds its name: 409) until the collector
    has seen it orphaned for that long; an owner made again under the same name is another owner (by uid),
    so the old Secret still goes."""
    store = store_with_crds()
    now = [100.0]
    store.gc.delay, store.gc.clock = 5.0, lambda: now[0]
    kernels, secrets = store.kind(GROUP, VERSION, KERNELS), store.kind("", "v1", "secrets")
    old = store.create(kernels, NS, gk("k1"))
    store.create(secrets, NS, secret("k1-connection", old))
    store.delete(kernels, NS, "k1")
    new = store.create(kernels, NS, gk("k1"))  # the same name again, at once
    assert store.collect_garbage() == 0
    now[0] += 4.9
    assert store.collect_garbage() == 0
    with pytest.raises(ApiError) as taken:
        store.create(secrets, NS, secret("k1-connection", new))
    assert (taken.value.code, taken.value.reason) == (409, "AlreadyExists")
    assert store.get(secrets, NS, "k1-connection")["metadata"]["ownerReferences"][0]["uid"] == old["metadata"]["uid"]
    now[0] += 0.2
    assert store.collect_garbage() == 1
    assert store.list(secrets, NS)[0] == []
    store.create(secrets, NS, secret("k1-connection", new))
    now[0] += 60
    assert store.collect_garbage() == 0  # its owner lives
    store.gc.delay = 0.0
    store.delete(kernels, NS, "k1")
    assert store.collect_garbage() == 1  # no delay: the next pass


@pytest.fixture
async def pid1_cluster(cluster_factory):
    from kube_helpers import install

    cluster = cluster_factory(pid1=True)
    await install(cluster)
    return cluster


async def test_with_pid1_a_process_without_a_sigterm_handler_takes_the_whole_grace_period(pid1_cluster):
    """``--pid1``: the kubelet sends SIGTERM only to a process that handles it; one that does not (a kernel's
    ipykernel) is Terminating for its whole grace period, holding its name (409), then killed: exit code 137.
    A process that handles SIGTERM stops at once."""
    kube = Kube(await pid1_cluster.api(), NS)
    try:
        await kube.core.create_namespaced_pod(NS, pod("stubborn", NO_HANDLER, grace=3))
        await kube.core.create_namespaced_pod(NS, pod("polite", HANDLER, grace=30))
        for name in ("stubborn", "polite"):  # "up" once its handler, if any, is in place
            await wait_until(lambda n=name: _up(kube, n), timeout=60, what=f"{name} to run")
        events: list[dict] = []
        follow = asyncio.create_task(follow_pod(pid1_cluster.url, NS, "stubborn", events))
        await kube.core.delete_namespaced_pod("stubborn", NS)
        await kube.core.delete_namespaced_pod("polite", NS)
        await wait_until(lambda: _gone(kube, "polite"), timeout=20, what="the pod handling SIGTERM to go")
        with pytest.raises(ApiException) as taken:
            await kube.core.create_namespaced_pod(NS, pod("stubborn"))
        assert taken.value.status == 409 and json.loads(taken.value.body)["reason"] == "AlreadyExists"
        assert (await kube.core.read_namespaced_pod("stubborn", NS)).metadata.deletion_timestamp is not None
        await asyncio.wait_for(follow, 60)
        removed = events[-1]["object"]  # as it was when the kubelet was done with it
        assert removed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
        await kube.core.create_namespaced_pod(NS, pod("stubborn"))  # the name is free again
    finally:
        await kube.close()


async def _up(kube: Kube, name: str) -> bool:
    try:
        return "up" in await kube.core.read_namespaced_pod_log(name, NS)
    except ApiException:  # not started yet
        return False


async def _gone(kube: Kube, name: str) -> bool:
    try:
        await kube.core.read_namespaced_pod(name, NS)
        return False
    except ApiException as e:
        return e.status == 404


async def test_a_restarted_api_server_keeps_its_state_and_compacts_its_watch_history(cluster, kube):
    """``restart``: every watch stream ends, nothing answers for a while, then the same address answers with
    every object kept; a watch resuming from before the restart gets a 410 (its client lists afresh), one from
    the current version goes on."""
    made = await kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, gk("k1"))
    before = made["metadata"]["resourceVersion"]
    url = f"{cluster.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{KERNELS}"
    async with aiohttp.ClientSession() as http:
        async with http.get(url, params={"watch": "1", "resourceVersion": before, "timeoutSeconds": "60"}) as watch:
            await kube.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, "k1",
                                                             {"spec": {"launch": 2}}, _content_type=MERGE)
            assert json.loads(await asyncio.wait_for(watch.content.readline(), 10))["type"] == "MODIFIED"
            await cluster.fault(restart=True, seconds=1.5)
            assert await asyncio.wait_for(watch.content.read(), 10) == b""  # the stream ended

    async def refused() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(url) as r:
                await r.read()
            return False
        except aiohttp.ClientError:
            return True

    await wait_until(refused, timeout=5, interval=0.05, what="the restarting API server to stop answering")
    listing = await wait_until(lambda: _listing(url), timeout=30, what="the API server to answer again")
    assert [(k["metadata"]["uid"], k["spec"]["launch"]) for k in listing["items"]] == [(made["metadata"]["uid"], 2)]
    async with aiohttp.ClientSession() as http:
        async with http.get(url, params={"watch": "1", "resourceVersion": before, "timeoutSeconds": "2"}) as old:
            assert [json.loads(line) for line in (await old.read()).splitlines()][0]["object"]["code"] == 410
        now = listing["metadata"]["resourceVersion"]
        async with http.get(url, params={"watch": "1", "resourceVersion": now, "timeoutSeconds": "3"}) as fresh:
            await kube.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, "k1",
                                                             {"spec": {"launch": 3}}, _content_type=MERGE)
            event = json.loads(await asyncio.wait_for(fresh.content.readline(), 10))
    assert (event["type"], event["object"]["spec"]["launch"]) == ("MODIFIED", 3)


async def _listing(url: str) -> dict | None:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            return await r.json() if r.status == 200 else None
    except aiohttp.ClientError:
        return None


async def test_the_gc_delay_can_be_set_while_the_cluster_runs(cluster, kube):
    """The ``gc_delay`` fault: a Secret owned by a deleted GPUKernel stays until the delay is over (here, set
    back to 0); a bad value is refused."""
    owner = await kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, gk("k1"))
    await kube.core.create_namespaced_secret(NS, secret("k1-connection", owner))
    await cluster.fault(gc_delay=3600)
    await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, "k1")
    await asyncio.sleep(1.0)  # nothing shows that the collector passed by (every 0.25 s): give it four passes
    assert [s["metadata"]["name"] for s in await kube.secrets()] == ["k1-connection"]
    await cluster.fault(gc_delay=0)
    await wait_until(lambda: _no_secrets(kube), timeout=10, what="the collector to delete the Secret")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{cluster.url}/testcluster/faults", json={"gc_delay": "soon"}) as r:
            assert r.status == 400 and "gc_delay must be a number of seconds" in (await r.json())["message"]


async def _no_secrets(kube: Kube) -> bool:
    return not await kube.secrets()
