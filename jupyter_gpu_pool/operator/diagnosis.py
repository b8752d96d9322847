"""A kernel pod's state, in words for the person at the notebook.

The scheduler, the kubelet and the container runtime speak of
``Unschedulable``, ``ImagePullBackOff`` and exit codes; a notebook user needs
"no GPU slice is free, try later" or "the kernel image cannot be pulled, ask
your admin".  A pod that can never start (no slice free past the admin's
grace, an image that cannot be pulled, a container that cannot be created)
makes the kernel ``Failed`` at once, so the launch fails in seconds rather than
at a timeout; a ``Failed`` kernel holds no quota.  A start that takes long says
why, from the pod's conditions and container status, its Events and its node
(pulling the image, volumes not mounted, the node not ready), and since when, from
the cluster's own timestamps: the words name the moment (``since <time>``), not the
seconds, so they stay the same while the wait goes on and are written once; each
reader shows "N s so far" as of its reading (``cluster/kernels.py::as_of``).  A container that exited
(cleanly or not) leaves the kernel ``Stopped`` with its exit code: it keeps its
slice for a restart until its server deletes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..cluster.kernels import since, timestamp
from ..cluster.resources import CRASHED, EXITED, FAILED, IMAGE_PULL, PREEMPTED, RUNNING, STARTING, STOPPED, UNSCHEDULABLE
from .sharing import device_attribute

_PULL = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable")
_CREATE = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")

# Reasons of a start under way (status.reason while the phase is Starting).
NODE_NOT_READY, PULLING, MOUNTING, CREATING = "NodeNotReady", "PullingImage", "MountingVolumes", "ContainerCreating"


# Why a dra claim cannot be allocated, found from the cluster's DeviceClasses and ResourceSlices.
NO_DEVICE_CLASS, NO_DRIVER, NO_SUCH_DEVICE, DEVICES_TAKEN = "NoDeviceClass", "NoDriver", "NoSuchDevice", "DevicesTaken"


@dataclass(frozen=True)
class DeviceShortfall:
    cause: str
    detail: str = ""  # NO_SUCH_DEVICE: what the nodes publish


def _kind_of(device: dict, driver: str) -> str:
    def attribute(name: str):
        return device_attribute(device, driver, name)

    if attribute("type") == "mig":
        return f"MIG {attribute('profile')} device"
    if attribute("type") == "gpu":
        return "GPU shared by memory" if device.get("allowMultipleAllocations") else "whole GPU"
    return f"device of type {attribute('type')!r}" if attribute("type") else "device without a type"


def device_shortfall(need, device_class: dict | None, slices: list[dict]) -> DeviceShortfall:
    """Why ``need`` (a :class:`~jupyter_gpu_pool.operator.sharing.DeviceNeed`) cannot be met: its
    DeviceClass is missing, the driver publishes no devices at all, no node has a device (or ``count``
    of them) that matches, or every matching device is taken."""
    if device_class is None:
        return DeviceShortfall(NO_DEVICE_CLASS)
    published = [((s.get("spec") or {}).get("nodeName") or ((s.get("spec") or {}).get("pool") or {}).get("name"), d)
                 for s in slices for d in (s.get("spec") or {}).get("devices") or []]
    if not published:
        return DeviceShortfall(NO_DRIVER)
    fitting = Counter(node for node, d in published if need.matches(d))
    if not fitting or max(fitting.values()) < need.count:
        kinds = Counter(_kind_of(d, need.driver) for _, d in published)
        nodes = len({node for node, _ in published})
        offer = ", ".join(f"{n} × {kind}" for kind, n in sorted(kinds.items()))
        return DeviceShortfall(NO_SUCH_DEVICE, f"{offer} (on {nodes} node{'s' if nodes != 1 else ''})")
    return DeviceShortfall(DEVICES_TAKEN)


def unschedulable(pod: dict) -> bool:
    scheduled = _condition(pod, "PodScheduled")
    return scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"


def claims_unmet(pod: dict) -> bool:
    """dra: the pod cannot be scheduled because its device claims cannot be allocated (the scheduler
    says so: "cannot allocate all claims"), not for want of CPU, memory or a toleration."""
    said = _condition(pod, "PodScheduled").get("message", "")
    return unschedulable(pod) and bool((pod.get("spec") or {}).get("resourceClaims")) and "claim" in said.lower()


def _claim_refusal(profile: str, slice_text: str, said: str, need, shortfall: DeviceShortfall | None) -> str:
    """A dra claim the scheduler cannot allocate, in words that say whether waiting can help."""
    what = f"profile {profile!r} ({slice_text})"
    if shortfall is None or need is None:  # the cluster's devices could not be read: say both
        return (f"No GPU device for {what} can be allocated right now: every device of that kind in the cluster "
                f"is taken, or none has it (the scheduler says: {said}) Try again in a few minutes, pick another "
                "profile, or shut down a kernel you no longer need.")
    if shortfall.cause == NO_DEVICE_CLASS:
        return (f"Kernels of {what} cannot start on this cluster: it has no DeviceClass {need.device_class!r}, "
                "which their device claims name. The DRA driver is not installed, or the operator names another "
                "class (GPUPoolOperator.dra_device_class, dra_mig_device_class). Waiting will not help; ask your "
                "admin.")
    if shortfall.cause == NO_DRIVER:
        return (f"Kernels of {what} cannot start on this cluster: no node publishes devices of the DRA driver "
                f"{need.driver!r} (it has no ResourceSlices), so the driver is not installed or not running on the "
                "GPU nodes. Waiting will not help; ask your admin.")
    if shortfall.cause == NO_SUCH_DEVICE:
        return (f"No node of the cluster has {need.wanted} for {what}: the nodes publish {shortfall.detail}. "
                "Waiting will not help: pick another profile, or ask your admin (to partition GPUs into such "
                "devices, or to change the profile).")
    return (f"Every GPU device for {what} is taken right now (the scheduler says: {said}) Try again in a few "
            "minutes, pick another profile, or shut down a kernel you no longer need.")


@dataclass(frozen=True)
class Verdict:
    phase: str
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    changes_at: float | None = None  # when time alone changes it (an unschedulable pod's grace runs out)


def _condition(pod: dict, type_: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def _container(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _at(text: str | None, now: float) -> float:
    """An RFC 3339 time as Unix seconds (``now`` when unknown)."""
    return timestamp(text) or now


def _event_time(event: dict) -> str | None:
    return event.get("eventTime") or event.get("firstTimestamp") or (event.get("metadata") or {}).get(
        "creationTimestamp")


def _last_time(event: dict) -> str | None:
    series = event.get("series") or {}
    return series.get("lastObservedTime") or event.get("lastTimestamp") or _event_time(event)


def _key(event: dict) -> float:
    return timestamp(_last_time(event))


def _latest(events: list[dict], *reasons: str) -> dict | None:
    """The most recent of the events with these reasons (by when it was last seen)."""
    found = [e for e in events if e.get("reason") in reasons]
    return max(found, key=_key) if found else None


def _node_not_ready(node: dict | None) -> dict | None:
    """The node's Ready condition when it is not True (the node is down, or not yet up)."""
    if not node:
        return None
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    return ready if ready is not None and ready.get("status") != "True" else None


