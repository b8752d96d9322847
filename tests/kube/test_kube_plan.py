"""The operator's plan for one kernel as a decision table (operator/plan.py, pure): each row is what the
operator observed and what it must do, in order, and when it looks again.  The rows are the behaviour the
controller had before the plan was pulled out of it, plus the defects fixed since (each named in its row),
and the bounds on its writes: a start that runs within ``progress_interval`` is not reported before it
runs, and a slow start's words name when its wait began, so looking again writes nothing new."""

from __future__ import annotations

import pytest
from kube_helpers import PROFILES, GiB

from jupyter_gpu_pool.cluster.kernels import as_of
from jupyter_gpu_pool.cluster.quotas import read_quotas
from jupyter_gpu_pool.cluster.resources import LABEL_LAUNCH
from jupyter_gpu_pool.config import GPUPool
from jupyter_gpu_pool.operator.admission import held_leases
from jupyter_gpu_pool.operator.plan import (Announce, Count, DeleteKernel, DeletePod, Ensure, Facts, Hibernation,
                                            Plan, Refusal, Write, plan, pod_refused)
from jupyter_gpu_pool.operator.settings import GPUPoolOperator, operator_settings
from jupyter_gpu_pool.pool.units import format_rfc3339

NOW = 1_714_564_800.0  # 2024-05-01T12:00:00Z
SETTINGS = operator_settings(GPUPoolOperator(kernel_image="quay.io/jupyter/k:1", progress_interval=5.0,
                                             heartbeat_timeout=120.0, kill_precaution_timeout=30.0),
                             GPUPool(profiles=PROFILES).check())
GRACE = operator_settings(GPUPoolOperator(kernel_image="quay.io/jupyter/k:1", unschedulable_grace=60.0),
                          GPUPool(profiles=PROFILES).check())
UID = "3f2a9c1e-0000-4000-8000-000000000001"
POD1 = "k-a-1-3f2a9c1e"
ADMITTED = {"profile": "small", "isolation": "hami", "memory": 10 * GiB, "smPercent": 0, "gpuCount": 1,
            "whole": False, "groups": [], "at": NOW - 100}


def kernel(status: dict | None = None, launch: int = 1, **spec) -> dict:
    return {"metadata": {"name": "k-a", "namespace": "jhub", "uid": UID, "generation": 1, "resourceVersion": "7"},
            "spec": {"owner": "alice", "kernelId": "a", "profile": "small", "launch": launch, **spec},
            "status": status or {}}


def started(**more) -> dict:
    """Admitted, its launch 1 started ``more.pop('ago', 1)`` s ago, its status saying nothing else yet."""
    ago = more.pop("ago", 1.0)
    return {"admitted": ADMITTED, "phase": "Starting", "launch": 1, "pod": POD1, "reason": "",
            "message": "Starting on 10 GiB of GPU memory (HAMi).", "startedAt": NOW - ago, **more}


def running(**more) -> dict:
    return {"admitted": ADMITTED, "phase": "Running", "launch": 1, "pod": POD1, "podIP": "10.0.0.7",
            "node": "gpu-node-1", "reason": "", "message": "", "exitCode": None, "startedAt": NOW - 30,
            "runningAt": NOW - 29, **more}


def pod(phase: str = "Running", name: str = POD1, launch: int = 1, node: str | None = "gpu-node-1",
        conditions=(), state=None, deleting: bool = False) -> dict:
    p = {"metadata": {"name": name, "namespace": "jhub", "uid": f"uid-{name}", "labels": {LABEL_LAUNCH: str(launch)},
                      "creationTimestamp": format_rfc3339(NOW - 6)},
         "spec": {"containers": [{"name": "kernel", "image": "quay.io/jupyter/k:1"}]},
         "status": {"phase": phase, "conditions": list(conditions)}}
    if node:
        p["spec"]["nodeName"] = node
    if phase == "Running":
        p["status"]["podIP"] = "10.0.0.7"
        state = state or {"running": {}}
    if state is not None:
        p["status"]["containerStatuses"] = [{"name": "kernel", "image": "quay.io/jupyter/k:1", "state": state}]
    if deleting:
        p["metadata"]["deletionTimestamp"] = format_rfc3339(NOW)
    return p


