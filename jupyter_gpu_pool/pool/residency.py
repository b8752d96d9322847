"""A kernel's GPU residency: where its GPU memory is, and the one lifecycle every mover steps through.

A kernel's GPU memory is on its GPU (it holds a slice), in host RAM (hibernated: its slice is free for
others), on its way between the two, or nowhere yet (it started without a slice).  The same lifecycle
holds on one machine and on a cluster, so it is written once, here, as a pure transition function:
:func:`step` takes the kernel's :class:`Residency` and an event (what was asked, or what a mover
reports) and returns the next residency with the *effects* to carry out, or raises :class:`Refused`
(nothing changes) where the event cannot happen in that state::

    no GPU yet ──cell, Resume: take a slice──▶ resuming (first)
    resuming (first) ──slice granted: set the environment──▶ restoring (first) ──restore done──▶ active
    resuming (first) ──no room──▶ queued (first) ──slice granted──▶ restoring (first);  ──room freed──▶ resuming (first)
    resuming, queued (first) ──quota refused, interrupted──▶ no GPU yet
    restoring (first) ──restore undone (its environment not set): give back──▶ no GPU yet

    active ──idle rule, Release, after cell, hint unused: claim host RAM, checkpoint──▶ hibernating
    hibernating ──checkpoint done: give back, record──▶ hibernated;  ──undone: free host RAM──▶ active
    hibernating ──checkpoint stuck──▶ failed;  ──cell, Resume: call it off, if still before the checkpoint
    hibernated ──cell, Resume: take a slice──▶ resuming;  ──hint: a slice only if free now──▶ resuming (hint)
    resuming ──slice granted: restore──▶ restoring;  ──no room──▶ queued;  ──quota refused: warn──▶ hibernated
    resuming (hint) ──no room, quota refused (declined, quietly)──▶ hibernated;  ──cell──▶ resuming
    queued ──slice granted: restore──▶ restoring;  ──room freed: ask again──▶ resuming;  ──quota refused──▶ hibernated
    restoring ──restore done: record, restart the idle clock──▶ active;  ──undone: give back──▶ hibernated
    restoring ──room lost (its GPU taken, a remap refused): give back, ask again──▶ resuming;  ──stuck──▶ failed
    restoring (hint) ──restore done: hold for a cell──▶ active (hint) ──cell: restart the idle clock──▶ active
    active (hint) ──hint unused (no warning)──▶ hibernating
    hibernated ──host RAM cap: evict, warn──▶ evicting ──deadline: shut down──▶ stopping;  evicting ──cell──▶ resuming
    any move ──interrupted (its server gone): put back by the processes' real states──▶ asleep, or active
    any ──stop──▶ stopping (was …: its move still reports, quietly) ──restarted──▶ active, or no GPU yet
    failed ──restarted──▶ active;  any ──gone: release all──▶ gone

Who steps it: the local hibernator (``hibernation/``: its moves ask :func:`step` what comes next and
carry out the effects, the ledger's compare-and-set phases staying the record, :func:`residency_of`
reading a lease back); the server's cluster hook (``server_extension/sleep/cluster.py``, through
``cluster.kernels.residency_of_kernel``); the node agent (``operator/pod_moves.py``: where a move it
carried out leaves the kernel); the planner's replay (``planning/simulator.py``).  **An admission of a
hibernate or resume request** (the operator's, under its lock; the local pool's through the
hibernator) is decided by :func:`admit`: the request's step composed with the pool's answer (room,
quota).  The ledger's allowed phase moves (:data:`MOVES`, :func:`check_move`) are derived from the
transitions here, so the store and the movers can never disagree on what may follow what.

Effects are words, carried out by whoever stepped (each consumer has its own way: a ledger write, a
status patch, a virtual event).  ``RESTART_IDLE_CLOCK`` marks a resume its user asked for (a cell,
Resume, a hint they then used): the idle rule counts from then, not from the last cell before it.  A
kernel woken on a hint and left unused goes back to sleep quietly (``HINT_UNUSED``: no warning).
"""

from __future__ import annotations

from dataclasses import dataclass

from .leases import ACTIVE, HIBERNATED, RELEASED, Lease
from .phases import EVICTING, FAILED, HIBERNATING, NO_GPU_YET, QUEUED, RESUMING, STOPPING, PhaseError

