"""The operator's reconcile logic, level-triggered: make a kernel's world match its GPUKernel.

For each kernel, on every change to it or its pod, and on a sweep every
``reconcile_interval``:

1. a kernel whose server stopped renewing its heartbeat is deleted (its pod,
   Secret and NetworkPolicy go with it: they are owned by the kernel);
2. a new kernel is admitted against quotas, under one lock for the whole
   operator so that two kernels never both take the last of a quota;
3. its Secret (the connection key) and NetworkPolicy exist;
4. the pod of the wanted launch runs (pods of other launches are deleted;
   ``spec.stopped`` stops it);
5. ``status`` says what the pod is doing, in the user's words.

The controller keeps the kernels, pods and quotas it was told about (kopf's
watches feed it, see ``handlers.py``) and writes through ``kubernetes_asyncio``.
A starting pod's story is read by ``story.py``, Events are posted by
``events.py``, and (dra) the claim templates and device facts are ``claims.py``'s.
Nothing here logs a Secret or its key.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Awaitable, Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..pool import PoolError, QuotaExceeded
from ..pool.rules import PolicyError, parse_policy
from ..cluster import resources
from ..cluster.quotas import read_quotas
from ..cluster.resources import claim_template_name
from ..cluster.watch import list_all, list_and_watch
from . import admission
from ..cluster.resources import (DESIRED_HIBERNATED, DESIRED_RUNNING, FAILED, GROUP, HIBERNATED, HIBERNATING, KERNELS,
                                 POLICIES, QUOTAS, RESUMING, RUNNING, STARTING, STOPPED, VERSION)
from . import hibernation as moves
from ..cluster.hibernation import HOST_MEMORY, NODE_CAP, UNSUPPORTED
from .claims import ClaimTemplates, DeviceFacts
from .diagnosis import claims_unmet, device_shortfall, diagnose
from ..cluster.kernels import desired, gpu_devices, hibernation, key, meta, spec, status
from .events import Events
from .manifests import new_curve_keys, new_key, render_network_policy, render_pod, render_secret
from .metrics import OperatorMetrics
from .sharing import DRA, quantity_value
from .settings import OperatorSettings
from .story import StartStories

log = logging.getLogger("jupyter_gpu_pool.operator")

MERGE = "application/merge-patch+json"
KERNEL_POD_SELECTOR = (f"{resources.LABEL_COMPONENT}={resources.KERNEL_COMPONENT},"
                       f"{resources.LABEL_PART_OF}={resources.PART_OF}")
Announce = Callable[[dict, str, str, str], Awaitable[None]]
MOVING = (HIBERNATING, HIBERNATED, RESUMING)  # the kernel's GPU memory is (going) in host memory: the agent's


def _hibernation_in_play(kernel: dict) -> bool:
    """Whether the kernel's status has writers beside the operator: once its server has asked for a state
    (spec.desiredState), the node agent settles its moves and the server may ask again at any time, so the
    operator's status writes are compare-and-set.  A kernel never asked has one writer of its phase (the
    agent's usage report is a field of its own), and keeps the plain merge patch."""
    return "desiredState" in spec(kernel) or status(kernel).get("phase") in MOVING


@dataclass(frozen=True)
class Refusal:
    """The API server refused a kernel's pod: for which launch, the wait before the next try, and when."""
    launch: int
    wait: float
    retry_at: float


def _node_memory(node: dict) -> int | None:
    """A Node's allocatable memory in bytes (None where it does not say)."""
    value = quantity_value(((node.get("status") or {}).get("allocatable") or {}).get("memory", ""))
    return int(value) if value else None


def _api_message(e: ApiException) -> str:
    """The API server's own words of a refusal (its Status's message), else its HTTP reason."""
    try:
        said = json.loads(e.body or "{}").get("message") or ""
    except (ValueError, AttributeError):
        said = ""
    said = said or f"{e.status} {e.reason}"
    return said if said.endswith(".") else said + "."


