"""The operator's decisions for one kernel, pure: from what it observed (the GPUKernel, its own pods, when
its heartbeat last changed, the API server's refusals, a slow start's Events and Node, the quotas and the
leases that count for its owner), the writes and deletes to make, in order, and when to look again.

:func:`plan` is the level-triggered reconcile (docs/kubernetes.md):

1. a kernel whose server stopped renewing its heartbeat is deleted (its pod, Secret and NetworkPolicy go
   with it: they are owned by the kernel), a pod its node agent resumed made safe to kill first;
2. a new kernel is admitted against quotas (:mod:`.admission`), and in the same status write its launch
   starts: its Secret (the connection key), NetworkPolicy and pod follow;
3. the pod of the wanted launch runs (pods of other launches are deleted; ``spec.stopped`` stops it), and
   ``status`` says what it does, in the user's words (:mod:`.diagnosis`);
4. a running kernel's asked hibernation or resume goes to the hibernation admission (node-wide:
   :mod:`.hibernation_admission`).

What bounds the writes: a status write carries only what changed; a start under way is not reported
before ``progress_interval`` (a pod that runs within it costs one write for its start and one for
running), and its words name when a wait began, never how long it has lasted, so they are written once;
"look again" is asked only where time alone changes the answer (a slow start's story, a grace period, a
back-off, a precaution's timeout).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..cluster import resources
from ..cluster.kernels import desired, hibernation, meta, spec, status
from ..cluster.quotas import Quotas
from ..cluster.resources import (DESIRED_HIBERNATED, DESIRED_RUNNING, FAILED, HIBERNATED, HIBERNATING, RESUMING,
                                 RUNNING, STARTING, STOPPED)
from ..pool import Lease, PoolError, PoolExhausted, QuotaExceeded
from . import admission
from .diagnosis import DeviceShortfall, Verdict, diagnose
from .settings import OperatorSettings

MOVING = (HIBERNATING, HIBERNATED, RESUMING)  # the kernel's GPU memory is (going) in host memory: the agent's
SECRET, POLICY, POD = "secret", "network policy", "pod"


# -- what a plan says to do --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Write:
    """A status write of ``changes`` (``compare``: with the resourceVersion read, so a newer status is never
    overwritten; ``always``: even when empty, to learn that the kernel still exists).  A write that finds the
    kernel gone, or changed since it was read, ends the plan: the kernel is looked at again as it is now."""
    changes: dict
    compare: bool = False
    always: bool = False


@dataclass(frozen=True)
class Ensure:
    """The kernel's Secret, NetworkPolicy or pod (``launch``) exists, made for this GPUKernel object."""
    what: str
    launch: int = 0


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace: int | None = None


@dataclass(frozen=True)
class DeleteKernel:
    reason: str
    message: str


@dataclass(frozen=True)
class Announce:
    """An Event on the GPUKernel (type Normal or Warning)."""
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Count:
    """A metric: ``admissions`` / ``launch_failures`` (by ``label``), ``start_seconds`` (observe ``value``)."""
    metric: str
    label: str = ""
    value: float = 1.0


@dataclass(frozen=True)
class Hibernation:
    """Hand the kernel's asked move to the hibernation admission: ``hibernate`` or ``resume``."""
    move: str


@dataclass(frozen=True)
class Plan:
    actions: tuple = ()
    look_again: float | None = None  # seconds from now
    admitted: dict | None = None  # an admission decided here: it counts against quotas from now on
    on: str = ""  # the node entry that admission counted it on (a reservation's room), until its pod is placed


@dataclass(frozen=True)
class Refusal:
    """The API server refused a kernel's pod: for which launch, the wait before the next try, and when."""
    launch: int
    wait: float
    retry_at: float


