"""The test cluster answers like a real API server where our code depends on it (see testcluster/__init__.py
for where it differs): resource versions and watch resumption, selectors, the status subresource,
patches and preconditions, validation, garbage collection, and a kubelet that runs pods."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from kube_helpers import Kube, wait_until
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException
from testcluster.errors import ApiError
from testcluster.store import Store

from jupyter_gpu_pool.cluster.resources import API_VERSION, GROUP, KERNELS, VERSION
from jupyter_gpu_pool.cluster.schema import crd_manifests

NS = "jhub"


def store_with_crds() -> Store:
    store = Store()
    for crd in crd_manifests():
        store.create(store.kind("apiextensions.k8s.io", "v1", "customresourcedefinitions"), None, crd)
    store.create(store.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": NS}})
    return store


def gk(name: str = "k1", **spec) -> dict:
    return {"apiVersion": API_VERSION, "kind": "GPUKernel", "metadata": {"name": name},
            "spec": {"owner": "alice", "kernelId": name, "profile": "small", "launch": 1, **spec}}


def secret(name: str, owner: dict | None = None, **ref) -> dict:
    meta = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "GPUKernel", "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], **ref}]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": {"a": "b"}}


def test_status_is_written_only_through_the_status_subresource_and_spec_changes_bump_generation():
    store = store_with_crds()
    kernels = store.kind(GROUP, VERSION, KERNELS)
    created = store.create(kernels, NS, {**gk(), "status": {"phase": "Running"}})
    assert "status" not in created and created["metadata"]["generation"] == 1
    patched = store.patch(kernels, NS, "k1", "application/merge-patch+json",
                          {"spec": {"launch": 2}, "status": {"phase": "Running"}})
    assert "status" not in patched and patched["metadata"]["generation"] == 2
    patched = store.patch(kernels, NS, "k1", "application/merge-patch+json",
                          {"spec": {"launch": 3}, "status": {"phase": "Failed"}}, "status")
    assert patched["status"] == {"phase": "Failed"} and patched["spec"]["launch"] == 2
    assert patched["metadata"]["generation"] == 2
    annotated = store.patch(kernels, NS, "k1", "application/merge-patch+json", {"metadata": {"annotations": {"x": "1"}}})
    assert annotated["metadata"]["generation"] == 2  # metadata is not spec
    assert int(annotated["metadata"]["resourceVersion"]) > int(patched["metadata"]["resourceVersion"])


def test_patches_and_preconditions_fail_like_a_real_server():
    store = store_with_crds()
    kernels = store.kind(GROUP, VERSION, KERNELS)
    obj = store.create(kernels, NS, gk())
    store.patch(kernels, NS, "k1", "application/merge-patch+json", {"spec": {"launch": 2}})
    with pytest.raises(ApiError) as e:  # a stale resourceVersion
        store.patch(kernels, NS, "k1", "application/merge-patch+json",
                    {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": {"launch": 5}})
    assert e.value.code == 409
    with pytest.raises(ApiError) as e:
        store.patch(kernels, NS, "k1", "application/json-patch+json",
                    [{"op": "test", "path": "/spec/launch", "value": 1}, {"op": "replace", "path": "/spec/launch",
                                                                           "value": 9}])
    assert e.value.code == 422
    assert store.patch(kernels, NS, "k1", "application/json-patch+json",
                       [{"op": "test", "path": "/spec/launch", "value": 2},
                        {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}])["metadata"]["finalizers"] == ["x"]
    with pytest.raises(ApiError) as e:
        store.patch(kernels, NS, "k1", "application/strategic-merge-patch+json", {"spec": {"launch": 3}})
    assert e.value.code == 415  # custom resources take no strategic merge patch
    with pytest.raises(ApiError) as e:
        store.patch(kernels, NS, "k1", "application/json-patch+json", {"spec": {"launch": 3}})
    assert e.value.code == 400  # a JSON patch is a list (kubernetes_asyncio's default content type for a dict!)
    with pytest.raises(ApiError) as e:
        store.create(kernels, NS, gk())
    assert e.value.code == 409 and e.value.reason == "AlreadyExists"


def test_a_write_on_a_stale_resource_version_is_refused_on_the_status_subresource_and_by_replace_too():
    """Compare-and-set as a real API server does it: a status patch (merge or JSON) or a replace that
    carries an older resourceVersion is refused with 409 and changes nothing; the current one is taken."""
    store = store_with_crds()
    kernels = store.kind(GROUP, VERSION, KERNELS)
    obj = store.create(kernels, NS, gk())
    old = obj["metadata"]["resourceVersion"]
    now = store.patch(kernels, NS, "k1", "application/merge-patch+json", {"status": {"phase": "Hibernated"}}, "status")
    stale_writes = [
        lambda: store.patch(kernels, NS, "k1", "application/merge-patch+json",
                            {"metadata": {"resourceVersion": old}, "status": {"phase": "Running"}}, "status"),
        lambda: store.patch(kernels, NS, "k1", "application/json-patch+json",
                            [{"op": "replace", "path": "/metadata/resourceVersion", "value": old},
                             {"op": "add", "path": "/status/phase", "value": "Running"}], "status"),
        lambda: store.replace(kernels, NS, "k1", {**now, "metadata": {**now["metadata"], "resourceVersion": old},
                                                  "status": {"phase": "Running"}}, "status"),
        lambda: store.replace(kernels, NS, "k1", {**now, "metadata": {**now["metadata"], "resourceVersion": old},
                                                  "spec": {**now["spec"], "launch": 7}}),
    ]
    for write in stale_writes:
        with pytest.raises(ApiError) as e:
            write()
        assert e.value.code == 409 and e.value.reason == "Conflict"
    assert store.get(kernels, NS, "k1") == now
    written = store.patch(kernels, NS, "k1", "application/merge-patch+json",
                          {"metadata": {"resourceVersion": now["metadata"]["resourceVersion"]},
                           "status": {"phase": "Resuming"}}, "status")
    assert written["status"]["phase"] == "Resuming"
    assert int(written["metadata"]["resourceVersion"]) > int(now["metadata"]["resourceVersion"])


def test_objects_are_validated_against_their_schemas_and_pruned():
    store = store_with_crds()
    kernels = store.kind(GROUP, VERSION, KERNELS)
    with pytest.raises(ApiError) as e:
        store.create(kernels, NS, gk(launch="one"))
    assert e.value.code == 422 and "spec.launch" in e.value.message
    with pytest.raises(ApiError) as e:
        store.create(kernels, NS, {**gk(), "spec": {"owner": "alice"}})
    assert e.value.code == 422 and "'kernelId' is a required property" in e.value.message
    assert "colour" not in store.create(kernels, NS, gk("k2", colour="blue"))["spec"]  # unknown fields pruned
    pods = store.kind("", "v1", "pods")
    with pytest.raises(ApiError) as e:
        store.create(pods, NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                "spec": {"containers": [{"name": "c", "image": "i", "colour": "blue"}]}})
    assert e.value.code == 422 and "spec.containers.0" in e.value.message  # strict: the real schemas
    with pytest.raises(ApiError) as e:
        store.create(pods, "nowhere", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                       "spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert e.value.code == 404 and 'namespaces "nowhere" not found' in e.value.message


def test_garbage_collection_follows_owner_references_and_propagation_policies():
    store = store_with_crds()
    kernels, secrets = store.kind(GROUP, VERSION, KERNELS), store.kind("", "v1", "secrets")
    k1, k2, k3 = (store.create(kernels, NS, gk(n)) for n in ("k1", "k2", "k3"))
    store.create(secrets, NS, secret("s1", k1))
    store.create(secrets, NS, secret("s2", k2))
    store.create(secrets, NS, secret("s3", k3, blockOwnerDeletion=True))
    store.delete(kernels, NS, "k1")  # background (the default)
    store.delete(kernels, NS, "k2", {"propagationPolicy": "Orphan"})
    store.delete(kernels, NS, "k3", {"propagationPolicy": "Foreground"})
    assert store.get(kernels, NS, "k3")["metadata"]["deletionTimestamp"]  # waits for its blocking dependent
    while store.collect_garbage():
        pass
    names = {s["metadata"]["name"]: s for s in store.list(secrets, NS)[0]}
    assert set(names) == {"s2"} and "ownerReferences" not in names["s2"]["metadata"]
    assert [k["metadata"]["name"] for k in store.list(kernels, NS)[0]] == []


async def test_a_watch_resumes_from_its_resource_version_and_sees_selector_moves():
    store = store_with_crds()
    kernels = store.kind(GROUP, VERSION, KERNELS)
    first = store.create(kernels, NS, {**gk("a"), "metadata": {"name": "a", "labels": {"team": "x"}}})
    rv = first["metadata"]["resourceVersion"]
    store.create(kernels, NS, {**gk("b"), "metadata": {"name": "b", "labels": {"team": "y"}}})
    store.patch(kernels, NS, "a", "application/merge-patch+json", {"metadata": {"labels": {"team": "y"}}})
    w = store.watch(kernels, NS, "team in (y,z)", None, rv, False)
    events = [w.queue.get_nowait() for _ in range(w.queue.qsize())]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b"), ("ADDED", "a")]
    store.patch(kernels, NS, "a", "application/merge-patch+json", {"metadata": {"labels": {"team": "x"}}})
    assert (await w.queue.get())["type"] == "DELETED"  # moved out of the selector
    small = Store()
    small.history = type(small.history)(small.history, maxlen=3)
    for i in range(5):
        small.create(small.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                                "metadata": {"name": f"n{i}"}})
    gone = small.watch(small.kind("", "v1", "namespaces"), None, None, None, "1", False)
    error = gone.queue.get_nowait()
    assert error["type"] == "ERROR" and error["object"]["code"] == 410


@pytest.fixture
async def kube(cluster):
    k = Kube(await cluster.api())
    yield k
    await k.close()


async def test_watch_requests_in_both_clients_forms_stream_and_a_bad_one_is_refused(cluster, kube):
    url = f"{cluster.url}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{KERNELS}"
    async with aiohttp.ClientSession() as http:
        async with http.get(url, params={"watch": "maybe"}) as r:
            assert r.status == 400
        async with http.get(url, params={"watch": "true", "timeoutSeconds": "1"}) as r:  # kopf's form
            assert r.status == 200 and await r.read() == b""
        async with http.get(url, params={"fieldSelector": "spec.owner=alice"}) as r:
            assert r.status == 400 and "field label not supported: spec.owner" in (await r.json())["message"]
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, gk("k1"))
    async with watch.Watch() as w:  # kubernetes_asyncio sends watch=True
        async for event in w.stream(kube.custom.list_namespaced_custom_object, GROUP, VERSION, NS, KERNELS,
                                    timeout_seconds=2):
            assert (event["type"], event["raw_object"]["metadata"]["name"]) == ("ADDED", "k1")
            break


async def test_the_kubelet_runs_a_pod_with_its_env_volumes_and_exit_code(cluster, kube):
    await kube.core.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                                  "stringData": {"token": "t0ps3cret"}})
    script = ("import os, sys, pathlib; print(os.environ['GREETING'], os.environ['MY_IP'], "
              "pathlib.Path(sys.argv[1]).read_text(), os.environ['FROM_SECRET']); sys.exit(7)")
    await kube.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
        "spec": {"restartPolicy": "Never", "volumes": [{"name": "v", "secret": {"secretName": "s"}}],
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "c", "image": "quay.io/jupyter/base-notebook", "command": ["python", "-c"],
                                 "args": [script, "/mnt/s/token"],
                                 "env": [{"name": "WHO", "value": "pod"},
                                         {"name": "GREETING", "value": "hello $(WHO) $$(WHO)"},
                                         {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                         {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s",
                                                                                                "key": "token"}}}],
                                 "volumeMounts": [{"name": "v", "mountPath": "/mnt/s", "readOnly": True}]}]}})

    async def finished():
        pod = await kube.core.read_namespaced_pod("p1", NS)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = await wait_until(finished, timeout=30)
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 7
    log = await kube.core.read_namespaced_pod_log("p1", NS)
    assert log.strip() == f"hello pod $(WHO) {pod.status.pod_ip} t0ps3cret t0ps3cret"
    assert pod.status.pod_ip.startswith("127.") and pod.status.pod_ip != "127.0.0.1"


async def test_a_container_that_writes_to_a_read_only_mount_is_stopped(cluster, kube):
    await kube.core.create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                                  "stringData": {"f": "x"}})
    await kube.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "writer"},
        "spec": {"restartPolicy": "Never", "volumes": [{"name": "v", "secret": {"secretName": "s"}}],
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "c", "image": "quay.io/jupyter/base-notebook",
                                 "command": ["python", "-c", "import time; open('/mnt/s/f', 'w').write('y'); "
                                                             "time.sleep(30)"],
                                 "volumeMounts": [{"name": "v", "mountPath": "/mnt/s", "readOnly": True}]}]}})

    async def stopped():
        pod = await kube.core.read_namespaced_pod("writer", NS)
        return pod if pod.status.phase == "Failed" else None

    pod = await wait_until(stopped, timeout=30)
    assert pod.status.container_statuses[0].state.terminated.reason == "ReadOnlyMountWritten"


async def test_the_scheduler_explains_why_no_node_fits(cluster, kube):
    def pod(name: str, **spec) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "quay.io/jupyter/base-notebook", "command": ["true"],
                                         "resources": spec.pop("resources", {})}], **spec}}

    await kube.core.create_namespaced_pod(NS, pod("untolerated"))  # the GPU node is tainted
    await kube.core.create_namespaced_pod(NS, pod("too-big", resources={"limits": {"nvidia.com/gpu": "3"}},
                                                  tolerations=[{"operator": "Exists"}]))
    await kube.core.create_namespaced_pod(NS, pod("elsewhere", nodeSelector={"disk": "ssd"},
                                                  tolerations=[{"operator": "Exists"}]))

    async def reason(name: str):
        p = await kube.core.read_namespaced_pod(name, NS)
        cond = [c for c in p.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"]
        return cond[0].message if cond else None

    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in await wait_until(lambda: reason(
        "untolerated"))
    assert "0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in await wait_until(lambda: reason("too-big"))
    assert "didn't match Pod's node affinity/selector" in await wait_until(lambda: reason("elsewhere"))
    events = (await kube.core.list_namespaced_event(NS, field_selector="reason=FailedScheduling")).items
    assert {e.involved_object.name for e in events} == {"untolerated", "too-big", "elsewhere"}


async def test_a_graceful_pod_deletion_stops_the_process_then_removes_the_pod(cluster, kube):
    await kube.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
        "spec": {"tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 20,
                 "containers": [{"name": "c", "image": "quay.io/jupyter/base-notebook", "command": ["python", "-c"],
                                 "args": ["import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
                                          "(time.sleep(3), sys.exit(0))); print('up', flush=True); time.sleep(60)"]}]}})
    await wait_until(lambda: _says_up(kube, "sleeper"), timeout=30, what="its process to handle SIGTERM")
    deleted = await kube.core.delete_namespaced_pod("sleeper", NS)
    assert deleted.metadata.deletion_timestamp is not None  # terminating, not gone: the kubelet stops it
    # (its SIGTERM handler takes 3 s before it exits: the pod is read while terminating, not raced to its end)
    assert (await kube.core.read_namespaced_pod("sleeper", NS)).metadata.deletion_timestamp is not None

    async def gone():
        try:
            await kube.core.read_namespaced_pod("sleeper", NS)
            return False
        except ApiException as e:
            return e.status == 404

    await wait_until(gone, timeout=10, what="the pod to go once its process exited on SIGTERM")


async def test_an_eviction_deletes_the_pod_gracefully_as_a_drain_does(cluster, kube):
    """``POST pods/<name>/eviction`` (kubectl drain's request, after it cordons the node): the pod is
    terminating with its own grace period, its process stopped; a body that is not an Eviction is refused."""
    await kube.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "evicted"},
        "spec": {"tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 20,
                 "containers": [{"name": "c", "image": "quay.io/jupyter/base-notebook", "command": ["python", "-c"],
                                 "args": ["import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
                                          "(time.sleep(3), sys.exit(0))); print('up', flush=True); time.sleep(60)"]}]}})
    await wait_until(lambda: _says_up(kube, "evicted"), timeout=30, what="its process to handle SIGTERM")
    with pytest.raises(ApiException) as refused:
        await kube.api.call_api(f"/api/v1/namespaces/{NS}/pods/evicted/eviction", "POST", body={"kind": "Pod"},
                                response_types_map={}, auth_settings=["BearerToken"])
    assert refused.value.status == 400
    # (its SIGTERM handler takes 3 s before it exits: the pod is read while terminating, not raced to its end)
    await kube.core.create_namespaced_pod_eviction("evicted", NS, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "evicted", "namespace": NS}})
    pod = await kube.core.read_namespaced_pod("evicted", NS)
    assert pod.metadata.deletion_timestamp is not None and pod.metadata.deletion_grace_period_seconds == 20

    async def gone():
        try:
            await kube.core.read_namespaced_pod("evicted", NS)
            return False
        except ApiException as e:
            return e.status == 404

    await wait_until(gone, timeout=10, what="the evicted pod to go once its process exited on SIGTERM")


async def _phase(kube: Kube, name: str, phase: str) -> bool:
    return (await kube.core.read_namespaced_pod(name, NS)).status.phase == phase


async def _says_up(kube: Kube, name: str) -> bool:
    """The pod runs and its process has said so (its SIGTERM handler is set: a pod only Running may not have
    got that far, and the signal would end it at once)."""
    return await _phase(kube, name, "Running") and "up" in await kube.core.read_namespaced_pod_log(name, NS)


def test_json_roundtrip_of_errors_is_a_status():
    e = ApiError(404, "NotFound", 'pods "x" not found', {"name": "x", "kind": "pods"})
    assert json.loads(json.dumps(e.status())) == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                  "status": "Failure", "message": 'pods "x" not found',
                                                  "reason": "NotFound", "details": {"name": "x", "kind": "pods"},
                                                  "code": 404}


__all__ = ["asyncio"]


def claim_template(memory: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": memory}}}}]}}}}


def test_quantities_are_stored_in_canonical_form():
    """As a real API server's decoding does: 10240Mi reads back as 10Gi, 1000m as 1, 0.5 as 500m."""
    from testcluster.quantities import canonical_quantity

    assert [canonical_quantity(q) for q in ("10240Mi", "1536Mi", "1024Ki", "1000m", "0.5", "1000", "250m", "64Mi",
                                            "81920", 2, "1e3")] == \
        ["10Gi", "1536Mi", "1Mi", "1", "500m", "1k", "250m", "64Mi", "81920", "2", "1e3"]
    store = Store({"DRAConsumableCapacity": True})
    store.create(store.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": NS}})
    stored = store.create(store.kind("resource.k8s.io", "v1", "resourceclaimtemplates"), NS, claim_template("10240Mi"))
    assert stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "10Gi"}}
    pod = store.create(store.kind("", "v1", "pods"), NS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"memory": "2048Mi", "cpu": "1000m"},
                                                                           "requests": {"cpu": "0.25"}}}]}})
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"memory": "2Gi", "cpu": "1"},
                                                         "requests": {"cpu": "250m"}}


