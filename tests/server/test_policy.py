"""The pure decision function, as a table of cases, and policy parsing with errors that name the rule and field."""

from __future__ import annotations

import pytest

from jupyter_gpu_pool.pool import policy as P
from jupyter_gpu_pool.pool.policy import (
    ACT,
    FRESH,
    NONE,
    WARN,
    WITHDRAW,
    Facts,
    KernelState,
    SnoozeRefused,
    Warning,
    decide,
    snooze,
)
from jupyter_gpu_pool.pool import rules as R
from jupyter_gpu_pool.pool.rules import Rule, parse_policy
from jupyter_gpu_pool.pool.units import parse_duration

NOW = 10_000.0
OFF = {"idle_timeout": None, "gpu_idle_timeout": None, "max_busy": None, "max_age": None, "max_hibernated": None}


def rule(**kw) -> Rule:
    return Rule(**{**OFF, "warn": 60.0, "action": "shutdown", **kw})


def facts(**kw) -> Facts:
    base = {"kernel_id": "k", "last_activity": NOW, "started": NOW - 100, "state_since": NOW - 100}
    return Facts(**{**base, **kw})


def warned(reason: str, deadline: float, action: str = "shutdown", at: float = NOW - 30) -> KernelState:
    return KernelState(warning=Warning(reason, action, at, deadline, "..."))


