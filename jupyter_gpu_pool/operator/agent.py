"""The node agent (a DaemonSet): each kernel pod's GPU memory and utilization, from NVML; and the
hibernation moves the operator admits for the kernels of its node (``pod_moves.py``).

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

It also writes each GPU's free memory, as NVML counts it, on its Node (annotation
``ANNOTATION_GPU_FREE``: what the operator admits a resume against), when it changed by
``FREE_CHANGE`` or more, after every move, and at least every ``min_report`` seconds; through
:class:`OwnNode`, which writes that annotation on its own Node and nothing anywhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass

from traitlets import Bool, Int, List, Unicode, default
from traitlets.config import Application

from ..cluster.kernels import key, status
from ..cluster.resources import (ANNOTATION_GPU_FREE, GROUP, KERNEL_COMPONENT, KERNELS, LABEL_COMPONENT, LABEL_KERNEL,
                                 LABEL_PART_OF, PART_OF, VERSION)
from ..cluster.watch import list_and_watch
from ..devices import checkpoint
from ..devices.nvml import GPUMemory
from ..periodic import every
from ..traits import Seconds
from .pod_moves import MOVES, PodMover

log = logging.getLogger("jupyter_gpu_pool.agent")

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
MERGE = "application/merge-patch+json"
FREE_CHANGE = 256 * 2**20  # a change in a GPU's free memory worth writing on the Node at once (bytes)


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


def pids_of_pod(uid: str, proc_root: str = "/proc") -> list[int]:
    """Every process whose cgroup names the pod ``uid``, in pid order: what a hibernation of that pod
    may touch, found from the node's own records and nothing a resource says."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(pid for pid in (int(e) for e in entries if e.isdigit()) if pod_uid_of(pid, proc_root) == uid)


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


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class NotOwnNode(Exception):
    """A write to a Node other than the agent's own, or of anything but its free-memory reading: refused
    before any request is made."""


class OwnNode:
    """The one Node the agent writes, and the one thing it writes there: its own Node (the name it was
    started with: the downward API's ``spec.nodeName``), the annotation ``ANNOTATION_GPU_FREE``.

    RBAC cannot bind a DaemonSet's right to patch Nodes to each pod's own node (``resourceNames`` is not
    templated), so every agent holds the right to patch any Node; this is where the code keeps it to its
    own.  Every Node write of the agent goes through :meth:`annotate`, which refuses another node's name,
    or any other annotation, with no request made."""

    def __init__(self, core, name: str):
        if not name or len(name) > 253 or not _NODE_NAME.fullmatch(name):
            raise ValueError(f"the node agent needs its own node's name (NODE_NAME from the downward API, or "
                             f"--node), and {name!r} is not a node name")
        self.core = core
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def annotate(self, node: str, annotations: dict[str, str]) -> None:
        if node != self._name:
            raise NotOwnNode(f"the node agent of {self._name} refused to write node {node!r}: it writes its own "
                             "Node only")
        if set(annotations) != {ANNOTATION_GPU_FREE}:
            raise NotOwnNode(f"the node agent refused to write annotations {sorted(annotations)} on node "
                             f"{self._name}: it writes {ANNOTATION_GPU_FREE} only")
        await self.core.patch_node(self._name, {"metadata": {"annotations": annotations}}, _content_type=MERGE)