# -- what the controller observed ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Facts:
    kernel: dict
    settings: OperatorSettings
    now: float
    pods: Mapping[str, dict] = field(default_factory=dict)  # the kernel's own pods (owned by its uid), by name
    going: frozenset[str] = frozenset()  # of those, the ones being deleted (or asked to be)
    pods_listed: bool = True  # its namespace's pods have been listed once (else a missing pod is unknown)
    heartbeat_seen: float | None = None  # when this operator last saw the heartbeat change
    refusal: Refusal | None = None  # the API server's last refusal of this launch's pod
    events: tuple = ()  # a slow start's pod Events
    node: dict | None = None  # and its Node
    shortfall: DeviceShortfall | None = None  # dra: why the cluster cannot meet the pod's device claim
    unsupported: str | None = None  # dra: why the profile's claim cannot be held at all
    quotas: Quotas | None = None  # for an admission
    holding: tuple[Lease, ...] = ()  # the leases an admission counts (the owner's, their groups')
    shared: admission.Shared | None = None  # where a reservation keeps room: what the admin's sharing reads


class Steps:
    """The actions planned for one kernel so far, and the kernel as it will be once their writes land."""

    def __init__(self, kernel: dict):
        self.kernel = kernel
        self.actions: list = []

    def write(self, wanted: dict, *, always: bool = False, compare: bool | None = None) -> None:
        """What changed of ``wanted`` (a None removes a field), merged into the write just before if any."""
        current = status(self.kernel)
        changes = {k: v for k, v in wanted.items() if current.get(k) != v and not (v is None and k not in current)}
        if not changes and not always:
            return
        compare = in_play(self.kernel) if compare is None else compare
        last = self.actions[-1] if self.actions else None
        if isinstance(last, Write) and last.compare == compare:
            self.actions[-1] = Write({**last.changes, **changes}, compare, last.always or always)
        else:
            self.actions.append(Write(changes, compare, always))
        self.kernel = {**self.kernel, "status": {**current, **changes}}

    def add(self, *actions) -> None:
        self.actions.extend(actions)

    def plan(self, look_again: float | None = None, admitted: dict | None = None) -> Plan:
        return Plan(tuple(self.actions), look_again, admitted)


def in_play(kernel: dict) -> bool:
    """Whether the kernel's status has writers beside the operator: once its server has asked for a state
    (spec.desiredState), the node agent settles its moves and the server may ask again at any time, so the
    operator's status writes are compare-and-set.  A kernel never asked has one writer of its phase (the
    agent's usage report is a field of its own), and keeps the plain merge patch."""
    return "desiredState" in spec(kernel) or status(kernel).get("phase") in MOVING


def fail(steps: Steps, reason: str, message: str) -> None:
    """The kernel fails (once per reason), with an Event saying why."""
    if status(steps.kernel).get("phase") == FAILED and status(steps.kernel).get("reason") == reason:
        return
    steps.write({"phase": FAILED, "reason": reason, "message": message})
    steps.add(Announce("Warning", reason, message))


def lost(steps: Steps, what: str) -> None:
    """The kernel's pod ended while its memory was in host memory (or moving): the kernel is gone, and so
    is its hold on quotas (phase Failed); nothing restarts it as a new, empty kernel."""
    state = {HIBERNATING: "hibernating", HIBERNATED: "hibernated", RESUMING: "resuming"}.get(
        status(steps.kernel).get("phase"), "hibernated")
    fail(steps, resources.PREEMPTED, f"The kernel's pod ended while the kernel was {state} ({what}): its variables "
         "are lost, and its GPU slice is free again. Start the kernel again to go on.")


# -- the plan ------------------------------------------------------------------------------------------------

def plan(f: Facts) -> Plan:
    """What to do about one kernel now (see the module's docstring)."""
    kernel, s = f.kernel, spec(f.kernel)
    steps = Steps(kernel)
    if orphaned(f):
        return _delete_kernel(f, steps)
    if status(kernel).get("phase") == FAILED:
        steps.add(*(DeletePod(name, 0) for name in f.pods if name not in f.going))
        return steps.plan()
    refusal = _invalid(f)
    if refusal is not None:
        fail(steps, resources.INVALID, refusal)
        return steps.plan()
    profile = f.settings.profile(s.get("profile", ""))
    assert profile is not None  # _invalid said so
    rendering = f.settings.renderings[profile.name]
    if status(kernel).get("admitted"):
        return _launch(f, steps, profile.name, rendering, None)
    decided = _admit(f, steps, profile.name, rendering)
    if decided is None:
        waits = status(steps.kernel).get("waiting") and status(steps.kernel).get("phase") != FAILED
        return steps.plan(f.settings.progress_interval if waits else None)
    return replace(_launch(f, steps, profile.name, rendering, decided.record), on=decided.on)


