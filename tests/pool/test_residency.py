"""The kernel's GPU residency as a decision table: every state × every event, each row the next state and
the effects to carry out, or the refusal (and its word).  The rows are written out here, by hand, from
what the lifecycle must do; the model (``pool/residency.py``) is code, so each row checks it."""

from __future__ import annotations

import pytest

from jupyter_gpu_pool.pool import residency as M
from jupyter_gpu_pool.pool.residency import (
    ACTIVE, AFTER_CELL, CALL_OFF, CELL, CHECKPOINT, CHECKPOINT_DONE, CHECKPOINT_STUCK, CHECKPOINT_UNDONE,
    CLAIM_HOST_RAM, DEADLINE, EVENTS, EVICT, EVICTING, FAILED, FREE_HOST_RAM, GIVE_BACK, GONE, HIBERNATED,
    HIBERNATING, HINT, HINT_UNUSED, HOLD_FOR_CELL, IDLE, INTERRUPTED, KERNEL_GONE, NO_GPU_YET, NO_ROOM,
    PUT_BACK_RUNNING, QUEUED, QUOTA_REFUSED, RECORD, RELEASE, RELEASE_ALL, RESTART_IDLE_CLOCK, RESTARTED,
    RESTORE, RESTORE_DONE, RESTORE_STUCK, RESTORE_UNDONE, RESTORING, RESUME, RESUMING, ROOM_FREED, ROOM_LOST,
    SET_ENVIRONMENT, SHUT_DOWN, SLICE_GRANTED, STATES, STOP, STOPPING, TAKE_SLICE, TAKE_SLICE_NOW, WARN,
    Refused, Residency, Step,
)

N, A, AH = Residency(NO_GPU_YET), Residency(ACTIVE), Residency(ACTIVE, hint=True)
HG, H, E = Residency(HIBERNATING), Residency(HIBERNATED), Residency(EVICTING)
R, RH, RF = Residency(RESUMING), Residency(RESUMING, hint=True), Residency(RESUMING, first=True)
Q, QF = Residency(QUEUED), Residency(QUEUED, first=True)
T, TH, TF = Residency(RESTORING), Residency(RESTORING, hint=True), Residency(RESTORING, first=True)
F, G = Residency(FAILED), Residency(GONE)
SETTLED = (N, A, AH, HG, H, E, R, RH, RF, Q, QF, T, TH, TF, F)
MOVING = (R, RH, RF, Q, QF, T, TH, TF)
HIBERNATE = (CLAIM_HOST_RAM, CHECKPOINT)
REPORTS = (CHECKPOINT_DONE, CHECKPOINT_UNDONE, CHECKPOINT_STUCK, SLICE_GRANTED, NO_ROOM, ROOM_FREED, QUOTA_REFUSED,
           ROOM_LOST, RESTORE_DONE, RESTORE_UNDONE, RESTORE_STUCK)


def stopped(state: Residency) -> Residency:
    """A kernel whose shutdown began while it was in ``state`` (a hint no longer matters)."""
    return Residency(STOPPING, first=state.first, was=state.stage)