# (name, facts, rule, state, keyword args, expected verb, expected reason, expected action, expected deadline)
CASES = [
    # idle_timeout: no execution and no activity
    ("idle, not yet near", facts(last_activity=NOW - 100), rule(idle_timeout=600), FRESH, {}, NONE, None, None, None),
    ("idle, within warn", facts(last_activity=NOW - 550), rule(idle_timeout=600), FRESH, {},
     WARN, "idle", "shutdown", NOW + 60),
    ("idle, late warning still gives the full lead", facts(last_activity=NOW - 9000), rule(idle_timeout=600),
     FRESH, {}, WARN, "idle", "shutdown", NOW + 60),
    ("idle, warned, before deadline", facts(last_activity=NOW - 610), rule(idle_timeout=600),
     warned("idle", NOW + 30), {}, NONE, "idle", "shutdown", NOW + 30),
    ("idle, warned, deadline reached", facts(last_activity=NOW - 700), rule(idle_timeout=600),
     warned("idle", NOW), {}, ACT, "idle", "shutdown", NOW),
    ("idle, used after the warning", facts(last_activity=NOW - 5), rule(idle_timeout=600),
     warned("idle", NOW + 10), {}, WITHDRAW, "idle", None, None),
    ("starting (no client yet) counts as idle", facts(execution_state="starting", last_activity=NOW - 700),
     rule(idle_timeout=600), FRESH, {}, WARN, "idle", "shutdown", NOW + 60),
    ("idle off", facts(last_activity=NOW - 99999), rule(), FRESH, {}, NONE, None, None, None),
    # a busy kernel is not idle, however long it prints nothing
    ("busy is not idle", facts(execution_state="busy", last_activity=NOW - 9000, busy_since=NOW - 9000),
     rule(idle_timeout=600), FRESH, {}, NONE, None, None, None),
    ("busy, warned for idle before it got busy: withdrawn",
     facts(execution_state="busy", last_activity=NOW - 9000, busy_since=NOW - 1), rule(idle_timeout=600),
     warned("idle", NOW + 10), {}, WITHDRAW, "idle", None, None),
    # max_busy: unless the rule says so
    ("busy past max_busy", facts(execution_state="busy", busy_since=NOW - 3600), rule(max_busy=3000), FRESH, {},
     WARN, "max_busy", "shutdown", NOW + 60),
    ("busy under max_busy", facts(execution_state="busy", busy_since=NOW - 60), rule(max_busy=3000), FRESH, {},
     NONE, None, None, None),
    ("max_busy ignores idle kernels", facts(busy_since=None), rule(max_busy=1), FRESH, {}, NONE, None, None, None),
    # gpu_idle_timeout: holds memory under the threshold, even while busy or with a tab open
    ("gpu idle while busy with a tab open", facts(execution_state="busy", busy_since=NOW - 9000,
     memory_used=2**30, gpu_idle_since=NOW - 1800), rule(gpu_idle_timeout=1800), FRESH, {},
     WARN, "gpu_idle", "shutdown", NOW + 60),
    ("gpu not idle (no idle-since)", facts(execution_state="busy", busy_since=NOW - 9000, memory_used=2**30),
     rule(gpu_idle_timeout=1800), FRESH, {}, NONE, None, None, None),
    ("gpu idle, not long enough", facts(gpu_idle_since=NOW - 60), rule(gpu_idle_timeout=1800), FRESH, {},
     NONE, None, None, None),
    # max_age
    ("older than max_age", facts(started=NOW - 90000), rule(max_age=86400), FRESH, {},
     WARN, "max_age", "shutdown", NOW + 60),
    ("max_age applies to hibernated kernels", facts(state="hibernated", started=NOW - 90000),
     rule(max_age=86400), FRESH, {}, WARN, "max_age", "shutdown", NOW + 60),
    # hibernated: holds no GPU, so never GPU-idle or idle; max_hibernated leads to shutdown
    ("hibernated is not gpu idle", facts(state="hibernated", gpu_idle_since=NOW - 99999, last_activity=0),
     rule(gpu_idle_timeout=1, idle_timeout=1), FRESH, {}, NONE, None, None, None),
    ("hibernated too long", facts(state="hibernated", state_since=NOW - 86400, can_hibernate=True),
     rule(max_hibernated=86400, action="hibernate"), FRESH, {}, WARN, "max_hibernated", "shutdown", NOW + 60),
    # the action
    ("hibernate where the kernel can", facts(last_activity=NOW - 700, can_hibernate=True),
     rule(idle_timeout=600, action="hibernate"), FRESH, {}, WARN, "idle", "hibernate", NOW + 60),
    ("hibernate falls back to shutdown", facts(last_activity=NOW - 700, can_hibernate=False,
     hibernate_unavailable="an MPS client cannot be checkpointed"), rule(idle_timeout=600, action="hibernate"),
     FRESH, {}, WARN, "idle", "shutdown", NOW + 60),
    # precedence: the earliest due condition wins; over-memory is due at once
    ("earliest due wins", facts(last_activity=NOW - 700, started=NOW - 90000, gpu_idle_since=NOW - 700),
     rule(idle_timeout=600, gpu_idle_timeout=650, max_age=86400), FRESH, {}, WARN, "max_age", "shutdown", NOW + 60),
    ("over memory (soft) beats idle", facts(memory_used=11 * 2**30, memory_limit=10 * 2**30, last_activity=NOW - 700),
     rule(idle_timeout=600, over_memory_grace=30), FRESH, {}, WARN, "over_memory", "shutdown", NOW + 30),
    ("over memory under mps is the hardware's job", facts(isolation="mps", memory_used=11 * 2**30,
     memory_limit=10 * 2**30), rule(), FRESH, {}, NONE, None, None, None),
    ("no reading, no over-memory", facts(memory_used=None, memory_limit=10 * 2**30), rule(), FRESH, {},
     NONE, None, None, None),
    ("a different reason re-warns", facts(memory_used=11 * 2**30, memory_limit=10 * 2**30, last_activity=NOW - 700),
     rule(idle_timeout=600, over_memory_grace=30), warned("idle", NOW + 5), {}, WARN, "over_memory", "shutdown",
     NOW + 30),
    # snoozes postpone everything but over-memory
    ("snoozed", facts(last_activity=NOW - 9000), rule(idle_timeout=600), KernelState(snoozes_used=1,
     snoozed_until=NOW + 600), {}, NONE, None, None, None),
    ("snooze ending: warned for its end", facts(last_activity=NOW - 9000), rule(idle_timeout=600),
     KernelState(snoozes_used=1, snoozed_until=NOW + 30), {}, WARN, "idle", "shutdown", NOW + 60),
    ("snooze ending later than the lead", facts(last_activity=NOW - 9000), rule(idle_timeout=600),
     KernelState(snoozes_used=1, snoozed_until=NOW + 59), {}, WARN, "idle", "shutdown", NOW + 60),
    ("over memory is not snoozable", facts(memory_used=11 * 2**30, memory_limit=10 * 2**30), rule(),
     KernelState(snoozes_used=1, snoozed_until=NOW + 600), {}, WARN, "over_memory", "shutdown", NOW + 120),
    # decide() has no waiters: a pressure_factor never tightens an idle timeout by itself (under pressure
    # pool.reclaim chooses whom to take back, and decide(reclaim=True) warns only those)
    ("pressure_factor alone tightens nothing", facts(last_activity=NOW - 300), rule(idle_timeout=600, pressure_factor=0.5),
     FRESH, {}, NONE, None, None, None),
    # dry run: decides and reports, once
    ("dry run warns", facts(last_activity=NOW - 700), rule(idle_timeout=600), FRESH, {"dry_run": True},
     WARN, "idle", "shutdown", NOW + 60),
    ("dry run acts (reports)", facts(last_activity=NOW - 700), rule(idle_timeout=600), warned("idle", NOW),
     {"dry_run": True}, ACT, "idle", "shutdown", NOW),
    ("dry run reports once", facts(last_activity=NOW - 700), rule(idle_timeout=600),
     KernelState(reported="idle"), {"dry_run": True}, NONE, "idle", "shutdown", None),
    # the owner's GPU-hour budget: warned from 90% on, acted on at 100%, busy or not
    ("budget below 90%", facts(budget_warn_at=NOW + 100, budget_due=NOW + 1000), rule(), FRESH, {},
     NONE, None, None, None),
    ("budget at 90% warns until 100%", facts(execution_state="busy", budget_warn_at=NOW, budget_due=NOW + 900),
     rule(), FRESH, {}, WARN, "budget", "shutdown", NOW + 900),
    ("budget warned, not yet spent", facts(budget_warn_at=NOW - 800, budget_due=NOW + 100), rule(),
     warned("budget", NOW + 100), {}, NONE, "budget", "shutdown", NOW + 100),
    ("budget spent: acted on", facts(budget_warn_at=NOW - 900, budget_due=NOW), rule(),
     warned("budget", NOW), {}, ACT, "budget", "shutdown", NOW),
    ("budget spent before the kernel was seen: still warned first", facts(budget_warn_at=NOW, budget_due=NOW),
     rule(), FRESH, {}, WARN, "budget", "shutdown", NOW + 60),
    ("budget spent: hibernates where the rule and kernel can", facts(budget_warn_at=NOW - 900, budget_due=NOW,
     can_hibernate=True), rule(action="hibernate"), warned("budget", NOW, "hibernate"), {}, ACT, "budget",
     "hibernate", NOW),
    ("budget: a snooze does not postpone it", facts(budget_warn_at=NOW - 900, budget_due=NOW), rule(),
     KernelState(warning=Warning("budget", "shutdown", NOW - 30, NOW, "..."), snoozed_until=NOW + 999), {},
     ACT, "budget", "shutdown", NOW),
]


