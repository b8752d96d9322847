"""Handles on the test cluster and the operator, each a real process, for the kube tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

HERE = Path(__file__).parent
REPO = HERE.parent.parent

GiB = 2**30
PROFILES = {
    "small": {"slice": "10GiB", "isolation": "soft"},
    "half": {"slice": "20GiB,50%", "isolation": "mps"},
    "whole": {"slice": "whole"},
}
# One node with two 40 GiB GPUs under HAMi: memory in MiB, cores in percent per GPU.
HAMI_NODE = {
    "name": "gpu-node-1",
    "labels": {"nvidia.com/gpu.product": "Test-GPU-40GB", "nvidia.com/gpu.memory": "40960",
               "nvidia.com/gpu.count": "2"},
    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2",
                    "nvidia.com/gpumem": str(2 * 40960), "nvidia.com/gpucores": "200"},
    "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
}
KERNEL_IMAGE = "quay.io/jupyter/pytorch-notebook:cuda12-test"
FAST = {  # operator settings that make the tests quick
    "GPUPoolOperator.reconcile_interval": 1.0,
    "GPUPoolOperator.heartbeat_timeout": 4.0,
    "GPUPoolOperator.metrics_port": 0,
    "GPUPoolOperator.kernel_image": KERNEL_IMAGE,
    "OperatorApp.liveness_endpoint": "",
}


class TestCluster:
    """``python -m testcluster`` in a subprocess: an API server, scheduler and kubelet."""

    def __init__(self, root: Path, nodes: list[dict] | None = None, images: list[str] | None = None):
        self.root = root
        self.state = root / "cluster"
        self.nodes = nodes or [HAMI_NODE]
        self.images = images or ["quay.io/jupyter/*"]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def kubeconfig(self) -> str:
        return str(self.state / "kubeconfig")

    def start(self) -> TestCluster:
        self.state.mkdir(parents=True, exist_ok=True)
        nodes = self.state / "nodes.json"
        nodes.write_text(json.dumps(self.nodes))
        args = [sys.executable, "-m", "testcluster", "--state-dir", str(self.state), "--nodes", str(nodes)]
        for image in self.images:
            args += ["--image", image]
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        self.log = open(self.state / "cluster.log", "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=self.log, cwd=str(self.root))
        line = self.proc.stdout.readline().decode()  # type: ignore[union-attr]
        if not line.startswith("testcluster ready"):
            self.stop()
            raise RuntimeError(f"the test cluster did not start: {line!r}; see {self.state / 'cluster.log'}")
        self.url = line.split()[-1]
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        if getattr(self, "log", None):
            self.log.close()

    async def api(self):
        from jupyter_gpu_pool.operator.kube import api_client

        return await api_client(self.kubeconfig)


def write_pool_config(directory: Path, **settings) -> Path:
    """A ``jupyter_gpu_pool_config.py``: ``settings`` are ``{"GPUPool.profiles": {...}, ...}``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "jupyter_gpu_pool_config.py"
    path.write_text("".join(f"c.{k} = {v!r}\n" for k, v in settings.items()))
    return path


class OperatorProcess:
    """``python -m jupyter_gpu_pool.operator`` against the test cluster, logging at DEBUG to a file."""

    def __init__(self, cluster: TestCluster, root: Path, settings: dict):
        self.cluster = cluster
        self.config_dir = root / "operator-config"
        self.log_path = root / "operator.log"
        write_pool_config(self.config_dir, **{"GPUPool.profiles": PROFILES, **FAST, **settings})
        self.proc: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(self.config_dir), "JUPYTER_CONFIG_PATH": "",
               "KUBECONFIG": self.cluster.kubeconfig}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpu_pool.operator", "run", f"--kubeconfig={self.cluster.kubeconfig}",
             "--log-level=DEBUG"], env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


async def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = ""):
    """Await ``predicate()`` (sync or async) until it is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(interval)


def kustomize(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class Kube:
    """A test's own client to the cluster (kubernetes_asyncio), for arranging and asserting."""

    def __init__(self, api):
        from kubernetes_asyncio import client

        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    async def close(self) -> None:
        await self.api.close()

    async def kernels(self, namespace: str = "jhub") -> list[dict]:
        from jupyter_gpu_pool.operator.crds import GROUP, KERNELS, VERSION

        return (await self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, KERNELS))["items"]

    async def pods(self, namespace: str = "jhub") -> list[dict]:
        listing = await self.core.list_namespaced_pod(namespace)
        return [self.api.sanitize_for_serialization(p) for p in listing.items]

    async def secrets(self, namespace: str = "jhub") -> list[dict]:
        listing = await self.core.list_namespaced_secret(namespace)
        return [self.api.sanitize_for_serialization(s) for s in listing.items]

    async def quota(self, scope: str, name: str = "", **limits) -> dict:
        from jupyter_gpu_pool.operator.crds import API_VERSION, GROUP, QUOTAS, VERSION

        spec = {"scope": scope, **({"name": name} if name else {}), **limits}
        obj_name = f"{scope}-{name}" if name else scope
        return await self.custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, {
            "apiVersion": API_VERSION, "kind": "GPUQuota", "metadata": {"name": obj_name}, "spec": spec})

    async def everything(self) -> list[dict]:
        """Every object of every kind the server serves, in every namespace (raw JSON)."""
        objects = []
        for prefix in ["/api/v1"] + [f"/apis/{g['preferredVersion']['groupVersion']}"
                                     for g in (await self._get("/apis"))["groups"]]:
            for res in (await self._get(prefix))["resources"]:
                if "/" in res["name"] or "list" not in res["verbs"]:
                    continue
                listing = await self._get(f"{prefix}/{res['name']}")
                for item in listing["items"]:  # a real server leaves kind out of built-in list items
                    item.setdefault("kind", listing["kind"].removesuffix("List"))
                objects += listing["items"]
        return objects

    async def _get(self, path: str) -> dict:
        import json as _json

        response = await self.api.call_api(path, "GET", response_types_map={}, _preload_content=False,
                                           _return_http_data_only=True, auth_settings=["BearerToken"])
        try:
            return _json.loads(await response.read())
        finally:
            response.release()


def pod_processes(pod: str) -> list[psutil.Process]:
    """The test kubelet's processes of one pod (it sets HOSTNAME to the pod's name)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("HOSTNAME") == pod and proc.environ().get("TESTCLUSTER_POD_IP"):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