def unschedulable(ago: float) -> dict:
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": format_rfc3339(NOW - ago), "message": "0/1 nodes are available: 1 Insufficient "
            "nvidia.com/gpumem."}


def facts(k: dict, *pods: dict, settings=SETTINGS, **more) -> Facts:
    quotas = read_quotas(more.pop("quotas", []))
    return Facts(kernel=k, settings=settings, now=NOW, pods={p["metadata"]["name"]: p for p in pods},
                 heartbeat_seen=more.pop("heartbeat_seen", NOW - 1), quotas=quotas, **more)


def shown(decided, kernel: dict) -> list:
    """A plan in short: each action as a tuple (a write: the kernel's phase and reason once it lands, and
    whether it is compare-and-set), then ('look again', seconds)."""
    out, st = [], dict(kernel.get("status") or {})
    for a in decided.actions:
        if isinstance(a, Write):
            st.update(a.changes)
            out.append(("write", st.get("phase"), st.get("reason"), a.compare))
        elif isinstance(a, Ensure):
            out.append(("ensure", a.what) + ((a.launch,) if a.launch else ()))
        elif isinstance(a, DeletePod):
            out.append(("delete pod", a.name, a.grace))
        elif isinstance(a, DeleteKernel):
            out.append(("delete kernel", a.reason))
        elif isinstance(a, Announce):
            out.append(("event", a.reason))
        elif isinstance(a, Count):
            out.append(("count", a.metric, a.label))
        elif isinstance(a, Hibernation):
            out.append(("hibernation", a.move))
    if decided.look_again is not None:
        out.append(("look again", round(decided.look_again, 3)))
    return out


MAKE = [("ensure", "secret"), ("ensure", "network policy"), ("ensure", "pod", 1)]
RESUMED = {"hibernation": {"pod": POD1, "resumedAt": NOW - 50}}

