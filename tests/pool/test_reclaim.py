"""Reclaiming under pressure (``pool.reclaim``), as a decision table: which idle kernels give their
slice back for the waiters in the queue now, and which never do."""

from __future__ import annotations

import pytest

from jupyter_gpu_pool.pool import policy as P
from jupyter_gpu_pool.pool.allocation import gpu_usage
from jupyter_gpu_pool.pool.gpus import GPU
from jupyter_gpu_pool.pool.leases import ACTIVE, HIBERNATED, Lease
from jupyter_gpu_pool.pool.queue import Waiter
from jupyter_gpu_pool.pool.reclaim import Candidate, Need, candidate, choose_reclaim, needs
from jupyter_gpu_pool.pool.rules import HIBERNATE, SHUTDOWN, Rule
from jupyter_gpu_pool.pool.slices import SliceSpec

GiB = 1 << 30
NOW = 1_000_000.0
G0 = GPU("GPU-0", "Test GPU", 40 * GiB, 0)
G1 = GPU("GPU-1", "Test GPU", 40 * GiB, 1)
POOL = [G0, G1]


def lease(kid: str, size: int | None, gpu: str = "GPU-0", isolation: str = "soft", state: str = ACTIVE) -> Lease:
    whole = size is None
    return Lease(id=f"L-{kid}", owner="alice", kernel_id=kid, profile="p", isolation=isolation,
                 memory=40 * GiB if whole else size * GiB, sm_percent=None, whole=whole, gpu_count=1, state=state,
                 gpus=(gpu,) if state == ACTIVE else (), last_gpus=(gpu,), groups=(), label=kid, created=0.0,
                 updated=0.0, state_since=0.0)


def waiter(size: int | None = 10, wid: str = "w1", resume: bool = True) -> Waiter:
    spec = SliceSpec(whole=True) if size is None else SliceSpec(memory=size * GiB)
    return Waiter(id=wid, owner="alice", kernel_id=f"k-{wid}", lease_id=f"L-{wid}" if resume else None, profile="p",
                  slice=spec, label=wid, enqueued=NOW, heartbeat=NOW)


def cand(held: Lease, action: str = HIBERNATE, idle_for: float = 600.0) -> Candidate:
    return Candidate(held, action, NOW - idle_for)


# The scene of the issue: GPU 0 holds a whole-GPU kernel; GPU 1 an MPS 10 GiB, two 10 GiB and a busy 10 GiB one.
WHOLE = lease("whole", None, "GPU-0")
MPS_K = lease("mps", 10, "GPU-1", isolation="mps")
TEN_A = lease("ten-a", 10, "GPU-1")
TEN_B = lease("ten-b", 10, "GPU-1")
BUSY = lease("busy", 10, "GPU-1")
SCENE = [WHOLE, MPS_K, TEN_A, TEN_B, BUSY]