@pytest.mark.parametrize("name, f, r, state, kw, verb, reason, action, deadline", CASES, ids=[c[0] for c in CASES])
def test_decide(name, f, r, state, kw, verb, reason, action, deadline):
    d = decide(f, r, NOW, state, **kw)
    assert (d.verb, d.reason, d.action) == (verb, reason, action)
    if deadline is not None:
        assert d.deadline == deadline
    assert d.dry_run == kw.get("dry_run", False)
    if verb == WARN:
        assert d.state.warning and d.state.warning.deadline == deadline and d.message
    if verb in (ACT, WITHDRAW):
        assert d.state.warning is None


def test_hibernation_fallback_is_explained():
    d = decide(facts(last_activity=NOW - 700, hibernate_unavailable="no hibernator is installed on this server"),
               rule(idle_timeout=600, action="hibernate"), NOW)
    assert d.action == "shutdown"
    assert d.note == "hibernation unavailable (no hibernator is installed on this server), so shut down instead"


def test_a_warning_always_precedes_the_action():
    """Walk a kernel's clock second by second: it is warned ``warn`` seconds before being acted on."""
    r, f, state = rule(idle_timeout=120, warn=30), facts(last_activity=NOW), FRESH
    verbs = {}
    for t in range(0, 200):
        d = decide(f, r, NOW + t, state)
        state = d.state
        if d.verb != NONE:
            verbs[t] = d.verb
            if d.verb == ACT:
                break
    assert verbs == {90: WARN, 120: ACT}


def test_a_warning_on_record_later_than_decided_keeps_the_whole_warning_time():
    """A pass decides its kernels one after another, and each warning is on record a moment after it was
    decided: its deadline moves as late, so the user has all of ``warn`` from when they could know."""
    r, f = rule(idle_timeout=120, warn=30), facts(last_activity=NOW)
    d = decide(f, r, NOW + 90)
    assert d.verb == WARN and d.state.warning.deadline == NOW + 120
    state = P.told(d.state, NOW + 90.02)
    assert state.warning.deadline == pytest.approx(NOW + 120.02) and state.warning.warned_at == NOW + 90
    assert decide(f, r, NOW + 120.01, state).verb == NONE  # not yet: 30 s from when it was told
    assert decide(f, r, NOW + 120.02, state).verb == ACT
    assert P.told(d.state, NOW + 90) == d.state and P.told(FRESH, NOW) == FRESH  # told at once, or nothing told