TABLE = {
    # -- admission: decided, and the launch started in the same status write --------------------------------
    "a new kernel under its quota is admitted and its launch starts": (
        facts(kernel()), [("count", "admissions", "admitted"), ("write", "Starting", "", False), *MAKE,
                          ("look again", 5.0)]),
    "a new kernel over its quota fails, saying so": (
        facts(kernel(), quotas=[{"metadata": {"name": "alice"}, "spec": {"scope": "user", "name": "alice",
                                                                         "kernels": 0}}]),
        [("count", "admissions", "quota_exceeded"), ("write", "Failed", "QuotaExceeded", False),
         ("event", "QuotaExceeded")]),
    "a quota that does not parse refuses the users it covers": (
        facts(kernel(), quotas=[{"metadata": {"name": "default"}, "spec": {"scope": "default", "memory": "lots"}}]),
        [("count", "admissions", "quota_misconfigured"), ("write", "Failed", "QuotaMisconfigured", False),
         ("event", "QuotaMisconfigured")]),
    "an unknown profile fails the kernel": (
        facts(kernel(profile="smal")), [("write", "Failed", "InvalidSpec", False), ("event", "InvalidSpec")]),
    "a failure already written is not written again": (
        facts(kernel({"phase": "Failed", "reason": "InvalidSpec"}, profile="smal")), []),
    "an image the admin does not allow fails the kernel": (
        facts(kernel(image="docker.io/someone/else:1")), [("write", "Failed", "InvalidSpec", False),
                                                          ("event", "InvalidSpec")]),
    # -- a kernel whose server is gone ----------------------------------------------------------------------
    "an orphan is deleted, its pod first": (
        facts(kernel(running()), pod(), heartbeat_seen=NOW - 121),
        [("delete pod", POD1, 0), ("delete kernel", "ServerGone")]),
    "an orphan whose pod its agent resumed: the precaution is asked first": (
        facts(kernel(running(**RESUMED)), pod(), heartbeat_seen=NOW - 121),
        [("write", "Running", "", True), ("look again", 30.0)]),
    "an orphan whose agent answered the precaution goes": (
        facts(kernel(running(**RESUMED, killPrecaution={"pod": POD1, "requestedAt": NOW - 3, "answeredAt": NOW - 1})),
              pod(), heartbeat_seen=NOW - 121), [("delete pod", POD1, 0), ("delete kernel", "ServerGone")]),
    "an orphan whose agent did not answer in time goes, with a warning": (
        facts(kernel(running(**RESUMED, killPrecaution={"pod": POD1, "requestedAt": NOW - 31})), pod(),
              heartbeat_seen=NOW - 121),
        [("event", "KillPrecautionTimedOut"), ("delete pod", POD1, 0), ("delete kernel", "ServerGone")]),
    "an orphan still waiting for the agent's answer waits": (
        facts(kernel(running(**RESUMED, killPrecaution={"pod": POD1, "requestedAt": NOW - 10})), pod(),
              heartbeat_seen=NOW - 121), [("look again", 20.0)]),
    # -- failed kernels, and a pod deleted once (issue 30: an unschedulable pod was deleted twice) -------------
    "a failed kernel's pods are deleted at once": (
        facts(kernel({"phase": "Failed", "reason": "Unschedulable"}), pod("Pending", node=None)),
        [("delete pod", POD1, 0)]),
    "a failed kernel's pod already being deleted is not deleted again": (
        facts(kernel({"phase": "Failed", "reason": "Unschedulable"}), pod("Pending", node=None),
              going=frozenset({POD1})), []),
    # -- no pod for the wanted launch ---------------------------------------------------------------------
    "before its namespace's pods are listed, a missing pod is unknown, not absent": (
        facts(kernel(started()), pods_listed=False), []),
    "a launch that ran and stopped stays stopped": (
        facts(kernel({**running(), "phase": "Stopped", "reason": "Exited"})), []),
    "a hibernated kernel whose pod is gone is lost, never restarted empty": (
        facts(kernel({**running(), "phase": "Hibernated"})), [("write", "Failed", "PodDeleted", True),
                                                              ("event", "PodDeleted")]),
    "a refused pod is not tried again before its back-off": (
        facts(kernel(started(reason="PodRefused", message="The cluster refused the kernel's pod: ...")),
              refusal=Refusal(1, 4.0, NOW + 2.5)), [("look again", 2.5)]),
    "a refused pod is tried again after its back-off, its words kept": (
        facts(kernel(started(reason="PodRefused", message="The cluster refused the kernel's pod: ...")),
              refusal=Refusal(1, 4.0, NOW - 0.1)), [("write", "Starting", "PodRefused", False), *MAKE,
                                                     ("look again", 5.0)]),
    # -- the pod of the wanted launch ---------------------------------------------------------------------
    "a start under way for less than progress_interval is not reported": (
        facts(kernel(started(ago=1)), pod("Pending", node=None)), [("look again", 4.0)]),
    "nor once placed on a node": (
        facts(kernel(started(ago=2)), pod("Pending", state={"waiting": {"reason": "ContainerCreating"}})),
        [("look again", 3.0)]),
    "a slow start waiting for the scheduler says so once": (
        facts(kernel(started(ago=6)), pod("Pending", node=None)), [("write", "Starting", "", False)]),
    "a slow start on a node says why, and is looked at again for its story": (
        facts(kernel(started(ago=6)), pod("Pending", state={"waiting": {"reason": "ContainerCreating"}}),
              events=({"reason": "Pulling", "firstTimestamp": format_rfc3339(NOW - 5),
                       "lastTimestamp": format_rfc3339(NOW - 5)},)),
        [("write", "Starting", "PullingImage", False), ("look again", 5.0)]),
    "a pod that runs makes the kernel Running": (
        facts(kernel(started(ago=2)), pod()), [("write", "Running", "", False), ("count", "start_seconds", "")]),
    "a running kernel whose pod runs on costs nothing": (facts(kernel(running()), pod()), []),
    "a hibernation refusal's words stay while the kernel runs on": (
        facts(kernel(running(reason="HibernationRefused", message="This cluster cannot hibernate kernels: ..."),
                     desiredState="Running"), pod()), []),
    "an unschedulable pod fails the launch at once by default, and is deleted": (
        facts(kernel(started(ago=2)), pod("Pending", node=None, conditions=[unschedulable(1)])),
        [("write", "Failed", "Unschedulable", False), ("count", "launch_failures", "Unschedulable"),
         ("event", "Unschedulable"), ("delete pod", POD1, 0)]),
    "a young start's grace that ends before progress_interval is looked at when it ends": (
        facts(kernel(started(ago=1)), pod("Pending", node=None, conditions=[unschedulable(1)]),
              settings=operator_settings(GPUPoolOperator(kernel_image="quay.io/jupyter/k:1", unschedulable_grace=2.0),
                                         GPUPool(profiles=PROFILES).check())),
        [("look again", 1.0)]),
    "within its grace an unschedulable pod waits, looked at again when the grace ends": (
        facts(kernel(started(ago=20)), pod("Pending", node=None, conditions=[unschedulable(15)]), settings=GRACE),
        [("write", "Starting", "Unschedulable", False), ("look again", 45.0)]),
    "an image that cannot be pulled fails the launch": (
        facts(kernel(started(ago=2)), pod("Pending", state={"waiting": {"reason": "ImagePullBackOff"}})),
        [("write", "Failed", "ImagePullFailed", False), ("count", "launch_failures", "ImagePullFailed"),
         ("event", "ImagePullFailed"), ("delete pod", POD1, 0)]),
    "a kernel that exits is Stopped with its code": (
        facts(kernel(running()), pod("Succeeded", state={"terminated": {"exitCode": 0}})),
        [("write", "Stopped", "Exited", False)]),
    "a pod being deleted stops the kernel": (
        facts(kernel(running()), pod(deleting=True)), [("write", "Stopped", "PodDeleted", False)]),
    "a pod made before names carried the uid is still its launch's": (
        facts(kernel(running(pod="k-a-1")), pod(name="k-a-1")), []),
    "spec.stopped deletes the pod with its grace and says Stopped": (
        facts(kernel(running(), stopped=True, stopGraceSeconds=3), pod()),
        [("delete pod", POD1, 3), ("write", "Stopped", "Stopped", False)]),
    "a new launch deletes the old one's pod and starts its own": (
        facts(kernel(running(), launch=2), pod()),
        [("delete pod", POD1, 10), ("write", "Starting", "", False), ("ensure", "secret"),
         ("ensure", "network policy"), ("ensure", "pod", 2), ("look again", 5.0)]),
    # -- moves: the hibernation admission's, node by node -------------------------------------------------
    "a running kernel asked to hibernate goes to the hibernation admission": (
        facts(kernel(running(), desiredState="Hibernated"), pod()), [("hibernation", "hibernate")]),
    "a hibernated kernel asked back goes to its node's resumes": (
        facts(kernel({**running(), "phase": "Hibernated"}, desiredState="Running"), pod()),
        [("hibernation", "resume")]),
    "a hibernated kernel asked to stay so leaves its queue": (
        facts(kernel({**running(), "phase": "Hibernated", "reason": "WaitingForRoom",
                      "hibernation": {"queuePosition": 2}}, desiredState="Hibernated"), pod()),
        [("write", "Hibernated", "", True)]),
    "a hibernated kernel whose pod failed is lost, and its pod deleted": (
        facts(kernel({**running(), "phase": "Hibernated"}, desiredState="Hibernated"),
              pod("Failed", state={"terminated": {"exitCode": 137}})),
        [("write", "Failed", "PodDeleted", True), ("event", "PodDeleted"), ("delete pod", POD1, 0)]),
}


