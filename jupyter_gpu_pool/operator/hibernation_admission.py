"""The operator's admission of hibernations and resumes, pure: given a node's kernels and what the operator
read of the node, which asked moves it admits (status phase Hibernating / Resuming, written by
compare-and-set), which it refuses, and where each resume left waiting stands (docs/kubernetes.md,
"Hibernation").  The tests of :mod:`.hibernation` hold the rules (backend, host memory, the node's cap,
safe wake); this module turns them into the status writes, and the controller carries them out, one
node at a time (a resume's room and the node's cap are questions about every kernel of the node).

- :func:`plan_hibernation`: a running kernel asked to hibernate (``spec.desiredState: Hibernated``).
- :func:`quota_pass` then :func:`room_pass`: the node's asked resumes, first asked first: each against
  its owner's quota (a resume waiting for its quota does not hold up the node's queue), then against the
  node agent's fresh NVML reading of its GPU (read only where some resume passed its quota); the resumes
  asked on a hint go behind every real waiter, and are admitted only into the room left, else declined.
  Where the admin shares the pool (``Shared``): a non-member's resume into the room a reservation keeps
  waits without holding up the node's queue (one that borrows says so: ``status.borrowed``), and the
  node's waiters are served in the order sharing gives them (a fair queue), each told why.

Each answer is a step of the shared residency model (:mod:`jupyter_gpu_pool.pool.residency`, the lifecycle the
local hibernator, the server's hook and the node agent step through too): a hibernation request takes an
active kernel to hibernating (the backend, host-memory and cap checks are its host-RAM claim); a resume is
:func:`~jupyter_gpu_pool.pool.residency.admit` with the quota's and the room's answers, whose resulting
stage says what is written: restoring (phase Resuming), queued (a place in the node's queue), or asleep
again (waiting for the quota, with a warning; or, for a hint, declined quietly).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..cluster import resources
from ..cluster.hibernation import HOST_MEMORY, NODE_CAP, UNSUPPORTED
from ..cluster.kernels import PHASE_OF, desired, gpu_devices, hibernation, meta, resume_hint, spec, status
from ..cluster.quotas import Quotas
from ..cluster.resources import DESIRED_HIBERNATED, RUNNING
from ..cluster.room import resume_waiter
from ..pool import Lease, PoolError, PoolExhausted
from ..pool import residency as life
from . import admission
from .admission import Shared
from . import hibernation as rules
from .plan import Announce, Count, Steps, hibernation_changes
from .settings import OperatorSettings
from .sharing import quantity_value

# One kernel's part of a node's plan: the kernel (as read), its actions, when to look at it again.
Part = tuple[dict, tuple, float | None]


def sleep_request(kernel: dict) -> str:
    """The residency event a server's hibernation request is (spec.hibernateReason)."""
    return {"user": life.RELEASE, "admin": life.RELEASE, "after_cell": life.AFTER_CELL}.get(
        spec(kernel).get("hibernateReason") or "idle", life.IDLE)


def resume_answer(kernel: dict, *, quota: bool, room: bool) -> life.Step:
    """Where a hibernated kernel's asked resume (a cell's, or a hint's) goes with the quota's and the room's
    answers: restoring, queued, or asleep (warned where it was a real resume)."""
    request = life.HINT if resume_hint(kernel) else life.CELL
    return life.admit(life.Residency(life.HIBERNATED), request, quota=quota, room=room)


def node_memory(node: dict | None) -> int | None:
    """A Node's allocatable memory in bytes (None where it does not say)."""
    value = quantity_value((((node or {}).get("status") or {}).get("allocatable") or {}).get("memory", ""))
    return int(value) if value else None


def _answered(kernel: dict) -> bool:
    """The node agent answered this request (refused, or failed and put it back): not asked again until a
    new one (a new generation of the spec)."""
    st, refused = status(kernel), (resources.HIBERNATION_FAILED, resources.HIBERNATION_REFUSED)
    return st.get("observedGeneration") == meta(kernel).get("generation") and st.get("reason") in refused and \
        hibernation(kernel).get("reason") in refused