def orphaned(f: Facts) -> bool:
    """No heartbeat change seen for ``heartbeat_timeout`` (measured on this operator's clock)."""
    return f.heartbeat_seen is not None and f.now - f.heartbeat_seen > f.settings.heartbeat_timeout


def _invalid(f: Facts) -> str | None:
    s = spec(f.kernel)
    if f.settings.profile(s.get("profile", "")) is None:
        known = ", ".join(sorted(f.settings.pool.profiles))
        return (f"There is no GPU profile named {s.get('profile')!r}. The profiles are: {known}. Pick one of "
                "these, or ask your admin to add it.")
    image = s.get("image") or f.settings.kernel_image
    if not any(fnmatch.fnmatchcase(image, p) for p in f.settings.allowed_images):
        return f"The kernel image {image!r} is not one the admin allows ({', '.join(f.settings.allowed_images)})."
    return None


def _admit(f: Facts, steps: Steps, profile: str, rendering) -> admission.Admitted | None:
    """The admission against quotas (and, where a reservation keeps room, the room): its record (written with
    the launch's start), or None (refused, or waiting for room reserved for its owner)."""
    assert f.quotas is not None, "an admission needs the quotas"
    try:
        admitted = admission.admit_start(f.kernel, profile, f.settings.sharing.backend, rendering, f.quotas,
                                         f.holding, f.now, shared=f.shared)
    except admission.WaitForRoom as e:
        _wait_for_room(f, steps, e)
        return None
    except PoolError as e:
        steps.add(Count("admissions", e.reason))
        reason = resources.QUOTA_EXCEEDED if isinstance(e, QuotaExceeded) else \
            resources.ROOM_RESERVED if isinstance(e, PoolExhausted) else "QuotaMisconfigured"
        fail(steps, reason, str(e))
        return None
    steps.add(Count("admissions", "admitted"))
    gpu = {"sharing": f.settings.sharing.backend, "resources": dict(rendering.limits)}
    if rendering.claim is not None:
        gpu["claimTemplate"] = resources.claim_template_name(profile)
    steps.write({"admitted": admitted.record, "phase": STARTING, "reason": "",
                 "message": f"Admitted: {rendering.description}.", "gpu": gpu, "waiting": None,
                 "borrowed": list(admitted.borrowed) or None, "observedGeneration": meta(f.kernel).get("generation")})
    return admitted


def _wait_for_room(f: Facts, steps: Steps, e: admission.WaitForRoom) -> None:
    """A member's start waits for the room reserved for them (others hold it): its place and why, written
    when they change, and looked at again every ``progress_interval`` (others' kernels give the room back)."""
    since = (status(f.kernel).get("waiting") or {}).get("since", f.now)
    steps.write({"phase": resources.PENDING, "reason": resources.WAITING_FOR_ROOM, "message": e.message,
                 "waiting": {"since": since, "memory": e.memory, "groups": list(e.groups), "position": e.position,
                             "why": e.why}})
    if not status(f.kernel).get("waiting"):
        steps.add(Count("admissions", "waiting_for_room"))


def launch_pod(kernel: dict, pods: Mapping[str, dict]) -> tuple[str, dict | None]:
    """The name of the wanted launch's pod among the kernel's own ``pods``, and that pod if it exists (found
    by its launch label: a pod made before the names carried the kernel's uid is still this launch's)."""
    launch = int(spec(kernel)["launch"])
    for name, pod in pods.items():
        if (meta(pod).get("labels") or {}).get(resources.LABEL_LAUNCH) == str(launch):
            return name, pod
    return resources.pod_name(meta(kernel)["name"], launch, meta(kernel)["uid"]), None


def _launch(f: Facts, steps: Steps, profile: str, rendering, admitted: dict | None) -> Plan:
    s = spec(f.kernel)
    wanted, pod = launch_pod(f.kernel, f.pods)
    stop_grace = int(s.get("stopGraceSeconds", 10))
    waits = []
    for name, other in f.pods.items():  # pods of other launches
        if name != wanted and name not in f.going:
            safe, wait = _precaution(f, steps, other)
            if safe:
                steps.add(DeletePod(name, stop_grace))
            waits.append(wait)
    if s.get("stopped"):
        return _stop(f, steps, pod, stop_grace, waits)
    if pod is None:
        return _start(f, steps, wanted, rendering, admitted, waits)
    return _follow(f, steps, pod, profile, rendering, waits, admitted)