def test_consumable_capacity_is_dropped_while_its_feature_gate_is_off():
    """Kubernetes 1.34's default: DRAConsumableCapacity off, the API server drops a request's capacity and
    a device's allowMultipleAllocations (the claim then takes a whole device)."""
    off = Store()
    off.create(off.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": NS}})
    stored = off.create(off.kind("resource.k8s.io", "v1", "resourceclaimtemplates"), NS, claim_template("10Gi"))
    assert "capacity" not in stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    from testcluster.dra import resource_slice

    node = {"name": "n", "dra": [{"name": "gpu-0", "attributes": {"type": "gpu"}, "capacity": {"memory": "24Gi"},
                                  "allowMultipleAllocations": True,
                                  "requestPolicy": {"memory": {"default": "24Gi"}}}]}
    [device] = off.create(off.kind("resource.k8s.io", "v1", "resourceslices"), None,
                          resource_slice(node))["spec"]["devices"]
    assert "allowMultipleAllocations" not in device and device["capacity"] == {"memory": {"value": "24Gi"}}
    on = Store({"DRAConsumableCapacity": True})
    [device] = on.create(on.kind("resource.k8s.io", "v1", "resourceslices"), None,
                         resource_slice(node))["spec"]["devices"]
    assert device["allowMultipleAllocations"] and device["capacity"]["memory"]["requestPolicy"]


async def test_injected_faults_answer_like_a_failing_api_server(cluster, kube):
    """A 503 for a while (its watch streams cut), a hang, and a stalled watch that ends in a 410."""
    await cluster.fault(resources=["gpukernels"], status=503, seconds=1.5)
    with pytest.raises(ApiException) as failed:
        await kube.kernels()
    assert failed.value.status == 503
    await asyncio.sleep(1.6)
    assert await kube.kernels() == []

    listing = await kube.custom.list_namespaced_custom_object(GROUP, VERSION, NS, KERNELS)
    await cluster.fault(stall=["gpukernels"])
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, KERNELS, gk("k-unheard"))
    events: list[dict] = []

    async def follow():
        stream = await kube.custom.list_namespaced_custom_object(
            GROUP, VERSION, NS, KERNELS, watch=True, resource_version=listing["metadata"]["resourceVersion"],
            _preload_content=False, timeout_seconds=10)
        async for line in stream.content:
            events.append(json.loads(line))

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.5)
    assert events == []  # quiet: the new kernel is not told of
    await cluster.fault(resume=True)
    await asyncio.wait_for(task, 5)
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]