@pytest.mark.parametrize("row", list(TABLE))
def test_the_plan(row):
    observed, expected = TABLE[row]
    assert shown(plan(observed), observed.kernel) == expected


def test_an_admission_is_counted_by_the_plan_and_its_start_is_one_write():
    decided = plan(facts(kernel()))
    assert decided.admitted is not None and decided.admitted["memory"] == 10 * GiB
    [write] = [a for a in decided.actions if isinstance(a, Write)]
    assert write.changes["admitted"] == decided.admitted and write.changes["launch"] == 1
    assert write.changes["pod"] == POD1 and write.changes["startedAt"] == NOW and write.always


def test_admission_counts_what_is_held_for_the_owner():
    quota = [{"metadata": {"name": "alice"}, "spec": {"scope": "user", "name": "alice", "kernels": 1}}]
    other = kernel(running())
    other["metadata"] = {**other["metadata"], "name": "k-b", "uid": "uid-b"}
    over = facts(kernel(), quotas=quota, holding=held_leases([other]))
    assert shown(plan(over), over.kernel)[1][2] == "QuotaExceeded"
    assert plan(facts(kernel(), quotas=quota)).admitted is not None


def test_a_slow_starts_words_are_written_once_and_read_as_of_each_reading():
    """The same slow start looked at 5 s later: nothing to write (its words name when the pull began), and
    a reader shows 5 s more."""
    pulling = ({"reason": "Pulling", "firstTimestamp": format_rfc3339(NOW - 5), "lastTimestamp": format_rfc3339(NOW - 5)},)
    creating = pod("Pending", state={"waiting": {"reason": "ContainerCreating"}})
    first = plan(facts(kernel(started(ago=6)), creating, events=pulling))
    [write] = [a for a in first.actions if isinstance(a, Write)]
    later = Facts(**{**facts(kernel({**started(ago=6), **write.changes}), creating, events=pulling).__dict__,
                     "now": NOW + 5})
    assert shown(plan(later), later.kernel) == [("look again", 5.0)]
    assert "pulling the kernel image 'quay.io/jupyter/k:1': 5 s so far" in as_of(write.changes["message"], NOW)
    assert ": 10 s so far" in as_of(write.changes["message"], NOW + 5)


