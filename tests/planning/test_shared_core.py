"""The pieces of the pool core the culler and the replay share: a kernel's facts (pool.culling), its
GPU use (pool.gpu_use), and policy.quiet_until, which lets a replay skip passes: for any facts, rule,
state and time, decide() answers "none" and keeps the state at every moment before it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from planning_helpers import T0, configuration, session, workload

from jupyter_gpu_pool.planning.simulator import Replay

from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, Lease
from jupyter_gpu_pool.pool import culling as C
from jupyter_gpu_pool.pool import policy as P
from jupyter_gpu_pool.pool import reclaim as Rc
from jupyter_gpu_pool.pool import rules as R
from jupyter_gpu_pool.pool.budgets import Budget, Scope, Standing
from jupyter_gpu_pool.pool.gpu_use import GPUUse

NOW = 10_000.0


def lease(state=ACTIVE, **kw) -> Lease:
    base = dict(id="l", owner="alice", kernel_id="k", profile="small", isolation="soft", memory=2**30, sm_percent=None,
                whole=False, gpu_count=1, state=state, gpus=("g0",) if state == ACTIVE else (), last_gpus=("g0",),
                groups=(), label="", created=1000.0, updated=1000.0, state_since=1500.0)
    return Lease(**{**base, **kw})


def test_gpu_use_reads_idle_since_and_last_use_per_threshold():
    use = GPUUse()
    assert use.idle_since(5) is None and use.last_active(5) is None
    use.record(100, 0, 0.0, (5.0, 20.0))
    assert use.idle_since(5) is None  # holds no memory: not GPU-idle
    use.record(110, 2**30, 50.0, (5.0, 20.0))
    assert use.idle_since(5) is None and use.last_active(5) == 110 and use.last_active(20) == 110
    use.record(120, 2**30, 10.0, (5.0, 20.0))
    assert use.idle_since(5) is None and use.idle_since(20) == 110 and use.last_active(5) == 120
    use.record(130, 2**30, 0.0, (5.0, 20.0))
    assert use.idle_since(5) == 120 and use.idle_since(20) == 110
    use.record(140, None, 0.0, (5.0, 20.0))  # memory held, NVML would not say how much
    assert use.idle_since(5) == 120


def test_a_kernels_facts_count_gpu_use_as_activity_and_ignore_readings_while_hibernated():
    f = C.kernel_facts(lease(), execution_state="idle", last_activity=None, busy_since=None, gpu_active=2000.0,
                       gpu_idle_since=None, memory_used=5, can_hibernate=True, why=None)
    assert f.last_activity == 2000.0 and f.started == 1000.0 and f.memory_used == 5
    asleep = C.kernel_facts(lease(HIBERNATED), execution_state="idle", last_activity=1200.0, busy_since=None,
                            gpu_active=None, gpu_idle_since=1300.0, memory_used=5, can_hibernate=True, why=None)
    assert asleep.last_activity == 1200.0 and asleep.memory_used is None and asleep.gpu_idle_since is None


def test_busy_since_is_kept_from_the_pass_that_first_saw_the_kernel_busy():
    assert C.busy_since(None, "busy", 90.0, 100.0) == 90.0
    assert C.busy_since(90.0, "busy", 99.0, 130.0) == 90.0
    assert C.busy_since(90.0, "idle", 99.0, 160.0) is None
    assert C.busy_since(None, "busy", None, 100.0) == 100.0


def test_budget_facts_warn_at_nine_tenths_and_act_when_spent():
    standing = Standing(Scope("alice", "user", Budget(10.0)), spent=8.0, rate=2.0, period_end=NOW + 86400, now=NOW)
    facts = C.budget_facts(standing)
    assert facts["budget_warn_at"] == NOW + 1800 and facts["budget_due"] == NOW + 3600
    assert facts["budget_used"] == 8.0 and facts["budget_limit"] == 10.0


durations = st.one_of(st.none(), st.floats(1, 5000))
rules = st.builds(P.Rule, idle_timeout=durations, gpu_idle_timeout=durations, max_busy=durations, max_age=durations,
                  max_hibernated=durations, warn=st.floats(1, 600), snooze=st.floats(1, 3000),
                  max_snoozes=st.integers(0, 3), action=st.sampled_from(R.ACTIONS),
                  pressure_factor=st.floats(0.1, 1.0), over_memory_grace=st.floats(1, 300))
times = st.floats(0, NOW)
facts = st.builds(
    P.Facts, kernel_id=st.just("k"), state=st.sampled_from((ACTIVE, HIBERNATED)),
    execution_state=st.sampled_from(("idle", "busy", "starting")), last_activity=times, started=times,
    state_since=times, busy_since=st.one_of(st.none(), times), memory_used=st.one_of(st.none(), st.integers(0, 2**35)),
    memory_limit=st.one_of(st.none(), st.integers(1, 2**35)), gpu_idle_since=st.one_of(st.none(), times),
    can_hibernate=st.booleans(), budget_due=st.one_of(st.none(), st.floats(0, 2 * NOW)),
    budget_warn_at=st.one_of(st.none(), st.floats(0, 2 * NOW)))


@st.composite
def states(draw):
    warning = draw(st.one_of(st.none(), st.builds(P.Warning, reason=st.sampled_from(P.REASONS),
                                                    action=st.sampled_from(R.ACTIONS), warned_at=times,
                                                    deadline=st.floats(0, 2 * NOW), message=st.just(""))))
    return P.KernelState(warning=warning, snoozes_used=draw(st.integers(0, 2)),
                         snoozed_until=draw(st.one_of(st.just(0.0), st.floats(0, 2 * NOW))),
                         reported=draw(st.one_of(st.none(), st.sampled_from(P.REASONS))))


@settings(max_examples=400, deadline=None)
@given(facts, rules, states(), st.booleans(), st.booleans(), st.lists(st.floats(0, 1), min_size=1, max_size=6))
def test_decide_stays_quiet_until_quiet_until_says(f, rule, state, reclaim, dry_run, fractions):
    """Chosen for a waiter or not (``reclaim``, held the same), as the replay re-judges a kernel whose
    choice changes."""
    now = NOW
    # the state the replay keeps is the one decide returned: start from it
    state = P.decide(f, rule, now, state, reclaim=reclaim, dry_run=dry_run).state
    until = P.quiet_until(f, rule, now, state, reclaim=reclaim, dry_run=dry_run)
    assert until >= now
    if until == now:
        return
    span = min(until, now + 10 * NOW) - now
    for fraction in fractions:
        t = now + fraction * span
        if t >= until:
            continue
        later = P.decide(f, rule, t, state, reclaim=reclaim, dry_run=dry_run)
        assert later.verb == P.NONE and later.state == state, (t, until, later)


# The reclaim scene of issue 22: a whole-GPU kernel on GPU 0; on GPU 1 four 10 GiB kernels, the one idle
# longest ("x") unable to hibernate; all idle past idle_timeout × pressure_factor when "f" asks for 10 GiB.
RECLAIM_RULE = [{"name": "idle", "idle_timeout": 1800, "gpu_idle_timeout": None, "warn": 60, "action": "hibernate",
                 "pressure_factor": 0.5, "max_hibernated": None, "slice_at": "start"}]
ASKED = T0 + 1000


def reclaim_scene(end: float, **settings):
    config = configuration(gpus=2, memory="40GiB", policy=RECLAIM_RULE, **settings)
    sessions = [session("W", T0, profile="whole"),
                session("x", T0 + 10, can_hibernate=False, why="an MPS client cannot be checkpointed"),
                session("a", T0 + 20), session("b", T0 + 30), session("c", T0 + 40), session("f", ASKED)]
    w = workload(sessions, interval=30.0)
    w.end = end
    r = Replay(w, config, config.pool_of(2), keep_decisions=True)
    return r, r.run()


def test_the_replay_reclaims_the_kernel_the_pure_choice_takes_for_a_waiter():
    """The scene as it stands when f has queued: the pure choice (pool.reclaim) from the pool's leases,
    the waiter and each idle kernel as a candidate takes back one 10 GiB kernel that keeps its state, the
    longest idle of those (not x, which would lose its variables; not the whole GPU).  The replay warns
    that kernel and no other (reason pressure, the rule's warning time), hibernates it at the deadline,
    and f starts on its slice; nobody else is warned although all are past the pressure factor."""
    queued, _ = reclaim_scene(ASKED + 1, start_queue_timeout=3600)
    pool = queued.pool
    [waiter] = pool.queue
    assert waiter.kernel_id == "f"
    leases = list({lease.id: lease for held in pool.on_gpu.values() for lease in held.values()}.values())
    candidates = []
    for lease in leases:
        rule = queued.policy.rule_for(lease.owner, lease.groups, lease.profile, "")
        action = P.release_action(rule, lease.kernel_id != "x", None)[0]  # x cannot hibernate
        found = Rc.candidate(lease, rule, action, idle_since=lease.created, busy=False, now=ASKED + 1)
        if found is not None:
            candidates.append(found)
    assert {c.kernel_id for c in candidates} == {"W", "a", "b", "c"}  # x would lose its state: never
    chosen = Rc.choose_reclaim(list(pool.gpus.values()), leases, [Rc.Need(waiter)], candidates)
    assert [(c.kernel_id, c.action) for c in chosen] == [("a", P.HIBERNATE)]

    _, tally = reclaim_scene(ASKED + 600, start_queue_timeout=3600)
    decisions = [(d.kernel, d.verb, d.reason, d.action) for d in tally.decisions]
    assert decisions == [("a", "warn", P.PRESSURE, P.HIBERNATE), ("a", "act", P.PRESSURE, P.HIBERNATE)]
    warned, acted = (d.at for d in tally.decisions)
    assert ASKED <= warned <= ASKED + 30 and acted >= warned + 60  # the next pass; the rule's warning time
    assert tally.hibernated == 1 and tally.shut_down == 0
    assert len(tally.waits) == 6 and 60 <= max(tally.waits) <= 120  # f waited for a's checkpoint, then started


def test_a_refused_start_reclaims_nothing():
    """The same scene with the queue off: f is refused at once, is no waiter, and nobody is warned."""
    _, tally = reclaim_scene(ASKED + 600, start_queue_timeout=0)
    assert [(r[1], r[2]) for r in tally.refused_asks] == [("f", "pool_exhausted")]
    assert tally.decisions == [] and tally.hibernated == tally.shut_down == 0
