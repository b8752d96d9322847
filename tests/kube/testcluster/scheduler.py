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
    def __init__(self, store: Store, spread: bool = False):
        self.store = store
        self.spread = spread
        self.pods = store.kind("", "v1", "pods")
        self.nodes = store.kind("", "v1", "nodes")
        self.allocator = Allocator(store)
        self._reported: dict[str, str] = {}  # pod uid -> last Unschedulable message
        self._pending: dict[str, dict] = {}  # pod uid -> the pod (as stored), waiting for a node
        self._placed: dict[str, tuple[str, dict[str, Fraction]]] = {}  # pod uid -> (node, its requests)
        self._used: dict[str, Counter] = {}  # node name -> what its pods request
        self._seen: dict[str, int] = {}  # pod uid -> the resourceVersion the cache holds
        self._allocatable: dict[str, tuple[str, dict[str, Fraction]]] = {}  # node -> (resourceVersion, allocatable)

    # -- the cache --------------------------------------------------------------------------------

    def observe(self, event_type: str, pod: dict) -> None:
        """One pod event (ignored when the cache holds a newer version of the pod)."""
        meta = pod["metadata"]
        uid, rv = meta["uid"], int(meta["resourceVersion"])
        if event_type != "DELETED" and rv < self._seen.get(uid, 0):
            return
        self._unplace(uid)
        self._pending.pop(uid, None)
        if event_type == "DELETED":
            self._seen.pop(uid, None)
            self._reported.pop(uid, None)
            return
        self._seen[uid] = rv
        if pod.get("status", {}).get("phase") in TERMINAL:
            return
        if pod["spec"].get("nodeName"):
            self._place(uid, pod["spec"]["nodeName"], pod_requests(pod))
        elif not meta.get("deletionTimestamp"):
            self._pending[uid] = pod

    def _place(self, uid: str, node: str, requests: dict[str, Fraction]) -> None:
        self._placed[uid] = (node, requests)
        used = self._used.setdefault(node, Counter())
        for name, value in requests.items():
            used[name] += value

    def _unplace(self, uid: str) -> None:
        placed = self._placed.pop(uid, None)
        if placed is not None:
            used = self._used[placed[0]]
            for name, value in placed[1].items():
                used[name] -= value

    def _free(self, node: dict) -> dict[str, Fraction]:
        name, rv = node["metadata"]["name"], node["metadata"]["resourceVersion"]
        held = self._allocatable.get(name)
        if held is None or held[0] != rv:
            held = self._allocatable[name] = (rv, {k: parse_quantity(v) for k, v in
                                                   (node.get("status", {}).get("allocatable") or {}).items()})
        used = self._used.get(name) or {}
        return {k: v - used.get(k, 0) for k, v in held[1].items()}

    # -- deciding ---------------------------------------------------------------------------------

    def _why_not(self, pod: dict, requests: dict[str, Fraction], node: dict, free: dict[str, Fraction]) -> list[str]:
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
        for name, value in sorted(requests.items()):
            if value > free.get(name, Fraction(0)):
                reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
        return reasons

    def _candidates(self, nodes: list[dict]) -> list[dict]:
        """The nodes in the order they are tried: by name, or (spread) the fewest pods first."""
        if not self.spread:
            return nodes
        return sorted(nodes, key=lambda n: ((self._used.get(n["metadata"]["name"]) or {}).get("pods", 0),
                                            n["metadata"]["name"]))

    def schedule_once(self) -> None:
        nodes = self.store.scan(self.nodes)
        for pod in sorted(self._pending.values(), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
            claims = None
            if pod["spec"].get("resourceClaims"):
                claims = self.allocator.claims_of(pod)
                if claims is None:
                    continue  # not schedulable before its claims exist (as the real scheduler gates it)
            reasons: Counter = Counter()
            chosen, allocations, requests = None, [], pod_requests(pod)
            for node in self._candidates(nodes):
                why = self._why_not(pod, requests, node, self._free(node))
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
                    self.observe("MODIFIED", self._bind(pod, chosen))  # counts against the node for the next pod
                else:
                    self._unschedulable(pod, len(nodes), reasons)
            except ApiError as e:  # deleted meanwhile
                log.debug("could not schedule %s: %s", pod["metadata"]["name"], e.message)

    def _bind(self, pod: dict, node: dict) -> dict:
        meta, node_name = pod["metadata"], node["metadata"]["name"]
        self.store.patch(self.pods, meta["namespace"], meta["name"], "application/merge-patch+json",
                         {"spec": {"nodeName": node_name}}, validate=False)
        bound = self.store.patch(self.pods, meta["namespace"], meta["name"], "application/merge-patch+json",
                                 {"status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                                             "lastTransitionTime": now_rfc3339()}]}}, "status",
                                 validate=False)
        self._reported.pop(meta["uid"], None)
        record_event(self.store, pod, "Normal", "Scheduled",
                     f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}", "default-scheduler")
        return bound

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
                             "message": message, "lastTransitionTime": now_rfc3339()}]}}, "status", validate=False)
        record_event(self.store, pod, "Warning", "FailedScheduling", message, "default-scheduler")

    async def run(self) -> None:
        """Schedule on every pod or node change, and retry the pending ones every second."""
        pods = self.store.watch(self.pods, None, None, None, None, False)
        nodes = self.store.watch(self.nodes, None, None, None, None, False)
        try:
            while True:
                self._drain(pods, nodes)
                self.schedule_once()
                getters = {asyncio.ensure_future(w.queue.get()): w for w in (pods, nodes)}
                done, waiting = await asyncio.wait(getters, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                for g in waiting:
                    g.cancel()
                for g in done:
                    event = g.result()
                    if event is not None and getters[g] is pods:
                        self.observe(event["type"], event["object"])
        finally:
            self.store.unwatch(pods)
            self.store.unwatch(nodes)

    def _drain(self, pods, nodes) -> None:
        while not pods.queue.empty():
            event = pods.queue.get_nowait()
            if event is not None:
                self.observe(event["type"], event["object"])
        while not nodes.queue.empty():
            nodes.queue.get_nowait()