def plan_hibernation(kernel: dict, pod: dict, node_kernels: list[dict], node: dict | None,
                     settings: OperatorSettings, now: float) -> tuple:
    """A running kernel's asked hibernation: admitted where the sharing backend hands memory back, the pod's
    memory limit holds the checkpoint and the node's cap allows it (phase Hibernating), else refused with
    the reason (written again for a new request, so that its server hears)."""
    steps = Steps(kernel)
    if status(kernel).get("phase") != RUNNING or desired(kernel) != DESIRED_HIBERNATED or _answered(kernel):
        return ()
    where, moved, generation = status(kernel).get("node") or "", rules.gpu_bytes(kernel), meta(kernel).get("generation")
    kind, refusal = UNSUPPORTED, rules.backend_refusal(settings.sharing, settings.hami_memory_scaling)
    if refusal is None:
        kind, refusal = HOST_MEMORY, rules.host_memory_refusal(pod, moved)
    if refusal is None:
        cap = settings.hibernated_cap_bytes(node_memory(node))
        kind, refusal = NODE_CAP, rules.node_cap_refusal(kernel, node_kernels, cap, moved, where)
    if refusal is not None:
        if status(kernel).get("message") != refusal or status(kernel).get("observedGeneration") != generation:
            steps.write({"reason": resources.HIBERNATION_REFUSED, "message": refusal, "observedGeneration": generation,
                         **hibernation_changes(kernel, {"reason": kind, "message": refusal})})
            steps.add(Count("admissions", "hibernation_refused"),
                      Announce("Normal", resources.HIBERNATION_REFUSED, refusal))
        return tuple(steps.actions)
    why = spec(kernel).get("hibernateReason") or "idle"
    asked = life.step(life.Residency(life.ACTIVE), sleep_request(kernel))  # its host-RAM claim passed just above
    steps.write({"phase": PHASE_OF[asked.state.stage], "reason": "", "observedGeneration": generation,
                 "message": f"Hibernating ({why}): its GPU memory moves to host memory on node {where}.",
                 "hibernation": {"requestedAt": now, "reason": why, "message": "", "queuePosition": None,
                                 "devices": list(gpu_devices(kernel)) or None}}, compare=True)
    steps.add(Count("admissions", "hibernation"))
    return tuple(steps.actions)


def asked_now(node_kernels: list[dict], node: str, now: float) -> dict[str, float]:
    """The node's resumes seen asked for the first time (requestedAt not after its hibernation): they join
    the queue at its end, now."""
    asked = {}
    for k in rules.resume_order(node_kernels, node):
        h = hibernation(k)
        if float(h.get("requestedAt") or 0) <= float(h.get("hibernatedAt") or 0):
            asked[meta(k)["uid"]] = now
    return asked


def quota_pass(node_kernels: list[dict], node: str, quotas: Quotas, holding: Mapping[str, tuple[Lease, ...]],
               settings: OperatorSettings, now: float, shared: Shared | None = None
               ) -> tuple[list[dict], list[dict], list[Part], dict[str, tuple[str, ...]]]:
    """The node's asked resumes against their owners' quotas (and, where a reservation keeps room, that room):
    those that pass (real ones in queue order, then the hinted ones), the parts of those that do not: asleep
    again, a real one warned (it waits for its quota, or for reserved room, without holding up the node's
    queue), a hint quietly (declined); and what each one that passed borrows (by uid).  ``holding``: each
    asker's counted leases, by uid."""
    asked = asked_now(node_kernels, node, now)
    real = sorted(rules.resume_order(node_kernels, node), key=lambda k: (
        asked.get(meta(k)["uid"], float(hibernation(k).get("requestedAt") or 0)), meta(k)["name"]))
    hints = rules.hinted_resumes(node_kernels, node)
    room = shared if shared is not None and shared.sharing.needs_everyone(now) else None
    passed: dict[str, list[dict]] = {"real": [], "hint": []}
    parts: list[Part] = []
    borrowed: dict[str, tuple[str, ...]] = {}
    for k in [*real, *hints]:
        try:
            borrowed[meta(k)["uid"]] = admission.admit_resume(k, quotas, holding[meta(k)["uid"]], now, room)
        except PoolError as refusal:
            if life.WARN in resume_answer(k, quota=False, room=False).effects:
                reason, why = resources.QUOTA_EXCEEDED, rules.quota_wait(refusal)
                if isinstance(refusal, PoolExhausted):  # the room it would resume in is reserved for others
                    reason, why = resources.WAITING_FOR_ROOM, f"waiting: the room it would resume in is reserved " \
                                                              f"({refusal.reserved})"
                parts.append(_wait(k, asked, None, reason, f"This kernel's resume is {why}.", why, settings))
            else:
                parts.append(_decline(k, "not_now", f"This kernel was not woken in advance: {refusal}"))
            continue
        passed["hint" if resume_hint(k) else "real"].append(k)
    return passed["real"], passed["hint"], parts, borrowed


