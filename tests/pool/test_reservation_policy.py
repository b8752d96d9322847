"""The policy's decision for a kernel chosen to give back reserved room (reason ``reserved``): warned with
the rule's warning time and the reason in words, not kept by using the kernel or by a snooze, acted on at
the deadline, withdrawn once the reservation no longer needs it."""

from __future__ import annotations

import pytest

from jupyter_gpu_pool.pool.policy import (
    ACT, FRESH, NONE, RESERVED, WARN, WITHDRAW, Facts, KernelState, SnoozeRefused, Warning, decide, quiet_until, snooze)
from jupyter_gpu_pool.pool.rules import Rule

NOW = 10_000.0
WORDS = "reserved for ML 101 lab from 10:00"
RULE = Rule(idle_timeout=3600.0, gpu_idle_timeout=None, warn=300.0, action="hibernate")


def facts(**kw) -> Facts:
    return Facts(**{"kernel_id": "k", "last_activity": NOW - 10, "started": NOW - 100, "state_since": NOW - 100,
                    "can_hibernate": True, **kw})


def test_a_kernel_chosen_for_a_reservation_is_warned_with_the_rules_warning_time_and_the_reason():
    d = decide(facts(), RULE, NOW, reserved=WORDS)
    assert (d.verb, d.reason, d.action, d.deadline) == (WARN, RESERVED, "hibernate", NOW + 300)
    assert d.message == ("The GPU room this kernel holds is reserved for ML 101 lab from 10:00: this kernel will be "
                         "hibernated (its variables are kept; the GPU slice is given back) in 5m (no snooze: the room "
                         "is reserved).")


def test_using_the_kernel_does_not_keep_reserved_room_and_the_deadline_acts():
    state = decide(facts(), RULE, NOW, reserved=WORDS).state
    busy_later = decide(facts(last_activity=NOW + 200), RULE, NOW + 200, state, reserved=WORDS)
    assert busy_later.verb == NONE and busy_later.state.warning.reason == RESERVED
    done = decide(facts(last_activity=NOW + 250), RULE, NOW + 300, busy_later.state, reserved=WORDS)
    assert (done.verb, done.reason, done.action) == (ACT, RESERVED, "hibernate")
    assert done.message == "Hibernated for a reservation: The GPU room this kernel holds is reserved for ML 101 lab " \
                           "from 10:00."


def test_the_warning_is_withdrawn_once_the_reservation_needs_the_kernel_no_more():
    state = decide(facts(), RULE, NOW, reserved=WORDS).state
    d = decide(facts(), RULE, NOW + 60, state)
    assert (d.verb, d.state.warning) == (WITHDRAW, None)
    assert d.message == "The reserved room no longer needs this kernel's GPU slice; the warning is withdrawn."


def test_a_reserved_warning_cannot_be_snoozed():
    state = decide(facts(), RULE, NOW, reserved=WORDS).state
    with pytest.raises(SnoozeRefused) as e:
        snooze(state, RULE, NOW + 10)
    assert e.value.reason == "reserved"


def test_an_earlier_warning_of_another_action_is_kept_not_postponed():
    idle = KernelState(warning=Warning("idle", "hibernate", NOW - 200, NOW + 100, "..."))
    d = decide(facts(last_activity=NOW - 3500), RULE, NOW, idle, reserved=WORDS)
    assert d.verb == NONE and d.state.warning.reason == "idle" and d.state.warning.deadline == NOW + 100


def test_a_hibernated_kernel_has_no_room_to_give_back():
    assert decide(facts(state="hibernated"), RULE, NOW, reserved=WORDS).verb == NONE


def test_quiet_until_reads_the_reserved_choice_ahead():
    # not warned yet: decide warns now; warned: nothing changes until the deadline, where it acts
    assert quiet_until(facts(), RULE, NOW, FRESH, reserved=WORDS) == NOW
    warned = decide(facts(), RULE, NOW, reserved=WORDS).state
    assert quiet_until(facts(), RULE, NOW + 1, warned, reserved=WORDS) == NOW + 300
    assert decide(facts(), RULE, NOW + 299, warned, reserved=WORDS).verb == NONE
    assert decide(facts(), RULE, NOW + 300, warned, reserved=WORDS).verb == ACT
