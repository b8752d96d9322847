"""The operator's decisions with the admin's sharing (issue 29 on a cluster), as decision tables in the style of
test_kube_plan.py: a start and a resume decided by the same pure functions as the local ledger's
(``pool.allocation.allocate`` with ``pool.sharing``), on the room counted node by node (``cluster.room``):
before a reservation's lead time nothing is kept; from it, non-members are kept out of its room (refused, in
words naming it); a member goes into it; a lead time into the window a non-member borrows what members leave
unused (``status.borrowed``), but not while a member waits; a member whose room others hold waits for it
(``status.waiting``, its place), and is admitted once it is free; a node's waiting resumes go in a fair queue's
order, each told why."""

from __future__ import annotations

import datetime as dt

import pytest
from kube_helpers import HAMI_NODE, GiB
from test_kube_plan import NOW, SETTINGS, _asleep, facts, kernel, running, shown

from jupyter_gpu_pool.cluster.quotas import read_quotas
from jupyter_gpu_pool.cluster.room import node_gpu, on_cluster, read_sharing, room_lease, usage
from jupyter_gpu_pool.operator.admission import Shared, held_leases
from jupyter_gpu_pool.operator.plan import Plan, Write, plan
from jupyter_gpu_pool.pool import Waiter, SliceSpec

NODE = {"metadata": {"name": HAMI_NODE["name"], "labels": HAMI_NODE["labels"]},
        "status": {"allocatable": HAMI_NODE["allocatable"]}}  # 2 GPUs of 40 GiB: 80 GiB of room
ENTRY = "node/gpu-node-1"
QUOTAS = [{"metadata": {"name": "group-ml101"}, "spec": {"scope": "group", "name": "ml101", "members": ["ann"],
                                                          "kernels": 100}},
          {"metadata": {"name": "group-research"}, "spec": {"scope": "group", "name": "research",
                                                             "members": ["rita"], "kernels": 100}}]


