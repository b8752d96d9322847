"""Fixtures for the Kubernetes tests: a test cluster, the operator, and a Jupyter server on them.

Each test gets its own cluster (a new run in a parked process of an earlier test's: see testcluster/__main__.py)
and its own operator process, so quotas, policies and heartbeats never leak between tests.  A module that sets
``REAL_CLUSTER_TOO = True`` runs its tests a second time, marked ``k8s``, on the
cluster ``KUBECONFIG`` names (skipped where it is not set): see ``RealCluster``.
"""

from __future__ import annotations

import pytest
from kube_helpers import (KERNEL_IMAGE, PROFILES, JupyterServer, Kube, OperatorProcess, RealCluster, TestCluster,
                          install, operator_ready, write_pool_config)

@pytest.fixture
def cluster_kind() -> str:
    return "test"


def pytest_generate_tests(metafunc):
    if "cluster_kind" in metafunc.fixturenames and getattr(metafunc.module, "REAL_CLUSTER_TOO", False):
        metafunc.parametrize("cluster_kind", ["test", pytest.param("real", marks=pytest.mark.k8s)])


@pytest.fixture
def cluster_factory(tmp_path):
    started: list[TestCluster] = []

    def make(**kwargs) -> TestCluster:
        cluster = TestCluster(tmp_path, **kwargs).start()
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture
def operator_factory(tmp_path):
    started: list[OperatorProcess] = []

    async def make(cluster: TestCluster, **settings) -> OperatorProcess:
        op = OperatorProcess(cluster, tmp_path, settings).start()
        started.append(op)
        await operator_ready(cluster)
        return op

    yield make
    for op in started:
        op.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster_options(**kwargs): the test cluster's TestCluster options "
                            "(pid1=True: a container's process ignores a SIGTERM it has no handler for)")


@pytest.fixture
async def cluster(request, cluster_kind, cluster_factory, tmp_path):
    if cluster_kind == "real":
        c = RealCluster(tmp_path).start()
        await install(c)
        yield c
        c.stop()
        return
    options = request.node.get_closest_marker("cluster_options")
    c = cluster_factory(**(options.kwargs if options else {}))
    await install(c)
    yield c


@pytest.fixture
async def operator(cluster, operator_factory) -> OperatorProcess:
    return await operator_factory(cluster)


@pytest.fixture
def configure_server(jp_environ, jp_config_dir):
    """Write the Jupyter side for a cluster: the pool's config (profiles, owner, where kernels go) and
    the gpu-pool-kubernetes kernelspecs; ``settings`` override (``GPUPoolKubernetes.launch_timeout=5``)."""
    from pathlib import Path

    from jupyter_gpu_pool.config import load_settings
    from jupyter_gpu_pool.kernel_provisioner import kernelspecs

    def configure(cluster, **extra) -> dict:
        settings = {
            "GPUPool.profiles": PROFILES,
            "GPUPool.owner": cluster.user,
            "GPUPoolKubernetes.kubeconfig": cluster.kubeconfig,
            "GPUPoolKubernetes.namespace": cluster.namespace,
            "GPUPoolKubernetes.server_id": "alice-server",
            "GPUPoolKubernetes.heartbeat_interval": 0.5,
            "GPUPoolKubernetes.launch_timeout": 60.0,
            **extra,
        }
        write_pool_config(Path(jp_config_dir), **settings)
        kernelspecs.install(list(load_settings().profiles.values()), prefix_name="gpu-pool-kubernetes", user=True,
                            provisioner="gpu-pool-kubernetes")
        return settings

    return configure


@pytest.fixture
def server_config(configure_server, cluster):
    """The Jupyter side, on the test's cluster."""
    return configure_server(cluster)


@pytest.fixture
async def kube(cluster):
    """A client of the test's cluster, in its namespace."""
    k = Kube(await cluster.api(), cluster.namespace)
    yield k
    await k.close()


@pytest.fixture
async def kube_sessions():
    """Close the provisioners' shared watches at the end of a test (they live on its event loop)."""
    yield
    from jupyter_server.serverapp import ServerApp

    from jupyter_gpu_pool.cluster.session import KernelSession

    if ServerApp.initialized() and hasattr(ServerApp.instance(), "kernel_manager"):
        await ServerApp.instance().kernel_manager.shutdown_all()  # while the watches still run
    await KernelSession.close_all()


@pytest.fixture
async def node(request, cluster, tmp_path):
    """A GPU node's side: the stand-in GPUs and driver (or, parametrised ``gpu``, this machine's real ones), a
    /proc stand-in and the real node agent on them (``test_kube_hibernation_e2e.Node``; its ``start`` runs the
    agent).  On a real cluster, the node ``GPU_POOL_TEST_NODE`` names (see ``RealCluster``), or a skip."""
    from test_kube_hibernation_e2e import Node

    n = Node(cluster, tmp_path, getattr(request, "param", "standin"), name=Node.name_on(cluster))
    yield n
    await n.close()


@pytest.fixture
async def drain(kube):
    """``drain(node, pod)``: what ``kubectl drain`` does to a node with one kernel pod on it: cordon, then
    evict the pod (deleted with its grace period).  A node this cordoned is uncordoned when the test ends,
    however it ends: on a real cluster (``k8s``) a test leaves the nodes as it found them."""
    cordoned: list[str] = []

    async def drain_(node: str, pod: str) -> None:
        if not (await kube.core.read_node(node)).spec.unschedulable:
            cordoned.append(node)
        await kube.core.patch_node(node, {"spec": {"unschedulable": True}})
        await kube.core.create_namespaced_pod_eviction(pod, kube.namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": kube.namespace}})

    yield drain_
    for name in cordoned:
        await kube.core.patch_node(name, {"spec": {"unschedulable": None}})


@pytest.fixture
def servers(tmp_path, cluster):
    started: list[JupyterServer] = []

    def make(**kwargs) -> JupyterServer:
        server = JupyterServer(tmp_path, cluster, **kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        if server.proc and server.proc.poll() is None:
            server.proc.terminate()
            server.proc.wait(30)


__all__ = ["KERNEL_IMAGE"]
