"""Reading GPUKernel objects: what a kernel holds, and the kernel as the pool core's :class:`Lease`.

The operator counts quota usage from here, and the server extension's cluster
backend shows kernels through the same ``Lease`` type as on one machine.
"""

from __future__ import annotations

import datetime
import re
import time

from ..pool import ACTIVE, HIBERNATED, RELEASED, Lease, Usage
from ..pool import phases
from ..pool import residency as M
from ..pool.units import format_rfc3339
from .resources import (DESIRED_RUNNING, FAILED, HIBERNATED as HIBERNATED_PHASE, HIBERNATING, PENDING,
                        QUOTA_EXCEEDED, RESUME_DECLINED, RESUMING, RUNNING, STARTING, STOPPED, WAITING_FOR_ROOM)


def spec(kernel: dict) -> dict:
    return kernel.get("spec") or {}


def status(kernel: dict) -> dict:
    return kernel.get("status") or {}


def meta(kernel: dict) -> dict:
    return kernel.get("metadata") or {}


def key(kernel: dict) -> tuple[str, str]:
    return (meta(kernel).get("namespace", ""), meta(kernel)["name"])


def timestamp(text: str | None) -> float:
    """RFC 3339 (``2024-05-01T12:00:00Z``) as Unix seconds; 0 when absent."""
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def controller_uid(obj: dict) -> str | None:
    """The uid of the object's controlling owner (a kernel's pod, Secret and NetworkPolicy: its GPUKernel)."""
    return next((ref.get("uid") for ref in meta(obj).get("ownerReferences") or [] if ref.get("controller")), None)