def test_a_budget_warning_cannot_be_snoozed():
    state = decide(facts(budget_warn_at=NOW, budget_due=NOW + 900, budget_used=9.0, budget_limit=10.0),
                   rule(max_snoozes=2, snooze=600), NOW).state
    assert "9.0 of the 10 GPU hours budgeted this week are used: this kernel will be" in state.warning.message
    with pytest.raises(SnoozeRefused) as refused:
        snooze(state, rule(max_snoozes=2, snooze=600), NOW)
    assert refused.value.reason == "budget" and "cannot add GPU time" in refused.value.message


def test_a_failed_hibernation_is_not_tried_again_before_the_rules_idle_time_has_passed_again():
    r = rule(idle_timeout=600.0, action="hibernate")
    f = facts(last_activity=NOW - 700, can_hibernate=True)  # idle past its rule: due now
    assert decide(f, r, NOW).verb == WARN
    state = P.hibernation_failed(warned("idle", NOW, "hibernate", at=NOW - 60), r, NOW)
    assert state.warning is None and state.retry_after == NOW + 600
    for later in (NOW + 1, NOW + 300, NOW + 539):  # no warning, no action, every pass until then
        assert decide(f, r, later, state).verb == NONE
    again = decide(f, r, NOW + 540, state)  # its warning comes its warning time ahead, as any other
    assert again.verb == WARN and again.action == "hibernate" and again.deadline == NOW + 600
    assert decide(f, r, NOW + 600, again.state).verb == ACT
    # a rule with no idle time waits its GPU-idle time, else its warning time (a minute at least)
    assert P.retry_delay(rule(gpu_idle_timeout=1200.0)) == 1200.0 and P.retry_delay(rule(warn=5.0)) == 60.0


def test_a_rule_given_no_name_is_read_by_whom_it_covers_not_by_its_place():
    policy = parse_policy([{"match": {"group": "students", "profile": ["gpu-*", "a100"]}}, {"idle_timeout": 60},
                           {"name": "lab"}])
    unnamed, everyone, named = policy.rules
    assert (unnamed.name, everyone.name) == ("rule 0", "rule 1")  # their identity is unchanged
    assert unnamed.label == "for group students, profile gpu-* or a100" and everyone.label == "for everyone"
    assert named.label == "lab" and R.DEFAULT_RULE.label == "default"
    assert (unnamed.described, named.described) == ("rule for group students, profile gpu-* or a100", "rule 'lab'")
    f = facts(last_activity=NOW - 4000)
    acted = decide(f, everyone, NOW, warned("idle", NOW, "hibernate"))
    assert acted.message.startswith("Shut down by the pool's rule for everyone. Idle for ")
    with pytest.raises(SnoozeRefused, match="The pool's rule for everyone allows no snoozes"):
        snooze(FRESH, rule(max_snoozes=0, name="rule 3"), NOW)


def test_snoozes_are_limited_and_given_back_once_used_again():
    r = rule(idle_timeout=600, snooze=300, max_snoozes=2)
    state = decide(facts(last_activity=NOW - 590), r, NOW).state
    state = P.snooze(state, r, NOW)
    assert state.warning is None and state.snoozed_until == NOW + 300 and P.snoozes_left(state, r) == 1
    state = P.snooze(state, r, NOW + 10, seconds=100)
    assert state.snoozed_until == NOW + 300  # a shorter snooze never shortens one in force
    with pytest.raises(P.SnoozeRefused) as e:
        P.snooze(state, r, NOW + 20)
    assert e.value.status == 409 and e.value.reason == "no_snoozes_left"
    with pytest.raises(P.SnoozeRefused) as e:
        P.snooze(FRESH, r, NOW, seconds=301)
    assert e.value.status == 400 and "at most 300 seconds" in e.value.message
    with pytest.raises(P.SnoozeRefused) as e:
        P.snooze(FRESH, rule(max_snoozes=0), NOW)
    assert e.value.reason == "snooze_not_allowed"
    # the user runs a cell: nothing is near due any more, snoozes are given back
    d = decide(facts(last_activity=NOW + 30), r, NOW + 30, state)
    assert d.state == FRESH and P.snoozes_left(d.state, r) == 2


