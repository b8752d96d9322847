"""The operator's side of hibernation in the cluster: whether a kernel may hibernate, and whether a
hibernated kernel may resume now (docs/kubernetes.md, "Hibernation").  Pure: the controller reads the
kernels, the pod and the Node, asks here, and writes the answer into the GPUKernel's status.

- A hibernation is admitted only where the freed memory can be used (the sharing backend lets the node
  hold more kernels than its GPUs' memory: :func:`backend_refusal`), where the pod's memory limit can
  hold the checkpoint on top of what the kernel uses (:func:`host_memory_refusal`), and under the
  per-node cap on hibernated bytes (:func:`node_cap_refusal`).
- A resume is admitted on the GPU its memory came from, only when the node agent's NVML reading of
  that GPU's free memory, fresh, less a margin and less what resumes admitted before it will restore,
  holds its checkpoint (safe wake: :func:`plan_resumes`); the node's waiters are served first come,
  first served, and each one left waiting is told its place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..cluster.kernels import desired, gpu_devices, hibernation, hint_declined, meta, resume_hint, status
from ..cluster.resources import DESIRED_RUNNING, HIBERNATED, HIBERNATING, RESUMING, RUNNING
from ..pool import QuotaExceeded, format_size
from ..cluster import hibernation as words
from ..cluster.hibernation import Support
from .sharing import Sharing, quantity_value


def backend_support(sharing: Sharing, hami_memory_scaling: float = 1.0) -> Support:
    """What a hibernation gives back under this backend (the words are :mod:`jupyter_gpu_pool.cluster.hibernation`'s,
    which the Jupyter server shares)."""
    return words.backend_support(sharing.backend, replicas=sharing.replicas, memory_scaling=hami_memory_scaling)


def backend_refusal(sharing: Sharing, hami_memory_scaling: float = 1.0) -> str | None:
    """None where hibernation hands memory back; else the refusal, in the user's words."""
    support = backend_support(sharing, hami_memory_scaling)
    return None if support.hands_back else words.refusal_words(support)


def gpu_bytes(kernel: dict) -> int:
    """The GPU memory a hibernation of the kernel moves to host memory: the agent's reading
    (status.usage.memoryUsed), else the slice it was admitted with (an upper bound under a hard cap)."""
    used = (status(kernel).get("usage") or {}).get("memoryUsed")
    if used is not None:
        return max(int(used), 0)
    return int((status(kernel).get("admitted") or {}).get("memory", 0))


def _container_memory(pod: dict) -> tuple[float | None, float | None]:
    """(request, limit) of the kernel container's memory, in bytes (None where unset)."""
    resources = (((pod.get("spec") or {}).get("containers") or [{}])[0].get("resources") or {})

    def memory(part: str) -> float | None:
        value = (resources.get(part) or {}).get("memory")
        return None if value is None else quantity_value(value)

    return memory("requests"), memory("limits")


def host_memory_refusal(pod: dict, moved: int) -> str | None:
    """The checkpoint lands in the kernel process's host memory, which the pod's memory cgroup counts:
    refuse where the container's memory limit cannot hold ``moved`` bytes on top of what the kernel uses
    (its memory request: what the pod is sized to use).  No limit: nothing to pass."""
    request, limit = _container_memory(pod)
    if limit is None:
        return None
    uses = request or 0
    if uses + moved <= limit:
        return None
    return (f"This kernel cannot hibernate: its {format_size(moved)} of GPU memory would land in its pod's host "
            f"memory, and the pod's memory limit ({format_size(int(limit))}) cannot hold it on top of the "
            f"{format_size(int(uses))} it is sized to use: the kernel would be killed for running out of memory. "
            "It keeps running. Ask your admin to size kernel pods for hibernation (memory limit at least the "
            "request plus the profile's GPU memory).")


def hibernated_bytes(kernel: dict) -> int:
    """Host bytes a kernel's hibernation holds or is about to hold on its node."""
    if status(kernel).get("phase") not in (HIBERNATING, HIBERNATED, RESUMING):
        return 0
    return int(hibernation(kernel).get("bytes") or gpu_bytes(kernel))


def node_cap_refusal(kernel: dict, kernels: list[dict], cap: int | None, moved: int, node: str) -> str | None:
    """The per-node cap on hibernated bytes (``GPUPoolOperator.hibernated_memory_per_node``)."""
    if cap is None:
        return None
    me = meta(kernel).get("uid")
    held = sum(hibernated_bytes(k) for k in kernels
               if status(k).get("node") == node and meta(k).get("uid") != me)
    if held + moved <= cap:
        return None
    return (f"This kernel cannot hibernate now: node {node!r} already holds {format_size(held)} of hibernated "
            f"kernels' memory, and {format_size(moved)} more would pass its cap of {format_size(cap)}. It keeps "
            "running; it can hibernate once others on the node have resumed or ended.")