_SINCE = re.compile(r"since (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def since(at: float) -> str:
    """How a status message names when the wait it describes began (``since 2024-05-01T12:00:00Z``): the
    words stay the same while the wait goes on, so the operator writes them once, and each reader shows
    the wait's length as of its own reading (:func:`as_of`)."""
    return f"since {format_rfc3339(at)}"


def as_of(message: str, now: float) -> str:
    """A status message as of ``now``: each ``since <time>`` in it becomes ``N s so far``."""
    return _SINCE.sub(lambda m: f"{max(int(now - timestamp(m.group(1))), 0)} s so far", message)


def holds_quota(kernel: dict) -> bool:
    """An admitted kernel holds its slice against quotas until it fails or is deleted (a stopped
    kernel keeps it: it is between two launches of a restart)."""
    return bool(status(kernel).get("admitted")) and status(kernel).get("phase") != FAILED \
        and not meta(kernel).get("deletionTimestamp")


def hibernated(kernel: dict) -> bool:
    """Whether the kernel's GPU memory is in host memory (phase Hibernated, a resume waiting or not):
    its memory and SM share are free on its node, its kernel count stays (the same rule as
    :func:`jupyter_gpu_pool.pool.quotas.usage_of` on one machine).  A kernel still Hibernating holds its
    slice until the agent says its memory is out; a Resuming one holds it again from its admission."""
    return holds_quota(kernel) and status(kernel).get("phase") == HIBERNATED_PHASE


def desired(kernel: dict) -> str:
    """What the kernel's server wants: spec.desiredState, Running when unset."""
    return spec(kernel).get("desiredState") or DESIRED_RUNNING


def resume_hint(kernel: dict) -> bool:
    """Whether the kernel's asked resume is a guess (spec.resumeHint: its user opened the notebook or
    started typing in it): admitted only where the node has room now and nobody waits, never queued."""
    return desired(kernel) == DESIRED_RUNNING and bool(spec(kernel).get("resumeHint"))


def hint_declined(kernel: dict) -> bool:
    """Whether the operator declined the kernel's current hint (its answer, ResumeDeclined, is written for
    this generation of the spec: an answer to an earlier ask does not count)."""
    st = status(kernel)
    return resume_hint(kernel) and st.get("reason") == RESUME_DECLINED and \
        int(st.get("observedGeneration") or 0) >= int(meta(kernel).get("generation") or 0)


def hibernation(kernel: dict) -> dict:
    return status(kernel).get("hibernation") or {}


def gpu_devices(kernel: dict) -> tuple[str, ...]:
    """The GPUs the kernel's memory lives on: where its checkpoint came from (the agent's record), else
    where its pod runs (status.gpu.devices), else where the agent last saw it (status.usage.devices)."""
    st = status(kernel)
    return tuple(hibernation(kernel).get("devices") or (st.get("gpu") or {}).get("devices")
                 or (st.get("usage") or {}).get("devices") or ())


def held(kernel: dict) -> Usage:
    a = status(kernel).get("admitted") or {}
    return Usage(int(a.get("memory", 0)), int(a.get("smPercent", 0)), 1)


def progress(kernel: dict, now: float | None = None) -> str | None:
    """While the kernel starts, what it waits for in plain words, as of ``now`` (the operator's
    ``status.message`` read by :func:`as_of`: "Node 'gpu-7' is pulling the kernel image ...: 45 s so far");
    None once it runs, stopped or failed."""
    st = status(kernel)
    if st.get("phase", PENDING) not in (PENDING, STARTING) or not st.get("message"):
        return None
    return as_of(st["message"], time.time() if now is None else now)


def as_lease(kernel: dict) -> Lease:
    """The kernel as a lease: id = the GPUKernel's uid, state active while it holds its slice;
    ``extra["progress"]`` is :func:`progress` (the REST API's ``progress`` of the kernel)."""
    m, s, st = meta(kernel), spec(kernel), status(kernel)
    a = st.get("admitted") or {}
    created = timestamp(m.get("creationTimestamp"))
    since = float(a.get("at") or created)
    devices = gpu_devices(kernel)
    state = (HIBERNATED if hibernated(kernel) else ACTIVE) if holds_quota(kernel) else RELEASED
    gpu_count = int(a.get("gpuCount", 1))
    return Lease(
        id=m.get("uid", m.get("name", "")), owner=s.get("owner", ""), kernel_id=s.get("kernelId", ""),
        profile=s.get("profile", ""), isolation=a.get("isolation", ""),
        memory=int(a.get("memory", 0)) // max(gpu_count, 1), sm_percent=a.get("smPercent") or None,
        whole=bool(a.get("whole", False)), gpu_count=gpu_count, state=state,
        gpus=devices if state == ACTIVE else (), last_gpus=devices, groups=tuple(a.get("groups") or ()),
        label=s.get("label", ""), created=created, updated=since, state_since=since, host=st.get("node", ""),
        host_bytes=int(hibernation(kernel).get("bytes") or 0) if state == HIBERNATED else 0,
        phase=_lease_phase(kernel) if state != RELEASED else "",
        borrowed=tuple(st.get("borrowed") or ()) if state != RELEASED else (),
        reason=st.get("reason", "") if st.get("phase") in (FAILED, STOPPED) else "",
        extra={"namespace": m.get("namespace", ""), "name": m.get("name", ""), "phase": st.get("phase", ""),
               "pod": st.get("pod", ""), "message": st.get("message", ""), "progress": progress(kernel)},
    )


def _lease_phase(kernel: dict) -> str:
    """The move under way, in the pool core's words: hibernating, resuming (asked back, or admitted), or
    queued (its resume waits for room on its node, or for its owner's quota)."""
    phase = status(kernel).get("phase")
    if phase == HIBERNATING:
        return phases.HIBERNATING
    if phase == RESUMING:
        return phases.RESUMING
    if phase == HIBERNATED_PHASE and desired(kernel) == DESIRED_RUNNING:  # asked back: admitted soon, or waiting
        if hint_declined(kernel):
            return ""  # a guess the operator declined: it sleeps on (its server withdraws the ask)
        waiting = hibernation(kernel).get("queuePosition") is not None or status(kernel).get("reason") in (
            WAITING_FOR_ROOM, QUOTA_EXCEEDED)
        return phases.QUEUED if waiting else phases.RESUMING
    return ""


# The status.phase a kernel's residency is written as (the operator admits into, the node agent settles).
PHASE_OF = {M.ACTIVE: RUNNING, M.HIBERNATING: HIBERNATING, M.HIBERNATED: HIBERNATED_PHASE, M.RESTORING: RESUMING,
            M.FAILED: FAILED}
# And back: the residency of a kernel in a phase of its GPU memory (phases.RESUMING is the pool core's word
# for a resume asked, which on a cluster is a Hibernated kernel whose spec asks Running).
RESIDENCY_OF_PHASE = {phase: M.Residency(stage) for stage, phase in PHASE_OF.items()}


def residency_of_kernel(kernel: dict | None, *, hint: bool = False) -> M.Residency:
    """The kernel's GPU residency (``pool.residency``), from its object as the watch has it (None: gone):
    its lease's (:func:`as_lease`), ``hint`` where its server woke it on a hint and no cell came since."""
    if kernel is None:
        return M.Residency(M.GONE)
    return M.residency_of(as_lease(kernel), hint=hint)


def settled_phase(phase: str, event: str) -> str:
    """The status.phase a move's report (``event``: a checkpoint or restore done, undone or stuck) settles a
    kernel in ``phase`` (Hibernating or Resuming) to, as the residency model steps it."""
    return PHASE_OF[M.step(RESIDENCY_OF_PHASE[phase], event).state.stage]
