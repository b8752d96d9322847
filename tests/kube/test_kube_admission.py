"""The operator's decisions as pure functions: admission against GPUQuota objects, and a pod's state
in the user's words."""

from __future__ import annotations

import pytest
from kube_helpers import GiB

from jupyter_gpu_pool.cluster.quotas import QuotaMisconfigured, read_quotas
from jupyter_gpu_pool.operator.admission import admit
from jupyter_gpu_pool.operator.diagnosis import diagnose
from jupyter_gpu_pool.cluster.kernels import as_lease, as_of
from jupyter_gpu_pool.operator.sharing import Sharing, render
from jupyter_gpu_pool.pool import QuotaExceeded, parse_profile

HAMI = Sharing("hami")
SMALL = render(parse_profile("small", "10GiB"), HAMI)
HALF = render(parse_profile("half", {"slice": "20GiB,50%"}), HAMI)


def quota(obj: str, **spec) -> dict:
    return {"metadata": {"name": obj}, "spec": spec}


def kernel(owner: str, uid: str, admitted: dict | None = None, phase: str = "Running", label: str = "") -> dict:
    status = {"phase": phase}
    if admitted:
        status["admitted"] = admitted
    return {"metadata": {"name": f"k-{uid}", "namespace": "jhub", "uid": uid,
                         "creationTimestamp": "2024-05-01T12:00:00Z"},
            "spec": {"owner": owner, "kernelId": uid, "profile": "small", "launch": 1, "label": label},
            "status": status}


def holding(owner: str, uid: str, memory: int = 10 * GiB, sm: int = 0, groups=(), **kw) -> dict:
    return kernel(owner, uid, {"profile": "small", "isolation": "hami", "memory": memory, "smPercent": sm,
                               "gpuCount": 1, "whole": False, "groups": list(groups), "at": 100.0}, **kw)


def test_quota_objects_become_the_pool_cores_quota_book():
    q = read_quotas([quota("default", scope="default", memory="40GiB", kernels=4),
                     quota("alice", scope="user", name="alice", memory="80GiB", smPercent=200),
                     quota("students", scope="group", name="students", members=["bob", "carol"], memory="160GiB")])
    assert q.problems == {}
    assert q.book.user_quota("alice").memory == 80 * GiB and q.book.user_quota("alice").sm_percent == 200
    assert q.book.user_quota("bob").kernels == 4 and q.book.user_quota("bob").memory == 40 * GiB
    assert q.book.groups_of("carol") == ("students",) and q.book.groups["students"].memory == 160 * GiB


def test_a_bad_quota_is_reported_and_refuses_the_users_it_covers_naming_it():
    q = read_quotas([quota("default", scope="default", memory="40 gigs"),
                     quota("alice", scope="user", name="alice", memory="80GiB"),
                     quota("dup", scope="user", name="alice", kernels=1),
                     quota("nameless", scope="group", memory="1GiB")])
    assert "GPUQuota 'default'.memory" in q.problems["default"]
    assert "'alice' already sets this user quota" in q.problems["dup"]
    assert "needs the group's name" in q.problems["nameless"]
    with pytest.raises(QuotaMisconfigured, match="GPUQuota 'default' is invalid"):
        admit(kernel("bob", "b1"), "small", "hami", SMALL, q, [], now=200.0)  # bob falls under the default
    admitted = admit(kernel("alice", "a1"), "small", "hami", SMALL, q, [], now=200.0)  # alice has her own
    assert admitted["memory"] == 10 * GiB