class Agent:
    """Watches the kernel pods on one node and the GPUKernels; every ``interval`` reads NVML and reports
    each pod's use and each GPU's free memory; carries out the hibernation moves of its node's kernels.

    ``driver`` is the CUDA checkpoint API (``devices.checkpoint.driver()`` where None), ``memory`` NVML's
    free-memory reading (``devices.nvml.memory()`` where None)."""

    def __init__(self, node: str, api, source, gpus: list[str], proc_root: str = "/proc", metrics=None,
                 min_report: float = 60.0, namespaces: tuple[str, ...] = (), *, driver: checkpoint.Driver | None = None,
                 memory: GPUMemory | None = None, lock_timeout: float = 10.0, checkpoint_before_kill: bool = True):
        from kubernetes_asyncio import client

        self.core = client.CoreV1Api(api)
        self.own_node = OwnNode(self.core, node)  # its only Node writer; refuses a bad name at once
        self.node = node
        self.custom = client.CustomObjectsApi(api)
        self.source = source
        self.gpus = set(gpus)
        self.proc_root = proc_root
        self.metrics = metrics or AgentMetrics()
        self.min_report = min_report
        self.namespaces = tuple(namespaces)
        self.pods: dict[str, dict] = {}  # uid -> pod
        self.kernels: dict[tuple[str, str], dict] = {}  # (namespace, name) -> GPUKernel, those of this node
        self.moves: dict[tuple[str, str], asyncio.Task] = {}  # the move under way of each kernel
        self._kills: set[asyncio.Task] = set()  # precautions under way before pods' kills
        self.precautions: dict[tuple[str, str], asyncio.Task] = {}  # the operator's requests being answered
        self._pods_listed = False  # a kernel's pod absent before the first listing is not yet known, not gone
        self._driver = driver
        self._memory = memory
        self.mover = PodMover(node, self.custom, lambda: self.driver, source, gpus,
                              lambda uid: pids_of_pod(uid, self.proc_root), lock_timeout, checkpoint_before_kill)
        self._reported: dict[str, tuple[dict, float]] = {}
        self._free_reported: tuple[dict[str, int], float] | None = None

    @property
    def driver(self) -> checkpoint.Driver:
        return self._driver if self._driver is not None else checkpoint.driver()

    @property
    def memory(self) -> GPUMemory:
        from ..devices import nvml

        return self._memory if self._memory is not None else nvml.memory()

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
            self._pods_listed = True
            for pod in items:  # a deletion begun while the watch was down is seen only here
                self._if_terminating(pod)
            self.dispatch()
        return replace

    async def _apply(self, event_type: str, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        if event_type == "DELETED":
            self.pods.pop(uid, None)
            self.mover.restored.pop(uid, None)
            self.mover.measured.pop(uid, None)
            return
        self.pods[uid] = pod
        self._if_terminating(pod)

    def _if_terminating(self, pod: dict) -> None:
        """A pod being deleted: the kubelet stops it now, so the processes this agent restored in it are
        checkpointed first (see PodMover.before_kill; once per pod: it forgets them as it starts)."""
        uid = pod["metadata"]["uid"]
        if pod["metadata"].get("deletionTimestamp") and uid in self.mover.restored:
            task = asyncio.create_task(self._before_kill(uid))
            self._kills.add(task)
            task.add_done_callback(self._kills.discard)

    async def _before_kill(self, uid: str) -> None:
        try:
            await self.mover.before_kill(uid, await asyncio.to_thread(pids_of_pod, uid, self.proc_root))
        except Exception:
            log.exception("the checkpoint before the kill of pod %s failed", uid)

    # -- the GPUKernels: the moves of this node's kernels ---------------------------------------

    async def watch_kernels(self) -> None:
        """Keep ``kernels`` current: the GPUKernels whose pod runs on this node (``status.node``), in the
        agent's namespaces; each one the operator set moving gets its move."""
        if not self.namespaces:
            await list_and_watch(self.custom.list_cluster_custom_object, GROUP, VERSION, KERNELS,
                                 replace=self._kernels_replacer(None), apply=self._kernel_event,
                                 what="the GPUKernels")
            return
        await asyncio.gather(*(list_and_watch(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, ns, KERNELS,
            replace=self._kernels_replacer(ns), apply=self._kernel_event, what=f"the GPUKernels in {ns}")
            for ns in self.namespaces))

    def _kernels_replacer(self, namespace: str | None):
        async def replace(items: list[dict]) -> None:
            self.kernels = {k: v for k, v in self.kernels.items() if namespace is not None and k[0] != namespace}
            for item in items:
                await self._kernel_event("ADDED", item)
        return replace

    async def _kernel_event(self, event_type: str, kernel: dict) -> None:
        k = key(kernel)
        if event_type == "DELETED" or status(kernel).get("node") != self.node:
            self.kernels.pop(k, None)
            return
        self.kernels[k] = kernel
        self.dispatch(k)

    def dispatch(self, only: tuple[str, str] | None = None) -> None:
        """Start the move of each kernel of this node whose phase asks for one and has none under way, and
        the answer to each request for the precaution before a kill that has none under way."""
        if not self._pods_listed:
            return
        for k in [only] if only else list(self.kernels):
            kernel = self.kernels.get(k)
            if kernel is not None and status(kernel).get("phase") in MOVES and k not in self.moves:
                self.moves[k] = asyncio.create_task(self._move(k))
            if kernel is not None and _kill_asked(kernel) and k not in self.precautions:
                self.precautions[k] = asyncio.create_task(self._answer_kill(k))

    async def _answer_kill(self, k: tuple[str, str]) -> None:
        try:
            move = self.moves.get(k)
            if move is not None:  # a resume under way: what it restores is what the precaution is for
                await asyncio.wait([move])
            kernel = self.kernels.get(k)
            if kernel is not None and _kill_asked(kernel):
                await self.mover.answer_kill(kernel, list(self.pods.values()))
        except Exception:  # the next event or pass answers again
            log.exception("the checkpoint before the kill of kernel %s/%s failed", *k)
        finally:
            self.precautions.pop(k, None)

    async def _move(self, k: tuple[str, str]) -> None:
        try:
            kernel = self.kernels.get(k)
            if kernel is not None:
                await self.mover.move(kernel, list(self.pods.values()))
                await self.report_free(force=True)
        except Exception as e:  # the next event or pass tries again from the processes' real states
            from aiohttp import ClientError
            from kubernetes_asyncio.client.exceptions import ApiException

            if isinstance(e, (ApiException, ClientError, OSError, TimeoutError)):  # the API server, unreachable
                log.warning("the move of kernel %s/%s is not settled (%s: %s); the next pass tries again",
                            *k, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            else:
                log.exception("the move of kernel %s/%s failed", *k)
        finally:
            self.moves.pop(k, None)

    async def watch(self) -> None:
        """Both watches: this node's kernel pods, and the GPUKernels."""
        await asyncio.gather(self.watch_pods(), self.watch_kernels())

    # -- NVML's free memory, on the Node --------------------------------------------------------

    async def report_free(self, force: bool = False) -> None:
        """Write each GPU's free memory (NVML) on this Node: when one changed by ``FREE_CHANGE`` or
        more, when ``force``d (a move just freed or took some), and at least every ``min_report``
        seconds.  GPUs NVML cannot read are left out; nothing is written where it can read none."""
        from kubernetes_asyncio.client.exceptions import ApiException

        memory = self.memory
        free = {gpu: value for gpu in sorted(self.gpus)
                if (value := await asyncio.to_thread(memory.free, gpu)) is not None}
        if not free:
            return
        now = time.time()
        last = self._free_reported
        if last and not force and now - last[1] < self.min_report and set(last[0]) == set(free) and \
                all(abs(free[g] - last[0][g]) < FREE_CHANGE for g in free):
            return
        value = json.dumps({"devices": free, "sampledAt": now}, sort_keys=True)
        try:
            await self.own_node.annotate(self.node, {ANNOTATION_GPU_FREE: value})
            self._free_reported = (free, now)
        except ApiException as e:
            log.warning("could not write the GPUs' free memory on node %s: %s", self.node, e.reason)

    async def sample_once(self) -> dict[str, PodUsage]:
        self.dispatch()  # level-triggered: a move whose pod was not yet seen, or one a failed pass left
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
        await self.report_free()
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
        watcher = asyncio.create_task(self.watch())
        try:
            await every(interval, self.sample_once, stop or asyncio.Event(), what=f"sampling the GPUs on {self.node}")
        finally:
            watcher.cancel()


def _kill_asked(kernel: dict) -> bool:
    """Whether the operator waits for this agent's precaution before it deletes the kernel's pod."""
    asked = status(kernel).get("killPrecaution") or {}
    return bool(asked.get("pod")) and asked.get("requestedAt") is not None and asked.get("answeredAt") is None


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
    description = ("Reports each kernel pod's GPU memory and utilization on this node (NVML), and hibernates and "
                   "resumes its kernel pods as the operator admits.")

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
    lock_timeout = Seconds(10.0, help="""Seconds a hibernation's lock waits for a kernel's GPU work to finish; a
        kernel still busy then is left running, untouched (the hibernation is refused).""").tag(config=True)
    checkpoint_before_kill = Bool(True, help="""Before a kernel pod this agent resumed is stopped, lock and
        checkpoint its restored processes again: killing a just-restored process hung a host on one driver
        (cuda-checkpoint issue 53). Costs one checkpoint's time at the pod's deletion.""").tag(config=True)
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
                        namespaces=tuple(self.namespaces), lock_timeout=self.lock_timeout,
                        checkpoint_before_kill=self.checkpoint_before_kill).run(self.interval)

        asyncio.run(run())
