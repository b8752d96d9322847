"""The state machine's allowed moves, what the UI is shown, and the admin's hibernation settings."""

from __future__ import annotations

import pytest

from jupyter_gpu_pool.hibernation import HibernationSettings, display_state, parse_host_memory
from jupyter_gpu_pool.pool.phases import PhaseError
from jupyter_gpu_pool.pool.residency import MOVES, check_move
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, Lease

GiB = 2**30


def lease(state=ACTIVE, phase=""):
    return Lease(id="L", owner="a", kernel_id="k", profile="p", isolation="soft", memory=GiB, sm_percent=None,
                 whole=False, gpu_count=1, state=state, gpus=(), last_gpus=(), groups=(), label="", created=0.0,
                 updated=0.0, state_since=0.0, phase=phase)


@pytest.mark.parametrize("state,phase,new", [
    (ACTIVE, "", "hibernating"), (ACTIVE, "hibernating", ""), (HIBERNATED, "", "resuming"),
    (HIBERNATED, "resuming", "queued"), (HIBERNATED, "queued", "resuming"), (HIBERNATED, "", "evicting"),
    (HIBERNATED, "evicting", "resuming"), (ACTIVE, "resuming", ""), (ACTIVE, "failed", ""),
])
def test_allowed_moves(state, phase, new):
    check_move(state, phase, new)


@pytest.mark.parametrize("state,phase,new", [
    (ACTIVE, "", "resuming"), (ACTIVE, "", "queued"), (HIBERNATED, "", "hibernating"),
    (ACTIVE, "failed", "hibernating"), (HIBERNATED, "queued", "failed"),
])
def test_moves_the_machine_refuses_name_what_is_allowed(state, phase, new):
    with pytest.raises(PhaseError, match="allowed:"):
        check_move(state, phase, new)


def test_every_phase_that_can_be_entered_can_be_left():
    entered = {new for targets in MOVES.values() for new in targets if new}
    left = {phase for (_, phase) in MOVES if phase}
    assert entered <= left


@pytest.mark.parametrize("state,phase,shown", [
    (ACTIVE, "", "active"), (ACTIVE, "hibernating", "hibernating"), (HIBERNATED, "", "hibernated"),
    (HIBERNATED, "resuming", "resuming"), (HIBERNATED, "queued", "queued"), (HIBERNATED, "evicting", "hibernated"),
    (ACTIVE, "failed", "active"),
])
def test_what_the_ui_shows(state, phase, shown):
    assert display_state(lease(state, phase)) == shown
    assert display_state(None) == "released"


@pytest.mark.parametrize("text,parsed", [
    ("64GiB", (64 * GiB, None)), ("50%", (None, 50.0)), ("12.5 %", (None, 12.5)), ("none", (None, None)),
])
def test_host_memory_cap_text(text, parsed):
    assert parse_host_memory(text) == parsed


@pytest.mark.parametrize("text,words", [
    ("0%", "above 0%"), ("150%", "at most 100%"), ("64", "no unit"), ("lots", "not a size"), (64, "must be text"),
])
def test_a_bad_cap_names_the_value_and_what_to_write(text, words):
    with pytest.raises(ValueError, match=words):
        parse_host_memory(text)


def test_settings_resolve_the_cap_against_the_machine_and_refuse_bad_values():
    assert HibernationSettings(host_memory="25%").cap_bytes(64 * GiB) == 16 * GiB
    assert HibernationSettings(host_memory="8GiB").cap_bytes(64 * GiB) == 8 * GiB
    assert HibernationSettings(host_memory="none").cap_bytes(64 * GiB) is None
    assert HibernationSettings(host_memory="25%").describe_cap(64 * GiB) == "16 GiB (25% of 64 GiB)"
    with pytest.raises(ValueError, match="over_cap: 'evict' is not one of evict_oldest, shutdown, keep_running"):
        HibernationSettings(over_cap="evict")
    with pytest.raises(ValueError, match="lock_timeout must be a number of seconds above 0"):
        HibernationSettings(lock_timeout=0)
