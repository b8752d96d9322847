"""The discrete-event replay: a workload's sessions on a virtual pool, in virtual time.

One event queue (``heapq``) holds what happens next: a user's next event (shifted by what the replay
made them wait so far), each culler's next pass (on the schedule it kept live, or every
``workload.interval``), a hibernation or restore finishing, a refused start asking again, a queued
start giving up.  What the pool decides is the pool core's, called as the live pool calls it:

- a start or resume: ``pool.allocation.allocate`` through :class:`VirtualPool` (the queue's rules,
  quotas, budgets, placement); a refused start waits in the queue up to the configuration's
  ``queue_timeout`` (a resume waits as long as it takes), as ``local/waiting.py`` does;
- a culling pass: each kernel's facts from ``pool.culling.kernel_facts`` (GPU use through
  ``pool.gpu_use.GPUUse``), the rule from ``Policy.rule_for``, the decision from
  ``pool.policy.decide``; while someone waits in the queue, the kernels chosen to give their slices
  back to the waiters by ``pool.reclaim.choose_reclaim`` (as the culler's ``reclaim``), each then
  decided with ``reclaim=True``; a snooze through ``pool.policy.snooze``;
- carrying out: a shutdown frees the slice at once; a hibernation holds it for the checkpoint's time
  (``costs``) and then frees it, and the policy's memory of the kernel starts afresh, as the culler's;
- a hibernation its user or an admin asked for (Release GPU) happens when they asked, as the culler's
  ``release`` does it: refused while a cell runs, a shutdown where the kernel cannot hibernate.

What a user does to a kernel the replay shut down is a restart (a new start; its state is lost); a
cell run on a hibernated kernel resumes it first.

When a kernel takes its slice is its rule's ``slice_at`` (``Policy.rule_for``): at start, or at its
first cell, where the kernel starts holding nothing and its first busy period asks for a slice through
the queue as a resume does (it waits as long as it takes; refused for another reason, the cell fails
and the kernel goes on without a slice).  With the configuration's resume hint (``Hint``), the resume
of a hibernated kernel starts ``lead`` seconds before the cell that needs it, where the pool has room
then and nobody waits; the wait its user feels is what is left of the restore when the cell comes
(``resume_delays``), and a hinted kernel that runs no cell within ``hold`` hibernates again (a decision
``hint_unused``, as the live server's).  A hint the live server acted on (a trace's) wakes a kernel asleep
in the replay too, on the same terms, with the live server's hold.  A rule's
``hibernate_after_cell`` hibernates a kernel that long after each cell (or other use) ends when no cell
has started since, without a warning, as the live server's ``after_cell``: the checkpoint holds the
slice, and the next cell resumes it (or the hint, ahead of it).  Nothing here reads a file or a clock.

A kernel's moves (hibernate, resume, a hint's wake, a restore done) step its GPU residency through the
lifecycle's model, ``pool.residency``, as the live hibernator does, and carry out the step's effects on
the virtual pool (the slice given back once checkpointed, a restore only on a slice granted).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable

from ..pool import ACTIVE as LEASE_ACTIVE, HIBERNATED, SOFT, PoolExhausted, Profile, Waiter
from ..pool.words import MPS_CANNOT_HIBERNATE
from ..pool import culling as C
from ..pool import policy as P
from ..pool import reclaim as R
from ..pool import residency as M
from ..pool.allocation import Ask, Grant
from ..pool.gpu_use import GPUUse
from ..pool.placement import choose
from ..pool.rules import FIRST_CELL
from .configuration import Configuration, Hint, PlanError
from .costs import COSTS, Costs
from .metrics import Tally
from .reserving import Reserving
from .virtual_pool import VirtualPool
from .workload import ACTIVE as ACT_EV, BUSY, END, GPU, HIBERNATE, IDLE, SNOOZE, Session, Workload
from .workload import HINT as HINT_EV

# Where a session's kernel is: its GPU residency's stage (pool.residency; WAKING is a resume under way,
# resuming, queued or restoring, as the kernel's waiter and lease tell), or around it the replay's own words:
# asking for a start (no lease yet), its session ended.  (UNSLICED: slice_at first-cell, before its first cell.)
RUNNING, HIBERNATING, ASLEEP, WAKING, LOST, UNSLICED = M.ACTIVE, M.HIBERNATING, M.HIBERNATED, M.RESUMING, M.GONE, \
    M.NO_GPU_YET
ASKING, DONE = "asking", "done"
_RESIDENCY = {(s.stage, s.hint): s for s in M.STATES if not s.first and not s.was}  # (stage, woken on a hint)
_WAKING = (M.RESUMING, M.QUEUED, M.RESTORING)
_HINTABLE = (M.ACTIVE, M.RESUMING, M.RESTORING)
_NOBODY: frozenset = frozenset()  # no kernel chosen for a waiter
# Event queue kinds, in the order same-time events run: users act before a pass looks.
_USER, _ASK, _TIMEOUT, _HIBERNATED, _RESTORED, _HINT, _HINT_END, _AFTER_CELL, _PASS, _SAMPLE, _DEADLINE, _PHASE = range(12)
FIRST = "first-cell"  # the ask of a kernel's first cell (slice_at first-cell)
AFTER_CELL = "after_cell"  # the reason of a hibernation by the rule's hibernate_after_cell (the journal's)
HINT_UNUSED = "hint_unused"  # the reason of a hibernation of a kernel a hint woke and no cell used (the journal's)


class _Kernel:
    """One session in one replay."""

    __slots__ = ("s", "events", "pending", "delay", "state", "lease", "starts", "ask_at", "asking", "waiter",
                 "busy", "busy_at", "busy_share", "last_activity", "busy_since", "use", "reading", "kstate", "grid",
                 "can", "why", "token", "profile", "wake", "room_only", "hinted", "hint_token", "cell_at",
                 "resume_wait", "seen", "deadline", "used")

    def __init__(self, session: Session, profile: Profile, can: bool, why: str | None, grid: tuple[float, float]):
        self.s = session
        self.profile = profile
        self.events = session.activity()
        self.pending = None  # (user time, code, value): an event that waits for the kernel (a slice, a restore)
        self.delay = 0.0  # what the replay made this user wait so far
        self.state = ASKING
        self.lease = None
        self.starts = 0
        self.ask_at = session.arrival
        self.asking = "start"  # start, restart or resume
        self.waiter = None
        self.busy = False
        self.busy_at = 0.0
        self.busy_share = 0.0  # the GPUs' worth it keeps busy while a cell runs
        self.last_activity = None
        self.busy_since = None
        self.use = None  # GPUUse, once a reading came
        self.reading = (0, 0.0)  # (memory, utilization) of the last reading
        self.kstate = P.FRESH  # the policy's memory of it
        self.grid = grid
        self.can, self.why = can, why
        self.token = 0  # a queued start's timeout counts only for the ask it was set for
        self.wake = 0.0  # no pass before this can change the policy's answer (0: its facts changed)
        self.room_only = False  # a start of its user can be refused for room only (no quota, no budget)
        self.deadline = None  # its warning's deadline, when the culler judges it again (None: no warning)
        self.hinted = False  # resumed by a hint, and no cell came since
        self.hint_token = 0  # a hint's expiry counts only for the hint it was set for
        self.cell_at = None  # when the cell that waits for this resume came (None: no cell waits yet)
        self.resume_wait = None  # what the last resume made its cell wait, until that cell ends
        self.seen = session.arrival  # the user's last event so far
        self.used = 0  # counts its uses (cells, activity): an after-cell hibernation counts only for the last


class Replay:
    """Replay ``workload`` under ``config`` on ``gpus``; :meth:`run` returns the :class:`Tally`."""

    def __init__(self, workload: Workload, config: Configuration, gpus, *, costs: Costs = COSTS,
                 keep_decisions: bool = False, progress: Callable[[float], None] | None = None,
                 timeline_points: int = 1500, every_pass: bool = False):
        """``every_pass``: judge every kernel on every pass, as the live culler does, instead of skipping
        the passes ``policy.quiet_until`` says cannot change a kernel's answer (slower; the same result)."""
        if not gpus:
            raise PlanError(f"configuration {config.name!r} has no GPU to replay on: give a count (--gpus N) or "
                            "declare the pool's GPUs (GPUPool.inventory)")
        self.w, self.config, self.costs = workload, config, costs
        self.pool = VirtualPool(config, list(gpus))
        self.policy = config.policy
        self.thresholds = self.policy.thresholds
        self.tally = Tally(len(gpus), workload.start, workload.end, keep_decisions,
                           reservations=config.sharing.reservations, classes=workload.classes)
        self.progress = progress
        self._heap: list = []
        self._seq = itertools.count()
        self._waiter_ids = itertools.count(1)
        self._grids: dict[tuple[float, float], dict[_Kernel, None]] = {}
        self._waiting: dict[str, _Kernel] = {}  # waiter id -> its kernel
        # The queue's starts that only room can refuse, by slice, and the other waiters: _serve stops where
        # everyone left asks for a slice that fits nowhere.
        self._queued_starts: Counter = Counter()
        self._queued_others = 0
        self._kernels: list[_Kernel] = []
        self._busy_share = 0.0
        self._asleep = 0
        self._idle_rules = False  # a kernel started under a rule with an idle timeout (only such are reclaimed)
        # per grid: the kernels chosen for a waiter at its last pass
        self._reclaimed: dict[tuple[float, float], frozenset[_Kernel] | set[_Kernel]] = {}
        self._due: dict[tuple[float, float], list] = {}  # per grid: (wake, seq, kernel), the earliest first
        self._judge_all = every_pass or bool(config.budgets.budgets)
        # reservations: their room, and per grid the kernels chosen to give it back at its last pass (and why)
        self.reserving = Reserving(config.sharing, self.pool, config.placement) if config.sharing.reservations else None
        self._reserved: dict[tuple[float, float], dict[_Kernel, str]] = {}
        self._step = max((workload.end - workload.start) / timeline_points, 1.0)
        for s in workload.sessions:
            profile = config.profiles.get(s.profile or config.default_profile)
            if profile is None:
                where = f"{workload.source.get('file', 'trace')} line {s.line}: " if s.line else ""
                raise PlanError(f"{where}profile {s.profile!r} of kernel {s.id} is not a profile of configuration "
                                f"{config.name!r} (its profiles: {', '.join(config.profiles)}); replay it under a "
                                "configuration that has it (--config)")
            if s.can_hibernate is None:
                can = profile.hibernation_possible
                why = None if can else MPS_CANNOT_HIBERNATE
            else:
                can, why = s.can_hibernate, s.why
            phase, interval = s.grid or (workload.start, workload.interval)
            k = _Kernel(s, profile, can, why, (phase % interval, interval))
            k.room_only = self.pool.only_room_refuses(s.user, s.groups)
            self._kernels.append(k)
            self._push(s.arrival, _ASK, k)

    # -- the loop ---------------------------------------------------------------------------

    def _push(self, at: float, kind: int, item) -> None:
        heapq.heappush(self._heap, (at, kind, next(self._seq), item))

    def run(self) -> Tally:
        w = self.w
        for phase, interval in dict.fromkeys(k.grid for k in self._kernels):
            self._grids[(phase, interval)] = {}
            self._due[(phase, interval)] = []
            self._push(w.start + (phase - w.start) % interval, _PASS, (phase, interval))
        self._push(w.start, _SAMPLE, None)
        for at in self.reserving.boundaries(w.start, w.end) if self.reserving else ():
            self._push(at, _PHASE, None)  # a reservation's room changes hands: the queue is served again
        handlers = {_USER: self._user, _ASK: self._ask, _TIMEOUT: self._timeout, _HIBERNATED: self._hibernated,
                    _RESTORED: self._restored, _HINT: self._hint, _HINT_END: self._hint_end,
                    _AFTER_CELL: self._after_cell, _PASS: self._pass,
                    _SAMPLE: self._sample,
                    _DEADLINE: self._deadline, _PHASE: lambda now, _item: self._serve(now)}
        heap, end, progress = self._heap, w.end, self.progress
        count = 0
        while heap:
            at, kind, _, item = heapq.heappop(heap)
            if at > end:
                break
            handlers[kind](at, item)
            count += 1
            if progress is not None and count % 20000 == 0:
                progress(at)
        for k in self._kernels:
            if k.busy:
                self._stop_busy(k, end)
            if k.state in (ASKING, WAKING) and (k.waiter is not None or k.state == ASKING):
                self.tally.unserved(k.s.id, end - k.ask_at, k.asking, k.s, k.ask_at)
        self.tally.user_seconds = math.fsum(max(k.seen - k.s.arrival, 0.0) for k in self._kernels)
        self.tally.sample(end, self.pool.held_share, self._busy_share, len(self.pool.queue), self._asleep)
        self.tally.close(self.pool.held_until(end), self.pool.peak_share)
        if progress is not None:
            progress(end)
        return self.tally

    # -- users --------------------------------------------------------------------------------

    def _advance(self, k: _Kernel, now: float) -> None:
        """Schedule the session's next event, moved by what the replay made its user wait; with the resume
        hint, a cell's hint ``lead`` seconds before it (not before now)."""
        nxt = next(k.events, None)
        if nxt is not None:
            at = nxt[0] + k.delay
            self._push(at, _USER, (k, nxt))
            hint = self.config.hint
            if hint is not None and (nxt[1] == BUSY or nxt[1] == ACT_EV):
                self._push(max(at - hint.lead, now), _HINT, k)

    def _user(self, now: float, item) -> None:
        k, event = item
        if k.state == DONE:
            return
        k.seen = now
        if event[1] == HINT_EV:  # a recorded hint: a resume only if the kernel sleeps here too; nobody waits for it
            self._hint(now, k, event[2])
            self._advance(k, now)
            return
        if k.state in (ASKING, HIBERNATING, WAKING):
            if k.cell_at is None and k.state != ASKING and (event[1] == BUSY or event[1] == ACT_EV):
                # a cell comes while a hinted resume is under way (it waits for the rest), or while the
                # kernel is being checkpointed (it waits for the checkpoint, then the whole resume)
                k.cell_at = now
            k.pending = event  # the session waits for its kernel
            return
        self._continue(k, now, event)

    def _continue(self, k: _Kernel, now: float, event) -> None:
        """``event`` happens now; the session goes on unless it must wait for its kernel."""
        self._deliver(k, now, event)
        if k.state != DONE and k.pending is None:
            self._advance(k, now)

    def _unpause(self, k: _Kernel, now: float) -> None:
        """The kernel is there: the event that waited for it happens now (a first start: the whole session moves)."""
        event = k.pending
        if event is None:
            k.delay = now - k.s.arrival
            self._advance(k, now)
            return
        k.pending = None
        k.delay = max(k.delay, now - event[0])
        self._continue(k, now, event)

    def _touch(self, k: _Kernel) -> None:
        """The kernel's facts changed: the next pass judges it."""
        if k.wake:
            k.wake = 0.0
            if k.lease is not None:
                heapq.heappush(self._due[k.grid], (0.0, next(self._seq), k))

    def _deliver(self, k: _Kernel, now: float, event) -> None:
        _, code, value = event
        self._touch(k)
        if code == END:
            self._end(k, now)
        elif k.state == UNSLICED:
            if code == BUSY or code == ACT_EV:  # its first cell (a quick one: active) asks, as a resume does
                k.pending, k.state, k.asking, k.ask_at = event, ASKING, FIRST, now
                self._push(now, _ASK, k)
            elif code == IDLE:
                k.busy = False
        elif (code == BUSY or code == ACT_EV) and k.state in (ASLEEP, LOST):
            # A cell (or other use) of a hibernated kernel resumes it first; of a kernel the replay shut
            # down, starts another one (its state is lost).
            if k.state == ASLEEP:
                _move(k, M.CELL)  # it asks for a slice (its _ASK, below)
                k.pending, k.asking, k.ask_at = event, "resume", now
                k.cell_at = k.cell_at if k.cell_at is not None else now  # (it came during the checkpoint)
                k.hinted = False
                self._asleep -= 1
            else:
                k.pending, k.state, k.asking, k.ask_at = event, ASKING, "restart", now
                self.tally.restarts += 1
            self._push(now, _ASK, k)
        elif code == BUSY:
            k.last_activity = now
            k.used += 1
            if k.hinted:  # the hinted resume was done before its cell came: the cell did not wait
                self._resume_waited(k, 0.0)
            if not k.busy:
                k.busy, k.busy_at, k.busy_share = True, now, self.pool.share(k.lease)
                self._busy_share += k.busy_share
        elif code == IDLE:
            if k.busy:
                self._stop_busy(k, now)
                self._cell_ended(k, now)
            if k.lease is not None:
                k.last_activity = now
        elif code == ACT_EV:
            k.last_activity = now
            k.used += 1
            if k.hinted:
                self._resume_waited(k, 0.0)
            if not k.busy:
                self._cell_ended(k, now)
        elif code == GPU:
            if k.state == RUNNING:
                if k.use is None:
                    k.use = GPUUse()
                else:  # the last reading held until now
                    k.use.record(now, k.reading[0], k.reading[1], self.thresholds)
                k.use.record(now, value[0], value[1], self.thresholds)
            k.reading = value
        elif code == SNOOZE:
            self._snooze(k, now, value)
        elif code == HIBERNATE and k.state == RUNNING:  # (asleep or shut down in this replay: nothing to do)
            self._requested(k, now)

    def _cell_ended(self, k: _Kernel, now: float) -> None:
        """A cell (or other use) ended: under a rule with ``hibernate_after_cell``, the kernel hibernates
        that long after unless it is used again."""
        if k.state != RUNNING or not k.can:  # (an MPS client cannot be checkpointed: no after-cell for it)
            return
        after = self._rule(k).hibernate_after_cell
        if after is not None:
            self._push(now + after, _AFTER_CELL, (k, k.used))

    def _after_cell(self, now: float, item) -> None:
        """No cell since the last one ended: the kernel hibernates, without a warning (it loses nothing)."""
        k, used = item
        if used != k.used or k.state != RUNNING or k.busy or k.hinted:
            return  # used again, moved, ended or already hibernated meanwhile
        dry_run = self.policy.dry_run
        self.tally.decision(now, k.s.id, "act", AFTER_CELL, P.HIBERNATE, dry_run)
        if not dry_run:
            self.tally.after_cell += 1
            self._act(k, now, P.HIBERNATE, M.AFTER_CELL)

    def _requested(self, k: _Kernel, now: float) -> None:
        """Its user (or an admin) asked for its hibernation: a shutdown where it cannot hibernate, as the
        culler's ``release`` falls back; the checkpoint is refused while a cell runs, as the hibernator does."""
        if k.can and k.busy:
            self.tally.hibernations_refused += 1
            return
        self.tally.requested += 1
        self._act(k, now, P.HIBERNATE if k.can else P.SHUTDOWN, M.RELEASE)

    def _stop_busy(self, k: _Kernel, now: float) -> None:
        self.tally.busy(k.busy_share * (now - k.busy_at))
        self._busy_share -= k.busy_share
        k.busy = False
        if k.resume_wait is not None:  # the cell a resume made wait is done: how much longer it felt
            self.tally.resumed_cell(now - k.busy_at, k.resume_wait)
            k.resume_wait = None

    def _resume_waited(self, k: _Kernel, seconds: float) -> None:
        """The cell that needed a resumed kernel waited ``seconds`` for it (queue and restore, less a hint's
        head start)."""
        self.tally.resume_delay(seconds)
        k.resume_wait, k.cell_at, k.hinted = seconds, None, False

    def _snooze(self, k: _Kernel, now: float, seconds: float) -> None:
        if k.state not in (RUNNING, ASLEEP):
            return
        rule = self._rule(k)
        memory, limit = k.reading[0], k.lease.total_memory
        over = k.lease.isolation == SOFT and k.use is not None and memory is not None and memory > limit
        try:
            k.kstate = P.snooze(k.kstate, rule, now, min(seconds, rule.snooze), over_memory=over)
            self.tally.snoozes += 1
        except P.SnoozeRefused:
            self.tally.snoozes_refused += 1

    def _end(self, k: _Kernel, now: float) -> None:
        if k.busy:
            self._stop_busy(k, now)
        if k.state == ASLEEP:
            self._asleep -= 1
        if k.lease is not None:
            self._drop(k, now)
            self._serve(now)
        k.state = DONE

    def _drop(self, k: _Kernel, now: float) -> None:
        self.pool.release(k.lease, now)
        self._grids[k.grid].pop(k, None)
        k.lease = None

    # -- asking for slices ----------------------------------------------------------------------

    def _ask(self, now: float, k: _Kernel) -> None:
        if k.state == WAKING:
            self._try_resume(k, now, None)
        elif k.state == ASKING:
            if k.asking == "start" and not k.starts and self.policy.rule_for(
                    k.s.user, k.s.groups, k.profile.name, k.s.kernelspec).slice_at == FIRST_CELL:
                k.state = UNSLICED  # it starts holding nothing; its first cell asks
                self.tally.unsliced += 1
                self._unpause(k, now)
                return
            self._try_start(k, now)

    def _start_ask(self, k: _Kernel) -> Ask:
        return Ask(owner=k.s.user, kernel_id=f"{k.s.id}~{k.starts}" if k.starts else k.s.id,
                   profile=k.profile, groups=k.s.groups)

    def _try_start(self, k: _Kernel, now: float) -> None:
        ask = self._start_ask(k)
        if k.room_only and self.pool.queue and choose(self.pool.room_after_queue(self.config.placement),
                                                      k.profile.slice, self.config.placement) is None:
            full, reason = True, PoolExhausted.reason  # allocate's answer, without building its message (_serve)
        else:
            result = self.pool.ask(ask, now)
            if isinstance(result, Grant):
                self._started(k, ask, result, now)
                return
            full, reason = isinstance(result, PoolExhausted), result.reason
        if full and k.asking == FIRST:  # a first cell waits in the queue as a resume does: no timeout
            self._enqueue(k, now, ask.kernel_id, None)
        elif full and self.config.queue_timeout > 0:
            self._enqueue(k, now, ask.kernel_id, None)
            self._push(now + self.config.queue_timeout, _TIMEOUT, (k, k.token))
        else:
            self._refused(k, now, reason)

    def _refused(self, k: _Kernel, now: float, reason: str) -> None:
        self.tally.refused(k.s.id, now, reason, k.asking)
        if k.asking == FIRST:  # the cell fails; the kernel goes on without a slice, its next cell asks again
            k.state, k.pending = UNSLICED, None
            self._advance(k, now)
            return
        if k.s.retry is not None:
            self._push(now + k.s.retry, _ASK, k)  # a synthetic user tries again
            return
        self.tally.unserved(k.s.id, now - k.ask_at, k.asking, k.s, k.ask_at)  # a recorded one went on without it
        k.state, k.pending = DONE, None

    def _enqueue(self, k: _Kernel, now: float, kernel_id: str, lease_id: str | None) -> None:
        spec = k.lease.slice if k.lease is not None else k.profile.slice
        k.waiter = Waiter(id=f"w{next(self._waiter_ids)}", owner=k.s.user, kernel_id=kernel_id, lease_id=lease_id,
                          profile=k.profile.name, slice=spec, label="", enqueued=now, heartbeat=now, groups=k.s.groups)
        self._waiting[k.waiter.id] = k
        self.pool.enqueue(k.waiter)
        if _plain_start(k, k.waiter):
            self._queued_starts[k.waiter.slice] += 1
        else:
            self._queued_others += 1

    def _leave_queue(self, k: _Kernel) -> None:
        if _plain_start(k, k.waiter):
            self._queued_starts[k.waiter.slice] -= 1
        else:
            self._queued_others -= 1
        self.pool.dequeue(k.waiter.id)
        self._waiting.pop(k.waiter.id, None)
        k.waiter = None

    def _timeout(self, now: float, item) -> None:
        k, token = item
        if k.waiter is None or k.token != token:
            return
        self._leave_queue(k)
        self._refused(k, now, PoolExhausted.reason)
        self._serve(now)

    def _started(self, k: _Kernel, ask: Ask, grant: Grant, now: float) -> None:
        k.lease = self.pool.take(ask, grant, now)
        k.token += 1
        k.starts += 1
        k.state = RUNNING
        k.kstate, k.busy_since, k.last_activity, k.use, k.reading = P.FRESH, None, None, None, (0, 0.0)
        self._grids[k.grid][k] = None
        self._idle_rules = self._idle_rules or self._rule(k).idle_timeout is not None
        k.wake = 0.0
        heapq.heappush(self._due[k.grid], (0.0, next(self._seq), k))
        self.tally.served(k.s.id, now - k.ask_at, k.asking, k.s, k.ask_at)
        if k.s.once:  # refused when recorded: its user went on without it
            self._drop(k, now)
            k.state = DONE
            self._serve(now)
            return
        self._unpause(k, now)

    def _try_resume(self, k: _Kernel, now: float, waiter_id: str | None) -> None:
        ask = self.pool.resume_ask(k.lease, k.profile, same_gpu=k.s.declared)
        result = self.pool.ask(ask, now, waiter_id)
        if isinstance(result, PoolExhausted):
            _move(k, M.NO_ROOM)  # it waits in the queue
            if k.waiter is None:
                self._enqueue(k, now, k.lease.kernel_id, k.lease.id)
            return
        if k.waiter is not None:
            self._leave_queue(k)
        if isinstance(result, Grant):
            self._wake(k, ask, result, now)
            return
        self.tally.refused(k.s.id, now, result.reason, "resume")
        _move(k, M.QUOTA_REFUSED)
        k.pending, k.cell_at = None, None  # the cell fails; the kernel sleeps on
        self._asleep += 1
        self._advance(k, now)

    def _wake(self, k: _Kernel, ask: Ask, grant: Grant, now: float) -> None:
        """The resume has its slice: the restore starts (the model's RESTORE, only ever on a slice granted)."""
        restore = M.RESTORE in _move(k, M.SLICE_GRANTED)
        k.lease = self.pool.take(ask, grant, now, k.lease)
        self.tally.served(k.s.id, now - k.ask_at, "resume", k.s, k.ask_at)
        self.tally.resumed += 1
        if restore:
            self._push(now + (0.0 if k.s.declared else self.costs.resume.seconds(self._moved(k))), _RESTORED, k)

    def _hint(self, now: float, k: _Kernel, hold: float | None = None) -> None:
        """Its user opened the notebook or started typing: the resume starts now if the pool has room for
        it and nobody waits (never a queue, never a refusal told: it is a guess).  ``hold``: how long it
        then waits for a cell (a recorded hint's, as the live server had it; else the configuration's)."""
        if k.state != ASLEEP:
            return
        if self.pool.queue:
            self.tally.hints_skipped += 1
            return
        ask = self.pool.resume_ask(k.lease, k.profile, same_gpu=k.s.declared)
        result = self.pool.ask(ask, now)
        if not isinstance(result, Grant):
            self.tally.hints_skipped += 1
            return
        k.hinted = True
        _move(k, M.HINT)  # the model's one try, granted: declined, it would have slept on quietly (above)
        k.asking, k.ask_at, k.cell_at = "resume", now, None
        self._asleep -= 1
        self.tally.hints += 1
        k.hint_token += 1
        if hold is None:
            hold = (self.config.hint or Hint()).hold
        self._push(now + hold, _HINT_END, (k, k.hint_token, hold))
        self._wake(k, ask, result, now)

    def _hint_end(self, now: float, item) -> None:
        """No cell came within the hint's hold: the kernel hibernates again, without a warning, on record
        as the live server's ``hint_unused`` (not the policy's: a dry-run policy does not stop it)."""
        k, token, hold = item
        if not k.hinted or token != k.hint_token:
            return
        if k.state == WAKING:  # (a restore longer than the hold) it is judged once it is there
            self._push(now + hold, _HINT_END, item)
            return
        if k.state == RUNNING:
            self.tally.hints_unused += 1
            self.tally.decision(now, k.s.id, "act", HINT_UNUSED, P.HIBERNATE, False)
            self._act(k, now, P.HIBERNATE, M.HINT_UNUSED)
        k.hinted = False

    def _restored(self, now: float, k: _Kernel) -> None:
        if k.state != WAKING:
            return
        _move(k, M.RESTORE_DONE)
        self._touch(k)
        k.last_activity = now
        k.use = None
        if k.reading[0]:  # the sampler reads the kernel afresh on its new slice
            k.use = GPUUse()
            k.use.record(now, k.reading[0], 0.0, self.thresholds)
        if k.cell_at is not None:
            self._resume_waited(k, now - k.cell_at)
        if k.pending is not None or not k.hinted:
            self._unpause(k, now)
        # (hinted, and its cell not come yet: the session's next event is already on its way)

    def _serve(self, now: float) -> None:
        """Room may have freed: each waiter in queue order tries again (a later one keeps what is left
        after every earlier waiter that fits took its slice: the queue's rules, in ``allocate``).

        A start whose slice fits nowhere in that room, and whom no quota or budget could refuse, would
        get ``PoolExhausted`` again: it is passed over without asking (the room is
        ``pool.queue.reserve_for_waiters``, folded one waiter at a time as ``allocate`` folds it; a
        waiter that does not fit leaves it as it was).  Without this, a queue of Q waiters cost Q asks
        of Q reservations each on every slice given back."""
        room, full = None, set()  # what is left after the waiters before this one; the slices that fit nowhere in it
        left, others = Counter(self._queued_starts), self._queued_others  # who is after this one
        placement = self.config.placement
        for w in self.pool.line(now):  # (in arrival order, unless sharing orders it otherwise)
            k = self._waiting.get(w.id)
            if k is None or k.waiter is None or k.waiter.id != w.id:  # (sharing's line holds copies)
                continue
            if _plain_start(k, w):
                left[w.slice] -= 1
            else:
                others -= 1
            if k.state == WAKING:
                self._try_resume(k, now, w.id)
                room, full = None, set()
                continue
            if k.room_only:
                if room is None:
                    room = self.pool.room_before(w.id, placement)
                if w.slice in full or choose(room, w.slice, placement) is None:
                    full.add(w.slice)
                    if not others and all(n == 0 or s in full for s, n in left.items()):
                        break  # everyone after this one asks for a slice that fits nowhere: all refused for room
                    continue
            room, full = None, set()
            ask = self._start_ask(k)
            result = self.pool.ask(ask, now, w.id)
            if isinstance(result, PoolExhausted):
                continue
            self._leave_queue(k)
            if isinstance(result, Grant):
                self._started(k, ask, result, now)
            else:
                self._refused(k, now, result.reason)

    # -- the culler -------------------------------------------------------------------------------

    def _rule(self, k: _Kernel) -> P.Rule:
        lease = k.lease
        return self.policy.rule_for(lease.owner, lease.groups, lease.profile, k.s.kernelspec)

    def _pass(self, now: float, grid: tuple[float, float]) -> None:
        self._push(now + grid[1], _PASS, grid)
        members = self._grids[grid]
        if not members:
            return
        budgets: dict[str, object] = {}
        facts: dict[_Kernel, tuple[P.Rule, P.Facts]] = {}  # this pass's, each kernel's read once
        # A kernel whose facts did not change since the policy said until when it stays quiet is skipped
        # until then (policy.quiet_until); budget facts move with every lease of their owner, so with
        # budgets every kernel is judged every pass.
        due = self._due[grid]
        if self._judge_all:
            judged = list(members)
            due.clear()
        else:
            judged = []
            while due and due[0][0] <= now:
                wake, _, k = heapq.heappop(due)
                if wake == k.wake and k in members:
                    judged.append(k)
        # Whether a kernel is chosen for a waiter is part of what decide is told: a kernel that comes into
        # or out of the choice is judged this pass (its quiet_until held for the choice it had).
        reclaimed = self._reclaim(members, now, facts, budgets) if self.pool.queue and self._idle_rules else _NOBODY
        before = self._reclaimed.get(grid, _NOBODY)
        if reclaimed != before:
            judged.extend(k for k in reclaimed ^ before if k in members and k not in judged)
        self._reclaimed[grid] = reclaimed
        reserved = self._reserve(members, now, facts, budgets)
        held = self._reserved.get(grid, {})
        judged.extend(k for k in set(reserved) ^ set(held) if k in members and k not in judged)
        self._reserved[grid] = reserved
        judged.sort(key=_started_first)  # as the culler goes through its kernels: the oldest first
        for k in judged:
            if k.state not in (RUNNING, ASLEEP):
                k.wake = 0.0
                heapq.heappush(due, (0.0, next(self._seq), k))
                continue  # a move is under way (its lease has a phase): the culler leaves it alone
            rule, f = facts.get(k) or self._facts(k, now, budgets)
            self._decide(k, now, rule, f, k in reclaimed, reserved.get(k, ""))

    def _decide(self, k: _Kernel, now: float, rule: P.Rule, f: P.Facts, chosen: bool, reserved: str = "") -> None:
        """Ask the policy about one kernel and carry its answer out, as the culler's ``_decide``; a warned
        kernel is judged again at its warning's deadline (``_deadline``), as the culler's timer does."""
        dry_run = self.policy.dry_run
        decision = P.decide(f, rule, now, k.kstate, reclaim=chosen, dry_run=dry_run, reserved=reserved)
        k.kstate = decision.state
        k.wake = max(P.quiet_until(f, rule, now, k.kstate, reclaim=chosen, dry_run=dry_run, reserved=reserved),
                     now + 1e-6)
        if k.wake != math.inf:
            heapq.heappush(self._due[k.grid], (k.wake, next(self._seq), k))
        if decision.verb == P.WARN:
            self.tally.decision(now, k.s.id, "warn", decision.reason, decision.action, decision.dry_run)
        elif decision.verb == P.ACT:
            self.tally.decision(now, k.s.id, "act", decision.reason, decision.action, decision.dry_run)
            if not decision.dry_run:
                self._act(k, now, decision.action)
        warning = k.kstate.warning
        if warning is None:
            k.deadline = None
        elif warning.deadline != k.deadline and k.state in (RUNNING, ASLEEP):
            k.deadline = warning.deadline
            self._push(warning.deadline, _DEADLINE, (k, warning.deadline))

    def _deadline(self, now: float, item) -> None:
        """A warned kernel's deadline: judged again now (its facts, whether a waiter still needs its slice)."""
        k, deadline = item
        warning = k.kstate.warning
        if (k.deadline != deadline or warning is None or warning.deadline != deadline
                or k.state not in (RUNNING, ASLEEP) or k not in self._grids[k.grid]):
            return  # moved, withdrawn, snoozed, released or acted on meanwhile
        k.deadline = None
        budgets: dict[str, object] = {}
        facts: dict[_Kernel, tuple[P.Rule, P.Facts]] = {}
        members = self._grids[k.grid]
        reclaimed = self._reclaim(members, now, facts, budgets) if self.pool.queue and self._idle_rules else _NOBODY
        reserved = self._reserve(members, now, facts, budgets)
        rule, f = facts.get(k) or self._facts(k, now, budgets)
        self._decide(k, now, rule, f, k in reclaimed, reserved.get(k, ""))

    def _facts(self, k: _Kernel, now: float, budgets: dict) -> tuple[P.Rule, P.Facts]:
        """The kernel's rule and facts at this pass, as the culler reads them (the sampler's latest reading
        recorded first)."""
        lease = k.lease
        rule = self._rule(k)
        use = k.use
        if use is not None and k.state == RUNNING:  # the sampler's latest reading
            use.record(now, k.reading[0], k.reading[1], self.thresholds)
        execution = "busy" if k.busy else "idle"
        k.busy_since = C.busy_since(k.busy_since, execution, k.last_activity, now)
        if lease.owner not in budgets:
            budgets[lease.owner] = self.pool.standing(lease.owner, lease.groups, now)
        threshold = rule.gpu_idle_threshold
        return rule, C.kernel_facts(
            lease, execution_state=execution, last_activity=k.last_activity, busy_since=k.busy_since,
            gpu_active=use.last_active(threshold) if use is not None else None,
            gpu_idle_since=use.idle_since(threshold) if use is not None else None,
            memory_used=k.reading[0] if use is not None else None, can_hibernate=k.can, why=k.why,
            budget=budgets[lease.owner])

    def _reclaim(self, members, now: float, facts: dict, budgets: dict) -> frozenset[_Kernel] | set[_Kernel]:
        """The kernels of this culler's server to give their slices back to the queue's waiters now, as
        the culler's ``reclaim`` chooses them (``pool.reclaim.choose_reclaim``, the same inputs): the
        candidates among its idle kernels, the whole pool's leases, each waiter with the GPUs it may take,
        its kernels being hibernated as room coming, and those warned for a waiter already."""
        candidates, freeing, warned = [], set(), set()
        for k in members:
            if k.state == HIBERNATING:
                freeing.add(k.lease.kernel_id)
                continue
            if k.state != RUNNING or k.busy or k.kstate.snoozed_until > now:
                continue  # not a candidate whatever its facts (pool.reclaim.candidate): spare reading them
            rule = self._rule(k)
            if rule.idle_timeout is None:
                continue
            rule, f = facts[k] = self._facts(k, now, budgets)
            if k.kstate.warning is not None and k.kstate.warning.reason == P.PRESSURE:
                warned.add(k.lease.kernel_id)
            action = P.release_action(rule, f.can_hibernate, f.hibernate_unavailable)[0]
            found = R.candidate(k.lease, rule, action, idle_since=f.last_activity, busy=False, now=now,
                                snoozed_until=k.kstate.snoozed_until)
            if found is not None:
                candidates.append(found)
        if not candidates:
            return _NOBODY
        pool = self.pool
        usage = list(pool.usage.values())

        def resuming(w: Waiter):
            waiting = self._waiting.get(w.id) if w.lease_id is not None else None
            if waiting is not None and waiting.lease is not None and waiting.lease.state == HIBERNATED:
                return waiting.lease
            return None

        needs = R.needs(pool.queue, usage, resuming)
        leases = list({lease.id: lease for held in pool.on_gpu.values() for lease in held.values()}.values())
        chosen = R.choose_reclaim([u.gpu for u in usage], leases, needs, candidates, freeing=freeing, warned=warned)
        ids = {c.kernel_id for c in chosen}
        return {k for k in members if k.lease is not None and k.lease.kernel_id in ids}

    def _reserve(self, members, now: float, facts: dict, budgets: dict) -> dict[_Kernel, str]:
        """The kernels of this culler's server to give back room a reservation keeps, and why (as the
        culler's: candidates from ``pool.reclaim.reservation_candidate``, chosen by ``Reserving``)."""
        if self.reserving is None or not self.reserving.active(now):
            return {}
        found, freeing, warned = [], set(), set()
        for k in members:
            if k.state == HIBERNATING:
                freeing.add(k.lease.kernel_id)
            if k.state != RUNNING or k.busy:
                continue
            rule, f = facts[k] = facts.get(k) or self._facts(k, now, budgets)
            if k.kstate.warning is not None and k.kstate.warning.reason == P.RESERVED:
                warned.add(k.lease.kernel_id)
            action = P.release_action(rule, f.can_hibernate, f.hibernate_unavailable)[0]
            c = R.reservation_candidate(k.lease, rule, action, idle_since=f.last_activity, busy=False)
            if c is not None:
                found.append((k, c))
        return self.reserving.choose(found, now, freeing=freeing, warned=warned)

    def _act(self, k: _Kernel, now: float, action: str, event: str = M.IDLE) -> None:
        """Carry out the policy's ``action`` (or, by ``event``, its user's Release, an after-cell or an unused
        hint's hibernation)."""
        if action == P.HIBERNATE and k.state == RUNNING:
            if k.busy:  # the hibernator refuses a kernel running a cell, and it runs on
                self.tally.hibernations_refused += 1
                return
            if M.CHECKPOINT in _move(k, event):  # its slice is held until the checkpoint is done
                cost = 0.0 if k.s.declared else self.costs.hibernate.seconds(self._moved(k))
                self._push(now + cost, _HIBERNATED, k)
            return
        if k.busy:
            self._stop_busy(k, now)
        if k.state == ASLEEP:
            self._asleep -= 1
        k.hinted = False
        self.tally.shut_down += 1
        _move(k, M.KERNEL_GONE)  # (LOST: a use of it starts another kernel)
        self._drop(k, now)
        self._serve(now)

    def _moved(self, k: _Kernel) -> int:
        """What a hibernation moves: what the kernel holds on its GPU (its last reading, else its slice)."""
        if k.use is not None and k.reading[0] is not None:
            return k.reading[0]
        if k.s.memory is not None:
            return k.s.memory
        return k.lease.total_memory

    def _hibernated(self, now: float, k: _Kernel) -> None:
        if k.state != HIBERNATING:
            return
        self.tally.host_bytes(self._moved(k))
        if M.GIVE_BACK in _move(k, M.CHECKPOINT_DONE):  # its memory in host RAM: the slice goes back
            k.lease = self.pool.hibernate(k.lease, now)
        self._touch(k)
        self._asleep += 1
        k.kstate = P.FRESH  # as the culler: the policy's memory of a hibernated kernel starts afresh
        self.tally.hibernated += 1
        if k.pending is not None:  # an event came during the checkpoint
            self._unpause(k, now)
        self._serve(now)

    # -- the record ---------------------------------------------------------------------------

    def _sample(self, now: float, _item) -> None:
        self.tally.sample(now, self.pool.held_share, self._busy_share, len(self.pool.queue), self._asleep)
        self._push(now + self._step, _SAMPLE, None)


def _move(k: _Kernel, event: str) -> tuple[str, ...]:
    """Step the kernel's GPU residency through the lifecycle's model by ``event``; return the step's effects for
    the caller to carry out.  Its stage now is the replay's (a resume under way is queued while it has a place
    in the queue, restoring once its lease holds a slice again, else resuming)."""
    stage = k.state
    if stage == WAKING:
        stage = M.RESTORING if k.lease.state == LEASE_ACTIVE else M.QUEUED if k.waiter is not None else M.RESUMING
    done = M.step(_RESIDENCY[(stage, k.hinted and stage in _HINTABLE)], event)
    k.state = WAKING if done.state.stage in _WAKING else done.state.stage
    return done.effects


def _plain_start(k: _Kernel, w: Waiter) -> bool:
    """A start in the queue that only room can refuse (no quota, no budget)."""
    return k.room_only and w.lease_id is None


def _started_first(k: _Kernel) -> tuple[float, str]:
    return (k.lease.created if k.lease is not None else math.inf, k.s.id)


def replay(workload: Workload, config: Configuration, gpus, **kwargs) -> Tally:
    """One replay of ``workload`` under ``config`` on ``gpus``."""
    return Replay(workload, config, gpus, **kwargs).run()
