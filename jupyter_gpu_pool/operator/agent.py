"""The node agent (a DaemonSet): each kernel pod's GPU memory and utilization, from NVML.

NVML reports per process; a process belongs to a container, whose cgroup names
its pod (``.../kubepods/burstable/pod<uid>/<container>`` with cgroupfs,
``.../kubepods-burstable-pod<uid_with_underscores>.slice/...`` with systemd).
The agent sums a pod's processes the way the server's own sampler sums a
kernel's process tree on one machine (memory: the sum; utilization: the
busiest GPU, at most 100%), writes the result into the kernel's
``status.usage`` (so the server's culler and the UI read the same facts as on
one machine) and serves it as Prometheus metrics.

NVML reads go through :class:`jupyter_gpu_pool.devices.telemetry.NVMLSource`,
in a thread; the process-to-pod mapping is this module's.  The agent needs
``hostPID`` to see the kernels' processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from dataclasses import dataclass

from traitlets import Int, List, Unicode, default
from traitlets.config import Application

from ..cluster.resources import GROUP, KERNEL_COMPONENT, KERNELS, LABEL_COMPONENT, LABEL_KERNEL, LABEL_PART_OF, PART_OF, VERSION
from ..cluster.watch import list_and_watch
from ..periodic import every
from ..traits import Seconds

log = logging.getLogger("jupyter_gpu_pool.agent")

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
MERGE = "application/merge-patch+json"


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod uid in a ``/proc/<pid>/cgroup`` (cgroup v1 or v2, cgroupfs or systemd driver), else None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        m = _POD_UID.search(path)
        if m:
            return m.group(1).replace("_", "-")
    return None


def pod_uid_of(pid: int, proc_root: str = "/proc") -> str | None:
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup")) as f:
            return pod_uid_from_cgroup(f.read())
    except OSError:  # gone, or not ours to read
        return None


@dataclass(frozen=True)
class PodUsage:
    memory_used: int | None
    utilization: float
    devices: tuple[str, ...]


def usage_by_pod(per_gpu: dict, proc_root: str = "/proc") -> dict[str, PodUsage]:
    """Per pod uid, its processes' use of the GPUs: ``per_gpu`` is ``{gpu uuid: {pid: ProcessReading}}``."""
    uid_of: dict[int, str | None] = {}
    memory: dict[str, int | None] = {}
    util: dict[str, dict[str, float]] = {}
    for gpu, procs in per_gpu.items():
        for pid, reading in procs.items():
            if pid not in uid_of:
                uid_of[pid] = pod_uid_of(pid, proc_root)
            uid = uid_of[pid]
            if uid is None:
                continue
            if reading.memory is None or memory.get(uid, 0) is None:
                memory[uid] = None
            else:
                memory[uid] = memory.get(uid, 0) + reading.memory  # type: ignore[operator]
            per = util.setdefault(uid, {})
            per[gpu] = per.get(gpu, 0.0) + reading.utilization
    return {uid: PodUsage(memory[uid], max(min(u, 100.0) for u in util[uid].values()), tuple(sorted(util[uid])))
            for uid in util}


