"""Properties of the residency model under random event sequences (Hypothesis), checked against an
independent account of what the kernel holds: the effects carried out move its slice and its memory,
and after every event its memory is counted exactly once, it holds at most one slice, a restore only
ever happens on a slice taken, a gone kernel holds nothing, and no sequence leaves it wedged.  Also:
the ledger's allowed phase moves are exactly what the transitions write."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpu_pool.pool import Lease
from jupyter_gpu_pool.pool import residency as M
from jupyter_gpu_pool.pool.leases import FIRST_CELL
from jupyter_gpu_pool.pool.phases import PhaseError
from jupyter_gpu_pool.pool.residency import (
    ACTIVE, CHECKPOINT, CHECKPOINT_DONE, CHECKPOINT_STUCK, CLAIM_HOST_RAM, EVENTS, FREE_HOST_RAM, GIVE_BACK, GONE,
    KERNEL_GONE, NO_GPU_YET, PUT_BACK_RUNNING, RELEASE_ALL, RESTARTED, RESTORE, RESTORE_DONE, RESTORE_STUCK,
    RESTORING,
    SLICE_GRANTED, STATES, STOP, Residency,
)


class Account:
    """What the kernel holds, kept from the events and the effects alone (not from the model's states)."""

    def __init__(self):
        self.slices = 0
        self.on_gpu = False  # its memory on a GPU
        self.in_host = False  # its memory in host RAM
        self.host_claim = False
        self.unknown = False  # a move stuck: where its memory is cannot be trusted (its slice still held)

    def event(self, before: Residency, event: str) -> None:
        if event == SLICE_GRANTED:
            self.slices += 1
        elif event == CHECKPOINT_DONE:
            assert self.host_claim, f"checkpointed from {before} without a claim on host RAM"
            self.on_gpu, self.in_host = False, True
        elif event == RESTORE_DONE:
            self.on_gpu, self.in_host, self.host_claim = True, False, False
        elif event in (CHECKPOINT_STUCK, RESTORE_STUCK):
            self.unknown = True
        elif event == RESTARTED:  # a new kernel process: whatever it had is gone, what it holds stays
            self.on_gpu, self.in_host, self.host_claim, self.unknown = self.slices == 1, False, False, False

    def effect(self, effect: str, state: Residency) -> None:
        if effect == GIVE_BACK:
            assert self.slices == 1, f"gave back a slice it did not hold ({state})"
            self.slices -= 1
        elif effect == RESTORE:
            assert self.slices == 1, f"a restore without room ({state})"
            assert self.in_host, f"a restore with nothing in host RAM ({state})"
        elif effect == CHECKPOINT:
            assert self.slices == 1 and not self.in_host, f"a checkpoint of memory not on a GPU ({state})"
        elif effect == CLAIM_HOST_RAM:
            self.host_claim = True
        elif effect == FREE_HOST_RAM:
            self.host_claim = False
        elif effect == PUT_BACK_RUNNING:
            assert self.slices == 1, f"put back running without a slice ({state})"
            self.on_gpu, self.in_host = True, False
        elif effect == RELEASE_ALL:
            self.slices, self.on_gpu, self.in_host, self.host_claim, self.unknown = 0, False, False, False, False

    def check(self, state: Residency) -> None:
        assert 0 <= self.slices <= 1, f"{self.slices} slices held ({state})"
        assert state.holds_slice == (self.slices == 1), f"{state} but {self.slices} slices held"
        if not self.unknown:
            assert not (self.on_gpu and self.in_host), f"memory counted twice ({state})"
            assert not self.on_gpu or self.slices == 1, f"memory on a GPU without a slice ({state})"
        if state.stage == GONE:
            assert (self.slices, self.in_host, self.host_claim) == (0, False, False), "a gone kernel holds something"


def start(state: Residency) -> Account:
    """The account of a kernel first seen in ``state`` (as a server that adopts it reads it)."""
    account = Account()
    if state.stage == M.STOPPING:
        account = start(Residency(state.was, first=state.first))
        account.unknown = True  # (it may be moving: its memory is its mover's to say)
        return account
    account.slices = 1 if state.holds_slice else 0
    account.on_gpu = state.stage in (ACTIVE, M.HIBERNATING)  # (a first slice being set up: nothing there yet)
    account.in_host = state.stage in (M.HIBERNATED, M.EVICTING) or (
        state.stage in (M.RESUMING, M.QUEUED, RESTORING) and not state.first)
    account.host_claim = account.in_host or state.stage == M.HIBERNATING
    account.unknown = state.stage == M.FAILED
    return account


def reaches_active(state: Residency) -> bool:
    """Whether some sequence of events, none of them the kernel ending, brings it back on a GPU."""
    seen, todo = {state}, deque([state])
    while todo:
        s = todo.popleft()
        if s.stage == ACTIVE:
            return True
        for event in EVENTS:
            if event != KERNEL_GONE and M.allowed(s, event):
                nxt = M.step(s, event).state
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    return False


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(STATES),
       st.lists(st.sampled_from(EVENTS), max_size=60))