# -- states (Residency.stage); a lease's state and phase, and the UI's words, where they are the same thing ----
# NO_GPU_YET: it started without a slice and has held none (slice_at first-cell)
# ACTIVE: its memory on its GPU, its slice held
# HIBERNATING: its slice held, host RAM claimed, its memory on the way to host RAM
# HIBERNATED: its memory in host RAM, its slice free
# EVICTING: hibernated, and to be shut down at a deadline (the host-RAM cap)
# RESUMING: it asks for a slice (a first one, or to restore into)
# QUEUED: it waits in the queue for room
RESTORING = "restoring"  # its slice taken, its memory coming back (a first slice: its environment being set)
# FAILED: a move that could be neither finished nor undone; its slice still held
# STOPPING: its kernel is being shut down
GONE = "gone"  # its lease is released: it holds nothing
STAGES = (NO_GPU_YET, ACTIVE, HIBERNATING, HIBERNATED, EVICTING, RESUMING, QUEUED, RESTORING, FAILED, STOPPING, GONE)

# -- events -------------------------------------------------------------------------------------------
# asked for: by its user, the policy, a rule
CELL = "cell"  # a cell for the kernel
RESUME = "resume"  # its user's Resume
HINT = "hint"  # its user opened the notebook: wake it only if a slice is free now and nobody waits
IDLE = "idle"  # the policy hibernates it (its idle rule, or a waiter's pressure)
RELEASE = "release"  # its user's (or an admin's) Release GPU
AFTER_CELL = "after_cell"  # its rule's hibernate_after_cell: no cell since the last one ended
HINT_UNUSED = "hint_unused"  # woken on a hint, and no cell came within the hold
# reported by a mover or the pool
CHECKPOINT_DONE = "checkpoint_done"
CHECKPOINT_UNDONE = "checkpoint_undone"  # failed or given up (lock timeout, a cell came), every process running again
CHECKPOINT_STUCK = "checkpoint_stuck"  # failed, and could not be undone
SLICE_GRANTED = "slice_granted"  # the pool gave it a slice (at once, or from the queue)
NO_ROOM = "no_room"  # no slice free (or others wait first): a resume waits in the queue, a hint is declined
ROOM_FREED = "room_freed"  # room came back while it waited: it asks again, in its turn
QUOTA_REFUSED = "quota_refused"  # its owner's quota or budget refuses it: it sleeps on
ROOM_LOST = "room_lost"  # the slice taken cannot take its memory (GPU memory taken meanwhile, a remap refused)
RESTORE_DONE = "restore_done"  # its memory is back (a first slice: its environment set)
RESTORE_UNDONE = "restore_undone"  # failed, put back in host RAM (a first slice: given back)
RESTORE_STUCK = "restore_stuck"  # failed, and could not be undone
INTERRUPTED = "interrupted"  # the move's mover is gone (its server restarted): settled by the processes' states
# the host-RAM cap, and the kernel's own life
EVICT = "evict"  # hibernated kernels past the host-RAM cap: it is shut down at a deadline unless resumed
DEADLINE = "deadline"  # its eviction's deadline
STOP = "stop"  # its kernel's shutdown began (a shutdown wins over any move under way)
RESTARTED = "restarted"  # a restart's new kernel process holds its lease
KERNEL_GONE = "gone"  # its lease was released: the kernel ended
ASKED_TO_SLEEP = (IDLE, RELEASE, AFTER_CELL, HINT_UNUSED)
ASKED_TO_WAKE = (CELL, RESUME, HINT)
EVENTS = (*ASKED_TO_WAKE, *ASKED_TO_SLEEP, CHECKPOINT_DONE, CHECKPOINT_UNDONE, CHECKPOINT_STUCK, SLICE_GRANTED,
          NO_ROOM, ROOM_FREED, QUOTA_REFUSED, ROOM_LOST, RESTORE_DONE, RESTORE_UNDONE, RESTORE_STUCK, INTERRUPTED,
          EVICT, DEADLINE, STOP, RESTARTED, KERNEL_GONE)

