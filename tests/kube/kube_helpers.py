"""Handles on the test cluster and the operator, each a real process, for the kube tests."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from kernel_helpers import free_port, wait_until  # noqa: F401  (wait_until re-exported for the tests)
import yaml

from jupyter_gpu_pool.cluster.resources import API_VERSION, GROUP, QUOTAS, VERSION
from jupyter_gpu_pool.cluster.schema import crd_manifests
from jupyter_gpu_pool.devices.nvml import GPUMemory

HERE = Path(__file__).parent
REPO = HERE.parent.parent

GiB = 2**30
NS = "jhub"  # where the tests' kernels run
PROFILES = {
    "small": {"slice": "10GiB", "isolation": "soft"},
    "half": {"slice": "20GiB,50%", "isolation": "mps"},
    "whole": {"slice": "whole"},
    "huge": {"slice": "64 x whole"},  # more GPUs than any node has: never schedulable, on any cluster
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

    local = True  # its pods are processes of this machine
    user = "alice"  # the owner of the tests' kernels

    def __init__(self, root: Path, nodes: list[dict] | None = None, images: list[str] | None = None,
                 namespace: str = NS, port: int = 0, slow_images: dict[str, float] | None = None,
                 feature_gates: dict[str, bool] | None = None, hollow_nodes: int = 0, pid1: bool = False,
                 gc_delay: float = 0.0, spread: bool = False):
        self.root = root
        self.feature_gates = feature_gates or {}  # over Kubernetes 1.34's defaults (testcluster/store.py)
        self.state = root / "cluster"
        # ``hollow_nodes``: that many hollow GPU nodes (testcluster/hollow.py), alone unless ``nodes`` are given
        self.nodes = nodes if nodes is not None else ([] if hollow_nodes else [HAMI_NODE])
        self.hollow_nodes = hollow_nodes
        self.pid1 = pid1  # a container's process ignores a SIGTERM it has no handler for (testcluster/kubelet.py)
        self.gc_delay = gc_delay  # the garbage collector acts this long after an owner went (testcluster/garbage.py)
        self.spread = spread  # the scheduler spreads pods over nodes (testcluster/scheduler.py)
        self.images = images or ["quay.io/jupyter/*"]
        self.slow_images = slow_images or {}
        self.namespace = namespace
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def kubeconfig(self) -> str:
        return str(self.state / "kubeconfig")

    def kubeconfig_for(self, identity: str) -> str:
        """A kubeconfig whose bearer token is ``identity``: the audit log says who asked what."""
        path = self.state / f"kubeconfig-{identity}"
        config = json.loads(Path(self.kubeconfig).read_text())
        config["users"] = [{"name": identity, "user": {"token": identity}}]
        config["contexts"][0]["context"]["user"] = identity
        path.write_text(json.dumps(config))
        return str(path)

    async def audit(self, user: str | None = None, since: int = 0) -> list[dict]:
        """Every resource request the API server served (from the ``since``-th on; of one ``user`` only):
        when (``at``), user (bearer token), verb, resource, namespace, name (a create's: what it made), and the
        seconds it took to serve (``took``)."""
        import aiohttp

        query = {"since": str(since), **({"user": user} if user is not None else {})}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.url}/testcluster/audit", params=query) as r:
                return await r.json()

    def _args(self) -> list[str]:
        nodes = self.state / "nodes.json"
        nodes.write_text(json.dumps(self.nodes))
        args = ["--state-dir", str(self.state), "--nodes", str(nodes), "--port", str(self.port),
                "--log-file", str(self.state / "cluster.log")]
        for image in self.images:
            args += ["--image", image]
        for image, seconds in self.slow_images.items():
            args += ["--slow-image", f"{image}={seconds}"]
        if self.feature_gates:
            args += ["--feature-gates", ",".join(f"{k}={str(v).lower()}" for k, v in self.feature_gates.items())]
        if self.hollow_nodes:
            args += ["--hollow-nodes", str(self.hollow_nodes)]
        return args + ["--gc-delay", str(self.gc_delay)] + ["--pid1"] * self.pid1 + ["--spread"] * self.spread

    def start(self) -> TestCluster:
        """A run of the test cluster: in a parked process of an earlier one where there is one (a new state on
        a new port: see testcluster/__main__.py), else in a new process."""
        self.state.mkdir(parents=True, exist_ok=True)
        args = self._args()
        self.proc = _parked.pop() if _parked and not self.port else None
        if self.proc is not None:
            self.proc.stdin.write(f"run {json.dumps(args)}\n".encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        else:
            # the caller's path after its own: where the packages come from a folder of wheels (the GPU machine's
            # scripts/gpu-check), the cluster finds aiohttp, kubernetes_validate and celpy there too
            path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
            with open(self.state / "cluster.log", "ab") as log:  # until it logs to --log-file itself
                self.proc = subprocess.Popen([sys.executable, "-m", "testcluster", "--reusable", *args],
                                             env={**os.environ, "PYTHONPATH": path}, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, cwd=str(self.root))
        line = _answer(self.proc)
        if not line.startswith("testcluster ready"):
            self.stop()
            raise RuntimeError(f"the test cluster did not start: {line!r}; see {self.state / 'cluster.log'}")
        self.url = line.split()[-1]
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart comes back on the same address
        return self

    def crash(self) -> None:
        """SIGKILL: the API server dies mid-response, its watch streams cut off (and its state lost,
        as a real API server's is not: a test puts back what it needs)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        _close(self.proc)

    def stop(self) -> None:
        """The run ends, every pod's process with it; the process is parked for the next run (see start), or
        stopped where it does not answer."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            if proc is not None:
                _close(proc)
            return
        try:
            proc.stdin.write(b"park\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            parked = _answer(proc) == "testcluster parked"
        except (BrokenPipeError, TimeoutError):
            parked = False
        if parked and len(_parked) < 2:
            _parked.append(proc)
        else:
            _end(proc)

    async def api(self):
        from jupyter_gpu_pool.cluster.client import api_client

        return await api_client(self.kubeconfig)

    async def fault(self, **body) -> None:
        """Inject a fault into the API server (see testcluster/faults.py): ``resources=[...], status=503,
        seconds=3``; ``hang=True``; ``stall=[...]``; ``resume=True``; ``restart=True, seconds=2`` (its state
        kept); ``gc_delay=5``; ``clear=True``."""
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.post(f"{self.url}/testcluster/faults", json=body) as r:
                assert r.status == 200, await r.text()


_parked: list[subprocess.Popen] = []  # test clusters' processes between runs (of this test process)


def _answer(proc: subprocess.Popen, timeout: float = 60) -> str:
    """The test cluster's answer to its start or to a command (its next line on stdout)."""
    import select

    if not select.select([proc.stdout], [], [], timeout)[0]:
        raise TimeoutError(f"the test cluster did not answer within {timeout:.0f} s")
    return proc.stdout.readline().decode().strip()  # type: ignore[union-attr]


def _close(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except BrokenPipeError:
                pass


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM (every pod's process goes with it), SIGKILL where that does not end it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _close(proc)


@atexit.register
def _end_parked() -> None:
    while _parked:
        _end(_parked.pop())


class RealCluster:
    """The cluster ``KUBECONFIG`` names (tests marked ``k8s``), in a namespace of the test's own.

    The tests run the operator from this checkout against it, serving that namespace only; the
    kernels' image (``GPU_POOL_TEST_IMAGE``) must hold ipykernel, the sharing backend is
    ``GPU_POOL_TEST_SHARING`` (default ``whole``), and this process must reach pod IPs (run the
    tests from a pod of the cluster).  See docs/kubernetes.md, "Testing".
    """

    local = False

    def __init__(self, root: Path, kubeconfig: str | None = None):
        import uuid

        self.root = root
        self.state = root / "cluster"
        self.kubeconfig = kubeconfig or os.environ["KUBECONFIG"].split(os.pathsep)[0]
        self.namespace = f"gpu-pool-test-{uuid.uuid4().hex[:8]}"
        self.user = self.namespace  # quotas are cluster-wide: the tests touch only their own user's
        self.quota = f"user-{self.user}"  # the tests' own quota for that user (made by conftest.install)
        self.url = ""

    @property
    def operator_settings(self) -> dict:
        image = os.environ.get("GPU_POOL_TEST_IMAGE", "quay.io/jupyter/base-notebook:latest")
        return {"GPUPoolOperator.sharing": os.environ.get("GPU_POOL_TEST_SHARING", "whole"),
                "GPUPoolOperator.gpu_memory": os.environ.get("GPU_POOL_TEST_GPU_MEMORY", "80GiB"),
                "GPUPoolOperator.kernel_image": image, "GPUPoolOperator.namespaces": [self.namespace]}

    def start(self) -> RealCluster:
        self.state.mkdir(parents=True, exist_ok=True)
        return self

    def stop(self) -> None:
        for kind, name in (("namespace", self.namespace), ("gpuquotas.jupyter-gpu-pool.readthedocs.io", self.quota)):
            subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, "delete", kind, name, "--wait=false",
                            "--ignore-not-found"], capture_output=True, timeout=60)

    async def api(self):
        from jupyter_gpu_pool.cluster.client import api_client

        return await api_client(self.kubeconfig)


def write_pool_config(directory: Path, **settings) -> Path:
    """A ``jupyter_gpu_pool_config.py``: ``settings`` are ``{"GPUPool.profiles": {...}, ...}``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "jupyter_gpu_pool_config.py"
    path.write_text("".join(f"c.{k} = {v!r}\n" for k, v in settings.items()))
    return path


class OperatorProcess:
    """``python -m jupyter_gpu_pool.operator`` against the test cluster, logging to a file (at DEBUG, or
    ``log_level``: None for the operator's default), with the tests' quick settings (``FAST``) unless
    ``fast`` is off (a benchmark runs the operator as deployed)."""

    def __init__(self, cluster: TestCluster | RealCluster, root: Path, settings: dict, kubeconfig: str | None = None,
                 fast: bool = True, log_level: str | None = "DEBUG"):
        self.cluster = cluster
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.config_dir = root / "operator-config"
        self.log_path = root / "operator.log"
        self.log_level = log_level
        write_pool_config(self.config_dir, **{"GPUPool.profiles": PROFILES, **(FAST if fast else {}),
                                              **getattr(cluster, "operator_settings", {}), **settings})
        self.proc: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        # as an admin starts it outside a cluster: the file on the command line only (no KUBECONFIG: see
        # test_kube_operator_start.py), and no in-cluster service account
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(self.config_dir), "JUPYTER_CONFIG_PATH": ""}
        env.pop("KUBECONFIG", None)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpu_pool.operator", "run", f"--kubeconfig={self.kubeconfig}",
             *([f"--log-level={self.log_level}"] if self.log_level else [])],
            env=env, stdout=self._log, stderr=subprocess.STDOUT)
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


def kustomize(path: Path) -> list[dict]:
    import shutil

    import pytest

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (kubectl kustomize renders the deployment offline)")
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class Kube:
    """A test's own client to the cluster (kubernetes_asyncio), for arranging and asserting."""

    def __init__(self, api, namespace: str = NS):
        from kubernetes_asyncio import client

        self.api = api
        self.namespace = namespace
        self.quotas: list[str] = []  # created here, deleted at close (they are cluster-wide)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    async def close(self) -> None:
        from jupyter_gpu_pool.cluster.resources import GROUP, QUOTAS, VERSION

        from kubernetes_asyncio.client.exceptions import ApiException

        for name in self.quotas:
            try:
                await self.custom.delete_cluster_custom_object(GROUP, VERSION, QUOTAS, name)
            except ApiException as e:
                if e.status != 404:
                    raise
        await self.api.close()

    async def kernels(self, namespace: str | None = None) -> list[dict]:
        from jupyter_gpu_pool.cluster.resources import GROUP, KERNELS, VERSION

        namespace = namespace or self.namespace
        return (await self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, KERNELS))["items"]

    async def pods(self, namespace: str | None = None) -> list[dict]:
        namespace = namespace or self.namespace
        listing = await self.core.list_namespaced_pod(namespace)
        return [self.api.sanitize_for_serialization(p) for p in listing.items]

    async def secrets(self, namespace: str | None = None) -> list[dict]:
        namespace = namespace or self.namespace
        listing = await self.core.list_namespaced_secret(namespace)
        return [self.api.sanitize_for_serialization(s) for s in listing.items]

    async def quota(self, scope: str, name: str = "", **limits) -> dict:
        """Create (or, when it exists, such as a real cluster's run's own user quota, replace) a GPUQuota."""
        from kubernetes_asyncio.client.exceptions import ApiException

        from jupyter_gpu_pool.cluster.resources import API_VERSION, GROUP, QUOTAS, VERSION

        spec = {"scope": scope, **({"name": name} if name else {}), **limits}
        obj_name = f"{scope}-{name}" if name else scope
        body = {"apiVersion": API_VERSION, "kind": "GPUQuota", "metadata": {"name": obj_name}, "spec": spec}
        try:
            made = await self.custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, body)
        except ApiException as e:
            if e.status != 409:
                raise
            current = await self.custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, obj_name)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            made = await self.custom.replace_cluster_custom_object(GROUP, VERSION, QUOTAS, obj_name, body)
        self.quotas.append(obj_name)
        return made

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

    async def get(self, path: str) -> dict:
        """GET any API path (raw JSON)."""
        return await self._get(path)

    async def _get(self, path: str) -> dict:
        import json as _json

        response = await self.api.call_api(path, "GET", response_types_map={}, _preload_content=False,
                                           _return_http_data_only=True, auth_settings=["BearerToken"])
        try:
            return _json.loads(await response.read())
        finally:
            response.release()