def _starting(pod: dict, container: dict, now: float, events: list[dict], node: dict | None) -> Verdict:
    """A pod the scheduler placed that does not run yet: what its node, its container and its Events say,
    and since when (the cluster's own timestamps)."""
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    where = spec.get("nodeName", "")
    placed = since(_at(_condition(pod, "PodScheduled").get("lastTransitionTime") or status.get("startTime")
                       or pod["metadata"].get("creationTimestamp"), now))
    not_ready = _node_not_ready(node)
    if not_ready is not None and not container:
        said = " ".join(x for x in (not_ready.get("reason", ""), not_ready.get("message", "")) if x)
        return Verdict(STARTING, NODE_NOT_READY,
                       f"The kernel's pod waits on node {where!r}, {placed}, but that node is not ready "
                       f"({said or 'Ready: ' + str(not_ready.get('status'))}), so nothing starts there until it "
                       "recovers. If it does not, Kubernetes evicts the pod after its not-ready toleration "
                       "(300 s by default); ask your admin about the node.")
    pulling, pulled = _latest(events, "Pulling"), _latest(events, "Pulled", "Failed", "BackOff")
    mount = _latest(events, "FailedMount", "FailedAttachVolume")
    sandbox = _latest(events, "FailedCreatePodSandBox")
    later = _latest(events, "Pulling", "Pulled", "Created", "Started")
    if pulling is not None and (pulled is None or _key(pulled) < _key(pulling)):
        image = container.get("image") or (spec.get("containers") or [{}])[0].get("image", "")
        return Verdict(STARTING, PULLING,
                       f"Node {where!r} is pulling the kernel image {image!r}: {since(_at(_event_time(pulling), now))} "
                       "(a large image can take minutes the first time on a node).")
    if mount is not None and (later is None or _key(later) < _key(mount)):
        return Verdict(STARTING, MOUNTING,
                       f"Node {where!r} cannot mount the kernel's volumes yet ({since(_at(_event_time(mount), now))}): "
                       f"{mount.get('message', '')}")
    if sandbox is not None and (later is None or _key(later) < _key(sandbox)):
        return Verdict(STARTING, CREATING,
                       f"Node {where!r} cannot create the kernel's pod sandbox yet ({placed}): "
                       f"{sandbox.get('message', '')}")
    waiting = (container.get("state") or {}).get("waiting") or {}
    if container or where:
        what = f"node {where!r}" if where else "its node"
        detail = f" ({waiting['message']})" if waiting.get("message") else ""
        return Verdict(STARTING, waiting.get("reason") or CREATING,
                       f"The kernel's pod is starting: {what} is creating its container{detail}, {placed}.")
    return Verdict(STARTING, "", f"The kernel's pod is starting: waiting for the scheduler, {placed}.")