# (state, event) → (next state, effects): every transition the lifecycle has.
ROWS: dict[tuple[Residency, str], tuple[Residency, tuple[str, ...]]] = {
    # asked to sleep: the idle rule, Release, after a cell; a hint unused (only where a hint woke it)
    **{(s, e): (HG, HIBERNATE) for s in (A, AH) for e in (IDLE, RELEASE, AFTER_CELL)},
    (AH, HINT_UNUSED): (HG, HIBERNATE),
    # asked to wake: a cell or Resume takes a slice (a first one for a kernel that never held one) ...
    **{(s, e): row for e in (CELL, RESUME) for s, row in {
        N: (RF, (TAKE_SLICE,)), H: (R, (TAKE_SLICE,)), E: (R, (TAKE_SLICE,)),
        A: (A, ()), AH: (A, (RESTART_IDLE_CLOCK,)),  # a hint's kernel used: the idle rule counts from now
        HG: (HG, (CALL_OFF,)),
        R: (R, ()), RH: (R, ()), RF: (RF, ()), Q: (Q, ()), QF: (QF, ()),  # joins the move; a hint's made real
        T: (T, ()), TH: (T, ()), TF: (TF, ()),
    }.items()},
    # ... a hint only where a slice is free now (one try), and it joins a resume under way unchanged
    (H, HINT): (RH, (TAKE_SLICE_NOW,)),
    **{(s, HINT): (s, ()) for s in MOVING},
    # the checkpoint's outcome
    (HG, CHECKPOINT_DONE): (H, (GIVE_BACK, RECORD)),
    (HG, CHECKPOINT_UNDONE): (A, (FREE_HOST_RAM, WARN)),
    (HG, CHECKPOINT_STUCK): (F, (WARN,)),
    # the pool's answers to a kernel asking for a slice
    (R, SLICE_GRANTED): (T, (RESTORE,)), (R, NO_ROOM): (Q, ()), (R, QUOTA_REFUSED): (H, (WARN,)),
    (RH, SLICE_GRANTED): (TH, (RESTORE,)), (RH, NO_ROOM): (H, ()), (RH, QUOTA_REFUSED): (H, ()),  # declined quietly
    (RF, SLICE_GRANTED): (TF, (SET_ENVIRONMENT,)), (RF, NO_ROOM): (QF, ()), (RF, QUOTA_REFUSED): (N, (WARN,)),
    (Q, SLICE_GRANTED): (T, (RESTORE,)), (Q, NO_ROOM): (Q, ()), (Q, ROOM_FREED): (R, (TAKE_SLICE,)),
    (Q, QUOTA_REFUSED): (H, (WARN,)),
    (QF, SLICE_GRANTED): (TF, (SET_ENVIRONMENT,)), (QF, NO_ROOM): (QF, ()), (QF, ROOM_FREED): (RF, (TAKE_SLICE,)),
    (QF, QUOTA_REFUSED): (N, (WARN,)),
    (T, ROOM_LOST): (R, (GIVE_BACK, TAKE_SLICE)),  # its GPU taken meanwhile, or a remap refused: waits on
    (TH, ROOM_LOST): (H, (GIVE_BACK,)),  # a hint gives up
    # the restore's outcome (a first slice: its environment set)
    (T, RESTORE_DONE): (A, (RECORD, RESTART_IDLE_CLOCK)),
    (TH, RESTORE_DONE): (AH, (RECORD, HOLD_FOR_CELL)),  # not the user's yet: back to sleep unless a cell comes
    (TF, RESTORE_DONE): (A, (RECORD, RESTART_IDLE_CLOCK)),
    (T, RESTORE_UNDONE): (H, (GIVE_BACK, WARN)), (TH, RESTORE_UNDONE): (H, (GIVE_BACK, WARN)),
    (TF, RESTORE_UNDONE): (N, (GIVE_BACK, WARN)),
    (T, RESTORE_STUCK): (F, (WARN,)), (TH, RESTORE_STUCK): (F, (WARN,)),
    # a move whose mover is gone, settled by the processes' real states
    (HG, INTERRUPTED): (A, (PUT_BACK_RUNNING, FREE_HOST_RAM)),
    (R, INTERRUPTED): (H, ()), (RH, INTERRUPTED): (H, ()), (Q, INTERRUPTED): (H, ()),
    (RF, INTERRUPTED): (N, ()), (QF, INTERRUPTED): (N, ()),
    (T, INTERRUPTED): (A, (PUT_BACK_RUNNING,)), (TH, INTERRUPTED): (A, (PUT_BACK_RUNNING,)), (TF, INTERRUPTED): (A, ()),
    # the host-RAM cap
    (H, EVICT): (E, (WARN,)), (E, EVICT): (E, ()), (E, DEADLINE): (stopped(H), (SHUT_DOWN, RECORD)),
    # the kernel's own life: a shutdown wins over anything; a restart's process holds what the lease held
    **{(s, STOP): (stopped(s), ()) for s in SETTLED},
    **{(stopped(s), STOP): (stopped(s), ()) for s in SETTLED},
    **{(stopped(s), RESTARTED): (A if s.holds_slice else N, ()) for s in SETTLED},
    (F, RESTARTED): (A, ()),  # a failed move's kernel restarted: it runs on its slice
    **{(s, KERNEL_GONE): (G, (RELEASE_ALL,)) for s in STATES if s != G},
    (G, KERNEL_GONE): (G, ()),
}
# A kernel shut down while a move was under way: nothing new starts, but the move still reports, and what it
# did still counts (its slice given back, its host RAM freed; a failure told), quietly.
ROWS.update({(stopped(s), e): (stopped(nxt), tuple(x for x in effects if x in (GIVE_BACK, FREE_HOST_RAM, WARN)))
             for (s, e), (nxt, effects) in list(ROWS.items()) if e in REPORTS and s in SETTLED and not s.hint})

# The words a refused request is answered with, by the state it found.
ASLEEP_WORDS = {N: "no_slice", H: "hibernated", E: "hibernated", F: "failed", G: "gone", HG: "in_progress",
                **{s: "in_progress" for s in MOVING}}
REFUSALS: dict[tuple[Residency, str], str] = {
    **{(s, e): word for e in (IDLE, RELEASE, AFTER_CELL, HINT_UNUSED) for s, word in ASLEEP_WORDS.items()},
    (A, HINT_UNUSED): "used",  # a cell came: the hint was right
    **{(s, e): word for e in (CELL, RESUME) for s, word in {F: "failed", G: "gone"}.items()},
    **{(s, HINT): word for s, word in {N: "no_gpu_yet", A: "not_hibernated", AH: "not_hibernated", E: "evicting",
                                       HG: "in_progress", F: "failed", G: "gone"}.items()},
    **{(s, EVICT): "not_hibernated" for s in SETTLED if s not in (H, E)},
    **{(s, DEADLINE): "spared" for s in SETTLED if s != E},
    **{(s, INTERRUPTED): "settled" for s in (N, A, AH, H, E, F)},
    **{(G, e): "gone" for e in EVENTS if e != KERNEL_GONE},
    # nothing but the move under way (and its end) happens to a kernel being shut down
    **{(stopped(s), e): "stopping" for s in SETTLED for e in EVENTS if e not in (*REPORTS, STOP, RESTARTED,
                                                                                 KERNEL_GONE)},
}