# -- effects --------------------------------------------------------------------------------------------
TAKE_SLICE = "take_slice"  # ask the pool for a slice, waiting in the queue if need be
TAKE_SLICE_NOW = "take_slice_now"  # one try: only if a slice is free now and nobody waits (a hint)
CLAIM_HOST_RAM = "claim_host_ram"  # claim host RAM for the checkpoint, under the cap
CHECKPOINT = "checkpoint"  # release the framework's cache, lock and checkpoint every CUDA process
CALL_OFF = "call_off"  # a cell came during a hibernation: give it up if still before the checkpoint
GIVE_BACK = "give_back"  # the slice goes back to the pool (the memory is in host RAM, or nowhere)
RESTORE = "restore"  # restore and unlock every checkpointed process on the slice taken
SET_ENVIRONMENT = "set_environment"  # a first slice: its environment into the running kernel
FREE_HOST_RAM = "free_host_ram"  # drop the host-RAM claim of a hibernation that did not happen
PUT_BACK_RUNNING = "put_back_running"  # an interrupted move: every process back running on its slice
HOLD_FOR_CELL = "hold_for_cell"  # woken on a hint: back to sleep, quietly, unless a cell comes in time
RESTART_IDLE_CLOCK = "restart_idle_clock"  # its user asked for it awake: the idle rule counts from now
WARN = "warn"  # tell its user (a refusal, a failure, an eviction coming)
RECORD = "record"  # put the move on record (journal, event, metric)
SHUT_DOWN = "shut_down"  # shut the kernel down (an eviction's deadline)
RELEASE_ALL = "release_all"  # its lease ends: whatever it holds (slice, host RAM) goes back
EFFECTS = (TAKE_SLICE, TAKE_SLICE_NOW, CLAIM_HOST_RAM, CHECKPOINT, CALL_OFF, GIVE_BACK, RESTORE, SET_ENVIRONMENT,
           FREE_HOST_RAM, PUT_BACK_RUNNING, HOLD_FOR_CELL, RESTART_IDLE_CLOCK, WARN, RECORD, SHUT_DOWN, RELEASE_ALL)

_MOVING = (HIBERNATING, RESUMING, QUEUED, RESTORING)
_HOLDING = (ACTIVE, HIBERNATING, RESTORING, FAILED)
_ASLEEP = (NO_GPU_YET, HIBERNATING, HIBERNATED, EVICTING, RESUMING, QUEUED, RESTORING)


@dataclass(frozen=True)
class Residency:
    """Where a kernel's GPU memory is (``stage``), with what its movers must remember besides:
    ``first``: the slice it asks for (resuming, queued) or sets up (restoring) is its first, with nothing
    to restore; ``hint``: a hint's one try (resuming, restoring), or woken on a hint with no cell since
    (active); ``was``: stopping, the stage its shutdown found it in (a move under way then still reports,
    and what it does still counts: a checkpoint done gives the slice back)."""

    stage: str
    first: bool = False
    hint: bool = False
    was: str = ""

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"{self.stage!r} is no residency stage; known: {', '.join(STAGES)}")
        if (self.stage == STOPPING) != (self.was in STAGES and self.was not in (STOPPING, GONE)):
            raise ValueError("a stopping kernel says the stage its shutdown found it in ('was'), and only it")
        if self.first and (self.was or self.stage) not in (RESUMING, QUEUED, RESTORING):
            raise ValueError(f"only a kernel asking for its first slice is 'first', not one {self.stage}")
        if self.hint and self.stage not in (RESUMING, RESTORING, ACTIVE):
            raise ValueError(f"only a resume or an awake kernel can be on a hint, not one {self.stage}")
        if self.first and self.hint:
            raise ValueError("a hint never gives a kernel its first slice")

    @property
    def holds_slice(self) -> bool:
        """Whether its slice is counted held in the pool."""
        return (self.was or self.stage) in _HOLDING

    @property
    def asleep(self) -> bool:
        """Whether a cell sent to it now must wait for a resume (or a first slice)."""
        return self.stage in _ASLEEP

    @property
    def moving(self) -> bool:
        """Whether a move of its memory (or its first slice) is under way."""
        return self.stage in _MOVING

    def __str__(self) -> str:
        flags = [f"was {self.was.replace('_', ' ')}"] if self.was else []
        flags += [name for name in ("first", "hint") if getattr(self, name)]
        return self.stage.replace("_", " ") + (f" ({', '.join(flags)})" if flags else "")