def gpu_pod(name: str, gpus: str = "1", **resources) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "kernel", "image": "python",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus, **resources}}}]}}


def resource_quota(name: str, **hard) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard}}


def test_a_resource_quota_refuses_a_pod_over_it_with_the_real_servers_words():
    store = store_with_crds()
    pods, quotas = store.kind("", "v1", "pods"), store.kind("", "v1", "resourcequotas")
    quota = store.create(quotas, NS, resource_quota("gpus", **{"requests.nvidia.com/gpu": "1", "count/pods": "5",
                                                               "requests.memory": "1Gi", "nvidia.com/gpu": "0"}))
    assert quota["status"]["used"] == {"requests.nvidia.com/gpu": "0", "count/pods": "0", "requests.memory": "0",
                                       "nvidia.com/gpu": "0"}
    # A bare extended resource name limits no pod (the real pod evaluator counts requests.<name> only).
    store.create(pods, NS, gpu_pod("first", memory="512Mi"))
    assert store.get(quotas, NS, "gpus")["status"]["used"]["requests.nvidia.com/gpu"] == "1"
    before = len(store.objects)
    with pytest.raises(ApiError) as e:
        store.create(pods, NS, gpu_pod("second"))
    assert e.value.code == 403 and e.value.reason == "Forbidden"
    assert e.value.message == ('pods "second" is forbidden: exceeded quota: gpus, requested: '
                               'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1, '
                               'limited: requests.nvidia.com/gpu=1')
    assert len(store.objects) == before  # nothing was written
    store.create(pods, NS, gpu_pod("cpu-only", gpus="0", memory="256Mi"))  # within every limit
    with pytest.raises(ApiError, match=r"requested: requests.memory=512Mi, used: requests.memory=768Mi, "
                                       r"limited: requests.memory=1Gi"):
        store.create(pods, NS, gpu_pod("big", gpus="0", memory="512Mi"))
    # A finished pod holds no GPU, but is still a pod object (count/pods, not pods).
    store.patch(pods, NS, "first", "application/merge-patch+json", {"status": {"phase": "Succeeded"}}, "status")
    store.create(pods, NS, gpu_pod("after"))
    assert store.get(quotas, NS, "gpus")["status"]["used"]["count/pods"] == "3"
    # Another namespace's quota does not apply.
    store.create(store.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": "other"}})
    store.create(pods, "other", gpu_pod("elsewhere", gpus="4"))


def test_a_resource_quota_is_validated_as_a_real_server_does():
    store = store_with_crds()
    quotas = store.kind("", "v1", "resourcequotas")
    with pytest.raises(ApiError, match="spec.hard.*must be a standard resource for quota") as e:
        store.create(quotas, NS, resource_quota("bad", gpu="1"))
    assert e.value.code == 422
    with pytest.raises(ApiError, match="must be greater than or equal to 0"):
        store.create(quotas, NS, resource_quota("negative", pods="-1"))
    with pytest.raises(ApiError, match="spec.hardd|Additional properties") as e:  # the schema: no unknown field
        store.create(quotas, NS, {**resource_quota("typo"), "spec": {"hardd": {"pods": "1"}}})
    assert e.value.code == 422
    with pytest.raises(ApiError, match="scopes are not supported") as e:
        store.create(quotas, NS, {**resource_quota("scoped", pods="1"), "spec": {"hard": {"pods": "1"},
                                                                               "scopes": ["BestEffort"]}})
    assert store.list(quotas, NS)[0] == []
    # A changed spec.hard: the status follows, and the next pod meets the new limit.
    store.create(quotas, NS, resource_quota("q", pods="0"))
    with pytest.raises(ApiError, match='exceeded quota: q, requested: pods=1, used: pods=0, limited: pods=0'):
        store.create(store.kind("", "v1", "pods"), NS, gpu_pod("p"))
    raised = store.patch(quotas, NS, "q", "application/merge-patch+json", {"spec": {"hard": {"pods": "1"}}})
    assert raised["status"]["hard"] == {"pods": "1"}
    store.create(store.kind("", "v1", "pods"), NS, gpu_pod("p"))
