"""When the policy will act on a kernel that stays idle: what an idle kernel's card says
("will be hibernated at 14:05 if still idle"), from the same conditions :func:`decide` judges."""

from __future__ import annotations

from jupyter_gpu_pool.pool import policy as P

RULE = P.Rule(name="lab", idle_timeout=600.0, gpu_idle_timeout=None, warn=60.0, max_hibernated=3600.0,
              action=P.HIBERNATE)


def facts(**kw) -> P.Facts:
    return P.Facts(**{"kernel_id": "k", "last_activity": 1000.0, "started": 900.0, "state_since": 900.0,
                      "can_hibernate": True, **kw})


def test_an_idle_kernel_is_due_its_idle_timeout_after_its_last_activity():
    assert P.next_action(facts(), RULE) == (1600.0, P.IDLE, P.HIBERNATE)
    # the same moment decide() warns (warn seconds before) and acts
    assert P.decide(facts(), RULE, 1539.0).verb == P.NONE
    assert P.decide(facts(), RULE, 1540.0).verb == P.WARN


def test_a_kernel_that_cannot_hibernate_will_be_shut_down():
    assert P.next_action(facts(can_hibernate=False, hibernate_unavailable="MPS"), RULE) == (1600.0, P.IDLE, P.SHUTDOWN)


def test_a_keep_alive_moves_the_time():
    snoozed = P.KernelState(snoozes_used=1, snoozed_until=2000.0)
    assert P.next_action(facts(), RULE, snoozed)[0] == 2000.0


def test_the_first_limit_due_wins_and_a_hibernated_kernel_is_shut_down_at_its_limit():
    old = P.Rule(name="old", idle_timeout=600.0, gpu_idle_timeout=None, max_age=300.0, warn=60.0)
    assert P.next_action(facts(), old) == (1200.0, P.MAX_AGE, P.HIBERNATE)
    assert P.next_action(facts(state="hibernated"), RULE) == (900.0 + 3600.0, P.MAX_HIBERNATED, P.SHUTDOWN)


def test_no_limit_no_time():
    none = P.Rule(name="never", idle_timeout=None, gpu_idle_timeout=None, max_hibernated=None)
    assert P.next_action(facts(), none) is None
