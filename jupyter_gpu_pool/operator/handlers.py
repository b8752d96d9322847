"""The operator's kopf wiring: kopf's watches of the custom resources feed the controller; the
controller's own watch of kernel pods and one sweep task run beside them.

Only kopf's event handlers are used (``on.event``): they add no finalizers and
store no handler progress on the objects, so deleting a GPUKernel never waits
for the operator (its pod, Secret and NetworkPolicy are owned by it and go with
it through the garbage collector), and the reconcile stays level-triggered.
Kernel pods are not watched through kopf, which filters labels only after the
whole cluster's pods arrive: the controller watches each kernels' namespace
with a server-side label selector (``Controller.watch_pods``).

kopf retries a failed API request along ``settings.networking.error_backoffs``
and, once they run out, lets the error through: the watch of that resource then
stops for good while the operator looks alive.  Its back-offs here never run
out (:class:`EndlessBackoffs`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import kopf

from ..periodic import every
from .controller import Controller
from ..cluster.resources import GROUP, KERNELS, POLICIES, QUOTAS, VERSION

log = logging.getLogger("jupyter_gpu_pool.operator")


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    sweeper: list[asyncio.Task] = []
    stop = asyncio.Event()

    @kopf.on.login(registry=registry)
    async def login(**kwargs):
        return await kopf.login_via_async_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_):
        settings.peering.standalone = True  # one operator replica (the Deployment says so)
        settings.scanning.disabled = True  # no watching of CRDs and namespaces: fewer rights needed
        settings.posting.enabled = False  # the controller posts its own, user-facing events
        settings.batching.batch_window = 0.02  # a kernel start should not wait for more events
        settings.watching.server_timeout = 300
        settings.networking.error_backoffs = EndlessBackoffs(controller.settings.api_retry_first,
                                                             controller.settings.api_retry_max)
        controller.start()
        sweeper.append(asyncio.create_task(every(controller.settings.reconcile_interval, controller.sweep, stop,
                                                 what="the operator's sweep over every kernel")))
        for namespace in controller.settings.namespaces:
            sweeper.append(asyncio.create_task(controller.prepare_namespace(namespace)))
        freeze_what_lasts()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_):
        stop.set()
        for task in sweeper:
            task.cancel()
        await controller.stop()

    @kopf.on.event(GROUP, VERSION, KERNELS, registry=registry)
    async def kernel(event, **_):
        await controller.kernel_event(event.get("type"), dict(event["object"]))

    @kopf.on.event(GROUP, VERSION, QUOTAS, registry=registry)
    async def quota(event, **_):
        await controller.quota_event(event.get("type"), dict(event["object"]))

    @kopf.on.event(GROUP, VERSION, POLICIES, registry=registry)
    async def policy(event, **_):
        await controller.policy_event(event.get("type"), dict(event["object"]))

    return registry


YOUNG_OBJECTS = 20_000  # allocations between two collections of the youngest generation (CPython: 700)


def freeze_what_lasts() -> None:
    """Keep the garbage collector's full collections short and rare: each holds the event loop while it
    walks every object it tracks.  What is made by now (modules, classes, kopf's and the API client's
    machinery: some 200,000 objects, as long-lived as the process) is moved out of its sight, so a full
    collection walks only what the operator keeps of the cluster (about 50 objects a kernel); and the
    youngest generation is collected every ``YOUNG_OBJECTS`` allocations, not 700, so what a watch event
    or a listing's page makes and drops (most of what the operator allocates) dies before it is promoted
    towards a full collection.  Called once, at start, after a collection, so no garbage is frozen."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, middle, old)


class EndlessBackoffs:
    """kopf's ``networking.error_backoffs`` that never run out: ``first``, doubling up to ``cap``, then
    ``cap`` for as long as a request fails.  An iterable without a length (kopf then counts no last
    attempt); each request iterates it afresh, so one request's failures do not lengthen another's."""

    def __init__(self, first: float, cap: float):
        self.first, self.cap = first, max(cap, first)

    def __iter__(self) -> Iterator[float]:
        wait = self.first
        while True:
            yield wait
            wait = min(wait * 2, self.cap)