def _soonest(*waits: float | None) -> float | None:
    known = [w for w in waits if w is not None]
    return max(min(known), 0.0) if known else None


def _stop(f: Facts, steps: Steps, pod: dict | None, grace: int, waits: list) -> Plan:
    if pod is not None and meta(pod)["name"] not in f.going and \
            (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        safe, wait = _precaution(f, steps, pod)
        if not safe:
            return steps.plan(_soonest(wait, *waits))  # the agent's answer (or the timeout) brings it back
        steps.add(DeletePod(meta(pod)["name"], grace))
    steps.write({"phase": STOPPED, "reason": "Stopped", "launch": int(spec(f.kernel)["launch"]),
                 "message": "The kernel was stopped by its server."})
    return steps.plan(_soonest(*waits))


def _start(f: Facts, steps: Steps, wanted: str, rendering, admitted: dict | None, waits: list) -> Plan:
    """No pod for the wanted launch: make one (unless this launch ended, or its memory was lost with it)."""
    if not f.pods_listed:
        return steps.plan(admitted=admitted)  # the operator just started: its pods' listing brings it back
    st, launch, now = status(steps.kernel), int(spec(f.kernel)["launch"]), f.now
    if st.get("launch") == launch and st.get("phase") == STOPPED:
        return steps.plan(_soonest(*waits))  # this launch ran and ended; a new launch needs spec.launch + 1
    if st.get("launch") == launch and st.get("phase") in MOVING:
        lost(steps, "its pod was deleted")  # a new pod would be a new, empty kernel
        return steps.plan()
    refused = f.refusal if f.refusal is not None and f.refusal.launch == launch else None
    if refused is not None and now < refused.retry_at:
        return steps.plan(_soonest(refused.retry_at - now, *waits), admitted)  # refused: not before then
    # The status first: a kernel deleted unseen answers 404 here, before anything is made for it. startedAt
    # once per launch, and a refusal's words kept while it is tried again: a write that changes nothing is
    # not made, so its watch event cannot bring this kernel back here at once.
    starting = {"phase": STARTING, "launch": launch, "pod": wanted, "podIP": None, "node": None, "exitCode": None,
                "runningAt": None}
    if refused is None:
        starting.update(reason="", message=f"Starting on {rendering.description}.")
    if st.get("launch") != launch or not st.get("startedAt") or st.get("phase") != STARTING:
        starting["startedAt"] = now
    steps.write(starting, always=True)
    if rendering.claim is not None and f.unsupported:
        fail(steps, resources.UNSUPPORTED, f.unsupported)
        return steps.plan(admitted=admitted)
    steps.add(Ensure(SECRET))
    if f.settings.network_policy:
        steps.add(Ensure(POLICY))
    steps.add(Ensure(POD, launch))
    return steps.plan(_soonest(f.settings.progress_interval, *waits), admitted)


def tells_story(kernel: dict, pod: dict, now: float, interval: float) -> bool:
    """Whether a pod's Events and Node are worth reading: it is placed, it has not started, and its start has
    taken ``interval`` already (a pod that runs sooner never costs a read)."""
    placed = bool((pod.get("spec") or {}).get("nodeName"))
    return placed and (pod.get("status") or {}).get("phase") == "Pending" and not _young(kernel, now, interval)


def _young(kernel: dict, now: float, interval: float) -> bool:
    """A start of this launch under way for less than ``interval``, whose status says nothing but that."""
    st = status(kernel)
    return st.get("phase") == STARTING and st.get("launch") == spec(kernel).get("launch") and not st.get("reason") \
        and now - float(st.get("startedAt") or 0) < interval


def _follow(f: Facts, steps: Steps, pod: dict, profile: str, rendering, waits: list,
            admitted: dict | None) -> Plan:
    """The wanted launch's pod exists: the kernel's status follows it."""
    now, settings = f.now, f.settings
    verdict = diagnose(pod, profile, rendering.description, now, settings.unschedulable_grace, list(f.events),
                       f.node, rendering.need, f.shortfall)
    phase_now = status(steps.kernel).get("phase")
    if phase_now in MOVING:
        if verdict.phase != RUNNING:  # the process that held the kernel's memory is gone with its pod
            lost(steps, verdict.message.rstrip("."))
            steps.add(DeletePod(meta(pod)["name"], 0))
            return steps.plan()
        return _moves(f, steps, pod, waits)
    grace = verdict.changes_at - now if verdict.changes_at is not None else None
    if verdict.phase == STARTING and _young(steps.kernel, now, settings.progress_interval):
        # Nothing to tell yet: most starts run within the interval, and their pod's events bring them back.
        began = float(status(steps.kernel).get("startedAt") or now)
        return steps.plan(_soonest(began + settings.progress_interval - now, grace, *waits), admitted)
    _report(f, steps, pod, verdict)
    if verdict.phase == RUNNING:
        return _moves(f, steps, pod, waits)
    if verdict.phase == FAILED:
        steps.add(Count("launch_failures", verdict.reason), Announce("Warning", verdict.reason, verdict.message),
                  DeletePod(meta(pod)["name"], 0))
        return steps.plan(_soonest(*waits))
    story = settings.progress_interval if tells_story(steps.kernel, pod, now, 0) else None
    return steps.plan(_soonest(story, grace, *waits), admitted)


def _report(f: Facts, steps: Steps, pod: dict, verdict: Verdict) -> None:
    """The pod's state into the kernel's status (what changed of it)."""
    st = status(steps.kernel)
    update = {"phase": verdict.phase, "reason": verdict.reason, "message": verdict.message,
              "launch": int(spec(f.kernel)["launch"]), "pod": meta(pod)["name"],
              "podIP": (pod.get("status") or {}).get("podIP"), "node": (pod.get("spec") or {}).get("nodeName"),
              "exitCode": verdict.exit_code}
    if verdict.phase == RUNNING and st.get("phase") == RUNNING and \
            st.get("reason") in (resources.HIBERNATION_REFUSED, resources.HIBERNATION_FAILED):
        del update["reason"], update["message"]  # the words stay until the server reads them
    started = verdict.phase == RUNNING and st.get("phase") != RUNNING
    if started:
        update["runningAt"] = f.now
    steps.write(update)
    if started and st.get("startedAt"):
        steps.add(Count("start_seconds", value=max(f.now - float(st["startedAt"]), 0)))


def _moves(f: Facts, steps: Steps, pod: dict, waits: list) -> Plan:
    """A kernel whose pod runs: its server's spec.desiredState, where it asks a move (docs/kubernetes.md)."""
    kernel = steps.kernel
    phase, want = status(kernel).get("phase"), desired(kernel)
    if phase == RUNNING and want == DESIRED_HIBERNATED:
        steps.add(Hibernation("hibernate"))
    elif phase == HIBERNATED and want == DESIRED_RUNNING:
        steps.add(Hibernation("resume"))
    elif phase == HIBERNATED and want == DESIRED_HIBERNATED and (
            hibernation(kernel).get("queuePosition") is not None
            or status(kernel).get("reason") in (resources.WAITING_FOR_ROOM, resources.QUOTA_EXCEEDED,
                                                resources.RESUME_DECLINED)):
        steps.write({"reason": "", "message": "Hibernated: asked to stay so.",
                     **hibernation_changes(kernel, {"queuePosition": None, "declined": None, "why": None})})
    return steps.plan(_soonest(*waits))


def hibernation_changes(kernel: dict, changes: dict) -> dict:
    """``{"hibernation": changes}`` where they change status.hibernation (a None removes a field, as in a
    merge patch), else nothing: a write that changes nothing is not made."""
    current = hibernation(kernel)
    merged = {k: v for k, v in {**current, **changes}.items() if v is not None}
    return {"hibernation": changes} if merged != current else {}


# -- deleting a kernel, and the precaution before killing a process the node agent restored ------------

def _delete_kernel(f: Facts, steps: Steps) -> Plan:
    """Delete a kernel whose server is gone: its pods first, each one its node agent resumed made safe to
    kill (until then the kernel stays, and the plan comes back here), then the GPUKernel."""
    waits, safe_all = [], True
    for name, pod in f.pods.items():
        if name in f.going:
            continue
        safe, wait = _precaution(f, steps, pod)
        if safe:
            steps.add(DeletePod(name, 0))
        else:
            safe_all = False
            waits.append(wait)
    if not safe_all:
        return steps.plan(_soonest(*waits))
    steps.add(DeleteKernel(resources.SERVER_GONE, f"Its server stopped renewing the heartbeat for over "
                           f"{f.settings.heartbeat_timeout:.0f}s: the kernel was deleted."))
    return steps.plan()


def resumed(kernel: dict, pod: dict) -> bool:
    """Whether ``pod``'s processes may have been restored by the node agent: the agent settled a resume of
    this very pod (hibernation.pod), or is resuming it now."""
    name = meta(pod).get("name")
    if hibernation(kernel).get("pod") == name and hibernation(kernel).get("resumedAt"):
        return True
    return status(kernel).get("phase") == RESUMING and status(kernel).get("pod") == name


def _precaution(f: Facts, steps: Steps, pod: dict) -> tuple[bool, float | None]:
    """Whether ``pod`` may be deleted now, and else when to look again.  A pod the node agent resumed is
    deleted only once the agent has locked and checkpointed its restored processes again (its answer in
    status.killPrecaution), or ``kill_precaution_timeout`` after the operator asked: the kubelet kills a
    pod's processes as its deletion begins, grace period or not, so the precaution must come before the
    delete (cuda-checkpoint issue 53).  The request is a compare-and-set write, as the moves are; the
    agent's answer brings the kernel back here.  Any other pod: at once."""
    timeout, kernel, now = f.settings.kill_precaution_timeout, steps.kernel, f.now
    if timeout <= 0 or not resumed(kernel, pod):
        return True, None
    name = meta(pod)["name"]
    asked = status(kernel).get("killPrecaution") or {}
    if asked.get("pod") == name and asked.get("answeredAt") is not None:
        return True, None
    if asked.get("pod") != name or asked.get("requestedAt") is None:
        steps.write({"killPrecaution": {"pod": name, "requestedAt": now, "answeredAt": None, "message": None}},
                    compare=True)
        return False, timeout
    waited = now - float(asked["requestedAt"])
    if waited < timeout:
        return False, timeout - waited
    message = (f"The node agent of node {status(kernel).get('node') or 'unknown'} did not answer within {timeout:g} "
               f"s whether it had checkpointed the kernel's restored GPU processes again, so its pod {name} is "
               "deleted anyway. On a driver with cuda-checkpoint issue 53 this kill can hang the node: check the "
               "node agent.")
    steps.add(Announce("Warning", resources.KILL_PRECAUTION_TIMED_OUT, message))
    return True, None


# -- the API server refused the kernel's pod -----------------------------------------------------------------

def pod_refused(f: Facts, said: str) -> tuple[Refusal, Plan]:
    """The API server refused the kernel's pod (a ResourceQuota, an admission policy; or it failed): tried
    again after a wait that doubles from ``api_retry_first`` up to ``reconcile_interval``, with the API
    server's words in the kernel's status (the user's server shows them) and, once per new refusal, an
    Event.  The kernel keeps waiting: a quota frees when other pods end."""
    settings, launch = f.settings, int(spec(f.kernel)["launch"])
    previous = f.refusal if f.refusal is not None and f.refusal.launch == launch else None
    wait = settings.api_retry_first if previous is None else \
        min(previous.wait * 2, max(settings.reconcile_interval, settings.api_retry_first))
    message = (f"The cluster refused the kernel's pod: {said} The operator tries again, at least every "
               f"{settings.reconcile_interval:.0f} s, until your server's start timeout. "
               + ("Ask your admin to raise the namespace's ResourceQuota, or shut down a kernel you no longer "
                  "need." if "exceeded quota" in said else "Ask your admin."))
    steps = Steps(f.kernel)
    steps.add(Count("launch_failures", resources.POD_REFUSED))
    if status(f.kernel).get("message") != message:
        steps.write({"phase": STARTING, "reason": resources.POD_REFUSED, "message": message})
        steps.add(Announce("Warning", resources.POD_REFUSED, message))
    return Refusal(launch, wait, f.now + wait), steps.plan(wait)