def _r(stage: str, **flags) -> Residency:
    return Residency(stage, **flags)


def _stopped(state: Residency) -> Residency:
    """``state`` once its kernel's shutdown began (a hint's guess no longer matters)."""
    return state if state.stage == STOPPING else Residency(STOPPING, first=state.first, was=state.stage)


_SETTLED = (_r(NO_GPU_YET), _r(ACTIVE), _r(ACTIVE, hint=True), _r(HIBERNATING), _r(HIBERNATED), _r(EVICTING),
            _r(RESUMING), _r(RESUMING, hint=True), _r(RESUMING, first=True), _r(QUEUED), _r(QUEUED, first=True),
            _r(RESTORING), _r(RESTORING, hint=True), _r(RESTORING, first=True), _r(FAILED))
STATES: tuple[Residency, ...] = (*_SETTLED, *dict.fromkeys(_stopped(s) for s in _SETTLED), _r(GONE))


@dataclass(frozen=True)
class Step:
    """Where an event leaves a kernel, and what to carry out for it (in order)."""

    state: Residency
    effects: tuple[str, ...] = ()


class Refused(PhaseError):
    """The event cannot happen to a kernel in that state; nothing changes.  ``reason`` is a word a
    refusal can be answered with (``in_progress``, ``hibernated``, ``no_slice`` …; ``cannot_happen`` for
    a report no mover can make there: a bug, or a stale report)."""

    def __init__(self, state: Residency, event: str, reason: str):
        self.state, self.event, self.reason = state, event, reason
        super().__init__(f"a kernel {state} cannot take the event {event!r} ({reason})")


# Why a kernel in each stage cannot be asked to move (the request events' refusals).
_BUSY = {HIBERNATING: "in_progress", RESUMING: "in_progress", QUEUED: "in_progress", RESTORING: "in_progress",
         FAILED: "failed", GONE: "gone"}


def _asked_to_sleep(state: Residency, event: str) -> Step | str:
    if state.stage == ACTIVE:
        if event == HINT_UNUSED and not state.hint:
            return "used"  # a cell came: the hint was right
        return Step(_r(HIBERNATING), (CLAIM_HOST_RAM, CHECKPOINT))
    if state.stage == NO_GPU_YET:
        return "no_slice"
    if state.stage in (HIBERNATED, EVICTING):
        return "hibernated"
    return _BUSY[state.stage]


def _asked_to_wake(state: Residency, event: str) -> Step | str:
    stage = state.stage
    if event == HINT:
        if stage == HIBERNATED:
            return Step(_r(RESUMING, hint=True), (TAKE_SLICE_NOW,))
        if stage in (RESUMING, QUEUED, RESTORING):
            return Step(state)  # a hint joins the resume under way, unchanged
        return {NO_GPU_YET: "no_gpu_yet", ACTIVE: "not_hibernated", EVICTING: "evicting",
                HIBERNATING: "in_progress"}.get(stage) or _BUSY[stage]
    if stage == NO_GPU_YET:
        return Step(_r(RESUMING, first=True), (TAKE_SLICE,))
    if stage in (HIBERNATED, EVICTING):  # (an eviction is called off: its user wants it)
        return Step(_r(RESUMING), (TAKE_SLICE,))
    if stage == ACTIVE:  # awake already; woken on a hint, it is now used
        return Step(_r(ACTIVE), (RESTART_IDLE_CLOCK,) if state.hint else ())
    if stage == HIBERNATING:
        return Step(state, (CALL_OFF,))
    if stage in (RESUMING, QUEUED, RESTORING):  # joins the resume under way; a hint's becomes a real one
        return Step(_r(stage, first=state.first))
    return _BUSY[stage]


def _checkpoint(state: Residency, event: str) -> Step | str:
    if state.stage != HIBERNATING:
        return "cannot_happen"
    return {CHECKPOINT_DONE: Step(_r(HIBERNATED), (GIVE_BACK, RECORD)),
            CHECKPOINT_UNDONE: Step(_r(ACTIVE), (FREE_HOST_RAM, WARN)),
            CHECKPOINT_STUCK: Step(_r(FAILED), (WARN,))}[event]


