"""Least privilege, exactly: the Roles of deploy/ against the calls the code makes.

The test cluster's API server keeps an audit log of every request, by bearer token.  The operator, a
user's Jupyter server (with the extension) and the node agent each get a token of their own and go
through what they do in a cluster: kernels started, run, restarted, refused over a quota, shut down and
orphaned by a killed server; quotas and the policy (with a reservation, whose room is counted on the nodes)
marked valid; the ``dra`` backend's claim templates
kept (a retired one deleted) and a claim no node can meet explained (its DeviceClass and the driver's
ResourceSlices read), so that the DRA overlay's extra rules are exercised too; the agent's
readings written (the pods' use in the kernels' status, its GPUs' free memory on its Node) and the
GPUKernels watched.  Then every call must be granted by a Role bound where it was made, and every grant
must have been used, but for the one exception stated below.  And the operator's kernel-pod watch is
namespaced, selected on the server and paged.
"""

from __future__ import annotations

import asyncio

import pytest
from kube_helpers import (
    KERNEL_IMAGE,
    REPO,
    GiB,
    JupyterServer,
    Kube,
    OperatorProcess,
    ScriptedMemory,
    ScriptedNVML,
    fake_proc,
    kustomize,
    pod_processes,
    wait_until,
)
from test_kube_dra import DRA_MIG, MIG_NODE
from tornado.httpclient import HTTPClientError

from jupyter_gpu_pool.cluster.client import api_client
from jupyter_gpu_pool.cluster.resources import GROUP, LABEL_KERNEL, LABEL_MANAGED_BY, kernel_name
from jupyter_gpu_pool.devices.telemetry import ProcessReading
from jupyter_gpu_pool.operator.agent import Agent

KERNELS_NS, HUB_NS, SYSTEM_NS = "jhub-kernels", "jhub", "gpu-pool-system"
ACCOUNTS = {"operator": (SYSTEM_NS, "gpu-pool-operator"), "server": (HUB_NS, "gpu-pool-server"),
            "agent": (SYSTEM_NS, "gpu-pool-agent")}
# Granted and not called, on purpose: where the OwnerReferencesPermissionEnforcement admission plugin is on
# (OpenShift), making a kernel the blocking owner (blockOwnerDeletion) of its pod, Secret and NetworkPolicy
# takes the right to update the kernel's finalizers.
UNCALLED = {("operator", GROUP, "gpukernels/finalizers", "update")}
KERNEL_PODS = {"app.kubernetes.io/component=kernel", "app.kubernetes.io/part-of=jupyter-gpu-pool"}


def bound_rules(docs: list[dict]) -> dict[str, list[tuple[str | None, dict]]]:
    """Per identity: (the namespace, or None where bound cluster-wide; a rule) of each Role bound to it."""
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole"}
    out: dict[str, list] = {who: [] for who in ACCOUNTS}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        for who, (ns, name) in ACCOUNTS.items():
            if {"kind": "ServiceAccount", "name": name, "namespace": ns} in binding["subjects"]:
                out[who] += [(scope, rule) for rule in roles[binding["roleRef"]["name"]]]
    return out


def allows(scope: str | None, rule: dict, call: dict) -> bool:
    return (call["group"] in rule["apiGroups"] and call["resource"] in rule["resources"]
            and call["verb"] in rule["verbs"] and (scope is None or call["namespace"] == scope))


