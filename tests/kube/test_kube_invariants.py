"""The Kubernetes side of the invariants: the connection key is only in the kernel's Secret (4);
no exit path of a server leaves a kernel pod behind (2); a restarted server adopts its kernels."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time

import pytest
from jupyter_client.manager import AsyncKernelManager
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from kernel_helpers import run_code
from kube_helpers import Kube, pod_processes, wait_until

from jupyter_gpu_pool.kernel_provisioner import KernelStartRefused
from jupyter_gpu_pool.cluster.session import KernelSession
from jupyter_gpu_pool.server_extension.backends.adoption import adopt_kernels
from jupyter_gpu_pool.cluster.resources import LABEL_KERNEL, kernel_name, secret_name

REAL_CLUSTER_TOO = True  # also run, marked k8s, on the cluster KUBECONFIG names


async def objects_of(kube: Kube, kernel_id: str) -> list[dict]:
    name = kernel_name(kernel_id)
    return ([k for k in await kube.kernels() if k["metadata"]["name"] == name]
            + [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == name]
            + [s for s in await kube.secrets() if s["metadata"]["labels"].get(LABEL_KERNEL) == name])


async def test_the_connection_key_is_in_the_secret_and_nowhere_else(cluster, operator, server_config, kube_sessions,
                                                                     kube, caplog):
    caplog.set_level(logging.DEBUG)
    await kube.quota("user", cluster.user, kernels=1)
    km = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
    await km.start_kernel()
    try:
        await run_code(km, "print('hello from the pod')")
        await km.restart_kernel()  # a second pod, the same Secret
        await run_code(km, "print('hello again')")
        refused = AsyncKernelManager(kernel_name="gpu-pool-kubernetes-small")
        with pytest.raises(KernelStartRefused):
            await refused.start_kernel()  # a refused kernel leaves its own trail of objects and logs

        [secret] = [s for s in await kube.secrets() if s["metadata"]["name"] == secret_name(kernel_name(km.kernel_id))]
        blob = secret["data"]["connection.json"]
        connection = json.loads(base64.b64decode(blob))
        key, curve = connection["key"], connection["curve_secretkey"]  # the HMAC key, the CurveZMQ secret
        assert len(key) == 64 and key.encode() == km.session.key and len(curve) == 40
        needles = {key, base64.b64encode(key.encode()).decode(), blob, curve}

        everything = await kube.everything()
        assert {"GPUKernel", "Pod", "Secret", "Event", "NetworkPolicy"} <= {o["kind"] for o in everything}
        holders = []
        for obj in everything:
            text = json.dumps(obj)
            if obj["kind"] == "Secret":
                text += "".join(base64.b64decode(v).decode(errors="replace") for v in (obj.get("data") or {}).values())
            if any(n in text for n in needles):
                holders.append((obj["kind"], obj["metadata"]["name"]))
        assert holders == [("Secret", secret["metadata"]["name"])]

        [pod] = [p for p in await kube.pods() if not p["metadata"].get("deletionTimestamp")]
        if cluster.local:  # the kernel's real process: its command line and its environment
            [proc] = pod_processes(pod["metadata"]["name"])
            assert not any(n in " ".join(proc.cmdline()) for n in needles)
            assert not any(n in json.dumps(proc.environ()) for n in needles)
        pod_log = await kube.core.read_namespaced_pod_log(pod["metadata"]["name"], cluster.namespace)
        logs = {"operator": operator.logs(), "provisioner": caplog.text, "pod": pod_log}
        if cluster.local:
            logs["cluster"] = (cluster.state / "cluster.log").read_text()
        assert len(logs["operator"]) > 1000 and "admitted" in logs["operator"]  # the logs are there to search
        assert kernel_name(km.kernel_id) in logs["provisioner"]
        assert [where for where, text in logs.items() if any(n in text for n in needles)] == []
    finally:
        await km.shutdown_kernel(now=True)


@pytest.mark.slow
async def test_a_killed_server_leaves_no_kernel_behind_once_the_reconcile_interval_passes(cluster, operator, kube,
                                                                                           servers):
    server = servers()
    await server.ready()
    kernel = await server.request("POST", "api/kernels", {"name": "gpu-pool-kubernetes-small"})
    [pod] = await kube.pods()
    assert not cluster.local or pod_processes(pod["metadata"]["name"])
    server.kill()  # kill -9: no shutdown, no cleanup of its own
    killed = time.monotonic()
    timeout, interval, beat = 4.0, 1.0, 0.5  # heartbeat_timeout, reconcile_interval (FAST), heartbeat_interval
    await wait_until(lambda: _none(objects_of(kube, kernel["id"])), timeout=timeout + interval + 10,
                     what="the orphaned kernel's objects to go")
    took = time.monotonic() - killed
    # Not before the heartbeat lapsed (the last beat came up to one heartbeat interval before the kill), and
    # gone within one reconcile interval after (plus the garbage collector's and kubelet's own moments).
    assert timeout - beat - 0.2 <= took <= timeout + interval + 3
    if cluster.local:
        await wait_until(lambda: not pod_processes(pod["metadata"]["name"]), timeout=10, what="the kernel process")
    gone = [e for e in (await kube.core.list_namespaced_event(cluster.namespace)).items if e.reason == "ServerGone"]
    assert len(gone) == 1, [e.message for e in gone]  # deleted once: one Event, no second delete
    assert operator.logs().count("deleted: ServerGone") == 1


async def _none(coro) -> bool:
    return not await coro


@pytest.mark.slow
async def test_a_restarted_server_adopts_its_running_kernel_with_its_state(cluster, operator, server_config,
                                                                             kube_sessions, jp_serverapp, kube):
    first = jp_serverapp.kernel_manager
    kernel_id = await first.start_kernel(kernel_name="gpu-pool-kubernetes-small")
    await run_code(first.get_kernel(kernel_id), "x = 42")
    pod = first.get_kernel(kernel_id).provisioner.pod

    # The first server dies: its watch and heartbeat stop; it shuts nothing down.
    km = first._kernels.pop(kernel_id)
    km.stop_restarter()
    await KernelSession.close_all()

    second = AsyncMappingKernelManager(parent=jp_serverapp, kernel_spec_manager=jp_serverapp.kernel_spec_manager)
    assert await adopt_kernels(second) == [kernel_id]
    adopted = second.get_kernel(kernel_id)
    assert adopted.provisioner.pod == pod and await adopted.is_alive()
    assert "42" in await run_code(adopted, "print(x)")  # the same process, its variables intact
    await asyncio.sleep(6)  # past the operator's heartbeat timeout (4 s): the new server keeps it alive
    assert "43" in await run_code(adopted, "print(x + 1)")
    await second.shutdown_kernel(kernel_id)
    await wait_until(lambda: _none(objects_of(kube, kernel_id)), timeout=20, what="the kernel's objects to go")