class Controller:
    def __init__(self, settings: OperatorSettings, api: client.ApiClient, metrics: OperatorMetrics | None = None,
                 clock: Callable[[], float] = time.time):
        self.settings = settings
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.net = client.NetworkingV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.metrics = metrics or OperatorMetrics()
        self.clock = clock
        self.kernels: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
        self.quotas: dict[str, dict] = {}
        self.policies: dict[str, dict] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._admission = asyncio.Lock()
        self._heartbeats: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._secrets: set[str] = set()  # kernel uids whose Secret exists
        self._policies_made: set[str] = set()
        self._listed = False  # whether admission has read every kernel and quota once
        self._gone: dict[str, float] = {}  # uid -> when: kernels deleted or found gone (late events must not revive them)
        self._rechecks: dict[tuple[str, str], asyncio.Task] = {}  # starting kernels, looked at again soon
        self._pod_watches: dict[str, asyncio.Task] = {}  # namespace -> its kernel-pod watch
        self._pods_listed: set[str] = set()  # namespaces whose kernel pods have been listed once
        self.events = Events(self.core, clock)
        self.stories = StartStories(self.core, settings.progress_interval)
        self.claims = ClaimTemplates(settings, self.resource, self.events)  # dra
        self.devices = DeviceFacts(self.resource, settings.progress_interval)  # dra
        self._refused: dict[tuple[str, str], Refusal] = {}  # kernels whose pod the API server refused: back off

    # -- intake (from the watches) ----------------------------------------------------------------

    async def kernel_event(self, event_type: str | None, body: dict) -> None:
        k = key(body)
        if event_type == "DELETED":
            self._forget(k, meta(body).get("uid"))
            self._gone.pop(meta(body).get("uid"), None)
            return
        if meta(body).get("uid") in self._gone:
            return  # deleted by this operator; the watch has not said so yet
        self.ensure_pod_watch(k[0])
        self._remember(body)
        await self.reconcile(k)

    def _forget(self, k: tuple[str, str], uid: str | None) -> None:
        self.kernels.pop(k, None)
        self.pods.pop(k, None)
        self._heartbeats.pop(k, None)
        self._locks.pop(k, None)
        self._secrets.discard(uid)
        self._policies_made.discard(uid)
        self._refused.pop(k, None)
        recheck = self._rechecks.pop(k, None)
        if recheck is not None and recheck is not asyncio.current_task():
            recheck.cancel()
        self._count_phases()

    async def prepare_namespace(self, namespace: str) -> None:
        """A namespace the operator serves, at start: its kernel-pod watch, and (dra) its claim templates,
        there before the first kernel."""
        self.ensure_pod_watch(namespace)
        if self.settings.sharing.backend == DRA:
            try:
                await self.claims.ensure(namespace)
            except Exception as e:  # the first kernel of the namespace tries again
                log.warning("could not write the ResourceClaimTemplates of namespace %s: %s", namespace, e)

    # -- the kernel pods' watch: only the kernels' namespaces, only kernel pods (a server-side selector) --

    def ensure_pod_watch(self, namespace: str) -> None:
        """Watch the kernel pods of a namespace that holds kernels (once)."""
        if namespace and namespace not in self._pod_watches:
            self._pod_watches[namespace] = asyncio.create_task(self.watch_pods(namespace))

    async def watch_pods(self, namespace: str) -> None:
        async def listed(items: list[dict]) -> None:
            current = {meta(p)["name"] for p in items}
            for k, pods in list(self.pods.items()):
                for name, pod in list(pods.items()):
                    if k[0] == namespace and name not in current:
                        await self.pod_event("DELETED", pod)
            for pod in items:
                await self.pod_event("MODIFIED", pod)
            if namespace not in self._pods_listed:  # until now a kernel's pod was unknown, not known absent
                self._pods_listed.add(namespace)
                for k in [k for k in self.kernels if k[0] == namespace]:
                    await self.reconcile(k)

        await list_and_watch(self.core.list_namespaced_pod, namespace, label_selector=KERNEL_POD_SELECTOR,
                             replace=listed, apply=self.pod_event, what=f"kernel pods in {namespace}")

    async def stop(self) -> None:
        tasks = [*self._pod_watches.values(), *self._rechecks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def pod_event(self, event_type: str | None, body: dict) -> None:
        kernel_name = (meta(body).get("labels") or {}).get(resources.LABEL_KERNEL)
        if not kernel_name:
            return
        k = (meta(body)["namespace"], kernel_name)
        if any(ref.get("uid") in self._gone for ref in meta(body).get("ownerReferences") or []):
            return  # a deleted kernel's pod, on its way out
        if event_type == "DELETED":
            self.pods[k].pop(meta(body)["name"], None)
        else:
            self.pods[k][meta(body)["name"]] = body
        if k in self.kernels:
            await self.reconcile(k)

    async def quota_event(self, event_type: str | None, body: dict) -> None:
        if event_type == "DELETED":
            self.quotas.pop(meta(body)["name"], None)
        else:
            self.quotas[meta(body)["name"]] = body
        await self._check_quotas()

    async def _check_quotas(self) -> None:
        """Each GPUQuota's status says whether it parses (one quota's problem can be another's: two that
        set the same subject)."""
        quotas = read_quotas(list(self.quotas.values()))
        for name, obj in list(self.quotas.items()):
            problem = quotas.problems.get(name)
            await self._object_status(QUOTAS, obj, {"valid": problem is None, "message": problem or ""})

    async def policy_event(self, event_type: str | None, body: dict) -> None:
        if event_type == "DELETED":
            self.policies.pop(meta(body)["name"], None)
            return
        self.policies[meta(body)["name"]] = body
        try:
            parse_policy(spec(body).get("rules") or [], bool(spec(body).get("dryRun", False)),
                         tuple(self.settings.pool.profiles))
            problem = None
        except PolicyError as e:
            problem = f"rules{e}" if str(e).startswith("[") else str(e)
        await self._object_status(POLICIES, body, {"valid": problem is None, "message": problem or ""})

    async def _object_status(self, plural: str, obj: dict, wanted: dict) -> None:
        if all(status(obj).get(k) == v for k, v in wanted.items()):
            return
        try:
            await self.custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, meta(obj)["name"],
                                                                 {"status": wanted}, _content_type=MERGE)
        except ApiException as e:
            if e.status != 404:
                raise

    def _remember(self, body: dict) -> None:
        if meta(body).get("uid") in self._gone:
            return
        k = key(body)
        old = self.kernels.get(k)
        if old is None or int(meta(body).get("resourceVersion", 0)) >= int(meta(old).get("resourceVersion", 0)):
            self.kernels[k] = body

    async def sweep(self) -> None:
        """List kernels and quotas afresh (forgetting what is gone), then reconcile every kernel (orphans,
        pods that vanished, grace periods that ran out)."""
        self.claims.look_again()  # dra (someone may have deleted a template)
        try:
            await self.relist()
        except Exception:  # the cluster may blink: reconcile what is known, list again next sweep
            self.metrics.errors.inc()
            log.exception("listing the kernels and quotas failed")
        self._prune()
        for k in list(self.kernels):
            try:
                await self.reconcile(k)
            except Exception:
                self.metrics.errors.inc()
                log.exception("reconciling kernel %s/%s failed", *k)

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, k: tuple[str, str]) -> None:
        async with self._locks[k]:
            kernel = self.kernels.get(k)
            if kernel is None or meta(kernel).get("deletionTimestamp"):
                return
            try:
                await self._reconcile(kernel)
            finally:
                self._count_phases()

    async def _reconcile(self, kernel: dict) -> None:
        k, s, now = key(kernel), spec(kernel), self.clock()
        if self._orphaned(kernel, now):
            await self._delete_kernel(kernel, resources.SERVER_GONE,
                                      f"Its server stopped renewing the heartbeat for over "
                                      f"{self.settings.heartbeat_timeout:.0f}s: the kernel was deleted.")
            return
        if status(kernel).get("phase") == FAILED:
            await self._delete_pods(kernel, keep=None, grace=0)
            return
        profile = self.settings.profile(s.get("profile", ""))
        if profile is None:
            known = ", ".join(sorted(self.settings.pool.profiles))
            await self._fail(kernel, resources.INVALID, f"There is no GPU profile named {s.get('profile')!r}. "
                             f"The profiles are: {known}. Pick one of these, or ask your admin to add it.")
            return
        image = s.get("image") or self.settings.kernel_image
        if not any(fnmatch.fnmatchcase(image, p) for p in self.settings.allowed_images):
            await self._fail(kernel, resources.INVALID, f"The kernel image {image!r} is not one the admin allows "
                             f"({', '.join(self.settings.allowed_images)}).")
            return
        rendering = self.settings.renderings[profile.name]
        if not status(kernel).get("admitted"):
            kernel = await self._admit(kernel, profile.name, rendering, now)
            if kernel is None:
                return
        launch = int(s["launch"])
        wanted = resources.pod_name(meta(kernel)["name"], launch)
        stop_grace = int(s.get("stopGraceSeconds", 10))
        await self._delete_pods(kernel, keep=wanted, grace=stop_grace, now=now)
        pod = self.pods[k].get(wanted)
        if s.get("stopped"):
            if pod is not None and not meta(pod).get("deletionTimestamp") and \
                    (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                if not await self._safe_to_kill(kernel, pod, now):
                    return  # the node agent's answer (or the timeout) brings this kernel back here
                await self._delete_pod(pod, stop_grace)
            await self._set_status(kernel, {"phase": STOPPED, "reason": "Stopped", "launch": launch,
                                            "message": "The kernel was stopped by its server."})
            return
        if pod is None:
            if k[0] not in self._pods_listed:
                return  # the operator just started: its pods' listing reconciles this kernel again
            st = status(kernel)
            if st.get("launch") == launch and st.get("phase") == STOPPED:
                return  # this launch ran and ended; a new launch needs spec.launch + 1
            if st.get("launch") == launch and st.get("phase") in MOVING:
                await self._lost(kernel, "its pod was deleted")  # a new pod would be a new, empty kernel
                return
            refused = self._refused.get(k)
            if refused is not None and refused.launch != launch:
                del self._refused[k]  # a new launch starts afresh
                refused = None
            if refused is not None and now < refused.retry_at:
                self._check_again(k, refused.retry_at - now)  # the API server refused it: not before then
                return
            # The status first: a kernel deleted unseen answers 404 here, before anything is made for it.
            # startedAt once per launch, and a refusal's words kept while it is tried again: a write that
            # changes nothing is not made, so its watch event cannot bring this kernel back here at once.
            starting = {"phase": STARTING, "launch": launch, "pod": wanted, "podIP": None, "node": None,
                        "exitCode": None, "runningAt": None}
            if refused is None:
                starting.update(reason="", message=f"Starting on {rendering.description}.")
            if st.get("launch") != launch or not st.get("startedAt") or st.get("phase") != STARTING:
                starting["startedAt"] = now
            kernel = await self._set_status(kernel, starting, always=True)
            if kernel is None:
                return
            if rendering.claim is not None:
                await self.claims.ensure(k[0])
                if profile.name in self.claims.unsupported:
                    await self._fail(kernel, resources.UNSUPPORTED, self.claims.unsupported[profile.name])
                    return
            await self._ensure_secret_and_policy(kernel)
            try:
                await self._create_pod(kernel, rendering, image, launch)
            except ApiException as e:
                await self._pod_refused(kernel, launch, e, now)
                return
            self._refused.pop(k, None)
            self._check_again(k)
            return
        events, node = await self.stories.read(pod, now)
        shortfall = None
        if rendering.need is not None and claims_unmet(pod):
            facts = await self.devices.of(rendering.need, now)
            shortfall = device_shortfall(rendering.need, *facts) if facts is not None else None
        verdict = diagnose(pod, profile.name, rendering.description, now, self.settings.unschedulable_grace,
                           events, node, rendering.need, shortfall)
        pod_status = pod.get("status") or {}
        phase_now = status(kernel).get("phase")
        if phase_now in MOVING:
            if verdict.phase != RUNNING:  # the process that held the kernel's memory is gone with its pod
                await self._lost(kernel, verdict.message.rstrip("."))
                await self._delete_pod(pod, 0)
                return
            await self._hibernation(kernel, pod, now)  # the phase is the agent's and the operator's admission's
            return
        update = {"phase": verdict.phase, "reason": verdict.reason, "message": verdict.message, "launch": launch,
                  "pod": meta(pod)["name"], "podIP": pod_status.get("podIP"), "node": pod.get("spec", {}).get("nodeName"),
                  "exitCode": verdict.exit_code}
        if verdict.phase == RUNNING and phase_now == RUNNING and \
                status(kernel).get("reason") in (resources.HIBERNATION_REFUSED, resources.HIBERNATION_FAILED):
            del update["reason"], update["message"]  # the words stay until the server reads them
        if verdict.phase == RUNNING and status(kernel).get("phase") != RUNNING:
            update["runningAt"] = now
            started = status(kernel).get("startedAt")
            if started:
                self.metrics.start_seconds.observe(max(now - started, 0))
        kernel = await self._set_status(kernel, update)
        if kernel is None:
            return
        if verdict.phase == RUNNING:
            await self._hibernation(kernel, pod, now)
        if verdict.phase == STARTING:
            self._check_again(k)  # its message says how long, and why: keep the numbers true
        if verdict.phase == FAILED:
            self.metrics.launch_failures.labels(reason=verdict.reason).inc()
            await self.events.announce(kernel, "Warning", verdict.reason, verdict.message)
            await self._delete_pod(pod, 0)

    # -- hibernation (docs/kubernetes.md): the server asks, the operator admits, the node agent moves --------

    async def _hibernation(self, kernel: dict, pod: dict, now: float) -> None:
        """Act on spec.desiredState of a kernel whose pod runs: admit a hibernation (Running -> Hibernating)
        or a resume (Hibernated -> Resuming, or a place in its node's queue).  Hibernating -> Hibernated and
        Resuming -> Running are the node agent's."""
        phase, want = status(kernel).get("phase"), desired(kernel)
        if phase == RUNNING and want == DESIRED_HIBERNATED:
            await self._admit_hibernation(kernel, pod, now)
        elif phase == HIBERNATED and want == DESIRED_RUNNING:
            await self._admit_resumes(status(kernel).get("node") or "", now)
        elif phase == HIBERNATED and want == DESIRED_HIBERNATED and (
                hibernation(kernel).get("queuePosition") is not None
                or status(kernel).get("reason") in (resources.WAITING_FOR_ROOM, resources.QUOTA_EXCEEDED,
                                                    resources.RESUME_DECLINED)):
            await self._set_status(kernel, {"reason": "", "message": "Hibernated: asked to stay so.",
                                            **self._hibernation_changes(kernel, {"queuePosition": None,
                                                                                 "declined": None})})

    @staticmethod
    def _hibernation_changes(kernel: dict, changes: dict) -> dict:
        """``{"hibernation": changes}`` where they change status.hibernation (a None removes a field, as in a
        merge patch), else nothing: a write that changes nothing is not made."""
        current = hibernation(kernel)
        merged = {k: v for k, v in {**current, **changes}.items() if v is not None}
        return {"hibernation": changes} if merged != current else {}

    async def _admit_hibernation(self, kernel: dict, pod: dict, now: float) -> None:
        async with self._admission:
            kernel = self.kernels.get(key(kernel), kernel)
            if status(kernel).get("phase") != RUNNING or desired(kernel) != DESIRED_HIBERNATED:
                return
            generation = meta(kernel).get("generation")
            if status(kernel).get("observedGeneration") == generation and status(kernel).get("reason") in (
                    resources.HIBERNATION_FAILED, resources.HIBERNATION_REFUSED) and \
                    hibernation(kernel).get("reason") in (resources.HIBERNATION_FAILED, resources.HIBERNATION_REFUSED):
                return  # the node agent answered this request (refused, or failed and put it back): not again
            node = status(kernel).get("node") or ""
            moved = moves.gpu_bytes(kernel)
            kind, refusal = UNSUPPORTED, moves.backend_refusal(self.settings.sharing,
                                                               self.settings.hami_memory_scaling)
            if refusal is None:
                kind, refusal = HOST_MEMORY, moves.host_memory_refusal(pod, moved)
            if refusal is None:
                node_obj = await self._read_node(node)
                node_memory = (_node_memory(node_obj) if node_obj is not None else None)
                cap = self.settings.hibernated_cap_bytes(node_memory)
                kind, refusal = NODE_CAP, moves.node_cap_refusal(kernel, list(self.kernels.values()), cap, moved,
                                                                 node)
            generation = meta(kernel).get("generation")
            if refusal is not None:  # written again for a new request (generation), so that its server hears
                if status(kernel).get("message") != refusal or status(kernel).get("observedGeneration") != generation:
                    log.info("kernel %s/%s: hibernation refused: %s", *key(kernel), refusal)
                    self.metrics.admissions.labels(result="hibernation_refused").inc()
                    kernel = await self._set_status(kernel, {
                        "reason": resources.HIBERNATION_REFUSED, "message": refusal, "observedGeneration": generation,
                        **self._hibernation_changes(kernel, {"reason": kind, "message": refusal})})
                    if kernel is not None:
                        await self.events.announce(kernel, "Normal", resources.HIBERNATION_REFUSED, refusal)
                return
            why = spec(kernel).get("hibernateReason") or "idle"
            moved_kernel = await self._move(kernel, {
                "phase": HIBERNATING, "reason": "", "observedGeneration": generation,
                "message": f"Hibernating ({why}): its GPU memory moves to host memory on node {node}.",
                "hibernation": {"requestedAt": now, "reason": why, "message": "", "queuePosition": None,
                                "devices": list(gpu_devices(kernel)) or None}})
            if moved_kernel is not None:
                log.info("kernel %s/%s: hibernation admitted (%s, about %d bytes)", *key(kernel), why, moved)
                self.metrics.admissions.labels(result="hibernation").inc()

    async def _admit_resumes(self, node: str, now: float) -> None:
        """Serve the node's queue of resumes, first asked first, as far as its GPUs' free memory goes; then
        the resumes asked on a hint, each admitted only where room is left now and nobody waits, else
        declined (a guess never queues, nor takes room from a waiter)."""
        async with self._admission:
            kernels = list(self.kernels.values())
            quotas = read_quotas(list(self.quotas.values()))
            asked: dict[str, float] = {}
            for k in moves.resume_order(kernels, node):  # a resume seen for the first time joins at the end
                h = hibernation(k)
                if float(h.get("requestedAt") or 0) <= float(h.get("hibernatedAt") or 0):
                    asked[meta(k)["uid"]] = now
            fit: list[dict] = []
            for k in sorted(moves.resume_order(kernels, node), key=lambda k: (
                    asked.get(meta(k)["uid"], float(hibernation(k).get("requestedAt") or 0)), meta(k)["name"])):
                try:
                    admission.admit_resume(k, quotas, kernels, now)
                except PoolError as e:  # the owner's own quota: they wait without holding up the node's queue
                    why = moves.quota_wait(e)
                    await self._wait_resume(k, asked, None, resources.QUOTA_EXCEEDED, f"This kernel's resume is {why}.",
                                            why)
                    continue
                fit.append(k)
            hinted: list[dict] = []
            for k in moves.hinted_resumes(kernels, node):
                try:
                    admission.admit_resume(k, quotas, kernels, now)
                except PoolError as e:  # a cell would wait for the quota: a guess does not
                    await self._decline_hint(k, "not_now", f"This kernel was not woken in advance: {e}")
                    continue
                hinted.append(k)
            if not fit and not hinted:
                return
            node_obj = await self._read_node(node)
            text = ((node_obj or {}).get("metadata", {}).get("annotations") or {}).get(resources.ANNOTATION_GPU_FREE)
            # The hints go behind every real waiter: first come, first served leaves them only the room left.
            admitted, waiting = moves.plan_resumes(fit + hinted, kernels, moves.FreeReading.parse(text), now,
                                                   self.settings.gpu_free_max_age, self.settings.resume_margin)
            for k in admitted:
                moved = await self._move(k, {
                    "phase": RESUMING, "reason": "", "observedGeneration": meta(k).get("generation"),
                    "message": f"Resuming on node {node}: its GPU memory comes back from host memory.",
                    "hibernation": {"queuePosition": None, "requestedAt": asked.get(meta(k)["uid"]), "message": "",
                                    "declined": None}})
                if moved is not None:
                    log.info("kernel %s/%s: resume admitted on node %s", *key(k), node)
                    self.metrics.admissions.labels(result="resume").inc()
            for k in fit:
                place = waiting.get(meta(k)["uid"])
                if place is not None:
                    await self._wait_resume(k, asked, place.position, resources.WAITING_FOR_ROOM,
                                            f"Waiting to resume: position {place.position} in the queue of node "
                                            f"{node}, {place.message}.", place.message)
            others = any(meta(k)["uid"] in waiting for k in fit)
            for k in hinted:
                place = waiting.get(meta(k)["uid"])
                if place is None:
                    continue
                if others:
                    await self._decline_hint(k, "others_waiting", f"Others are waiting to resume on node {node}, so "
                                             "this kernel was not woken in advance: it resumes when a cell runs, in "
                                             "its turn.")
                else:
                    await self._decline_hint(k, "no_room", f"No room on its GPU now ({place.message}), so this "
                                             "kernel was not woken in advance: it resumes when a cell runs (in the "
                                             "queue if need be).")

    async def _decline_hint(self, kernel: dict, word: str, message: str) -> None:
        """Answer a resume asked on a hint that would have had to wait: declined, in words, in no queue (its
        server then withdraws the ask; a cell asks again, for real)."""
        log.info("kernel %s/%s: resume on a hint declined (%s)", *key(kernel), word)
        self.metrics.admissions.labels(result="hint_declined").inc()
        await self._set_status(kernel, {"reason": resources.RESUME_DECLINED, "message": message,
                                        "observedGeneration": meta(kernel).get("generation"),
                                        **self._hibernation_changes(kernel, {"queuePosition": None,
                                                                             "declined": word})})

    async def _wait_resume(self, kernel: dict, asked: dict[str, float], position: int | None, reason: str,
                           message: str, why: str) -> None:
        """Leave a resume waiting, with its place and words (status.message the sentence, hibernation.message
        what it waits for; written only when they change), and look at it again soon: room frees as the
        node's agent reports."""
        changes = {"queuePosition": position, "message": why, "declined": None}
        if meta(kernel)["uid"] in asked:
            changes["requestedAt"] = asked[meta(kernel)["uid"]]
        await self._set_status(kernel, {"reason": reason, "message": message,
                                        "observedGeneration": meta(kernel).get("generation"),
                                        **self._hibernation_changes(kernel, changes)})
        self._check_again(key(kernel))

    async def _move(self, kernel: dict, changes: dict) -> dict | None:
        """A phase move the operator admits, written by compare-and-set on the kernel's resourceVersion (the
        node agent writes the other moves the same way); None when the kernel changed meanwhile (it is read
        again and decided again) or is gone."""
        return await self._write_status(kernel, changes, compare=True)

    async def _lost(self, kernel: dict, what: str) -> None:
        """The kernel's pod ended while its memory was in host memory (or moving): the kernel is gone, and
        so is its hold on quotas (phase Failed); nothing restarts it as a new, empty kernel."""
        state = {HIBERNATING: "hibernating", HIBERNATED: "hibernated", RESUMING: "resuming"}.get(
            status(kernel).get("phase"), "hibernated")
        await self._fail(kernel, resources.PREEMPTED,
                         f"The kernel's pod ended while the kernel was {state} ({what}): its variables are lost, "
                         "and its GPU slice is free again. Start the kernel again to go on.")

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

    # -- pieces -------------------------------------------------------------------------------

    async def _pod_refused(self, kernel: dict, launch: int, e: ApiException, now: float) -> None:
        """The API server refused the kernel's pod (a ResourceQuota, an admission policy; or it failed):
        tried again after a wait that doubles from ``api_retry_first`` up to ``reconcile_interval``, with
        the API server's words in the kernel's status (the user's server shows them) and, once per new
        refusal, an Event.  The kernel keeps waiting: a quota frees when other pods end."""
        k = key(kernel)
        previous = self._refused.get(k)
        wait = self.settings.api_retry_first if previous is None else \
            min(previous.wait * 2, max(self.settings.reconcile_interval, self.settings.api_retry_first))
        self._refused[k] = Refusal(launch, wait, now + wait)
        said = _api_message(e)
        message = (f"The cluster refused the kernel's pod: {said} The operator tries again, at least every "
                   f"{self.settings.reconcile_interval:.0f} s, until your server's start timeout. "
                   + ("Ask your admin to raise the namespace's ResourceQuota, or shut down a kernel you no "
                      "longer need." if "exceeded quota" in said else "Ask your admin."))
        self.metrics.launch_failures.labels(reason=resources.POD_REFUSED).inc()
        log.warning("kernel %s/%s: pod refused (%s), trying again in %.0f s: %s", *k, e.status, wait, said)
        if status(kernel).get("message") != message:
            kernel = await self._set_status(kernel, {"phase": STARTING, "reason": resources.POD_REFUSED,
                                                     "message": message})
            if kernel is not None:
                await self.events.announce(kernel, "Warning", resources.POD_REFUSED, message)
        self._check_again(k, wait)

    async def _ensure_secret_and_policy(self, kernel: dict) -> None:
        """The kernel's Secret (its connection key) and NetworkPolicy, made once, before its first pod."""
        if meta(kernel)["uid"] not in self._secrets:
            curve = new_curve_keys() if self.settings.transport_encryption else None
            await self._create_once(self.core.create_namespaced_secret, kernel,
                                    render_secret(kernel, self.settings, new_key(), curve))
            self._secrets.add(meta(kernel)["uid"])
        if self.settings.network_policy and meta(kernel)["uid"] not in self._policies_made:
            await self._create_once(self.net.create_namespaced_network_policy, kernel,
                                    render_network_policy(kernel, self.settings))
            self._policies_made.add(meta(kernel)["uid"])

    def _orphaned(self, kernel: dict, now: float) -> bool:
        """No heartbeat change seen for ``heartbeat_timeout`` (measured on this clock, so skew does not matter)."""
        k = key(kernel)
        beat = (meta(kernel).get("annotations") or {}).get(resources.ANNOTATION_HEARTBEAT)
        seen = self._heartbeats.get(k)
        if seen is None or seen[0] != beat:
            self._heartbeats[k] = (beat, now)
            return False
        return now - seen[1] > self.settings.heartbeat_timeout

    async def _list_everything_once(self) -> None:
        """Read every kernel and quota before the first admission: at start the watches' first
        listings arrive object by object, and a kernel admitted before all of them would be
        counted against quotas not yet known, next to kernels not yet seen."""
        if not self._listed:
            await self.relist()

    async def relist(self) -> None:
        """Kernels and quotas as the API server lists them now.  kopf's watches say nothing of an object
        deleted while a watch was down (after a 410 they list afresh, and what is gone is simply not
        listed), so a kernel or quota cached here but absent from a listing newer than it is forgotten:
        a deleted kernel is not reconciled again, a deleted quota no longer limits anyone."""
        kernels: list[dict] = []
        versions = []
        for ns in self.settings.namespaces or (None,):
            if ns is None:
                items, rv = await list_all(self.custom.list_cluster_custom_object, GROUP, VERSION, KERNELS)
            else:
                items, rv = await list_all(self.custom.list_namespaced_custom_object, GROUP, VERSION, ns, KERNELS)
            kernels += items
            versions.append((ns, int(rv)))
        quotas, quotas_rv = await list_all(self.custom.list_cluster_custom_object, GROUP, VERSION, QUOTAS)
        listed = {key(k) for k in kernels}
        for k, cached in list(self.kernels.items()):
            rv = next((v for ns, v in versions if ns is None or ns == k[0]), None)
            if rv is not None and k not in listed and int(meta(cached).get("resourceVersion", 0)) <= rv:
                log.info("kernel %s/%s is gone (deleted while a watch was down); forgetting it", *k)
                self._gone.setdefault(meta(cached).get("uid"), self.clock())
                self._forget(k, meta(cached).get("uid"))
        for item in kernels:
            self.ensure_pod_watch(meta(item)["namespace"])
            self._remember(item)
        listed_quotas = {meta(q)["name"] for q in quotas}
        changed = False
        for name, cached in list(self.quotas.items()):
            if name not in listed_quotas and int(meta(cached).get("resourceVersion", 0)) <= int(quotas_rv):
                log.info("GPUQuota %s is gone (deleted while a watch was down); it limits no one now", name)
                del self.quotas[name]
                changed = True
        for item in quotas:
            old = self.quotas.get(meta(item)["name"])
            if old is None or int(meta(item)["resourceVersion"]) > int(meta(old).get("resourceVersion", 0)):
                self.quotas[meta(item)["name"]] = item
                changed = True
        self._listed = True
        if changed:
            await self._check_quotas()

    def _prune(self) -> None:
        """Drop what the caches keep about things that are gone: the Events and Nodes read for start
        stories (read again when needed), pods of unknown kernels, deleted kernels' uids once no late
        event can bring them back."""
        now = self.clock()
        self.stories.prune({meta(p).get("uid") for pods in self.pods.values() for p in pods.values()}, now)
        self.devices.prune(now)
        for k in [k for k, pods in self.pods.items() if not pods and k not in self.kernels]:
            del self.pods[k]
        known = {meta(k).get("uid") for k in self.kernels.values()}
        self._secrets &= known
        self._policies_made &= known
        linger = max(60.0, 2 * self.settings.reconcile_interval)
        for uid in [u for u, at in self._gone.items() if u not in known and now - at > linger]:
            del self._gone[uid]

    async def _admit(self, kernel: dict, profile: str, rendering, now: float) -> dict | None:
        async with self._admission:
            await self._list_everything_once()
            kernel = self.kernels.get(key(kernel), kernel)
            if status(kernel).get("admitted"):
                return kernel
            quotas = read_quotas(list(self.quotas.values()))
            try:
                admitted = admission.admit(kernel, profile, self.settings.sharing.backend, rendering, quotas,
                                           list(self.kernels.values()), now)
            except PoolError as e:
                reason = resources.QUOTA_EXCEEDED if isinstance(e, QuotaExceeded) else "QuotaMisconfigured"
                self.metrics.admissions.labels(result=e.reason).inc()
                await self._fail(kernel, reason, str(e))
                return None
            self.metrics.admissions.labels(result="admitted").inc()
            gpu = {"sharing": self.settings.sharing.backend, "resources": dict(rendering.limits)}
            if rendering.claim is not None:
                gpu["claimTemplate"] = claim_template_name(profile)
            kernel = await self._set_status(kernel, {"admitted": admitted, "phase": STARTING, "reason": "",
                                                     "message": f"Admitted: {rendering.description}.", "gpu": gpu,
                                                     "observedGeneration": meta(kernel).get("generation")})
            if kernel is None:  # deleted meanwhile (its status write found no object): nothing to start
                return None
            log.info("kernel %s/%s of %s admitted on profile %s", *key(kernel), spec(kernel)["owner"], profile)
            return kernel

    async def _fail(self, kernel: dict, reason: str, message: str) -> None:
        if status(kernel).get("phase") == FAILED and status(kernel).get("reason") == reason:
            return
        log.info("kernel %s/%s refused: %s", *key(kernel), reason)
        written = await self._set_status(kernel, {"phase": FAILED, "reason": reason, "message": message})
        if written is not None:  # else gone, or changed meanwhile and decided again
            await self.events.announce(written, "Warning", reason, message)

    async def _set_status(self, kernel: dict, wanted: dict, *, always: bool = False) -> dict | None:
        """Write what changed of ``wanted`` into the kernel's status (``always``: even when nothing did, to
        learn whether the kernel still exists: an empty patch, which the API server answers without a write
        or a watch event); the kernel as written, or None when it is gone (a 404: it was deleted without
        this operator hearing of it, and is forgotten here) or, for a kernel in hibernation's hands, changed
        since it was read (see ``_write_status``)."""
        current = status(kernel)
        changes = {k: v for k, v in wanted.items() if current.get(k) != v and not (v is None and k not in current)}
        if not changes and not always:
            return kernel
        return await self._write_status(kernel, changes, compare=_hibernation_in_play(kernel))

    async def _write_status(self, kernel: dict, changes: dict, *, compare: bool) -> dict | None:
        """One status write.  ``compare``: it carries the resourceVersion the kernel was read at, so the API
        server refuses it (409) where anyone wrote the kernel since (the node agent settling a move, its
        server changing spec.desiredState): nothing is overwritten; the kernel is read again and decided
        again from what it is now, and None is returned."""
        ns, name = key(kernel)
        body: dict = {"status": changes}
        version = meta(kernel).get("resourceVersion")
        if compare and version:
            body["metadata"] = {"resourceVersion": version}
        try:
            written = await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, KERNELS, name, body, _content_type=MERGE)
        except ApiException as e:
            if e.status == 404:
                log.info("kernel %s/%s is gone; forgetting it", ns, name)
                self._gone.setdefault(meta(kernel)["uid"], self.clock())
                self._forget(key(kernel), meta(kernel)["uid"])
                return None
            if e.status == 409 and "metadata" in body:
                log.info("kernel %s/%s changed since it was read (version %s): read again, decided again", ns,
                         name, version)
                await self._read_again(kernel)
                return None
            raise
        self._remember(written)
        return self.kernels.get(key(written), written)

    async def _read_again(self, kernel: dict) -> None:
        """The kernel as the API server has it now (an empty status patch: no write, no watch event, and no
        right beyond the status patch the operator holds), then a reconcile of it once the one under way
        ends."""
        ns, name = key(kernel)
        try:
            fresh = await self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, KERNELS, name, {},
                                                                            _content_type=MERGE)
        except ApiException as e:
            if e.status != 404:
                raise
            self._gone.setdefault(meta(kernel)["uid"], self.clock())
            self._forget(key(kernel), meta(kernel)["uid"])
            return
        self._remember(fresh)
        pending = self._rechecks.pop(key(kernel), None)
        if pending is not None and pending is not asyncio.current_task():
            pending.cancel()
        self._check_again(key(kernel), 0)

    async def _create_once(self, create, kernel: dict, body: dict):
        try:
            return await create(meta(kernel)["namespace"], body)
        except ApiException as e:
            if e.status != 409:  # 409: it exists already (created before a restart of the operator)
                raise
            return None

    async def _create_pod(self, kernel: dict, rendering, image: str, launch: int) -> None:
        body = render_pod(kernel, self.settings, rendering, image, launch)
        try:
            pod = await self.core.create_namespaced_pod(meta(kernel)["namespace"], body)
        except ApiException as e:
            if e.status != 409:
                raise
            return  # created before a restart of the operator: the pod watch delivers it
        self.metrics.pods_created.inc()
        pod = self.core.api_client.sanitize_for_serialization(pod)
        self.pods[key(kernel)].setdefault(meta(pod)["name"], pod)
        log.info("kernel %s/%s: pod %s created (launch %d)", *key(kernel), meta(pod)["name"], launch)

    def _check_again(self, k: tuple[str, str], delay: float | None = None) -> None:
        """Reconcile a starting kernel again in ``delay`` (``progress_interval`` by default; once at a time)."""
        if k in self._rechecks:
            return

        async def later() -> None:
            await asyncio.sleep(self.settings.progress_interval if delay is None else delay)
            self._rechecks.pop(k, None)
            try:
                await self.reconcile(k)
            except Exception:
                self.metrics.errors.inc()
                log.exception("reconciling kernel %s/%s failed", *k)

        self._rechecks[k] = asyncio.create_task(later())

    async def _delete_pod(self, pod: dict, grace: int) -> None:
        try:
            await self.core.delete_namespaced_pod(meta(pod)["name"], meta(pod)["namespace"],
                                                  grace_period_seconds=grace)
        except ApiException as e:
            if e.status != 404:
                raise

    async def _delete_pods(self, kernel: dict, keep: str | None, grace: int, now: float | None = None) -> bool:
        """Delete the kernel's pods but ``keep``; with ``now``, each one its node agent resumed only once the
        agent has made it safe to kill (:meth:`_safe_to_kill`).  Whether every one is deleted (or going)."""
        done = True
        for name, pod in list(self.pods[key(kernel)].items()):
            if name != keep and not meta(pod).get("deletionTimestamp"):
                if now is not None and not await self._safe_to_kill(kernel, pod, now):
                    done = False
                    continue
                await self._delete_pod(pod, grace)
        return done

    # -- the precaution before killing a process the node agent restored (cuda-checkpoint issue 53) --

    @staticmethod
    def _resumed(kernel: dict, pod: dict) -> bool:
        """Whether ``pod``'s processes may have been restored by the node agent: the agent settled a resume
        of this very pod (hibernation.pod), or is resuming it now."""
        name = meta(pod).get("name")
        if hibernation(kernel).get("pod") == name and hibernation(kernel).get("resumedAt"):
            return True
        return status(kernel).get("phase") == RESUMING and status(kernel).get("pod") == name

    async def _safe_to_kill(self, kernel: dict, pod: dict, now: float) -> bool:
        """Whether ``pod`` may be deleted now.  A pod the node agent resumed is deleted only once the agent
        has locked and checkpointed its restored processes again (its answer in status.killPrecaution), or
        ``kill_precaution_timeout`` after the operator asked: the kubelet kills a pod's processes as its
        deletion begins, grace period or not, so the precaution must come before the delete.  The request
        is a compare-and-set write, as the moves are; the agent's answer brings the kernel back here, and
        a look again at the deadline stands in for an answer that never comes.  Any other pod: at once."""
        timeout = self.settings.kill_precaution_timeout
        if timeout <= 0 or not self._resumed(kernel, pod):
            return True
        name = meta(pod)["name"]
        asked = status(kernel).get("killPrecaution") or {}
        if asked.get("pod") == name and asked.get("answeredAt") is not None:
            return True
        if asked.get("pod") != name or asked.get("requestedAt") is None:
            written = await self._move(kernel, {"killPrecaution": {"pod": name, "requestedAt": now,
                                                                   "answeredAt": None, "message": None}})
            if written is not None:
                log.info("kernel %s/%s: asked its node agent to checkpoint pod %s's restored processes before "
                         "the pod is deleted", *key(kernel), name)
            self._check_again(key(kernel), timeout)
            return False
        waited = now - float(asked["requestedAt"])
        if waited < timeout:
            self._check_again(key(kernel), timeout - waited)
            return False
        message = (f"The node agent of node {status(kernel).get('node') or 'unknown'} did not answer within "
                   f"{timeout:g} s whether it had checkpointed the kernel's restored GPU processes again, so its pod "
                   f"{name} is deleted anyway. On a driver with cuda-checkpoint issue 53 this kill can hang the "
                   "node: check the node agent.")
        log.warning("kernel %s/%s: %s", *key(kernel), message)
        await self.events.announce(kernel, "Warning", resources.KILL_PRECAUTION_TIMED_OUT, message)
        return True

    async def _delete_kernel(self, kernel: dict, reason: str, message: str) -> None:
        """Delete a kernel once: what arrives about it afterwards (its pods going, a late watch event)
        finds it forgotten, so no second delete and no second Event.  A pod its node agent resumed is made
        safe to kill first: until then the kernel stays, and the next reconcile comes back here."""
        ns, name = key(kernel)
        if not await self._delete_pods(kernel, keep=None, grace=0, now=self.clock()):
            return
        try:
            await self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, KERNELS, name,
                                                              body={"propagationPolicy": "Background"})
            deleted = True
        except ApiException as e:
            if e.status != 404:
                raise
            deleted = False  # deleted by someone else, unseen: nothing to say about it
        self._gone.setdefault(meta(kernel)["uid"], self.clock())
        self._forget(key(kernel), meta(kernel)["uid"])
        if deleted:
            log.info("kernel %s/%s deleted: %s", ns, name, reason)
            self.metrics.orphans.inc()
            await self.events.announce(kernel, "Warning", reason, message)

    def _count_phases(self) -> None:
        counts = defaultdict(int)
        for kernel in self.kernels.values():
            counts[status(kernel).get("phase") or resources.PENDING] += 1
        for phase in resources.PHASES:
            self.metrics.kernels.labels(phase=phase).set(counts.get(phase, 0))