def _slice(state: Residency, event: str) -> Step | str:
    """The pool's answers to a kernel asking for a slice."""
    stage, first = state.stage, state.first
    asleep = _r(NO_GPU_YET) if first else _r(HIBERNATED)
    if stage == RESUMING:
        if event == SLICE_GRANTED:
            return Step(_r(RESTORING, first=first, hint=state.hint), (SET_ENVIRONMENT,) if first else (RESTORE,))
        if event == NO_ROOM:  # a hint never queues: declined, quietly
            return Step(asleep) if state.hint else Step(_r(QUEUED, first=first))
        if event == QUOTA_REFUSED:
            return Step(asleep, () if state.hint else (WARN,))
        return "cannot_happen"
    if stage == QUEUED:
        return {SLICE_GRANTED: Step(_r(RESTORING, first=first), (SET_ENVIRONMENT,) if first else (RESTORE,)),
                NO_ROOM: Step(state), ROOM_FREED: Step(_r(RESUMING, first=first), (TAKE_SLICE,)),
                QUOTA_REFUSED: Step(asleep, (WARN,))}.get(event, "cannot_happen")
    if stage == RESTORING and event == ROOM_LOST and not first:  # given back; a hint gives up, a resume waits on
        return Step(_r(HIBERNATED), (GIVE_BACK,)) if state.hint else Step(_r(RESUMING), (GIVE_BACK, TAKE_SLICE))
    return "cannot_happen"


def _restore(state: Residency, event: str) -> Step | str:
    if state.stage != RESTORING:  # (a restore is onto a slice taken)
        return "cannot_happen"
    if event == RESTORE_DONE:
        if state.hint:
            return Step(_r(ACTIVE, hint=True), (RECORD, HOLD_FOR_CELL))
        return Step(_r(ACTIVE), (RECORD, RESTART_IDLE_CLOCK))
    if event == RESTORE_UNDONE:
        return Step(_r(NO_GPU_YET) if state.first else _r(HIBERNATED), (GIVE_BACK, WARN))
    return "cannot_happen" if state.first else Step(_r(FAILED), (WARN,))  # (a first slice restores nothing)


def _interrupted(state: Residency) -> Step | str:
    stage = state.stage
    if stage == HIBERNATING:
        return Step(_r(ACTIVE), (PUT_BACK_RUNNING, FREE_HOST_RAM))
    if stage in (RESUMING, QUEUED):  # no slice was taken: it sleeps on
        return Step(_r(NO_GPU_YET) if state.first else _r(HIBERNATED))
    if stage == RESTORING:
        return Step(_r(ACTIVE), () if state.first else (PUT_BACK_RUNNING,))
    return "settled"  # nothing under way


_REPORTS = (CHECKPOINT_DONE, CHECKPOINT_UNDONE, CHECKPOINT_STUCK, SLICE_GRANTED, NO_ROOM, ROOM_FREED, QUOTA_REFUSED,
            ROOM_LOST, RESTORE_DONE, RESTORE_UNDONE, RESTORE_STUCK)
_SETTLING = (GIVE_BACK, FREE_HOST_RAM, WARN)  # what a stopping kernel's move still carries out


def _stopping(state: Residency, event: str) -> Step | str:
    """A shutdown wins over any move: nothing new starts, but the move under way still reports, and what
    it did still counts (its slice given back, its host RAM freed), quietly."""
    if event == STOP:
        return Step(state)
    if event == RESTARTED:  # a new kernel process holds what the lease held (a slice, or nothing yet)
        return Step(_r(ACTIVE) if state.holds_slice else _r(NO_GPU_YET))
    if event not in _REPORTS:
        return "stopping"
    found = _rule(Residency(state.was, first=state.first), event)
    if isinstance(found, str):
        return found
    return Step(_stopped(found.state), tuple(e for e in found.effects if e in _SETTLING))


def _life(state: Residency, event: str) -> Step | str:
    """The host-RAM cap's eviction, and the kernel's shutdown, restart and end."""
    stage = state.stage
    if event == STOP:
        return Step(_stopped(state))
    if event == RESTARTED:  # (a failed move's kernel: its restart clears it)
        return Step(_r(ACTIVE)) if stage == FAILED else "cannot_happen"
    if event == EVICT:
        return {HIBERNATED: Step(_r(EVICTING), (WARN,)), EVICTING: Step(state)}.get(stage, "not_hibernated")
    assert event == DEADLINE
    return Step(_stopped(_r(HIBERNATED)), (SHUT_DOWN, RECORD)) if stage == EVICTING else "spared"


