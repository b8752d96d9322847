"""A scheduler for the test cluster: binds pending pods to nodes whose free resources fit.

It sums the pods' requests per resource (a missing request defaults to the
limit, as for extended resources such as ``nvidia.com/gpu``) against each node's
``status.allocatable``, honours ``nodeSelector`` and ``NoSchedule`` taints, and
otherwise writes ``PodScheduled=False, reason=Unschedulable`` with a message in
the real scheduler's words (``0/2 nodes are available: 2 Insufficient
nvidia.com/gpumem. ...``) plus a ``FailedScheduling`` event.  Device plugins'
finer rules (HAMi's per-GPU memory, MIG placement) are not modelled: a node's
extended resources are one pool each.  Pods that claim devices (Dynamic Resource
Allocation) wait until their claims exist, and bind only where every claim can be
allocated (``dra.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from fractions import Fraction

from .dra import Allocator, Unsatisfiable
from .errors import ApiError
from .events import record_event
from .quantities import parse_quantity
from .store import Store, now_rfc3339

log = logging.getLogger("testcluster.scheduler")

TERMINAL = ("Succeeded", "Failed")


def pod_requests(pod: dict) -> dict[str, Fraction]:
    total: Counter = Counter()
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}
        for name, value in requests.items():
            total[name] += parse_quantity(value)
    total["pods"] += 1
    return dict(total)


def _tolerates(pod: dict, taint: dict) -> bool:
    for t in pod["spec"].get("tolerations") or []:
        key_ok = t.get("key") == taint.get("key") or (not t.get("key") and t.get("operator") == "Exists")
        value_ok = t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")
        effect_ok = not t.get("effect") or t.get("effect") == taint.get("effect")
        if key_ok and value_ok and effect_ok:
            return True
    return False


class Scheduler:
    def __init__(self, store: Store):
        self.store = store
        self.pods = store.kind("", "v1", "pods")
        self.nodes = store.kind("", "v1", "nodes")
        self.allocator = Allocator(store)
        self._reported: dict[str, str] = {}  # pod uid -> last Unschedulable message

    def _free(self, node: dict, pods: list[dict]) -> dict[str, Fraction]:
        free = {k: parse_quantity(v) for k, v in (node.get("status", {}).get("allocatable") or {}).items()}
        for pod in pods:
            if pod["spec"].get("nodeName") == node["metadata"]["name"] and \
                    pod.get("status", {}).get("phase") not in TERMINAL:
                for name, value in pod_requests(pod).items():
                    free[name] = free.get(name, Fraction(0)) - value
        return free

    def _why_not(self, pod: dict, node: dict, free: dict[str, Fraction]) -> list[str]:
        if node.get("spec", {}).get("unschedulable"):
            return ["node(s) were unschedulable"]
        labels = node["metadata"].get("labels") or {}
        selector = pod["spec"].get("nodeSelector") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            return ["node(s) didn't match Pod's node affinity/selector"]
        for taint in node.get("spec", {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, taint):
                return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
        reasons = []
        for name, value in sorted(pod_requests(pod).items()):
            if value > free.get(name, Fraction(0)):
                reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
        return reasons

    def schedule_once(self) -> None:
        pods, _ = self.store.list(self.pods, None)
        nodes, _ = self.store.list(self.nodes, None)
        for pod in pods:
            meta = pod["metadata"]
            if pod["spec"].get("nodeName") or meta.get("deletionTimestamp") or \
                    pod.get("status", {}).get("phase") in TERMINAL:
                continue
            claims = None
            if pod["spec"].get("resourceClaims"):
                claims = self.allocator.claims_of(pod)
                if claims is None:
                    continue  # not schedulable before its claims exist (as the real scheduler gates it)
            reasons: Counter = Counter()
            chosen, allocations = None, []
            for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
                why = self._why_not(pod, node, self._free(node, pods))
                if not why and claims is not None:
                    try:
                        allocations = self.allocator.allocate(pod, claims, node["metadata"]["name"])
                    except Unsatisfiable as e:
                        why = [str(e)]
                if not why:
                    chosen = node
                    break
                reasons.update(why)
            try:
                if chosen is not None:
                    self.allocator.commit(allocations)
                    self._bind(pod, chosen)
                    pod["spec"]["nodeName"] = chosen["metadata"]["name"]  # counts against the node for the next pod
                else:
                    self._unschedulable(pod, len(nodes), reasons)
            except ApiError as e:  # deleted meanwhile
                log.debug("could not schedule %s: %s", meta["name"], e.message)

    def _bind(self, pod: dict, node: dict) -> None:
        meta, node_name = pod["metadata"], node["metadata"]["name"]
        self.store.patch(self.pods, meta["namespace"], meta["name"], "application/merge-patch+json",
                         {"spec": {"nodeName": node_name}})
        self.store.patch(self.pods, meta["namespace"], meta["name"], "application/merge-patch+json",
                         {"status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                                     "lastTransitionTime": now_rfc3339()}]}}, "status")
        self._reported.pop(meta["uid"], None)
        record_event(self.store, pod, "Normal", "Scheduled",
                     f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}", "default-scheduler")

    def _unschedulable(self, pod: dict, node_count: int, reasons: Counter) -> None:
        meta = pod["metadata"]
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = (f"0/{node_count} nodes are available: {detail or 'no nodes registered'}. preemption: "
                   f"0/{node_count} nodes are available: {node_count} No preemption victims found for incoming pod.")
        if self._reported.get(meta["uid"]) == message:
            return
        self._reported[meta["uid"]] = message
        self.store.patch(self.pods, meta["namespace"], meta["name"], "application/merge-patch+json",
                         {"status": {"phase": "Pending", "conditions": [{
                             "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": message, "lastTransitionTime": now_rfc3339()}]}}, "status")
        record_event(self.store, pod, "Warning", "FailedScheduling", message, "default-scheduler")

    async def run(self) -> None:
        """Schedule on every pod or node change, and retry the pending ones every second."""
        wake_pods = self.store.watch(self.pods, None, None, None, None, False)
        wake_nodes = self.store.watch(self.nodes, None, None, None, None, False)
        try:
            while True:
                self.schedule_once()
                getters = [asyncio.ensure_future(w.queue.get()) for w in (wake_pods, wake_nodes)]
                await asyncio.wait(getters, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                for g in getters:
                    g.cancel()
                for w in (wake_pods, wake_nodes):
                    while not w.queue.empty():
                        w.queue.get_nowait()
        finally:
            self.store.unwatch(wake_pods)
            self.store.unwatch(wake_nodes)
