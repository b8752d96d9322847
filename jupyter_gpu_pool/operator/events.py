"""The operator's Events, in its users' words: on a GPUKernel (``kubectl describe gpukernel``) or on
another object of the kernels' namespace (a ResourceClaimTemplate).  A courtesy: an Event that cannot
be posted never fails a reconcile."""

from __future__ import annotations

import logging
from typing import Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster import resources
from ..cluster.kernels import meta
from ..pool.units import format_rfc3339

log = logging.getLogger("jupyter_gpu_pool.operator")

COMPONENT = "jupyter-gpu-pool-operator"


class Events:
    def __init__(self, core: client.CoreV1Api, clock: Callable[[], float]):
        self.core = core
        self.clock = clock

    async def announce(self, kernel: dict, type_: str, reason: str, message: str) -> None:
        """An Event on the GPUKernel."""
        await self.post(kernel, resources.API_VERSION, resources.KERNEL_KIND, type_, reason, message)

    async def post(self, obj: dict, api_version: str, kind: str, type_: str, reason: str, message: str) -> None:
        """An Event on any object of the kernels' namespace."""
        now = format_rfc3339(self.clock())
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{meta(obj)['name']}.", "namespace": meta(obj)["namespace"]},
                 "involvedObject": {"apiVersion": api_version, "kind": kind,
                                    "name": meta(obj)["name"], "namespace": meta(obj)["namespace"],
                                    "uid": meta(obj)["uid"]},
                 "type": type_, "reason": reason, "message": message[:1000],
                 "source": {"component": COMPONENT},
                 "reportingComponent": COMPONENT, "reportingInstance": COMPONENT,
                 "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            await self.core.create_namespaced_event(meta(obj)["namespace"], event)
        except ApiException as e:  # events are a courtesy: never fail a reconcile over one
            log.debug("could not post an event on %s: %s", meta(obj)["name"], e.reason)
