"""The operator's controller: it watches, keeps what it hears, and carries out what the pure plan decides.

- Intake (kopf's watches of GPUKernels, GPUQuotas and GPUPoolPolicies; its own watch of each kernels'
  namespace's pods): each event is kept in the cache (``cache.py``) and marks its kernel in the work
  queue (``workqueue.py``), and nothing more: no request, no decision inside a watch loop.  An event no
  newer than what is kept (the answer to the operator's own write, come back) marks nothing, nor does a
  change of the server's heartbeat alone.
- A pass over one kernel (:meth:`Controller.reconcile`, a few at once, never two over one kernel):
  observe (the kernel, its own pods, when its heartbeat last changed, the API server's refusals, for a
  slow start its pod's Events and Node, the quotas and the leases that count for its owner), then the
  pure :func:`.plan.plan`, then carry the plan out (``writes.py``) and look again when it says.
- The admission of a kernel is decided and counted (``Cache.hold``) with no wait in between, so two
  passes never both take the last of a quota, and no lock is held across a write.  Hibernations and
  resumes are decided node by node (``hibernation_admission.py``), under that node's lock.
- The sweep, every ``reconcile_interval``: list kernels and quotas afresh (forgetting what was deleted
  while a watch was down), delete kernel pods whose GPUKernel is gone, and mark every kernel, behind
  every kernel an event marked.

Nothing here logs a Secret or its key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster import resources
from ..cluster.kernels import key, meta, spec, status
from ..cluster.resources import FAILED, GROUP, KERNELS, QUOTAS, VERSION
from ..cluster.watch import list_all, list_and_watch
from . import hibernation_admission as sleep
from .cache import Cache, Intake
from .claims import ClaimTemplates, DeviceFacts
from .diagnosis import claims_unmet, device_shortfall
from .events import Events
from .hibernation import FreeReading
from .metrics import OperatorMetrics
from .plan import (POD, Announce, Count, DeleteKernel, DeletePod, Ensure, Facts, Hibernation, Plan, Write, launch_pod,
                   plan, pod_refused, tells_story)
from .settings import OperatorSettings
from .sharing import DRA
from .story import StartStories
from .validity import Validity
from .workqueue import WorkQueue
from .writes import Foreign, Writer, api_message

log = logging.getLogger("jupyter_gpu_pool.operator")

YIELD_EVERY = 200  # kernels kept from a listing between two turns given to the other tasks
KERNEL_POD_SELECTOR = (f"{resources.LABEL_COMPONENT}={resources.KERNEL_COMPONENT},"
                       f"{resources.LABEL_PART_OF}={resources.PART_OF}")


def together(actions) -> list[tuple]:
    """A plan's actions in steps: the kernel's Secret and NetworkPolicy, one after the other in the plan,
    are made at once (neither needs the other; the pod, which needs both, comes after them), so a start
    waits for three round trips to the API server, not four."""
    steps: list[tuple] = []
    for action in actions:
        if isinstance(action, Ensure) and action.what != POD and steps and \
                all(isinstance(a, Ensure) and a.what != POD for a in steps[-1]):
            steps[-1] += (action,)
        else:
            steps.append((action,))
    return steps


class Controller:
    def __init__(self, settings: OperatorSettings, api: client.ApiClient, metrics: OperatorMetrics | None = None,
                 clock: Callable[[], float] = time.time):
        self.settings = settings
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.metrics = metrics or OperatorMetrics()
        self.clock = clock
        self.cache = Cache(clock, settings.pool.sharing)
        self.queue = WorkQueue(self.reconcile, settings.workers, retry_first=settings.api_retry_first,
                               retry_max=settings.reconcile_interval, failed=self._failed)
        self.writer = Writer(api, self.cache, settings, self.mark)
        self.validity = Validity(self.custom, self.cache, tuple(settings.pool.profiles))
        self.events = Events(self.core, clock)
        self.stories = StartStories(self.core, settings.progress_interval)
        self.claims = ClaimTemplates(settings, client.ResourceV1Api(api), self.events)  # dra
        self.devices = DeviceFacts(client.ResourceV1Api(api), settings.progress_interval)  # dra
        self._nodes: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # hibernation admission, per node
        self._pod_watches: dict[str, asyncio.Task] = {}  # namespace -> its kernel-pod watch
        self._first_listing: asyncio.Task | None = None

    def start(self) -> None:
        """Start the workers (on the running loop)."""
        self.queue.start()

    async def stop(self) -> None:
        tasks = list(self._pod_watches.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.queue.stop()
        await self.validity.stop()

    def _failed(self, k, e: BaseException) -> None:
        self.metrics.errors.inc()
        log.error("reconciling kernel %s/%s failed", *k, exc_info=e)

    # -- intake (from the watches) ----------------------------------------------------------------

    async def kernel_event(self, event_type: str | None, body: dict) -> None:
        k, uid = key(body), meta(body).get("uid")
        if event_type == "DELETED":
            if meta(self.cache.kernels.get(k) or {}).get("uid") in (uid, None):
                self.cache.forget(k, uid)
                self.queue.forget(k)
            self.cache.gone.pop(uid, None)  # no event can come after this one
            return
        self.ensure_pod_watch(k[0])
        if self.cache.remember(body) is Intake.CHANGED:
            self.mark(k)

    async def pod_event(self, event_type: str | None, body: dict) -> None:
        k = self.cache.pod_seen(event_type, body)
        if k is not None:
            self.mark(k)

    def mark(self, k: tuple[str, str]) -> None:
        """Mark a kernel for a pass: one admitted already goes before those still to admit (what finishes a
        start, or serves a running kernel's ask, does not wait behind a class's admissions)."""
        self.queue.add(k, first=bool(status(self.cache.kernels.get(k) or {}).get("admitted")))

    async def quota_event(self, event_type: str | None, body: dict) -> None:
        if self.cache.quota_seen(event_type, body):
            self.validity.quotas_changed()

    async def policy_event(self, event_type: str | None, body: dict) -> None:
        if event_type != "DELETED" and (spec(body).get("reservations") or self.cache.room.sharing.reservations):
            await self._read_nodes_safely()  # a reservation's fit is judged on the nodes as they are
        await self.validity.policy_event(event_type, body)

    async def prepare_namespace(self, namespace: str) -> None:
        """A namespace the operator serves, at start: its kernel-pod watch, and (dra) its claim templates,
        there before the first kernel."""
        self.ensure_pod_watch(namespace)
        if self.settings.sharing.backend == DRA:
            try:
                await self.claims.ensure(namespace)
            except Exception as e:  # the first kernel of the namespace tries again
                log.warning("could not write the ResourceClaimTemplates of namespace %s: %s", namespace, e)

    def ensure_pod_watch(self, namespace: str) -> None:
        """Watch the kernel pods of a namespace that holds kernels (once; only kernel pods: a server-side
        selector)."""
        if namespace and namespace not in self._pod_watches:
            self._pod_watches[namespace] = asyncio.create_task(self.watch_pods(namespace))

    async def watch_pods(self, namespace: str) -> None:
        async def listed(items: list[dict]) -> None:
            self.cache.pods_listed_in(namespace, items)  # until now a kernel's pod was unknown, not known absent
            for k in [k for k in self.cache.kernels if k[0] == namespace]:
                self.mark(k)

        await list_and_watch(self.core.list_namespaced_pod, namespace, label_selector=KERNEL_POD_SELECTOR,
                             replace=listed, apply=self.pod_event, what=f"kernel pods in {namespace}")

    # -- the sweep --------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """List kernels and quotas afresh (forgetting what is gone), delete kernel pods whose GPUKernel is
        gone, and mark every kernel for a pass (orphans, grace periods that ran out, anything missed)."""
        self.claims.look_again()  # dra (someone may have deleted a template)
        try:
            await self.relist()
            await self._delete_orphan_pods()
        except Exception:  # the cluster may blink: reconcile what is known, list again next sweep
            self.metrics.errors.inc()
            log.exception("listing the kernels and quotas failed")
        if self.cache.room.sharing.reservations:
            await self._read_nodes_safely()
        self._prune()
        self.validity.quotas_changed()
        for k in list(self.cache.kernels):  # (marks only: the passes come one by one, after every event's)
            self.queue.add(k, sweep=True)

    async def relist(self) -> None:
        """Kernels and quotas as the API server lists them now.  kopf's watches say nothing of an object
        deleted while a watch was down (after a 410 they list afresh, and what is gone is simply not
        listed), so a kernel or quota kept here but absent from a listing newer than it is forgotten: a
        deleted kernel is not reconciled again, a deleted quota no longer limits anyone."""
        kernels: list[dict] = []
        versions = {}
        for ns in self.settings.namespaces or (None,):
            if ns is None:
                items, rv = await list_all(self.custom.list_cluster_custom_object, GROUP, VERSION, KERNELS)
            else:
                items, rv = await list_all(self.custom.list_namespaced_custom_object, GROUP, VERSION, ns, KERNELS)
            kernels += items
            versions[ns] = int(rv)
        quotas, quotas_rv = await list_all(self.custom.list_cluster_custom_object, GROUP, VERSION, QUOTAS)
        listed = {key(k) for k in kernels}
        for k, kept in list(self.cache.kernels.items()):
            rv = versions.get(None, versions.get(k[0]))
            if rv is not None and k not in listed and int(meta(kept).get("resourceVersion", 0)) <= rv:
                log.info("kernel %s/%s is gone (deleted while a watch was down); forgetting it", *k)
                self.cache.forget(k, meta(kept).get("uid"), gone=True)
        for i, item in enumerate(kernels):
            self.ensure_pod_watch(meta(item)["namespace"])
            if self.cache.remember(item) is Intake.CHANGED:
                self.mark(key(item))
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # thousands of kernels: let the watches and the liveness probe in
        names = {meta(q)["name"] for q in quotas}
        for name, kept in list(self.cache.quotas.items()):
            if name not in names and int(meta(kept).get("resourceVersion", 0)) <= int(quotas_rv):
                log.info("GPUQuota %s is gone (deleted while a watch was down); it limits no one now", name)
                self.cache.quota_seen("DELETED", kept)
        for item in quotas:
            self.cache.quota_seen("MODIFIED", item)
        self.cache.listed = True

    async def _read_nodes_safely(self) -> None:
        """The GPU nodes, whose memory a reservation's room is counted against (``cluster/room.py``): read while
        a reservation is configured, every sweep (nodes come and go rarely; the last listing stands meanwhile)."""
        try:
            nodes = await self.core.list_node()
        except Exception:  # the last listing stands; the next sweep reads them again
            self.metrics.errors.inc()
            log.exception("listing the nodes (the room reservations keep) failed")
            return
        self.cache.room.set_nodes(self.core.api_client.sanitize_for_serialization(nodes).get("items") or [])

    async def _list_everything_once(self) -> None:
        """Read every kernel and quota before the first admission: at start the watches' first events arrive
        object by object, and a kernel admitted before all of them would be counted against quotas not yet
        known, next to kernels not yet seen (one listing, however many passes wait for it)."""
        if self._first_listing is None or (self._first_listing.done() and not self.cache.listed):
            self._first_listing = asyncio.create_task(self.relist())
        await asyncio.shield(self._first_listing)

    async def _delete_orphan_pods(self) -> None:
        """Kernel pods whose GPUKernel is no live one (the garbage collector's work, where it did not do it:
        such a pod would hold its GPU with no kernel to show for it)."""
        for pod in self.cache.orphan_pods(linger=self.settings.reconcile_interval):
            log.warning("pod %s/%s belongs to no live GPUKernel: deleted", meta(pod)["namespace"], meta(pod)["name"])
            await self.writer.delete_pod(pod, None)

    def _prune(self) -> None:
        """Drop what is kept about things that are gone: the Events and Nodes read for start stories (read
        again when needed), pod lists of unknown kernels, deleted kernels' uids once no late event can
        bring them back."""
        now = self.clock()
        self.stories.prune({meta(p).get("uid") for pods in self.cache.pods.values() for p in pods.values()}, now)
        self.devices.prune(now)
        self.cache.prune(linger=max(60.0, 2 * self.settings.reconcile_interval))
        self.writer.prune()

    # -- one kernel's pass: observe, plan, carry out ---------------------------------------------------

    async def reconcile(self, k: tuple[str, str]) -> None:
        try:
            kernel = self.cache.kernels.get(k)
            if kernel is None or meta(kernel).get("deletionTimestamp"):
                return
            facts = await self.observe(kernel)
            if facts is None:
                return
            await self.carry_out(facts.kernel, plan(facts), facts)
        finally:
            self._count_phases()

    async def observe(self, kernel: dict) -> Facts | None:
        """What a plan needs to know of the kernel, read where it is not kept (a slow start's story, dra's
        device facts and claim templates, every kernel before a first admission); the kept part is taken
        last, with no wait before the plan, so an admission counts every other one decided before it."""
        k, now, s = key(kernel), self.clock(), spec(kernel)
        events, node, shortfall, unsupported = (), None, None, None
        profile = self.settings.profile(s.get("profile", ""))
        if profile is not None and status(kernel).get("phase") != FAILED:
            rendering = self.settings.renderings[profile.name]
            _, pod = launch_pod(kernel, self.cache.pods_of(kernel))
            if pod is not None and tells_story(kernel, pod, now, self.settings.progress_interval):
                events, node = await self.stories.read(pod, now)
            if pod is not None and rendering.need is not None and claims_unmet(pod):
                facts = await self.devices.of(rendering.need, now)
                shortfall = device_shortfall(rendering.need, *facts) if facts is not None else None
            if pod is None and rendering.claim is not None:
                await self.claims.ensure(k[0])
                unsupported = self.claims.unsupported.get(profile.name)
            if not status(kernel).get("admitted") and not self.cache.listed:
                await self._list_everything_once()
        kernel = self.cache.kernels.get(k)
        if kernel is None or meta(kernel).get("deletionTimestamp"):
            return None
        pods = dict(self.cache.pods_of(kernel))
        quotas = self.cache.quota_book()
        owner, now = s.get("owner", ""), self.clock()
        shared = self.cache.shared(now) if not status(kernel).get("admitted") and self.cache.room.keeps(now) else None
        return Facts(kernel=kernel, settings=self.settings, now=now, pods=pods, shared=shared,
                     going=frozenset(n for n, p in pods.items() if self.cache.going(p)),
                     pods_listed=k[0] in self.cache.pods_listed, heartbeat_seen=self.cache.heartbeat_seen(k),
                     refusal=self.cache.refused.get(k), events=tuple(events), node=node, shortfall=shortfall,
                     unsupported=unsupported, quotas=quotas,
                     holding=self.cache.holding(owner, quotas.book.groups_of(owner), meta(kernel).get("uid")))

    async def carry_out(self, kernel: dict, decided: Plan, facts: Facts | None = None) -> None:
        """The plan's actions in order; a status write that finds the kernel gone or changed ends it (the
        kernel is then looked at again as it is now)."""
        k = key(kernel)
        if decided.admitted is not None:  # counted from now: no wait since it was decided
            self.cache.hold(kernel, decided.admitted, decided.on)
        try:
            for step in together(decided.actions):
                kernel = await self._step(kernel, step, facts)
                if kernel is None:
                    return
        except BaseException:
            if decided.admitted is not None:
                self.cache.unhold(kernel)
            raise
        if decided.look_again is not None:
            self.queue.later(k, decided.look_again)

    async def _step(self, kernel: dict, step: tuple, facts: Facts | None) -> dict | None:
        """One action, or actions that may run at once; the kernel as it is after them (None: stop here)."""
        if len(step) == 1:
            return await self._act(kernel, step[0], facts)
        after = await asyncio.gather(*(self._act(kernel, action, facts) for action in step))
        return None if any(k is None for k in after) else kernel

    async def _act(self, kernel: dict, action, facts: Facts | None) -> dict | None:
        """One action; the kernel as it is after it (None: stop here)."""
        if isinstance(action, Write):
            return await self.writer.status(kernel, action)
        if isinstance(action, Ensure):
            return await self._ensure(kernel, action, facts)
        if isinstance(action, DeletePod):
            pod = self.cache.pods_of(kernel).get(action.name)
            if pod is not None:
                await self.writer.delete_pod(pod, action.grace)
        elif isinstance(action, DeleteKernel):  # said first: whoever finds the kernel gone can read why
            await self.events.announce(kernel, "Warning", action.reason, action.message)
            if await self.writer.delete_kernel(kernel):
                log.info("kernel %s/%s deleted: %s", *key(kernel), action.reason)
                self.metrics.orphans.inc()
            self.queue.forget(key(kernel))
            return None
        elif isinstance(action, Announce):
            if action.type == "Warning":
                log.warning("kernel %s/%s: %s", *key(kernel), action.message)
            await self.events.announce(kernel, action.type, action.reason, action.message)
        elif isinstance(action, Count):
            self._count(kernel, action)
        elif isinstance(action, Hibernation):
            await self._hibernation(kernel, action.move)
        return kernel

    async def _ensure(self, kernel: dict, action: Ensure, facts: Facts | None) -> dict | None:
        try:
            await self.writer.ensure(kernel, action.what, action.launch)
        except Foreign as e:  # an earlier kernel's pod of this name: its going brings this kernel back
            log.info("kernel %s/%s: %s", *key(kernel), e)
            self.queue.later(key(kernel), self.settings.progress_interval)
            return None
        except ApiException as e:
            if action.what != POD:
                raise
            # The API server refused the pod: back off, its words in the kernel's status.
            seen = Facts(kernel=kernel, settings=self.settings, now=self.clock(),
                         refusal=self.cache.refused.get(key(kernel)))
            refusal, then = pod_refused(seen, api_message(e))
            log.warning("kernel %s/%s: pod refused (%s), trying again in %.0f s: %s", *key(kernel), e.status,
                        refusal.wait, api_message(e))
            self.cache.refused[key(kernel)] = refusal
            await self.carry_out(kernel, then)
            return None
        if action.what == POD:
            self.cache.refused.pop(key(kernel), None)
        return kernel

    def _count(self, kernel: dict, count: Count) -> None:
        if count.metric == "admissions":
            self.metrics.admissions.labels(result=count.label).inc()
            if count.label == "admitted":
                log.info("kernel %s/%s of %s admitted on profile %s", *key(kernel), spec(kernel).get("owner"),
                         spec(kernel).get("profile"))
        elif count.metric == "launch_failures":
            self.metrics.launch_failures.labels(reason=count.label).inc()
        elif count.metric == "start_seconds":
            self.metrics.start_seconds.observe(count.value)

    def _count_phases(self) -> None:
        for phase in resources.PHASES:
            self.metrics.kernels.labels(phase=phase).set(self.cache.phases.get(phase, 0))

    # -- hibernations and resumes: decided node by node ---------------------------------------------

    async def _hibernation(self, kernel: dict, move: str) -> None:
        """A kernel's asked hibernation, or its node's asked resumes (``hibernation_admission.py``), decided
        under the node's lock from its kernels as kept; each write is compare-and-set."""
        node = status(kernel).get("node") or ""
        async with self._nodes[node]:
            if move == "hibernate":
                await self._admit_hibernation(kernel, node)
            else:
                await self._admit_resumes(node)

    async def _admit_hibernation(self, kernel: dict, node: str) -> None:
        node_obj = await self._read_node(node)
        kernel = self.cache.kernels.get(key(kernel), kernel)
        _, pod = launch_pod(kernel, self.cache.pods_of(kernel))
        if pod is None:
            return
        actions = sleep.plan_hibernation(kernel, pod, self.cache.kernels_on(node), node_obj, self.settings,
                                         self.clock())
        await self.carry_out(kernel, Plan(actions))

    def _quota_pass(self, node: str, now: float):
        kernels, quotas = self.cache.kernels_on(node), self.cache.quota_book()
        holding = {meta(k)["uid"]: self.cache.holding(spec(k).get("owner", ""), quotas.book.groups_of(
            spec(k).get("owner", "")), meta(k)["uid"]) for k in kernels}
        shared = None if self.cache.room.decided.plain else self.cache.shared(now)
        return (*sleep.quota_pass(kernels, node, quotas, holding, self.settings, now, shared), shared)

    async def _admit_resumes(self, node: str) -> None:
        fit, hinted, parts, _borrowed, _shared = self._quota_pass(node, self.clock())
        if fit or hinted:  # the room on their GPUs: the agent's reading on the Node
            node_obj = await self._read_node(node)
            reading = FreeReading.parse(((node_obj or {}).get("metadata", {}).get("annotations") or {}).get(
                resources.ANNOTATION_GPU_FREE))
            now = self.clock()
            fit, hinted, parts, borrowed, shared = self._quota_pass(node, now)  # again, as kept now
            parts += sleep.room_pass(fit, hinted, self.cache.kernels_on(node), node, reading, self.settings, now,
                                     shared, borrowed)
        held = set()
        for k, actions, _ in parts:
            if any(isinstance(a, Write) and a.changes.get("phase") == resources.RESUMING for a in actions):
                self.cache.hold(k, status(k).get("admitted") or {})  # its slice counts again from now
                held.add(meta(k)["uid"])
        for k, actions, again in parts:
            await self.carry_out(k, Plan(actions, again, (status(k).get("admitted") or {})
                                         if meta(k)["uid"] in held else None))

    async def _read_node(self, name: str) -> dict | None:
        if not name:
            return None
        try:
            node = await self.core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return self.core.api_client.sanitize_for_serialization(node)