async def follow_pod(url: str, namespace: str, name: str, events: list[dict], timeout: float = 60) -> None:
    """Append one pod's watch events (from its current state on) to ``events`` until it is deleted."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/v1/namespaces/{namespace}/pods", params={
                "watch": "1", "fieldSelector": f"metadata.name={name}", "timeoutSeconds": str(int(timeout))}) as r:
            async for line in r.content:
                events.append(json.loads(line))
                if events[-1]["type"] == "DELETED":
                    return


def pod_processes(pod: str, anywhere: bool = False) -> list[psutil.Process]:
    """The test kubelet's processes of one pod (it sets HOSTNAME to the pod's name); ``anywhere``: any container's
    on this machine (a container runtime sets HOSTNAME to the pod's name too: seen from the node's host)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("HOSTNAME") == pod and (anywhere or env.get("TESTCLUSTER_POD_IP")):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class JupyterServer:
    """``jupyter server`` in its own process, on the test cluster, with the kubernetes kernelspecs."""

    def __init__(self, root: Path, cluster: TestCluster | RealCluster, server_id: str = "alice-server",
                 extension: bool = False, kubeconfig: str | None = None):
        self.root = root
        self.extension = extension
        self.config = root / "server-config"
        self.data = root / "server-data"
        self.port = free_port()
        self.token = "test-token"
        write_pool_config(self.config, **{
            "GPUPool.profiles": PROFILES, "GPUPool.owner": cluster.user,
            "GPUPoolKubernetes.kubeconfig": kubeconfig or cluster.kubeconfig,
            "GPUPoolKubernetes.namespace": cluster.namespace,
            "GPUPoolKubernetes.server_id": server_id, "GPUPoolKubernetes.heartbeat_interval": 0.5,
            "GPUPoolExtension.pool_backend": "kubernetes", "GPUPoolExtension.hibernator_class": None,
        })
        env = {**os.environ, "JUPYTER_DATA_DIR": str(self.data), "JUPYTER_CONFIG_DIR": str(self.config)}
        subprocess.run([sys.executable, "-c", (
            "from jupyter_gpu_pool.config import load_settings; from jupyter_gpu_pool.kernel_provisioner import "
            "kernelspecs; kernelspecs.install(list(load_settings().profiles.values()), "
            "prefix_name='gpu-pool-kubernetes', user=True, provisioner='gpu-pool-kubernetes')")],
            env=env, check=True)
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> JupyterServer:
        self.log = open(self.root / f"server-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--no-browser", "--allow-root",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             f"--ServerApp.jpserver_extensions={{'jupyter_gpu_pool': {self.extension}}}"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    async def request(self, method: str, path: str, body: dict | None = None) -> dict:
        from tornado.httpclient import AsyncHTTPClient

        response = await AsyncHTTPClient().fetch(
            f"http://127.0.0.1:{self.port}/{path}", method=method, headers={"Authorization": f"token {self.token}"},
            body=json.dumps(body) if body is not None else None, request_timeout=120)
        return json.loads(response.body) if response.body else {}

    async def ready(self) -> None:
        async def up():
            try:
                await self.request("GET", "api/status")
                return True
            except (ConnectionError, OSError):
                return False
            except Exception:
                return False

        await wait_until(up, timeout=60, interval=0.2, what="jupyter server to answer")

    async def execute(self, kernel_id: str, code: str, timeout: float = 60) -> str:
        """Run code over the kernel's websocket, as JupyterLab does; its stdout (raises on an error)."""
        import uuid

        from tornado.websocket import websocket_connect

        ws = await websocket_connect(f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?token={self.token}")
        msg_id = uuid.uuid4().hex
        await ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "alice",
                       "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        out = []
        replied = idle = False  # output is complete once the reply came and iopub said idle (either order)
        try:
            while not (replied and idle):
                reply = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
                if reply.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if reply["msg_type"] == "stream":
                    out.append(reply["content"]["text"])
                elif reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                    idle = True
                elif reply["msg_type"] == "execute_reply":
                    if reply["content"]["status"] != "ok":
                        raise AssertionError(f"{code!r} failed: {reply['content']}")
                    replied = True
            return "".join(out)
        finally:
            ws.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


class ScriptedNVML:
    """Per-process GPU readings a test sets: stands in for NVMLSource, which needs a GPU (the
    ``gpu`` tests read the real one)."""

    def __init__(self, readings: dict | None = None):
        self.readings = readings or {}

    def available(self):
        return True, ""

    def read(self, gpu_uuids):
        return {g: dict(self.readings.get(g, {})) for g in gpu_uuids}

    def device_utilization(self, gpu_uuids):
        return {g: 55.0 for g in gpu_uuids}


class ScriptedMemory(GPUMemory):
    """NVML's free memory per GPU as a test sets it (``devices.nvml.GPUMemory``; NVMLMemory needs a GPU)."""

    def __init__(self, free: dict[str, int] | None = None):
        self.free_bytes = dict(free or {})

    def of_processes(self, pids):
        return {}

    def free(self, gpu_uuid: str):
        return self.free_bytes.get(gpu_uuid)


def fake_proc(root: Path, pods: dict[int, str | None]) -> str:
    """A /proc stand-in (the test kubelet runs no containers): each pid's cgroup file as a node with
    the systemd cgroup driver has it for a process of pod ``uid`` (None: a host process)."""
    for pid, uid in pods.items():
        os.makedirs(root / str(pid), exist_ok=True)
        line = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
                "cri-containerd-ab12.scope" if uid else "0::/system.slice/sshd.service")
        (root / str(pid) / "cgroup").write_text(line + "\n")
    return str(root)


async def install(cluster: TestCluster | RealCluster) -> None:
    """The CRDs (unless a real cluster has them) and the kernels' namespace, as an admin would apply them;
    on a real cluster, also a quota of the tests' own for their own user, so that whatever quotas the
    cluster has (such as deploy/examples' default) do not apply to them."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    api = await cluster.api()
    async with api:
        ext = client.ApiextensionsV1Api(api)
        for crd in crd_manifests():
            try:
                await ext.create_custom_resource_definition(crd)
            except ApiException as e:
                if e.status != 409 or cluster.local:
                    raise
        await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": cluster.namespace}})
        if not cluster.local:
            await client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, QUOTAS, {
                "apiVersion": API_VERSION, "kind": "GPUQuota", "metadata": {"name": cluster.quota},
                "spec": {"scope": "user", "name": cluster.user, "kernels": 1000}})  # no memory or SM limit


async def operator_ready(cluster: TestCluster | RealCluster, namespace: str | None = None) -> None:
    """Wait until the operator serving the tests' namespace has its watches live: it refuses a probe
    GPUKernel of the test's own (a profile no one has), which is then deleted.  Nothing shared is written
    (on a real cluster the GPUPoolPolicy "default", like every quota but the run's own, is the admin's),
    and a second operator on the same cluster is waited for too (each probe is new)."""
    import uuid

    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    from jupyter_gpu_pool.cluster.resources import KERNEL_KIND, KERNELS

    name = f"operator-ready-probe-{uuid.uuid4().hex[:8]}"
    namespace = namespace or cluster.namespace  # the operator serving this namespace is waited for
    api = await cluster.api()
    async with api:
        custom = client.CustomObjectsApi(api)
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, KERNELS, {
            "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": name},
            "spec": {"owner": "operator-ready-probe", "kernelId": name, "profile": "no-such-profile (probe)",
                     "launch": 1}})

        async def refused():
            obj = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, KERNELS, name)
            return (obj.get("status") or {}).get("reason") == "InvalidSpec"

        try:
            await wait_until(refused, timeout=60, what="the operator to take up a probe GPUKernel")
        finally:
            try:
                await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, KERNELS, name)
            except ApiException as e:
                if e.status != 404:
                    raise
