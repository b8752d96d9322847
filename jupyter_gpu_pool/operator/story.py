"""A starting pod's story: for a pod placed on a node that has not started it yet, its Events and its
Node, which ``diagnosis.diagnose`` turns into the user's words ("Node 'gpu-7' is pulling the kernel
image …: 45 s so far").  Each is read at most once per ``progress_interval`` (per pod, per node), and
a read that fails only makes the story shorter."""

from __future__ import annotations

import logging

from kubernetes_asyncio import client

from ..cluster.kernels import meta
from ..cluster.watch import list_all

log = logging.getLogger("jupyter_gpu_pool.operator")


class StartStories:
    def __init__(self, core: client.CoreV1Api, progress_interval: float):
        self.core = core
        self.progress_interval = progress_interval
        self.events: dict[str, tuple[float, list[dict]]] = {}  # pod uid -> (read at, its Events)
        self.nodes: dict[str, tuple[float, dict | None]] = {}  # node name -> (read at, the Node)

    async def read(self, pod: dict, now: float) -> tuple[list[dict], dict | None]:
        """The pod's Events and its Node; nothing for a pod not placed, or no longer Pending."""
        spec_, st = pod.get("spec") or {}, pod.get("status") or {}
        if st.get("phase") != "Pending" or not spec_.get("nodeName"):
            return [], None
        events: list[dict] = []
        uid = meta(pod)["uid"]
        read_at, cached = self.events.get(uid, (0.0, []))
        if now - read_at < self.progress_interval:
            events = cached
        else:
            try:
                events, _ = await list_all(self.core.list_namespaced_event, meta(pod)["namespace"],
                                           field_selector=f"involvedObject.uid={uid}")
            except Exception as e:  # noqa: BLE001 (a courtesy: the story is shorter without them)
                log.debug("could not read the events of pod %s: %s", meta(pod)["name"], e)
            self.events[uid] = (now, events)
        name = spec_["nodeName"]
        read_at, node = self.nodes.get(name, (0.0, None))
        if now - read_at >= self.progress_interval:
            try:
                node = self.core.api_client.sanitize_for_serialization(await self.core.read_node(name))
            except Exception as e:  # noqa: BLE001
                log.debug("could not read node %s: %s", name, e)
                node = None
            self.nodes[name] = (now, node)
        return events, node

    def prune(self, live_pods: set[str], now: float) -> None:
        """Drop the Events of pods that are gone and Nodes read a ``progress_interval`` ago or more
        (read again when needed)."""
        for uid in [u for u in self.events if u not in live_pods]:
            del self.events[uid]
        for name in [n for n, (at, _) in self.nodes.items() if now - at >= self.progress_interval]:
            del self.nodes[name]