def moment(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def sharing(opens_in: float, *, order: str = "fifo", lead: float = 600, memory: str = "40GiB", **fair):
    """"ML 101 lab" for group ml101, opening ``opens_in`` seconds from NOW for two hours, as a GPUPoolPolicy
    sets it."""
    start = NOW + opens_in
    return read_sharing({"reservations": [{"name": "ML 101 lab", "groups": ["ml101"], "start": moment(start),
                                           "end": moment(start + 7200), "timezone": "UTC", "memory": memory,
                                           "lead": lead}], "queueOrder": order, **({"fairShare": fair} if fair else {})})


def member(memory: int, owner: str = "ann", uid: str = "uid-m") -> object:
    """A member's running kernel as the room counts it (on the node)."""
    k = kernel(running(admitted={"profile": "small", "memory": memory, "gpuCount": 1, "groups": ["ml101"],
                                 "at": NOW - 50}), owner=owner)
    k["metadata"] = {**k["metadata"], "name": f"k-{uid}", "uid": uid}
    return room_lease(held_leases([k])[0], "gpu-node-1")


def waiter(owner: str = "ann", groups=("ml101",), since: float = NOW - 5, uid: str = "uid-w") -> Waiter:
    return Waiter(id=uid, owner=owner, kernel_id=uid, lease_id=None, profile="small",
                  slice=SliceSpec(memory=10 * GiB), label="", enqueued=since, heartbeat=NOW, groups=groups)


def shared(opens_in: float, used: int, *, everyone=(), waiters=(), **kw) -> Shared:
    gpu = node_gpu(NODE)
    s = on_cluster(sharing(opens_in, **kw), [gpu])
    return Shared(s, tuple(usage([gpu], {ENTRY: (used, 1)} if used else {})), tuple(everyone), tuple(waiters))


def starting(owner: str = "alice", **status) -> dict:
    return kernel(status or None, owner=owner)


ADMIT = [("count", "admissions", "admitted"), ("write", "Starting", "", False), ("ensure", "secret"),
         ("ensure", "network policy"), ("ensure", "pod", 1), ("look again", 5.0)]
REFUSE = [("count", "admissions", "pool_exhausted"), ("write", "Failed", "RoomReserved", False),
          ("event", "RoomReserved")]
WAIT = [("write", "Pending", "WaitingForRoom", False), ("count", "admissions", "waiting_for_room"),
        ("look again", 5.0)]

TABLE = {
    # -- from the lead time: the room is kept from non-members ------------------------------------------------
    "from the lead time a non-member is refused the room a reservation keeps, in words naming it": (
        facts(starting(), quotas=QUOTAS, shared=shared(300, 50 * GiB)), REFUSE),
    "a non-member fits beside the reserved room": (
        facts(starting(), quotas=QUOTAS, shared=shared(300, 20 * GiB)), ADMIT),
    "a member goes into the room reserved for them": (
        facts(starting("ann"), quotas=QUOTAS, shared=shared(300, 50 * GiB)), ADMIT),
    # -- the window: borrowing, and members waiting for their room ----------------------------------------------
    "in the window's first lead time a non-member may not borrow yet": (
        facts(starting(), quotas=QUOTAS, shared=shared(-60, 50 * GiB)), REFUSE),
    "a lead time into the window a non-member borrows what members leave unused": (
        facts(starting(), quotas=QUOTAS, shared=shared(-700, 50 * GiB)), ADMIT),
    "but not while a member waits for the room": (
        facts(starting(), quotas=QUOTAS, shared=shared(-700, 50 * GiB, waiters=[waiter()])), REFUSE),
    "a member whose room others hold waits for it, told its place": (
        facts(starting("ann"), quotas=QUOTAS, shared=shared(-700, 80 * GiB)), WAIT),
    "a waiting member is admitted once the room is free": (
        facts(starting("ann", phase="Pending", reason="WaitingForRoom",
                       waiting={"since": NOW - 5, "memory": 10 * GiB, "groups": ["ml101"], "position": 1}),
              quotas=QUOTAS, shared=shared(-700, 40 * GiB, waiters=[waiter(uid="3f2a9c1e-0000-4000-8000-000000000001")])),
        [("count", "admissions", "admitted"), ("write", "Starting", "", False), ("ensure", "secret"),
         ("ensure", "network policy"), ("ensure", "pod", 1), ("look again", 5.0)]),
    "a member with nothing left of their room unused is left to the scheduler": (
        facts(starting("ann"), quotas=QUOTAS, shared=shared(-700, 80 * GiB, everyone=[member(40 * GiB)])), ADMIT),
    "a non-member with the count full and nothing reserved in the way is left to the scheduler": (
        facts(starting(), quotas=QUOTAS, shared=shared(300, 80 * GiB, memory="1GiB")), ADMIT),
}


@pytest.mark.parametrize("row", list(TABLE))
def test_a_start_with_the_admins_sharing(row):
    observed, expected = TABLE[row]
    assert shown(plan(observed), observed.kernel) == expected


def _write(decided: Plan) -> dict:
    return next(a for a in decided.actions if isinstance(a, Write)).changes


def test_what_a_start_is_told_borrowed_refused_or_waiting():
    refused = _write(plan(facts(starting(), quotas=QUOTAS, shared=shared(300, 50 * GiB))))
    assert refused["message"].startswith("'Python 3 · small' (10 GiB) cannot start now: the room it would fit in is reserved "
                                         "(40 GiB reserved for ML 101 lab from ")
    borrowing = plan(facts(starting(), quotas=QUOTAS, shared=shared(-700, 50 * GiB)))
    assert _write(borrowing)["borrowed"] == ["ML 101 lab"] and borrowing.on == ENTRY  # counted there until placed
    beside = plan(facts(starting(), quotas=QUOTAS, shared=shared(300, 20 * GiB)))
    assert "borrowed" not in _write(beside) and beside.on == ENTRY
    waits = _write(plan(facts(starting("ann"), quotas=QUOTAS, shared=shared(-700, 80 * GiB))))
    why = "1st in the queue: going first into the room reserved for ML 101 lab"
    assert waits["waiting"] == {"since": NOW, "memory": 10 * GiB, "groups": ["ml101"], "position": 1, "why": why}
    assert waits["message"].startswith("Waiting for GPU room: ML 101 lab: 40 GiB reserved until ") and \
        waits["message"].endswith(f"they give it back (hibernated, their variables kept, with a warning). {why}.")
    # looked at again while nothing changed: its words and place stand, so nothing is written
    again = facts(kernel({**waits}, owner="ann"), quotas=QUOTAS, shared=shared(-700, 80 * GiB, waiters=[
        waiter(uid="3f2a9c1e-0000-4000-8000-000000000001", since=NOW)]))
    assert shown(plan(again), again.kernel) == [("look again", 5.0)]
    admitted = _write(plan(facts(kernel({**waits}, owner="ann"), quotas=QUOTAS, shared=shared(-700, 40 * GiB))))
    assert admitted["waiting"] is None and admitted["phase"] == "Starting"


def test_without_sharing_a_start_is_decided_on_quotas_alone_as_before():
    """No reservation keeping room (the controller passes none): the count of the room is not read at all."""
    decided = plan(facts(starting(), quotas=QUOTAS))
    assert shown(decided, decided and facts(starting()).kernel) == ADMIT and decided.on == ""
    assert "borrowed" not in _write(decided) and "waiting" not in _write(decided)


# -- resumes: a non-member's into reserved room, and a node's waiters in a fair queue ------------------------

def test_a_non_members_resume_into_reserved_room_waits_without_holding_up_the_node_and_a_borrower_says_so():
    from jupyter_gpu_pool.operator.hibernation import FreeReading
    from jupyter_gpu_pool.operator.hibernation_admission import quota_pass, room_pass

    alices = _asleep("alices", 10 * GiB, 10)
    alices["status"]["admitted"] = {**alices["status"]["admitted"], "memory": 10 * GiB}
    anns = _asleep("anns", 10 * GiB, 20, owner="ann")
    anns["status"]["admitted"] = {**anns["status"]["admitted"], "memory": 10 * GiB, "groups": ["ml101"]}
    node, quotas = [alices, anns], read_quotas(QUOTAS)
    making_room = shared(300, 50 * GiB)
    fit, hinted, parts, borrowed = quota_pass(node, "gpu-node-1", quotas, {"uid-alices": (), "uid-anns": ()},
                                              SETTINGS, NOW, making_room)
    assert [k["metadata"]["name"] for k in fit] == ["anns"]  # the member's goes on; alice's waits aside
    [(k, actions, again)] = parts
    assert k is alices and shown(Plan(actions, again), k) == [("write", "Hibernated", "WaitingForRoom", True),
                                                              ("look again", 5.0)]
    assert actions[0].changes["hibernation"]["queuePosition"] is None  # not in the node's queue
    assert "the room it would resume in is reserved (40 GiB reserved for ML 101 lab from" in \
        actions[0].changes["message"]
    # a lead time into the window, alice's resume borrows the room ann leaves unused, and is told so
    fit, hinted, parts, borrowed = quota_pass(node, "gpu-node-1", quotas, {"uid-alices": (), "uid-anns": ()},
                                              SETTINGS, NOW, shared(-700, 50 * GiB))
    assert parts == [] and borrowed == {"uid-alices": ("ML 101 lab",), "uid-anns": ()}
    served = {k["metadata"]["name"]: actions[0].changes.get("borrowed") for k, actions, _ in room_pass(
        fit, hinted, node, "gpu-node-1", FreeReading({"GPU-a": 80 * GiB}, NOW - 1), SETTINGS, NOW,
        shared(-700, 50 * GiB), borrowed)}
    assert served == {"alices": ["ML 101 lab"], "anns": None}


def test_a_nodes_waiting_resumes_go_in_a_fair_queues_order_each_told_why():
    """Rita's group (research) used more than its share lately, so Ann's resume (ml101), asked later, goes
    first; the one left waiting reads why, in the words of the local queue."""
    from jupyter_gpu_pool.operator.hibernation import FreeReading
    from jupyter_gpu_pool.operator.hibernation_admission import quota_pass, room_pass

    ritas = _asleep("ritas", 6 * GiB, 10, owner="rita")
    ritas["status"]["admitted"] = {**ritas["status"]["admitted"], "groups": ["research"]}
    anns = _asleep("anns", 6 * GiB, 20, owner="ann")
    anns["status"]["admitted"] = {**anns["status"]["admitted"], "groups": ["ml101"]}
    node = [ritas, anns]
    gpu = node_gpu(NODE)
    fair = Shared(sharing(86400 * 3, order="fair", weights={"ml101": 1, "research": 1}), tuple(usage([gpu], {})),
                  group_use={"research": 900.0, "ml101": 100.0})
    fit, hinted, parts, borrowed = quota_pass(node, "gpu-node-1", read_quotas(QUOTAS),
                                              {"uid-ritas": (), "uid-anns": ()}, SETTINGS, NOW, fair)
    room = FreeReading({"GPU-a": 8 * GiB}, NOW - 1)  # room for one of the two
    served = {k["metadata"]["name"]: actions for k, actions, _ in room_pass(fit, hinted, node, "gpu-node-1", room,
                                                                             SETTINGS, NOW, fair, borrowed)}
    assert served["anns"][0].changes["phase"] == "Resuming"
    waiting = served["ritas"][0].changes
    assert waiting["hibernation"]["queuePosition"] == 1
    assert waiting["hibernation"]["why"] == ("group 'research' has used more than its share lately (1.8x); "
                                             "1 ahead is from groups under their share")
    assert waiting["message"].startswith("Waiting to resume: position 1 in the queue of node gpu-node-1 (group "
                                         "'research' has used more than its share lately (1.8x); 1 ahead")
    # first come, first served without sharing: Rita's, asked first, goes first
    fifo = {k["metadata"]["name"]: actions[0].changes for k, actions, _ in room_pass(
        fit, hinted, node, "gpu-node-1", room, SETTINGS, NOW)}
    assert fifo["ritas"]["phase"] == "Resuming" and fifo["anns"]["hibernation"]["queuePosition"] == 1
    assert fifo["anns"]["hibernation"]["why"] is None
