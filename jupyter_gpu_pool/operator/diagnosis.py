"""A kernel pod's state, in words for the person at the notebook.

The scheduler, the kubelet and the container runtime speak of
``Unschedulable``, ``ImagePullBackOff`` and exit codes; a notebook user needs
"no GPU slice is free, try later" or "the kernel image cannot be pulled, ask
your admin".  A pod that can never start (no slice free past the admin's
grace, an image that cannot be pulled, a container that cannot be created)
makes the kernel ``Failed`` at once, so the launch fails in seconds rather than
at a timeout; a ``Failed`` kernel holds no quota.  A container that exited
(cleanly or not) leaves the kernel ``Stopped`` with its exit code: it keeps its
slice for a restart until its server deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.resources import CRASHED, EXITED, FAILED, IMAGE_PULL, PREEMPTED, RUNNING, STARTING, STOPPED, UNSCHEDULABLE
from ..cluster.kernels import timestamp

_PULL = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable")
_CREATE = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")


@dataclass(frozen=True)
class Verdict:
    phase: str
    reason: str = ""
    message: str = ""
    exit_code: int | None = None



def _condition(pod: dict, type_: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def _container(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def diagnose(pod: dict, profile: str, slice_text: str, now: float, unschedulable_grace: float) -> Verdict:
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    name = pod["metadata"]["name"]
    if pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        return Verdict(STOPPED, PREEMPTED, "The kernel's pod is being deleted.")
    container = _container(pod)
    state = container.get("state") or {}
    if phase == "Pending":
        scheduled = _condition(pod, "PodScheduled")
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            since = timestamp(scheduled.get("lastTransitionTime")) or now
            said = scheduled.get("message", "")
            if now - since >= unschedulable_grace:
                return Verdict(FAILED, UNSCHEDULABLE,
                               f"No GPU slice is free for profile {profile!r} ({slice_text}): the cluster has no "
                               f"node with room for it right now (the scheduler says: {said}) Try again in a few "
                               "minutes, pick a smaller profile, or shut down a kernel you no longer need.")
            return Verdict(STARTING, UNSCHEDULABLE, f"Waiting for a GPU slice ({slice_text}) to be free: {said}")
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
        return Verdict(STARTING, waiting.get("reason", "") or "", "The kernel's pod is starting.")
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