ROWS = [
    # (name, leases, needs, candidates, freeing, expected kernel ids, in order of choice)
    ("one waiter for 10 GiB: one 10 GiB kernel, not the whole GPU nor the MPS one",
     SCENE, [Need(waiter(10))], [cand(WHOLE), cand(MPS_K, SHUTDOWN, 900), cand(TEN_A, idle_for=300),
                                 cand(TEN_B, idle_for=200)], (), ["ten-a"]),
    ("the longest idle of equals", SCENE, [Need(waiter(10))],
     [cand(TEN_A, idle_for=300), cand(TEN_B, idle_for=500)], (), ["ten-b"]),
    ("refused starts left no waiter: nothing", SCENE, [],
     [cand(WHOLE), cand(MPS_K, SHUTDOWN), cand(TEN_A)], (), []),
    ("a waiter the room left serves: nothing", [WHOLE, TEN_A], [Need(waiter(10))],
     [cand(WHOLE), cand(TEN_A)], (), []),
    ("a waiter served by room on its way back: nothing more", SCENE, [Need(waiter(10))],
     [cand(WHOLE), cand(TEN_A), cand(TEN_B)], ("ten-a",), []),
    ("hibernation before shutdown, even two for one", SCENE, [Need(waiter(20))],
     [cand(MPS_K, SHUTDOWN, 5000), cand(TEN_A), cand(TEN_B)], (), ["ten-a", "ten-b"]),
    ("a shutdown only where nothing else serves", SCENE, [Need(waiter(10))],
     [cand(MPS_K, SHUTDOWN)], (), ["mps"]),
    ("fewest kernels: one 20 GiB rather than two 10 GiB",
     [WHOLE, lease("twenty", 20, "GPU-1"), TEN_A, TEN_B], [Need(waiter(20))],
     [cand(TEN_A, idle_for=900), cand(TEN_B, idle_for=900), cand(lease("twenty", 20, "GPU-1"), idle_for=100)],
     (), ["twenty"]),
    ("a whole GPU for a whole-GPU waiter: everything on one GPU", SCENE, [Need(waiter(None))],
     [cand(WHOLE, idle_for=10), cand(TEN_A, idle_for=900), cand(TEN_B, idle_for=900)], (), ["whole"]),
    ("the right GPU: a resume that may take GPU 1 only", SCENE, [Need(waiter(10), only=("GPU-1",))],
     [cand(WHOLE, idle_for=9000), cand(TEN_A)], (), ["ten-a"]),
    ("the right GPU: nothing on it is a candidate, so nothing elsewhere is taken in vain", SCENE,
     [Need(waiter(10), only=("GPU-1",))], [cand(WHOLE, idle_for=9000)], (), []),
    ("two waiters: one kernel each", SCENE, [Need(waiter(10, "w1")), Need(waiter(10, "w2"))],
     [cand(TEN_A, idle_for=900), cand(TEN_B, idle_for=800), cand(WHOLE, idle_for=10)], (), ["ten-a", "ten-b"]),
    ("the second waiter fits in what the first one's reclaim left", SCENE,
     [Need(waiter(20, "w1")), Need(waiter(10, "w2"))],
     [cand(lease("busy", 10, "GPU-1"), idle_for=50), cand(TEN_A, idle_for=900), cand(TEN_B, idle_for=800)], (),
     ["ten-a", "ten-b", "busy"]),
]


@pytest.mark.parametrize("name,leases,needs,candidates,freeing,expected", ROWS, ids=[r[0] for r in ROWS])
def test_reclaim_table(name, leases, needs, candidates, freeing, expected):
    chosen = choose_reclaim(POOL, leases, needs, candidates, freeing=freeing)
    assert [c.kernel_id for c in chosen] == expected
    by_id = {c.kernel_id: c for c in candidates}
    for c in chosen:
        assert c.action == by_id[c.kernel_id].action


def test_a_choice_holds_from_pass_to_pass():
    """Of two equal kernels, the one warned already stays the one chosen (its warning is not withdrawn
    for another's)."""
    cands = [cand(TEN_A, idle_for=900), cand(TEN_B, idle_for=300)]
    assert [c.kernel_id for c in choose_reclaim(POOL, SCENE, [Need(waiter(10))], cands)] == ["ten-a"]
    again = choose_reclaim(POOL, SCENE, [Need(waiter(10))], cands, warned={"ten-b"})
    assert [c.kernel_id for c in again] == ["ten-b"]


IDLE_RULE = Rule(idle_timeout=600.0, pressure_factor=0.5)

CANDIDATE_ROWS = [
    # (name, lease, rule, action, idle for, busy, a candidate?)
    ("idle long enough, hibernates", TEN_A, IDLE_RULE, HIBERNATE, 300, False, True),
    ("snoozed by its user", TEN_A, IDLE_RULE, HIBERNATE, 3000, "snoozed", False),
    ("idle less than idle_timeout x pressure_factor", TEN_A, IDLE_RULE, HIBERNATE, 299, False, False),
    ("busy", TEN_A, IDLE_RULE, HIBERNATE, 3000, True, False),
    ("no idle timeout in its rule", TEN_A, Rule(idle_timeout=None), HIBERNATE, 9000, False, False),
    ("MPS under a hibernate rule: would lose its variables, never", MPS_K, IDLE_RULE, SHUTDOWN, 9000, False, False),
    ("MPS under a shutdown rule: allowed", MPS_K, Rule(idle_timeout=600.0, action=SHUTDOWN), SHUTDOWN, 9000, False,
     True),
    ("hibernated already", lease("h", 10, state=HIBERNATED), IDLE_RULE, HIBERNATE, 9000, False, False),
]