class Agent:
    """Watches the kernel pods on one node; every ``interval`` reads NVML and reports each pod's use."""

    def __init__(self, node: str, api, source, gpus: list[str], proc_root: str = "/proc", metrics=None,
                 min_report: float = 60.0, namespaces: tuple[str, ...] = ()):
        from kubernetes_asyncio import client

        self.node = node
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.source = source
        self.gpus = set(gpus)
        self.proc_root = proc_root
        self.metrics = metrics or AgentMetrics()
        self.min_report = min_report
        self.namespaces = tuple(namespaces)
        self.pods: dict[str, dict] = {}  # uid -> pod
        self._reported: dict[str, tuple[dict, float]] = {}

    async def watch_pods(self) -> None:
        """Keep ``pods`` current: the kernel pods of this node (a server-side label and field selector),
        in the agent's namespaces (all namespaces when none are named)."""
        selector = f"{LABEL_COMPONENT}={KERNEL_COMPONENT},{LABEL_PART_OF}={PART_OF}"
        fields = f"spec.nodeName={self.node}"
        if not self.namespaces:
            await list_and_watch(self.core.list_pod_for_all_namespaces, label_selector=selector,
                                 field_selector=fields, replace=self._replacer(None), apply=self._apply,
                                 what=f"kernel pods on {self.node}")
            return
        await asyncio.gather(*(list_and_watch(
            self.core.list_namespaced_pod, ns, label_selector=selector, field_selector=fields,
            replace=self._replacer(ns), apply=self._apply, what=f"kernel pods on {self.node} in {ns}")
            for ns in self.namespaces))

    def _replacer(self, namespace: str | None):
        async def replace(items: list[dict]) -> None:
            self.pods = {uid: p for uid, p in self.pods.items()
                         if namespace is not None and p["metadata"].get("namespace") != namespace}
            self.pods.update({p["metadata"]["uid"]: p for p in items})
        return replace

    async def _apply(self, event_type: str, pod: dict) -> None:
        if event_type == "DELETED":
            self.pods.pop(pod["metadata"]["uid"], None)
        else:
            self.pods[pod["metadata"]["uid"]] = pod

    async def sample_once(self) -> dict[str, PodUsage]:
        per_gpu = await asyncio.to_thread(self.source.read, self.gpus)
        devices = await asyncio.to_thread(self.source.device_utilization, self.gpus)
        usage = await asyncio.to_thread(usage_by_pod, per_gpu, self.proc_root)
        for gpu, value in devices.items():
            self.metrics.device.labels(node=self.node, gpu=gpu).set(value)
        now = time.time()
        for uid, pod in list(self.pods.items()):
            meta = pod["metadata"]
            kernel = (meta.get("labels") or {}).get(LABEL_KERNEL)
            if not kernel or (pod.get("status") or {}).get("phase") != "Running":
                continue
            found = usage.get(uid, PodUsage(0, 0.0, ()))
            labels = {"namespace": meta["namespace"], "kernel": kernel, "pod": meta["name"]}
            if found.memory_used is not None:
                self.metrics.memory.labels(**labels).set(found.memory_used)
            self.metrics.utilization.labels(**labels).set(found.utilization)
            await self._report(meta["namespace"], kernel, found, now)
        return usage

    async def _report(self, namespace: str, kernel: str, found: PodUsage, now: float) -> None:
        """Write status.usage when it changed, and at least every ``min_report`` seconds."""
        from kubernetes_asyncio.client.exceptions import ApiException

        usage = {"memoryUsed": found.memory_used, "utilization": round(found.utilization, 1),
                 "devices": list(found.devices)}
        last = self._reported.get(kernel)
        if last and last[0] == usage and now - last[1] < self.min_report:
            return
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, KERNELS, kernel, {"status": {"usage": {**usage, "sampledAt": now}}},
                _content_type=MERGE)
            self._reported[kernel] = (usage, now)
        except ApiException as e:
            if e.status != 404:
                log.warning("could not report the GPU use of kernel %s/%s: %s", namespace, kernel, e.reason)

    async def run(self, interval: float, stop: asyncio.Event | None = None) -> None:
        """Watch the node's kernel pods and sample every ``interval`` (a sample that fails, a driver
        hiccup, is logged and the next one goes on) until ``stop`` is set or the task is cancelled."""
        watcher = asyncio.create_task(self.watch_pods())
        try:
            await every(interval, self.sample_once, stop or asyncio.Event(), what=f"sampling the GPUs on {self.node}")
        finally:
            watcher.cancel()


class AgentMetrics:
    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry, Gauge

        self.registry = registry or CollectorRegistry()
        labels = ["namespace", "kernel", "pod"]
        self.memory = Gauge("gpu_pool_kernel_gpu_memory_bytes", "GPU memory held by a kernel pod's processes.",
                            labels, registry=self.registry)
        self.utilization = Gauge("gpu_pool_kernel_gpu_utilization_percent",
                                 "SM utilization of a kernel pod (its busiest GPU).", labels, registry=self.registry)
        self.device = Gauge("gpu_pool_node_gpu_utilization_percent", "SM utilization of a whole GPU.",
                            ["node", "gpu"], registry=self.registry)


class AgentApp(Application):
    name = "jupyter-gpu-pool-agent"
    description = "Reports each kernel pod's GPU memory and utilization on this node (NVML)."

    node_name = Unicode(help="This node (default: NODE_NAME, from the downward API, else the host name).").tag(
        config=True)

    @default("node_name")
    def _default_node(self) -> str:
        return os.environ.get("NODE_NAME") or socket.gethostname()

    interval = Seconds(10.0, help="Seconds between two NVML readings.").tag(config=True)
    metrics_port = Int(9400, help="Port of /metrics (0: off).").tag(config=True)
    kubeconfig = Unicode("", help="A kubeconfig file (default: in-cluster).").tag(config=True)
    namespaces = List(Unicode(), default_value=[], help="""The kernels' namespaces, whose pods this agent
        watches (empty: every namespace, which needs a cluster-wide right to read pods).""").tag(config=True)
    proc_root = Unicode("/proc", help="Where the host's processes are (hostPID: /proc).").tag(config=True)
    aliases = {"node": "AgentApp.node_name", "interval": "AgentApp.interval", "namespace": "AgentApp.namespaces",
               "log-level": "Application.log_level"}

    def start(self) -> None:
        from ..devices.nvml import discover
        from ..devices.telemetry import NVMLSource
        from ..cluster.client import api_client

        logging.basicConfig(level=self.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
        source = NVMLSource()
        ok, why = source.available()
        if not ok:
            self.log.critical("no GPU telemetry on node %s: %s", self.node_name, why)
            raise SystemExit(1)
        gpus = [g.uuid for g in discover().gpus]

        async def run() -> None:
            api = await api_client(self.kubeconfig)
            metrics = AgentMetrics()
            if self.metrics_port:
                from prometheus_client import start_http_server

                start_http_server(self.metrics_port, registry=metrics.registry)
            self.log.info("GPU agent on %s: %d GPU(s), every %gs", self.node_name, len(gpus), self.interval)
            await Agent(self.node_name, api, source, gpus, self.proc_root, metrics,
                        namespaces=tuple(self.namespaces)).run(self.interval)

        asyncio.run(run())