def test_rule_matching_first_match_wins():
    policy = parse_policy([
        {"name": "alice", "match": {"user": "alice"}, "idle_timeout": "10m"},
        {"name": "students", "match": {"group": ["students", "interns"]}, "idle_timeout": "30m"},
        {"name": "whole", "match": {"profile": "gpu-whole*", "kernelspec": "gpu-pool-*"}, "idle_timeout": "2h"},
    ])
    assert policy.rule_for("alice", ("students",), "gpu-10g", "gpu-pool-gpu-10g").name == "alice"
    assert policy.rule_for("bob", ("interns",), "gpu-whole", "gpu-pool-gpu-whole").name == "students"
    assert policy.rule_for("carol", (), "gpu-whole", "gpu-pool-gpu-whole").name == "whole"
    assert policy.rule_for("carol", (), "gpu-whole", "python3").name == "default"  # every key must match
    assert policy.rule_for("carol", (), "gpu-10g", "x") is R.DEFAULT_RULE


def test_defaults_are_sane_for_a_shared_box():
    r = R.DEFAULT_RULE
    assert (r.idle_timeout, r.gpu_idle_timeout, r.gpu_idle_threshold) == (3600, 3600, 5)
    assert r.max_busy is None and r.max_age is None  # a long training run is never cut by default
    assert (r.warn, r.snooze, r.max_snoozes, r.action, r.max_hibernated) == (300, 1800, 2, "hibernate", 86400)


@pytest.mark.parametrize("text, seconds", [
    (90, 90.0), (1.5, 1.5), ("45s", 45.0), ("30m", 1800.0), ("2h", 7200.0), ("1h30m", 5400.0), ("1d", 86400.0),
    ("1d 2h", 93600.0), (None, None), ("never", None),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("rules, message", [
    ("not a list", "must be a list of rules, not str"),
    (["idle"], "[0] must be a dict"),
    ([{"idle_timout": "1h"}], "[0] has unknown field(s) ['idle_timout']"),
    ([{}, {"name": "lab", "idle_timeout": "30 minutes"}], "[1] ('lab').idle_timeout: '30 minutes' is not a duration"),
    ([{"idle_timeout": 0}], "[0].idle_timeout: 0 must be more than zero (write null to turn it off)"),
    ([{"warn": None}], "[0].warn cannot be turned off"),
    ([{"action": "kill"}], "[0].action: 'kill' is not one of hibernate, shutdown"),
    ([{"max_snoozes": -1}], "[0].max_snoozes must be a whole number of at least 0, not -1"),
    ([{"gpu_idle_threshold": 150}], "[0].gpu_idle_threshold must be above 0 and at most 100, not 150"),
    ([{"gpu_idle_threshold": "low"}], "[0].gpu_idle_threshold: 'low' is not a percentage"),
    ([{"pressure_factor": 2}], "[0].pressure_factor must be a number above 0 and at most 1"),
    ([{"match": {"team": "x"}}], "[0].match has unknown key(s) ['team']"),
    ([{"match": {"user": []}}], "[0].match.user must be a name or a non-empty list of names"),
    ([{"match": {"profile": "gpu-1g"}}], "[0].match.profile: 'gpu-1g' is not a profile; the profiles are small"),
    ([{"name": "a"}, {"name": "a"}], "[1].name: 'a' is used by rule 0 too"),
    ([{"hibernate_after_cell": "30s", "action": "shutdown"}], "[0].hibernate_after_cell needs action: hibernate"),
    ([{"hibernate_after_cell": "soon"}], "[0].hibernate_after_cell: 'soon' is not a duration"),
])
def test_bad_policies_name_the_rule_and_field(rules, message):
    with pytest.raises(R.PolicyError) as e:
        parse_policy(rules, profiles=("small", "half"))
    assert message in str(e.value)


def test_hibernate_after_cell_is_off_by_default_and_read_as_a_duration():
    assert parse_policy([{}]).rules[0].hibernate_after_cell is None
    rule = parse_policy([{"hibernate_after_cell": "20s"}]).rules[0]
    assert rule.hibernate_after_cell == 20.0 and rule.to_dict()["hibernate_after_cell"] == 20.0


def test_config_error_names_the_setting(tmp_path):
    from jupyter_gpu_pool.config import ConfigError, load_settings

    (tmp_path / "jupyter_gpu_pool_config.py").write_text(
        'c.GPUPool.policy = [{"name": "ok"}, {"name": "students", "idle_timeout": "soon"}]\n')
    with pytest.raises(ConfigError) as e:
        load_settings(paths=[str(tmp_path)])
    assert str(e.value).startswith("GPUPool.policy[1] ('students').idle_timeout: 'soon' is not a duration")
