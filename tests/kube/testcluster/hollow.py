"""Hollow nodes: GPU nodes whose kubelet marks the pods bound to it Running without running them (the idea
of Kubernetes' kubemark), so that the operator can be driven with hundreds or thousands of kernels on one
machine.

A node listed with ``"hollow": true`` (``hollow_nodes()`` makes any number of them, with GPUs under HAMi's
resource names) gets no process kubelet (``kubelet.py`` leaves its pods alone).  Its hollow kubelet does, in
a real kubelet's order, what the API server and the pod's watchers can see:

- a pod bound to it gets a pod IP (``10.x.y.z``, unique in the cluster), ``hostIP``, ``startTime`` and the
  ``ContainerCreating`` status, then, ``startSeconds`` later (the node's, default 0), phase ``Running`` with
  every condition ``True`` and a running, ready container status; the ``Pulled`` and ``Started`` Events a
  kubelet posts;
- a pod being deleted is stopped: at once (a container that exits on SIGTERM, exit code 143), or, where
  the cluster runs with ``pid1`` (``--pid1``, see ``kubelet.py``: a kernel's process as its container's
  PID 1 ignores SIGTERM), after its whole grace period (exit code 137); its status then says so and the
  pod is removed, as ``kubelet.py`` does;
- a pod force-deleted (grace 0) is forgotten.

Nothing runs, so nothing answers on the pod's address, and no log is kept; images all "pull".  Node
status is written once, when the cluster starts (Ready).
"""

from __future__ import annotations

import asyncio
import logging

from .errors import ApiError
from .events import record_event
from .store import Store, now_rfc3339

log = logging.getLogger("testcluster.hollow")

MERGE = "application/merge-patch+json"


def hollow_nodes(count: int, gpus: int = 8, gpu_memory_mib: int = 81920, split: int = 10,
                 prefix: str = "hollow-node", start_seconds: float = 0.0) -> list[dict]:
    """``count`` hollow GPU nodes (``nodes.json`` entries): ``gpus`` GPUs of ``gpu_memory_mib`` each under
    HAMi (``nvidia.com/gpu``: ``split`` shares per GPU, ``gpumem`` in MiB, ``gpucores`` in percent), 64 CPUs,
    512 GiB, 110 pods (a kubelet's default), tainted ``nvidia.com/gpu`` as the GPU operator taints them."""
    return [{
        "name": f"{prefix}-{i:04d}", "hollow": True, "startSeconds": start_seconds,
        "labels": {"nvidia.com/gpu.product": f"Hollow-GPU-{gpu_memory_mib // 1024}GB",
                   "nvidia.com/gpu.memory": str(gpu_memory_mib), "nvidia.com/gpu.count": str(gpus),
                   "nvidia.com/gpu.present": "true"},
        "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus * split),
                        "nvidia.com/gpumem": str(gpus * gpu_memory_mib), "nvidia.com/gpucores": str(gpus * 100)},
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    } for i in range(count)]