@dataclass(frozen=True)
class FreeReading:
    """The node agent's NVML reading of each GPU's free memory on a node (annotation ANNOTATION_GPU_FREE)."""

    devices: dict[str, int]
    sampled_at: float

    @classmethod
    def parse(cls, text: str | None) -> FreeReading | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            devices = {str(k): int(v) for k, v in (data.get("devices") or {}).items()}
            return cls(devices, float(data["sampledAt"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@dataclass(frozen=True)
class Waiting:
    """A resume left waiting: its place in its node's queue (1 = next) and why it waits, in words."""

    position: int
    message: str


def resume_order(kernels: list[dict], node: str) -> list[dict]:
    """The node's resumes waiting for room, first asked first (status.hibernation.requestedAt, which the
    operator sets when it first sees the resume asked; then the name).  A hint's resume is not one of
    them: it never queues (:func:`hinted_resumes`)."""
    waiting = [k for k in kernels if status(k).get("node") == node and status(k).get("phase") == HIBERNATED
               and desired(k) == DESIRED_RUNNING and not resume_hint(k)]
    return sorted(waiting, key=lambda k: (float(hibernation(k).get("requestedAt") or 0), meta(k).get("name", "")))


def hinted_resumes(kernels: list[dict], node: str) -> list[dict]:
    """The node's resumes asked on a hint (spec.resumeHint) that the operator has not answered yet: each is
    admitted only behind every real waiter, where room is left now, and otherwise declined."""
    return sorted((k for k in kernels if status(k).get("node") == node and status(k).get("phase") == HIBERNATED
                   and resume_hint(k) and not hint_declined(k)), key=lambda k: meta(k).get("name", ""))


def quota_wait(refusal) -> str:
    """Why a resume waits for its owner's quota, in words that stay the same while the holdings do (a
    refusal's own text names the kernels held with their ages, which change every second)."""
    if isinstance(refusal, QuotaExceeded):
        whose = "your" if refusal.scope == "user" else f"group {refusal.scope!r}'s"
        return (f"waiting for {whose} GPU quota: {refusal.resource} {refusal.used} of {refusal.limit} held, and this "
                f"kernel needs {refusal.asked} again; it resumes once another kernel is shut down")
    return f"waiting: {refusal}"


def plan_resumes(waiters: list[dict], kernels: list[dict], reading: FreeReading | None, now: float, max_age: float,
                 margin: int) -> tuple[list[dict], dict[str, Waiting]]:
    """Which of a node's waiting resumes (``waiters``, in queue order) are admitted now, and for each one
    left waiting (by uid) its place and why.  First come, first served: once one does not fit, those
    behind it wait too (a small kernel never overtakes a large one for ever).  Room is the reading of the
    kernel's own GPUs, less ``margin``, less the checkpoints of resumes already admitted there that the
    reading cannot have seen restored yet; a reading older than ``max_age`` is no room at all."""
    admitted: list[dict] = []
    waiting: dict[str, Waiting] = {}
    if reading is None:
        why = ("waiting for the node's agent to report its GPUs' free memory (no reading yet): a resume starts "
               "only where the GPU really has room")
    elif now - reading.sampled_at > max_age:
        # No age in the words: they are written only when they change, and an age would change each time.
        why = (f"waiting for a fresh reading of the node's free GPU memory: the last is over {max_age:.0f} s old "
               "(its agent may be down), and a resume starts only where the GPU really has room")
    else:
        why = None
    pending: dict[str, int] = {}  # device -> bytes that admitted resumes will restore, unseen by the reading
    if why is None:
        for k in kernels:
            st = status(k)
            restored_at = float(hibernation(k).get("resumedAt") or 0)
            if st.get("phase") == RESUMING or (st.get("phase") == RUNNING and restored_at > reading.sampled_at):
                _reserve(pending, k)
    blocked = why is not None
    for k in waiters:
        uid = meta(k).get("uid", "")
        if not blocked:
            short = _shortfall(k, reading, pending, margin)
            if short is None:
                admitted.append(k)
                _reserve(pending, k)
                continue
            blocked, why = True, short
        waiting[uid] = Waiting(len(waiting) + 1, why or "")
    return admitted, waiting


def _share(kernel: dict) -> tuple[tuple[str, ...], int]:
    devices = gpu_devices(kernel)
    moved = int(hibernation(kernel).get("bytes") or 0)
    return devices, (moved // len(devices) if devices else moved)


def _reserve(pending: dict[str, int], kernel: dict) -> None:
    devices, each = _share(kernel)
    for d in devices:
        pending[d] = pending.get(d, 0) + each


def _shortfall(kernel: dict, reading: FreeReading, pending: dict[str, int], margin: int) -> str | None:
    """None when each of the kernel's GPUs has room for its share of the checkpoint; else why not."""
    devices, each = _share(kernel)
    if not devices:
        if len(reading.devices) != 1:
            return ("waiting for the node's agent to record which GPU this kernel's memory came from: a resume "
                    "must go back to that GPU")
        devices = tuple(reading.devices)
    for d in devices:
        free = reading.devices.get(d)
        if free is None:
            return f"waiting for the node's agent to report GPU {d}, where this kernel's memory came from"
        room = free - margin - pending.get(d, 0)
        if room < each:
            return (f"waiting for {format_size(each)} of GPU memory on its GPU ({d}): {format_size(max(free, 0))} is "
                    f"free, less a margin of {format_size(margin)}"
                    + (f" and {format_size(pending[d])} for resumes ahead of it" if pending.get(d) else ""))
    return None