def test_admission_counts_the_users_held_kernels_and_refuses_with_the_pool_message():
    q = read_quotas([quota("default", scope="default", memory="25GiB", kernels=3)])
    others = [holding("alice", "a1", label="first.ipynb"), holding("alice", "a2", label="second.ipynb"),
              holding("bob", "b1"), holding("alice", "a3", phase="Failed"),  # failed: holds nothing
              kernel("alice", "a4")]  # not admitted yet: holds nothing
    with pytest.raises(QuotaExceeded) as e:
        admit(kernel("alice", "new"), "small", "hami", SMALL, q, others, now=200.0)
    message = str(e.value)
    assert message.startswith("GPU quota exceeded: 'Python 3 · small' needs 10 GiB of GPU memory, and you hold "
                              "20 GiB of your 25 GiB.")
    assert "first.ipynb" in message and "second.ipynb" in message
    assert admit(kernel("bob", "new"), "small", "hami", SMALL, q, others, now=200.0)["memory"] == 10 * GiB


def test_a_group_quota_counts_every_member_together():
    q = read_quotas([quota("students", scope="group", name="students", members=["bob", "carol"], smPercent=80)])
    others = [holding("bob", "b1", memory=20 * GiB, sm=50, groups=["students"])]
    admitted = admit(kernel("dave", "d1"), "half", "hami", HALF, q, others, now=200.0)
    assert admitted["groups"] == []  # dave is in no group
    with pytest.raises(QuotaExceeded) as e:
        admit(kernel("carol", "c1"), "half", "hami", HALF, q, others, now=200.0)
    assert e.value.scope == "students" and "group 'students' holds 50% of its 80% (all its members together)" in str(e.value)


def test_an_admitted_kernel_is_a_lease_of_the_pool_core():
    lease = as_lease(holding("alice", "a1", memory=20 * GiB, sm=50, groups=["students"], label="x.ipynb"))
    assert (lease.owner, lease.kernel_id, lease.memory, lease.sm_percent, lease.state) == (
        "alice", "a1", 20 * GiB, 50, "active")
    assert lease.groups == ("students",) and lease.label == "x.ipynb" and lease.created == 1714564800.0
    assert as_lease(holding("alice", "a2", phase="Failed")).state == "released"


def pod(phase: str = "Pending", conditions=(), state=None, deleting: bool = False) -> dict:
    p = {"metadata": {"name": "k-1-1"}, "status": {"phase": phase, "conditions": list(conditions)}}
    if state is not None:
        p["status"]["containerStatuses"] = [{"name": "kernel", "image": "img:1", "state": state}]
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    return p


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "lastTransitionTime": "2024-05-01T12:00:00Z",
                 "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpumem."}
T0 = 1714564800.0