def diagnose(pod: dict, profile: str, slice_text: str, now: float, unschedulable_grace: float,
             events: list[dict] | None = None, node: dict | None = None, need=None,
             shortfall: DeviceShortfall | None = None) -> Verdict:
    """The kernel's phase, reason and message from its pod; ``events`` (the pod's Events) and ``node``
    (the Node it is placed on) tell the story of a start that takes long; for a pod that claims devices
    (dra), ``need`` is what its claim needs and ``shortfall`` why the cluster cannot give it."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    name = pod["metadata"]["name"]
    if pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        return Verdict(STOPPED, PREEMPTED, "The kernel's pod is being deleted.")
    container = _container(pod)
    state = container.get("state") or {}
    if phase == "Pending":
        scheduled = _condition(pod, "PodScheduled")
        if unschedulable(pod):
            began = timestamp(scheduled.get("lastTransitionTime")) or now
            said = scheduled.get("message", "")
            if now - began >= unschedulable_grace and claims_unmet(pod):  # dra: the device claim cannot be met
                return Verdict(FAILED, UNSCHEDULABLE, _claim_refusal(profile, slice_text, said, need, shortfall))
            if now - began >= unschedulable_grace:
                return Verdict(FAILED, UNSCHEDULABLE,
                               f"No GPU slice is free for profile {profile!r} ({slice_text}): the cluster has no "
                               f"node with room for it right now (the scheduler says: {said}) Try again in a few "
                               "minutes, pick a smaller profile, or shut down a kernel you no longer need.")
            return Verdict(STARTING, UNSCHEDULABLE, f"Waiting for a GPU slice ({slice_text}) to be free, "
                           f"{since(began)}: {said}", changes_at=began + unschedulable_grace)
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _PULL:
            image = container.get("image", "")
            return Verdict(FAILED, IMAGE_PULL,
                           f"The kernel image {image!r} cannot be pulled ({waiting['reason']}: "
                           f"{waiting.get('message', 'no detail')}). Ask your admin to check the image's name "
                           "and the registry's credentials.")
        if waiting.get("reason") in _CREATE:
            return Verdict(FAILED, CRASHED,
                           f"The kernel's container cannot start ({waiting['reason']}: "
                           f"{waiting.get('message', 'no detail')}). Ask your admin; pod {name!r} has the details.")
        return _starting(pod, container, now, events or [], node)
    if phase == "Running":
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _CREATE:
            return Verdict(FAILED, CRASHED, f"The kernel's container keeps crashing ({waiting['reason']}). "
                           f"Ask your admin; pod {name!r} has the details.")
        return Verdict(RUNNING)
    terminated = state.get("terminated") or {}
    code = terminated.get("exitCode")
    if phase == "Succeeded":
        return Verdict(STOPPED, EXITED, "The kernel exited.", code if code is not None else 0)
    if phase == "Failed":
        why = terminated.get("reason") or status.get("reason") or "Error"
        detail = f": {terminated['message']}" if terminated.get("message") else ""
        return Verdict(STOPPED, CRASHED,
                       f"The kernel's process exited with code {code} ({why}{detail}). If this happens at start, "
                       f"the image may lack ipykernel; pod {name!r} has its log.", code)
    return Verdict(STARTING, "", f"The kernel's pod is in phase {phase}.")