def _rule(state: Residency, event: str) -> Step | str:
    if event == KERNEL_GONE:
        return Step(_r(GONE), () if state.stage == GONE else (RELEASE_ALL,))
    if state.stage == GONE:
        return "gone"
    if state.stage == STOPPING:
        return _stopping(state, event)
    if event in ASKED_TO_SLEEP:
        return _asked_to_sleep(state, event)
    if event in ASKED_TO_WAKE:
        return _asked_to_wake(state, event)
    if event in (CHECKPOINT_DONE, CHECKPOINT_UNDONE, CHECKPOINT_STUCK):
        return _checkpoint(state, event)
    if event in (SLICE_GRANTED, NO_ROOM, ROOM_FREED, QUOTA_REFUSED, ROOM_LOST):
        return _slice(state, event)
    if event in (RESTORE_DONE, RESTORE_UNDONE, RESTORE_STUCK):
        return _restore(state, event)
    if event == INTERRUPTED:
        return _interrupted(state)
    return _life(state, event)


TABLE: dict[tuple[Residency, str], Step | str] = {(s, e): _rule(s, e) for s in STATES for e in EVENTS}


def step(state: Residency, event: str) -> Step:
    """Where ``event`` leaves a kernel in ``state``, and the effects to carry out; raises :class:`Refused`
    (nothing changes) where it cannot happen there."""
    try:
        found = TABLE[(state, event)]
    except KeyError:
        raise ValueError(f"{event!r} is no residency event; known: {', '.join(EVENTS)}") from None
    if isinstance(found, str):
        raise Refused(state, event, found)
    return found


def allowed(state: Residency, event: str) -> bool:
    """Whether ``event`` can happen to a kernel in ``state`` (no exception raised)."""
    return not isinstance(TABLE.get((state, event), ""), str)


def admit(state: Residency, request: str, *, quota: bool = True, room: bool = True) -> Step:
    """The admission of a request to hibernate (``IDLE``, ``RELEASE``, ``AFTER_CELL``, ``HINT_UNUSED``) or to
    wake (``CELL``, ``RESUME``, ``HINT``) a kernel in ``state``: the request's step and, where it asks the pool
    for a slice, the pool's answer (``quota``: its owner's quota and budget allow it; ``room``: a slice fits
    now, nobody waiting before it), composed into one step (its effects in order).  A resume without room
    waits in the queue, a hint without room or quota is declined (it sleeps on, quietly); a refused request
    raises :class:`Refused` with the word to answer it with."""
    asked = step(state, request)
    if TAKE_SLICE not in asked.effects and TAKE_SLICE_NOW not in asked.effects:
        return asked
    answer = step(asked.state, SLICE_GRANTED if quota and room else NO_ROOM if quota else QUOTA_REFUSED)
    effects = tuple(e for e in asked.effects if e not in (TAKE_SLICE, TAKE_SLICE_NOW)) + answer.effects
    return Step(answer.state, effects)


def asked_to_wake(state: Residency, request: str) -> Step:
    """A user's request to wake a kernel (``RESUME``, or ``HINT``: its notebook opened) as the API answers it
    before any mover runs: the request's step, where it starts a resume or (a Resume) joins the one under way;
    else :class:`Refused` with the word to answer it with: the model's own refusals, ``not_hibernated`` where
    the kernel is awake already (a Resume has nothing to do), ``in_progress`` where a hint would only join a
    move under way (a hint's one try is its own, never another's)."""
    asked = step(state, request)
    if asked.state.stage == ACTIVE and state.stage == ACTIVE:
        raise Refused(state, request, "not_hibernated")
    if request == HINT and TAKE_SLICE_NOW not in asked.effects:
        raise Refused(state, request, "in_progress")
    return asked


# -- the store's view: a lease's (state, phase) ---------------------------------------------------------

