"""Faults of the API server lose nothing: every watch loop of the product (the node agent's, the
operator's kernel-pod watch and kopf's, the servers' GPUKernel watch) survives the API server dying
mid-stream, and comes back, with back-off, when it does."""

from __future__ import annotations

import asyncio
import logging

from jupyter_client.manager import AsyncKernelManager
from kernel_helpers import run_code
from kube_helpers import Kube, ScriptedNVML, wait_until

from jupyter_gpu_pool.cluster.resources import KERNEL_COMPONENT, LABEL_COMPONENT, LABEL_KERNEL, LABEL_PART_OF, PART_OF
from jupyter_gpu_pool.cluster.session import KernelSession
from jupyter_gpu_pool.cluster.watch import Backoff
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