class HollowKubelet:
    """The kubelet of every hollow node of the cluster (one watch of pods for all of them)."""

    def __init__(self, store: Store, nodes: list[dict], pid1: bool = False, node_ip: str = "127.0.0.1"):
        self.store = store
        self.pods = store.kind("", "v1", "pods")
        self.start_seconds = {n["name"]: float(n.get("startSeconds", 0)) for n in nodes}
        self.pid1 = pid1
        self.node_ip = node_ip
        self._started: dict[str, str] = {}  # pod uid -> its IP (a pod this kubelet has started)
        self._stopping: set[str] = set()  # pod uids being stopped
        self._next_ip = 1 << 16  # 10.1.0.0 on
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def nodes(self) -> set[str]:
        return set(self.start_seconds)

    async def run(self) -> None:
        watcher = self.store.watch(self.pods, None, None, None, None, False)
        try:
            while True:
                event = await watcher.queue.get()
                if event is not None:
                    self.observe(event["type"], event["object"])
        finally:
            self.store.unwatch(watcher)
            for timer in self._timers:
                timer.cancel()

    def observe(self, event_type: str, pod: dict) -> None:
        node = pod["spec"].get("nodeName")
        if node not in self.start_seconds:
            return
        uid = pod["metadata"]["uid"]
        if event_type == "DELETED":
            self._started.pop(uid, None)
            self._stopping.discard(uid)
            return
        if pod["metadata"].get("deletionTimestamp"):
            if uid not in self._stopping:
                self._stopping.add(uid)
                grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                self._later(grace if self.pid1 else 0.0, self._stop, pod, 137 if self.pid1 else 143)
            return
        if uid not in self._started and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._started[uid] = self._ip()
            self._create_container(pod)
            self._later(self.start_seconds[node], self._run_container, pod)

    def _later(self, seconds: float, callback, *args) -> None:
        if seconds <= 0:
            callback(*args)
            return
        timer = asyncio.get_running_loop().call_later(seconds, lambda: (self._timers.discard(timer), callback(*args)))
        self._timers.add(timer)

    def _ip(self) -> str:
        n, self._next_ip = self._next_ip, self._next_ip + 1
        return f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"

    def _status(self, pod: dict, status: dict) -> bool:
        meta = pod["metadata"]
        current = self.store.objects.get((self.pods.key, meta["namespace"], meta["name"]))
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return False  # gone (or another pod of that name now)
        try:
            self.store.patch(self.pods, meta["namespace"], meta["name"], MERGE, {"status": status}, "status",
                             validate=False)
        except ApiError as e:
            log.debug("hollow kubelet: status of %s not written: %s", meta["name"], e.message)
            return False
        return True

    def _container(self, pod: dict, state: dict, ready: bool) -> list[dict]:
        c = pod["spec"]["containers"][0]
        return [{"name": c["name"], "image": c.get("image", ""), "imageID": f"hollow://{c.get('image', '')}",
                 "containerID": f"hollow://{pod['metadata']['uid']}", "ready": ready, "started": "running" in state,
                 "restartCount": 0, "state": state}]

    @staticmethod
    def _conditions(ready: bool) -> list[dict]:
        at = now_rfc3339()
        value = "True" if ready else "False"
        return [{"type": t, "status": s, "lastTransitionTime": at} for t, s in (
            ("PodReadyToStartContainers", "True"), ("Initialized", "True"), ("Ready", value),
            ("ContainersReady", value), ("PodScheduled", "True"))]

    def _create_container(self, pod: dict) -> None:
        ip = self._started[pod["metadata"]["uid"]]
        if self._status(pod, {"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": self.node_ip,
                              "hostIPs": [{"ip": self.node_ip}], "startTime": now_rfc3339(),
                              "conditions": self._conditions(False),
                              "containerStatuses": self._container(pod, {"waiting": {"reason": "ContainerCreating"}},
                                                                   False)}):
            image = pod["spec"]["containers"][0].get("image", "")
            record_event(self.store, pod, "Normal", "Pulled", f'Container image "{image}" already present on machine',
                         "kubelet")

    def _run_container(self, pod: dict) -> None:
        if pod["metadata"]["uid"] in self._stopping:
            return
        started = now_rfc3339()
        if self._status(pod, {"phase": "Running", "conditions": self._conditions(True),
                              "containerStatuses": self._container(pod, {"running": {"startedAt": started}}, True)}):
            record_event(self.store, pod, "Normal", "Started",
                         f"Started container {pod['spec']['containers'][0]['name']}", "kubelet")

    def _stop(self, pod: dict, code: int) -> None:
        finished = now_rfc3339()
        if code:
            self._status(pod, {"phase": "Failed", "conditions": self._conditions(False),
                               "containerStatuses": self._container(pod, {"terminated": {
                                   "exitCode": code, "reason": "Error", "startedAt": finished,
                                   "finishedAt": finished}}, False)})
        self.store.finish_pod_deletion(pod)