@pytest.mark.parametrize("state", STATES, ids=str)
@pytest.mark.parametrize("event", EVENTS)
def test_every_state_and_event(state, event):
    if (state, event) in ROWS:
        nxt, effects = ROWS[(state, event)]
        assert M.step(state, event) == Step(nxt, effects)
        assert M.allowed(state, event)
        return
    with pytest.raises(Refused) as refused:
        M.step(state, event)
    assert refused.value.reason == REFUSALS.get((state, event), "cannot_happen")
    assert str(state) in str(refused.value) and event in str(refused.value)
    assert not M.allowed(state, event)


def test_the_table_names_only_states_and_events_of_the_model():
    assert {s for s, _ in ROWS} | {nxt for nxt, _ in ROWS.values()} <= set(STATES)
    assert {e for _, e in ROWS} <= set(EVENTS) and not set(REFUSALS) & set(ROWS)


def test_an_unknown_event_or_state_is_a_clear_error():
    with pytest.raises(ValueError, match="'hibernate' is no residency event"):
        M.step(A, "hibernate")
    with pytest.raises(ValueError, match="no residency stage"):
        Residency("sleeping")
    with pytest.raises(ValueError, match="a hint never gives a kernel its first slice"):
        Residency(RESUMING, first=True, hint=True)
    with pytest.raises(ValueError, match="only a resume or an awake kernel can be on a hint"):
        Residency(HIBERNATED, hint=True)


@pytest.mark.parametrize("request_, quota, room, expected", [
    (IDLE, True, True, Step(HG, HIBERNATE)),  # a hibernation asks the pool nothing
    (RESUME, True, True, Step(T, (RESTORE,))),
    (RESUME, True, False, Step(Q, ())),  # waits in the queue
    (RESUME, False, True, Step(H, (WARN,))),  # its quota: it sleeps on, and its user is told
    (HINT, True, True, Step(TH, (RESTORE,))),
    (HINT, True, False, Step(H, ())),  # a hint is declined quietly, never queued
    (HINT, False, True, Step(H, ())),
    (CELL, True, True, Step(T, (RESTORE,))),
])
def test_the_admission_of_a_request_composes_its_step_with_the_pools_answer(request_, quota, room, expected):
    state = A if request_ == IDLE else H
    assert M.admit(state, request_, quota=quota, room=room) == expected


@pytest.mark.parametrize("state, request_, answer", [
    # a Resume starts a resume, or joins (or calls off, for) a move under way; nothing to do awake
    (H, RESUME, Step(R, (TAKE_SLICE,))), (E, RESUME, Step(R, (TAKE_SLICE,))), (N, RESUME, Step(RF, (TAKE_SLICE,))),
    (Q, RESUME, Step(Q, ())), (T, RESUME, Step(T, ())), (HG, RESUME, Step(HG, (CALL_OFF,))),
    (A, RESUME, "not_hibernated"), (AH, RESUME, "not_hibernated"), (F, RESUME, "failed"),
    (stopped(H), RESUME, "stopping"),
    # a hint only where it takes a slice itself
    (H, HINT, Step(RH, (TAKE_SLICE_NOW,))), (N, HINT, "no_gpu_yet"), (A, HINT, "not_hibernated"),
    (E, HINT, "evicting"), (HG, HINT, "in_progress"), (Q, HINT, "in_progress"), (T, HINT, "in_progress"),
])
def test_a_users_request_to_wake_is_answered_by_the_model(state, request_, answer):
    """What the REST API's Resume and hint ask (``rest/resume.py``): the model's step, or the word it refuses with."""
    if isinstance(answer, Step):
        assert M.asked_to_wake(state, request_) == answer
    else:
        with pytest.raises(Refused) as refused:
            M.asked_to_wake(state, request_)
        assert refused.value.reason == answer


def test_admission_of_a_first_slice_and_of_a_request_that_cannot_be():
    assert M.admit(N, CELL, room=False) == Step(QF, ())
    assert M.admit(N, CELL) == Step(TF, (SET_ENVIRONMENT,))
    with pytest.raises(Refused) as refused:
        M.admit(H, RELEASE)
    assert refused.value.reason == "hibernated"
    with pytest.raises(Refused) as refused:
        M.admit(N, HINT)
    assert refused.value.reason == "no_gpu_yet"