async def scenario(cluster, kube: Kube, tmp_path) -> None:
    """What each part does in a cluster, each with its own token."""
    from kube_helpers import operator_ready

    await kube.api.call_api(  # a claim template of a profile since removed: the operator deletes it
        f"/apis/resource.k8s.io/v1/namespaces/{KERNELS_NS}/resourceclaimtemplates", "POST", response_types_map={},
        body={"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
              "metadata": {"name": "gpu-pool-retired", "labels": {LABEL_MANAGED_BY: "jupyter-gpu-pool-operator"}},
              "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                  "deviceClassName": "gpu.nvidia.com"}}]}}}}, auth_settings=["BearerToken"])
    await kube.quota("group", "ml", members=["alice"], kernels=10)
    await kube.custom.create_cluster_custom_object(GROUP, "v1alpha1", "gpupoolpolicies", {  # the admin's policy,
        "apiVersion": f"{GROUP}/v1alpha1", "kind": "GPUPoolPolicy", "metadata": {"name": "default"},  # with a
        "spec": {"rules": [], "reservations": [{  # reservation: the operator reads the nodes its room is counted on
            "name": "Lab", "groups": ["ml"], "days": ["sun"], "start": "03:00", "end": "04:00", "timezone": "UTC",
            "memory": "1GiB"}]}})
    operator = OperatorProcess(cluster, tmp_path, {**DRA_MIG, "GPUPoolOperator.namespaces": [KERNELS_NS],
                                                   "GPUPoolOperator.progress_interval": 0.5},
                               kubeconfig=cluster.kubeconfig_for("operator")).start()
    agent_api = await api_client(cluster.kubeconfig_for("agent"))
    server = JupyterServer(tmp_path, cluster, extension=True, kubeconfig=cluster.kubeconfig_for("server"))
    watcher = None
    try:
        server.start()  # the server's start and the operator's overlap: neither waits on the other
        await operator_ready(cluster)
        await wait_until(lambda: _valid(kube, "default", "gpupoolpolicies"), timeout=20,
                         what="the operator to mark the policy valid")
        await server.ready()
        first = (await server.request("POST", "api/kernels", {"name": "gpu-pool-kubernetes-small"}))["id"]
        assert await server.execute(first, "print('one')") == "one\n"

        [pod] = [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == kernel_name(first)]
        [proc] = pod_processes(pod["metadata"]["name"])
        nvml = ScriptedNVML({"GPU-aaaa": {proc.pid: ProcessReading(2 * GiB, 12.0)}})
        agent = Agent("dra-node-1", agent_api, nvml, ["GPU-aaaa"], namespaces=(KERNELS_NS,),
                      proc_root=fake_proc(tmp_path / "proc", {proc.pid: pod["metadata"]["uid"]}),
                      memory=ScriptedMemory({"GPU-aaaa": 30 * GiB}))
        watcher = asyncio.create_task(agent.watch())  # its node's kernel pods and the GPUKernels
        await wait_until(lambda: agent.pods, timeout=10, what="the agent to see the kernel pod")
        await agent.sample_once()

        await server.request("POST", f"api/kernels/{first}/restart", {})
        assert await server.execute(first, "print('two')") == "two\n"
        try:  # 64 GPUs: no node has as many; the operator reads the devices to say so
            await server.request("POST", "api/kernels", {"name": "gpu-pool-kubernetes-huge"})
            raise AssertionError("a claim no node can meet was not refused")
        except HTTPClientError as e:
            assert e.code == 503
        await kube.quota("user", "alice", kernels=1)
        await wait_until(lambda: _valid(kube, "user-alice"), timeout=20, what="the quota to be read")
        try:
            await server.request("POST", "api/kernels", {"name": "gpu-pool-kubernetes-small"})
            raise AssertionError("a second kernel passed a quota of one")
        except HTTPClientError as e:
            assert e.code == 403
        await server.request("DELETE", f"api/kernels/{first}")
        await server.request("POST", "api/kernels", {"name": "gpu-pool-kubernetes-small"})
        server.kill()  # its kernel is orphaned: the operator deletes it once the heartbeat lapses
        await wait_until(lambda: _no_kernels(kube), timeout=30, what="the orphan to be deleted")
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        await agent_api.close()
        if server.proc and server.proc.poll() is None:
            server.kill()
        operator.stop()


async def _valid(kube: Kube, name: str, plural: str = "gpuquotas") -> bool:
    from jupyter_gpu_pool.cluster.resources import VERSION

    return bool((await kube.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)).get("status", {})
                .get("valid"))


async def _no_kernels(kube: Kube) -> bool:
    return not await kube.kernels()


@pytest.mark.slow
async def test_the_roles_grant_exactly_the_calls_the_code_makes(cluster_factory, tmp_path):
    rules = bound_rules(kustomize(REPO / "deploy" / "overlays" / "dra"))
    # Each kernel's image takes 2 s to pull: a start slower than the operator's progress_interval (0.5 s), whose
    # story it reads (the pod's Events, its Node) to tell the user; a quick start costs no such read.
    cluster = cluster_factory(nodes=[MIG_NODE], namespace=KERNELS_NS, slow_images={KERNEL_IMAGE: 2.0})
    from kube_helpers import install

    await install(cluster)
    kube = Kube(await cluster.api(), KERNELS_NS)
    try:
        await scenario(cluster, kube, tmp_path)
    finally:
        await kube.close()
    calls = [c for c in await cluster.audit() if c["user"] in ACCOUNTS]

    refused = sorted({(c["user"], c["verb"], c["group"], c["resource"], c["namespace"]) for c in calls
                      if not any(allows(scope, rule, c) for scope, rule in rules[c["user"]])})
    assert refused == [], "calls no Role grants"

    unused = set()
    for who, bound in rules.items():
        for scope, rule in bound:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        call = {"group": group, "resource": resource, "verb": verb}
                        if not any(c["user"] == who and allows(scope, rule, c) and all(c[k] == v for k, v in
                                                                                          call.items())
                                   for c in calls):
                            unused.add((who, group, resource, verb))
    assert unused == UNCALLED, "grants no call uses"
    assert {(who, group, res, verb) for who, bound in rules.items() for _, r in bound for group in r["apiGroups"]
            for res in r["resources"] for verb in r["verbs"]} >= UNCALLED  # the exception is granted

    pods = [c for c in calls if c["user"] == "operator" and c["resource"] == "pods" and c["verb"] in ("list", "watch")]
    assert pods and all(c["namespace"] == KERNELS_NS and set(c["labelSelector"].split(",")) == KERNEL_PODS
                        for c in pods)  # never the whole cluster's pods
    assert all(c["limit"] for c in pods if c["verb"] == "list")  # listed in pages
    agent = [c for c in calls if c["user"] == "agent" and c["resource"] == "pods"]
    assert agent and all(c["namespace"] == KERNELS_NS and c["fieldSelector"] == "spec.nodeName=dra-node-1"
                         for c in agent)