def in_line(fit: list[dict], shared: Shared | None, now: float) -> tuple[list[dict], dict[str, str]]:
    """The node's real resume waiters in the order the admin's sharing serves them (a fair queue; members of a
    reservation keeping room first), and why each is where it is (by uid); first asked first without it."""
    if shared is None or shared.sharing.plain or len(fit) < 2:
        return fit, {}
    line = shared.sharing.line([resume_waiter(k, now) for k in fit], now=now, gpus=shared.gpus,
                               everyone=shared.everyone, use=shared.group_use)
    by_uid = {meta(k)["uid"]: k for k in fit}
    told = line.told()
    return [by_uid[w.id] for w in told], {w.id: w.why.split(": ", 1)[-1] for w in told if w.why}


def room_pass(fit: list[dict], hinted: list[dict], node_kernels: list[dict], node: str, reading: rules.FreeReading | None,
              settings: OperatorSettings, now: float, shared: Shared | None = None,
              borrowed: Mapping[str, tuple[str, ...]] | None = None) -> list[Part]:
    """The resumes that passed their quotas, against the room on their GPUs (safe wake), first come, first
    served (or in the order the admin's sharing gives: ``shared``), the hints behind every real waiter:
    restoring (phase Resuming, with what it borrows), queued (with its place, and why where sharing orders the
    queue), or, a hint without room, asleep (declined, saying whether others wait)."""
    asked = asked_now(node_kernels, node, now)
    fit, whys = in_line(fit, shared, now)
    borrowed = borrowed or {}
    admitted, waiting = rules.plan_resumes(fit + hinted, node_kernels, reading, now, settings.gpu_free_max_age,
                                           settings.resume_margin)
    others = any(meta(k)["uid"] in waiting for k in fit)
    parts: list[Part] = []
    for k in fit + hinted:
        place = waiting.get(meta(k)["uid"])
        answer = resume_answer(k, quota=True, room=place is None)
        if answer.state.stage == life.RESTORING:
            steps = Steps(k)
            steps.write({"phase": PHASE_OF[life.RESTORING], "reason": "",
                         "observedGeneration": meta(k).get("generation"),
                         "borrowed": list(borrowed.get(meta(k)["uid"], ())) or None,
                         "message": f"Resuming on node {node}: its GPU memory comes back from host memory.",
                         "hibernation": {"queuePosition": None, "requestedAt": asked.get(meta(k)["uid"]),
                                         "message": "", "declined": None, "why": None}}, compare=True)
            steps.add(Count("admissions", "resume"))
            parts.append((k, tuple(steps.actions), None))
        elif answer.state.stage == life.QUEUED:
            why = whys.get(meta(k)["uid"])
            parts.append(_wait(k, asked, place.position, resources.WAITING_FOR_ROOM,
                               f"Waiting to resume: position {place.position} in the queue of node {node}"
                               + (f" ({why})" if why else "") + f", {place.message}.", place.message, settings,
                               why=why))
        elif others:
            parts.append(_decline(k, "others_waiting", f"Others are waiting to resume on node {node}, so this kernel "
                                  "was not woken in advance: it resumes when a cell runs, in its turn."))
        else:
            parts.append(_decline(k, "no_room", f"No room on its GPU now ({place.message}), so this kernel was not "
                                  "woken in advance: it resumes when a cell runs (in the queue if need be)."))
    return parts


def _decline(kernel: dict, word: str, message: str) -> Part:
    """A resume asked on a hint that would have had to wait: declined, in words, in no queue (its server then
    withdraws the ask; a cell asks again, for real)."""
    steps = Steps(kernel)
    steps.write({"reason": resources.RESUME_DECLINED, "message": message,
                 "observedGeneration": meta(kernel).get("generation"),
                 **hibernation_changes(kernel, {"queuePosition": None, "declined": word})})
    if steps.actions:
        steps.add(Count("admissions", "hint_declined"))
    return kernel, tuple(steps.actions), None


def _wait(kernel: dict, asked: dict[str, float], position: int | None, reason: str, message: str, what: str,
          settings: OperatorSettings, why: str | None = None) -> Part:
    """A resume left waiting, with its place and words (status.message the sentence, hibernation.message what
    it waits for, hibernation.why why it is where it is in a shared queue; written only when they change),
    looked at again soon: room frees as the node's agent reports."""
    changes = {"queuePosition": position, "message": what, "declined": None, "why": why}
    if meta(kernel)["uid"] in asked:
        changes["requestedAt"] = asked[meta(kernel)["uid"]]
    steps = Steps(kernel)
    steps.write({"reason": reason, "message": message, "observedGeneration": meta(kernel).get("generation"),
                 **hibernation_changes(kernel, changes)})
    return kernel, tuple(steps.actions), settings.progress_interval