def test_random_event_sequences_keep_the_memory_counted_once_and_never_wedge(first, events):
    state, account = first, start(first)
    account.check(state)
    for event in events:
        if not M.allowed(state, event):
            with pytest.raises(M.Refused):
                M.step(state, event)
            continue  # refused: nothing changed
        before = state
        found = M.step(state, event)
        account.event(before, event)
        for effect in found.effects:
            account.effect(effect, before)
        state = found.state
        assert state in STATES
        account.check(state)
    assert state.stage == GONE or reaches_active(state), f"wedged in {state}"


def test_from_every_state_the_kernel_can_be_active_again_or_end():
    for state in STATES:
        assert M.allowed(state, KERNEL_GONE)
        assert state.stage == GONE or reaches_active(state), f"wedged in {state}"


def test_every_state_is_closed_and_a_shutdown_wins_over_any_move():
    for (state, event), found in M.TABLE.items():
        if not isinstance(found, str):
            assert found.state in STATES, f"{state} --{event}--> {found.state}, which is no state"
    assert all(M.step(s, STOP).state.stage == M.STOPPING for s in STATES if s.stage != GONE)


# -- the store's view ------------------------------------------------------------------------------

def lease(state: str, phase: str = "", reason: str = "") -> Lease:
    return Lease(id="L", owner="a", kernel_id="k", profile="p", isolation="soft", memory=1, sm_percent=None,
                 whole=False, gpu_count=1, state=state, gpus=(), last_gpus=(), groups=(), label="", created=0.0,
                 updated=0.0, state_since=0.0, phase=phase, reason=reason)


@pytest.mark.parametrize("state", STATES, ids=str)
def test_a_lease_reads_back_as_the_residency_it_records(state):
    lease_state, phase = M.ledger_view(state)
    first = (state.first or NO_GPU_YET in (state.stage, state.was)) and lease_state != ACTIVE
    read = M.residency_of(lease(lease_state, phase, FIRST_CELL if first else ""), first=state.first, hint=state.hint)
    if state.stage != M.STOPPING:
        assert read == state
    else:  # what move was under way is its mover's to know: the lease says what it holds
        assert read == Residency(M.STOPPING, was=ACTIVE if state.holds_slice else NO_GPU_YET if first else
                                 M.HIBERNATED)


def test_a_lease_the_queue_just_handed_a_slice_is_restoring_and_odd_pairs_are_refused():
    assert M.residency_of(lease("active", "queued")) == Residency(RESTORING)
    assert M.residency_of(None) == Residency(GONE)
    with pytest.raises(PhaseError, match="a hibernated lease in phase 'hibernating' is no residency"):
        M.residency_of(lease("hibernated", "hibernating"))


def test_the_ledgers_moves_are_the_ones_the_transitions_write():
    """Each transition between two held states is allowed by the ledger, written as the store writes it
    (its state change first, the phase kept, then the phase), and the ledger allows nothing else."""
    written = set()
    for (a, _event), found in M.TABLE.items():
        if isinstance(found, str) or GONE in (a.stage, found.state.stage):
            continue
        (_, phase), (to_state, to_phase) = M.ledger_view(a), M.ledger_view(found.state)
        if phase != to_phase:
            M.check_move(to_state, phase, to_phase)
            written.add((to_state, phase, to_phase))
    allowed = {(s, p, to) for (s, p), targets in M.MOVES.items() for to in targets}
    assert allowed - written == {("active", "queued", to) for to in ("", "failed", "resuming", "stopping")} - written