def test_a_refused_pod_backs_off_doubling_to_the_sweep_and_says_so_once():
    said = 'pods "k-a-1" is forbidden: exceeded quota: no-gpus.'
    seen = facts(kernel(started()))
    refusal, first = pod_refused(seen, said)
    assert refusal == Refusal(1, 1.0, NOW + 1.0)
    assert shown(first, seen.kernel) == [("count", "launch_failures", "PodRefused"), ("write", "Starting", "PodRefused", False),
                            ("event", "PodRefused"), ("look again", 1.0)]
    [write] = [a for a in first.actions if isinstance(a, Write)]
    again = facts(kernel(started(**write.changes)), refusal=Refusal(1, 16.0, NOW))
    refusal, second = pod_refused(again, said)
    assert refusal.wait == 30.0  # doubled, up to the sweep's interval
    assert shown(second, again.kernel) == [("count", "launch_failures", "PodRefused"), ("look again", 30.0)]  # the same words


# -- the hibernation admission (operator/hibernation_admission.py): the node's moves, through the residency model

def test_a_hibernation_is_admitted_where_memory_is_handed_back_and_refused_in_words_where_not():
    from jupyter_gpu_pool.operator.hibernation_admission import plan_hibernation

    asked = kernel(running(usage={"memoryUsed": 6 * GiB, "devices": ["GPU-a"]}), desiredState="Hibernated",
                   hibernateReason="user")
    hami_scaled = operator_settings(GPUPoolOperator(hami_memory_scaling=2.0), GPUPool(profiles=PROFILES).check())
    admitted = plan_hibernation(asked, pod(), [asked], None, hami_scaled, NOW)
    assert shown(Plan(admitted), asked) == [("write", "Hibernating", "", True), ("count", "admissions", "hibernation")]
    assert admitted[0].changes["hibernation"]["reason"] == "user"
    refused = plan_hibernation(asked, pod(), [asked], None, SETTINGS, NOW)  # HAMi without memory scaling
    assert shown(Plan(refused), asked) == [("write", "Running", "HibernationRefused", True),
                                           ("count", "admissions", "hibernation_refused"),
                                           ("event", "HibernationRefused")]
    answered = kernel(running(**{**refused[0].changes, "hibernation": {"reason": "HibernationRefused"}}),
                      desiredState="Hibernated")  # the agent's answer, for this generation
    assert plan_hibernation(answered, pod(), [answered], None, hami_scaled, NOW) == ()  # answered: not asked again