@pytest.mark.parametrize("p, now, grace, phase, reason, words", [
    (pod(conditions=[UNSCHEDULABLE]), T0 + 1, 0, "Failed", "Unschedulable",
     "No GPU slice is free for profile 'small' (10 GiB of GPU memory (HAMi)): the cluster has no node with room"),
    (pod(conditions=[UNSCHEDULABLE]), T0 + 10, 60, "Starting", "Unschedulable", "Waiting for a GPU slice"),
    (pod(conditions=[UNSCHEDULABLE]), T0 + 61, 60, "Failed", "Unschedulable", "2 Insufficient nvidia.com/gpumem"),
    (pod(state={"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}), T0, 0, "Failed",
     "ImagePullFailed", "The kernel image 'img:1' cannot be pulled (ImagePullBackOff"),
    (pod(state={"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}}), T0, 0,
     "Failed", "ContainerCrashed", "The kernel's container cannot start"),
    (pod(state={"waiting": {"reason": "ContainerCreating"}}), T0, 0, "Starting", "ContainerCreating", "starting"),
    (pod("Running", state={"running": {}}), T0, 0, "Running", "", ""),
    (pod("Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}}), T0, 0, "Stopped", "Exited",
     "The kernel exited."),
    (pod("Failed", state={"terminated": {"exitCode": 3, "reason": "Error"}}), T0, 0, "Stopped", "ContainerCrashed",
     "exited with code 3 (Error)"),
    (pod("Running", state={"running": {}}, deleting=True), T0, 0, "Stopped", "PodDeleted", "being deleted"),
])
def test_a_pods_state_in_the_users_words(p, now, grace, phase, reason, words):
    v = diagnose(p, "small", SMALL.description, now, grace)
    assert (v.phase, v.reason) == (phase, reason)
    assert words in v.message


def _claiming(message: str) -> dict:
    p = pod(conditions=[{**UNSCHEDULABLE, "message": message}])
    p["spec"] = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-pool-small"}]}
    return p


def test_a_claiming_pod_is_told_about_devices_only_where_its_claims_are_what_cannot_be_met():
    """dra: a pod that claims a GPU may wait for CPU, memory or a toleration too; the device story is
    told only where the scheduler says the claims cannot be allocated."""
    from jupyter_gpu_pool.operator.diagnosis import claims_unmet

    devices = _claiming("0/2 nodes are available: 2 cannot allocate all claims.")
    cpu = _claiming("0/2 nodes are available: 2 Insufficient cpu.")
    assert claims_unmet(devices) and not claims_unmet(cpu) and not claims_unmet(pod(conditions=[UNSCHEDULABLE]))
    told = diagnose(cpu, "small", SMALL.description, T0 + 61, 60)
    assert told.reason == "Unschedulable" and "2 Insufficient cpu" in told.message and "device" not in told.message
    assert "device" in diagnose(devices, "small", SMALL.description, T0 + 61, 60).message.lower()


def placed(conditions=(), state=None, node: str = "gpu-node-1") -> dict:
    p = pod(conditions=[{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-05-01T12:00:00Z"},
                        *conditions], state=state)
    p["spec"] = {"nodeName": node, "containers": [{"name": "kernel", "image": "img:1"}]}
    return p


def event(reason: str, at: float, message: str = "") -> dict:
    from testcluster.store import now_rfc3339

    return {"reason": reason, "message": message, "firstTimestamp": now_rfc3339(at), "lastTimestamp": now_rfc3339(at)}


NOT_READY = {"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                        "message": "Kubelet stopped posting node status."}]}}
READY = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
CREATING = {"waiting": {"reason": "ContainerCreating"}}


@pytest.mark.parametrize("p, events, node, reason, words", [
    (placed(), [], NOT_READY, "NodeNotReady",
     "waits on node 'gpu-node-1', 42 s so far, but that node is not ready (NodeStatusUnknown Kubelet stopped posting"),
    (placed(), [], READY, "ContainerCreating", "node 'gpu-node-1' is creating its container, 42 s so far"),
    (placed(state=CREATING), [event("Scheduled", T0), event("Pulling", T0 + 2)], READY, "PullingImage",
     "Node 'gpu-node-1' is pulling the kernel image 'img:1': 40 s so far"),
    (placed(state=CREATING), [event("Pulling", T0 + 2), event("Pulled", T0 + 2)], READY, "ContainerCreating",
     "is creating its container"),  # a pull that ended in the second it began is over
    (placed(state=CREATING), [event("FailedMount", T0 + 12, 'MountVolume.SetUp failed for volume "connection" : '
                                    'secret "k-1-connection" not found')], READY, "MountingVolumes",
     "cannot mount the kernel's volumes yet (30 s so far): MountVolume.SetUp failed"),
    (placed(state=CREATING), [event("FailedMount", T0 + 1), event("Pulled", T0 + 20)], READY, "ContainerCreating",
     "is creating its container"),  # mounted since
])
def test_a_slow_start_says_why_with_the_clusters_own_numbers(p, events, node, reason, words):
    """The words name when each wait began (the cluster's own timestamps), so they stay the same while it goes
    on; a reader shows how long, as of its reading."""
    v = diagnose(p, "small", SMALL.description, T0 + 42, 0, events, node)
    assert (v.phase, v.reason) == ("Starting", reason)
    assert words in as_of(v.message, T0 + 42)
    assert diagnose(p, "small", SMALL.description, T0 + 50, 0, events, node) == v  # a later look: nothing to write
    if "so far" in words:
        assert words.replace("42 s", "50 s").replace("40 s", "48 s").replace("30 s", "38 s") in as_of(v.message, T0 + 50)