def ledger_view(state: Residency) -> tuple[str, str]:
    """The lease's (state, phase) in a ledger for a kernel in ``state`` (a first slice's lease also keeps
    the reason ``first_cell`` until it has a slice)."""
    stage = state.stage
    if stage == GONE:
        return RELEASED, ""
    phase = {NO_GPU_YET: "", ACTIVE: "", HIBERNATED: "", RESTORING: RESUMING}.get(stage, stage)
    return (ACTIVE if state.holds_slice else HIBERNATED), phase


# A lease the queue just handed a slice, before its mover relabels it resuming: restoring already.
_ALIASES = {(ACTIVE, QUEUED): RESTORING}
# Each (state, phase) back to its stage (a settled hibernated lease of a kernel that has held no slice is
# told apart by its reason: Lease.awaits_first_cell).
_BY_VIEW = {ledger_view(s): s.stage for s in _SETTLED if s == Residency(s.stage) and s.stage != NO_GPU_YET}


def residency_of(lease: Lease | None, *, first: bool = False, hint: bool = False, was: str = "") -> Residency:
    """The residency of a kernel from its lease (None: gone).  What the ledger does not keep is the
    mover's to say: ``first`` (the slice it is restoring into is its first), ``hint`` (its resume is a
    hint's, or it was woken on one and no cell came since) and, for a lease found stopping, ``was``: the
    stage of the move it has under way (where that agrees with what the lease holds; else, and by default,
    it reads as stopped where it was settled).  A (state, phase) no residency shows as raises
    :class:`PhaseError`."""
    if lease is None or lease.state == RELEASED:
        return _r(GONE)
    first = first or lease.awaits_first_cell
    if lease.phase == STOPPING:
        held = lease.state == ACTIVE
        if was in _MOVING and (was in _HOLDING) == held:
            return _r(STOPPING, was=was, first=first and was in (RESUMING, QUEUED, RESTORING))
        return _r(STOPPING, was=ACTIVE if held else NO_GPU_YET if lease.awaits_first_cell else HIBERNATED)
    pair = (lease.state, lease.phase)
    stage = _ALIASES.get(pair) or _BY_VIEW.get(pair)
    if stage is None:
        raise PhaseError(f"a {lease.state} lease in phase {lease.phase or 'settled'!r} is no residency of a kernel")
    if stage == HIBERNATED and first:
        stage = NO_GPU_YET
    return _r(stage, first=first and stage in (RESUMING, QUEUED, RESTORING),
              hint=hint and not first and stage in (RESUMING, RESTORING, ACTIVE))


def _store_moves() -> dict[tuple[str, str], tuple[str, ...]]:
    """The phase moves a ledger allows, from the transitions: a transition from ``a`` to ``b`` is written
    as the store's state change (its phase kept) and then the phase move, so it allows ``(b's state, a's
    phase) → b's phase`` for each (state, phase) ``a`` shows as."""
    views = {s: [ledger_view(s)] + [p for p, stage in _ALIASES.items() if stage == s.stage and s.stage != GONE]
             for s in STATES}
    moves: dict[tuple[str, str], list[str]] = {}
    for (a, _event), found in TABLE.items():
        if isinstance(found, str) or GONE in (a.stage, found.state.stage):
            continue
        to_state, to_phase = ledger_view(found.state)
        for _state, phase in views[a]:
            if phase != to_phase and to_phase not in moves.setdefault((to_state, phase), []):
                moves[(to_state, phase)].append(to_phase)
    return {pair: tuple(sorted(targets)) for pair, targets in sorted(moves.items())}


# (lease state, phase) → the phases a ledger lets it move to (``""``: settled), derived from the transitions.
MOVES: dict[tuple[str, str], tuple[str, ...]] = _store_moves()


def check_move(state: str, phase: str, new_phase: str) -> None:
    """Raise :class:`PhaseError` unless a ledger may move a ``state`` lease from ``phase`` to ``new_phase``
    (a shutdown, ``stopping``, wins over anything: every residency but gone can be stopped)."""
    if new_phase == STOPPING:
        return
    found = MOVES.get((state, phase), ())
    if new_phase not in found:
        shown = phase or "settled"
        raise PhaseError(f"a {state} lease in phase {shown!r} cannot move to {new_phase or 'settled'!r}; "
                         f"allowed: {', '.join(p or 'settled' for p in found) or 'nothing'}")