def _asleep(name: str, moved: int, asked_at: float, hint: bool = False, owner: str = "alice") -> dict:
    k = kernel({**running(), "phase": "Hibernated", "hibernation": {"bytes": moved, "devices": ["GPU-a"],
                                                                    "requestedAt": asked_at, "hibernatedAt": 1.0}},
               desiredState="Running", **({"resumeHint": True} if hint else {}))
    k["metadata"] = {**k["metadata"], "name": name, "uid": f"uid-{name}"}
    k["spec"]["owner"] = owner
    return k


def test_a_nodes_resumes_are_served_in_order_into_the_room_its_agent_reads():
    from jupyter_gpu_pool.operator.hibernation import FreeReading
    from jupyter_gpu_pool.operator.hibernation_admission import quota_pass, room_pass

    first, second, guess = _asleep("first", 6 * GiB, 10), _asleep("second", 2 * GiB, 20), _asleep("guess", GiB, 0, True)
    node = [first, second, guess]
    fit, hinted, parts, _ = quota_pass(node, "gpu-node-1", read_quotas([]), {k["metadata"]["uid"]: () for k in node},
                                       SETTINGS, NOW)
    assert ([k["metadata"]["name"] for k in fit], [k["metadata"]["name"] for k in hinted], parts) == (
        ["first", "second"], ["guess"], [])
    reading = FreeReading({"GPU-a": 8 * GiB}, NOW - 1)  # 8 GiB less a 1 GiB margin: the first only
    served = {k["metadata"]["name"]: shown(Plan(actions, again), k)
              for k, actions, again in room_pass(fit, hinted, node, "gpu-node-1", reading, SETTINGS, NOW)}
    assert served == {"first": [("write", "Resuming", "", True), ("count", "admissions", "resume")],
                      "second": [("write", "Hibernated", "WaitingForRoom", True), ("look again", 5.0)],
                      "guess": [("write", "Hibernated", "ResumeDeclined", True),
                                ("count", "admissions", "hint_declined")]}


def test_a_resume_over_its_owners_quota_waits_warned_and_a_hint_is_declined_quietly():
    from jupyter_gpu_pool.operator.hibernation_admission import quota_pass

    real, guess = _asleep("real", 6 * GiB, 10), _asleep("guess", GiB, 0, True)
    full = read_quotas([{"metadata": {"name": "alice"}, "spec": {"scope": "user", "name": "alice",
                                                                  "memory": "10GiB"}}])
    holding = held_leases([kernel(running())])  # 10 GiB held by another kernel of alice's
    fit, hinted, parts, _ = quota_pass([real, guess], "gpu-node-1", full, {"uid-real": holding, "uid-guess": holding},
                                       SETTINGS, NOW)
    assert fit == [] and hinted == []
    said = {k["metadata"]["name"]: (shown(Plan(a, again), k), a[0].changes["message"]) for k, a, again in parts}
    assert said["real"][0] == [("write", "Hibernated", "QuotaExceeded", True), ("look again", 5.0)]
    assert "resume is waiting for your GPU quota" in said["real"][1]
    assert said["guess"][0] == [("write", "Hibernated", "ResumeDeclined", True),
                                ("count", "admissions", "hint_declined")]


def test_a_starts_secret_and_network_policy_are_made_at_once_and_its_pod_after_both():
    from jupyter_gpu_pool.operator.controller import together

    steps = together(plan(facts(kernel(), pods_listed=True)).actions)
    shape = [tuple(a.what if isinstance(a, Ensure) else type(a).__name__ for a in step) for step in steps]
    assert shape == [("Count",), ("Write",), ("secret", "network policy"), ("pod",)]