@pytest.mark.parametrize("name,held,rule,action,idle_for,busy,expected", CANDIDATE_ROWS,
                         ids=[r[0] for r in CANDIDATE_ROWS])
def test_candidate_table(name, held, rule, action, idle_for, busy, expected):  # busy: True, False or "snoozed"
    found = candidate(held, rule, action, idle_since=NOW - idle_for, busy=busy is True, now=NOW,
                      snoozed_until=NOW + 60 if busy == "snoozed" else 0.0)
    assert (found is not None) == expected


RULE = Rule(idle_timeout=3600.0, gpu_idle_timeout=None, warn=90.0)


def test_a_reclaimed_kernel_is_warned_with_the_rules_lead_and_the_reason():
    facts = P.Facts("k", last_activity=NOW - 200, can_hibernate=True)
    d = P.decide(facts, RULE, NOW, reclaim=True)
    assert (d.verb, d.reason, d.action, d.deadline) == (P.WARN, P.PRESSURE, HIBERNATE, NOW + 90.0)
    assert d.message.startswith("Someone is waiting for a GPU slice and this kernel has been idle for")
    assert "will be hibernated (its variables are kept; the GPU slice is given back) in 1m," in d.message
    # Still chosen: nothing until the deadline, which never moves earlier; then act.
    later = P.decide(facts, RULE, NOW + 60, d.state, reclaim=True)
    assert later.verb == P.NONE and later.deadline == NOW + 90.0
    done = P.decide(facts, RULE, NOW + 90, later.state, reclaim=True)
    assert (done.verb, done.reason, done.action) == (P.ACT, P.PRESSURE, HIBERNATE)


def test_a_kernel_not_chosen_any_more_has_its_warning_withdrawn():
    facts = P.Facts("k", last_activity=NOW - 200, can_hibernate=True)
    d = P.decide(facts, RULE, NOW, reclaim=True)
    gone = P.decide(facts, RULE, NOW + 30, d.state, reclaim=False)
    assert gone.verb == P.WITHDRAW and "Nobody waits" in gone.message


def test_pressure_alone_moves_no_idle_deadline():
    """Someone waiting does not tighten a kernel's own idle clock: its card's time stays put."""
    facts = P.Facts("k", last_activity=NOW - 200, can_hibernate=True)
    assert P.next_action(facts, RULE) == (NOW - 200 + 3600.0, P.IDLE, HIBERNATE)
    assert P.decide(facts, RULE, NOW).verb == P.NONE


def test_a_kernel_warned_already_of_an_action_as_soon_keeps_that_warning_and_its_deadline():
    facts = P.Facts("k", last_activity=NOW - 3600 + 60, can_hibernate=True)  # idle, due in 60 s: warned
    idle = P.decide(facts, RULE, NOW)
    assert (idle.verb, idle.reason, idle.deadline) == (P.WARN, P.IDLE, NOW + 90.0)
    chosen = P.decide(facts, RULE, NOW + 10, idle.state, reclaim=True)
    assert chosen.verb == P.NONE and chosen.deadline == NOW + 90.0 and chosen.state.warning == idle.state.warning
    done = P.decide(facts, RULE, NOW + 90, chosen.state, reclaim=True)
    assert (done.verb, done.reason) == (P.ACT, P.IDLE)


def test_a_resume_needs_its_last_gpus_model_and_a_start_any_gpu():
    other = GPU("GPU-2", "Other GPU", 80 * GiB, 2)
    usage = gpu_usage([G0, G1, other], [])
    hibernated = {"L-w1": lease("w1", 10, "GPU-1", state=HIBERNATED)}
    queue = [waiter(10, "w1"), waiter(10, "w2", resume=False), waiter(10, "w3")]  # w3's lease is not hibernated
    found = needs(queue, usage, lambda w: hibernated.get(w.lease_id))
    assert [(n.waiter.id, n.only) for n in found] == [("w1", ("GPU-0", "GPU-1")), ("w2", None), ("w3", None)]
