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

Its rooms: ``agenda.py`` (what happens next), ``kernels.py`` (a session's kernel and its moves through the
model), ``waiters.py`` (the queue as the replay keeps it), ``culler.py`` (the passes, the policy's answers, the
kernels given back for waiters and reservations); here the users' sessions, the asks for slices and what each
move does to the virtual pool.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from ..pool import PoolExhausted
from ..pool import policy as P
from ..pool import residency as M
from ..pool.allocation import Ask, Grant
from ..pool.gpu_use import GPUUse
from ..pool.placement import choose
from ..pool.rules import FIRST_CELL
from . import agenda as A
from .agenda import Agenda
from .configuration import Configuration, Hint, PlanError
from .costs import COSTS, Costs
from .culler import Culler
from .kernels import ASKING, ASLEEP, DONE, HIBERNATING, LOST, RUNNING, UNSLICED, WAKING, Kernel, move
from .metrics import Tally
from .virtual_pool import VirtualPool
from .waiters import Waiters
from .workload import ACTIVE as ACT_EV, BUSY, END, GPU, HIBERNATE, IDLE, SNOOZE, Workload
from .workload import HINT as HINT_EV

FIRST = "first-cell"  # the ask of a kernel's first cell (slice_at first-cell)
AFTER_CELL = "after_cell"  # the reason of a hibernation by the rule's hibernate_after_cell (the journal's)
HINT_UNUSED = "hint_unused"  # the reason of a hibernation of a kernel a hint woke and no cell used (the journal's)


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
        self.agenda = Agenda()
        self.waiters = Waiters(self.pool, config.placement)
        self.culler = Culler(config, self.pool, self.tally, self.agenda, self.waiters, self._act, every_pass=every_pass)
        self._busy_share = 0.0
        self._asleep = 0
        self._step = max((workload.end - workload.start) / timeline_points, 1.0)
        self._kernels = [Kernel.of(s, config, workload, self.pool) for s in workload.sessions]
        for k in self._kernels:
            self.agenda.push(k.s.arrival, A.ASK, k)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> Tally:
        w, push = self.w, self.agenda.push
        self.culler.start((k.grid for k in self._kernels), w.start)
        push(w.start, A.SAMPLE, None)
        reserving = self.culler.reserving
        for at in reserving.boundaries(w.start, w.end) if reserving else ():
            push(at, A.PHASE, None)  # a reservation's room changes hands: the queue is served again
        handlers = {A.USER: self._user, A.ASK: self._ask, A.TIMEOUT: self._timeout, A.HIBERNATED: self._hibernated,
                    A.RESTORED: self._restored, A.HINT: self._hint, A.HINT_END: self._hint_end,
                    A.AFTER_CELL: self._after_cell, A.PASS: self.culler.pass_once,
                    A.SAMPLE: self._sample,
                    A.DEADLINE: self.culler.deadline, A.PHASE: lambda now, _item: self._serve(now)}
        heap, end, progress = self.agenda.heap, w.end, self.progress
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

    def _advance(self, k: Kernel, now: float) -> None:
        """Schedule the session's next event, moved by what the replay made its user wait; with the resume
        hint, a cell's hint ``lead`` seconds before it (not before now)."""
        nxt = next(k.events, None)
        if nxt is not None:
            at = nxt[0] + k.delay
            self.agenda.push(at, A.USER, (k, nxt))
            hint = self.config.hint
            if hint is not None and (nxt[1] == BUSY or nxt[1] == ACT_EV):
                self.agenda.push(max(at - hint.lead, now), A.HINT, k)

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
                # a cell comes while a hinted resume is under way (it waits for the rest, and the hint's
                # resume becomes one its user asked for), or while the kernel is being checkpointed (it waits
                # for the checkpoint, then the whole resume)
                k.cell_at = now
                if k.hinted:
                    self._used(k, now)
            k.pending = event  # the session waits for its kernel
            return
        self._continue(k, now, event)

    def _continue(self, k: Kernel, now: float, event) -> None:
        """``event`` happens now; the session goes on unless it must wait for its kernel."""
        self._deliver(k, now, event)
        if k.state != DONE and k.pending is None:
            self._advance(k, now)

    def _unpause(self, k: Kernel, now: float) -> None:
        """The kernel is there: the event that waited for it happens now (a first start: the whole session moves)."""
        event = k.pending
        if event is None:
            k.delay = now - k.s.arrival
            self._advance(k, now)
            return
        k.pending = None
        k.delay = max(k.delay, now - event[0])
        self._continue(k, now, event)

    def _deliver(self, k: Kernel, now: float, event) -> None:
        _, code, value = event
        self.culler.touch(k)
        if code == END:
            self._end(k, now)
        elif k.state == UNSLICED:
            if code == BUSY or code == ACT_EV:  # its first cell (a quick one: active) asks, as a resume does
                k.pending, k.state, k.asking, k.ask_at = event, ASKING, FIRST, now
                self.agenda.push(now, A.ASK, k)
            elif code == IDLE:
                k.busy = False
        elif (code == BUSY or code == ACT_EV) and k.state in (ASLEEP, LOST):
            # A cell (or other use) of a hibernated kernel resumes it first; of a kernel the replay shut
            # down, starts another one (its state is lost).
            if k.state == ASLEEP:
                move(k, M.CELL)  # it asks for a slice (its A.ASK, below)
                k.pending, k.asking, k.ask_at = event, "resume", now
                k.cell_at = k.cell_at if k.cell_at is not None else now  # (it came during the checkpoint)
                k.hinted = False
                self._asleep -= 1
            else:
                k.pending, k.state, k.asking, k.ask_at = event, ASKING, "restart", now
                self.tally.restarts += 1
            self.agenda.push(now, A.ASK, k)
        elif code == BUSY:
            k.last_activity = now
            k.used += 1
            if k.hinted:  # the hinted resume was done before its cell came: the cell did not wait
                self._used(k, now)
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
                self._used(k, now)
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
            self.culler.snooze(k, now, value)
        elif code == HIBERNATE and k.state == RUNNING:  # (asleep or shut down in this replay: nothing to do)
            self.culler.release(k, now)

    def _used(self, k: Kernel, now: float) -> None:
        """A cell (or other use) came for a kernel a hint woke, or is waking: the model's ``CELL`` makes it a
        resume its user asked for, and its ``RESTART_IDLE_CLOCK`` restarts the idle clock where it is awake
        (the live hook's ``used``); still restoring, the clock restarts when the restore is done."""
        if M.RESTART_IDLE_CLOCK in move(k, M.CELL):
            k.resumed = now
        k.hinted = False

    def _cell_ended(self, k: Kernel, now: float) -> None:
        """A cell (or other use) ended: under a rule with ``hibernate_after_cell``, the kernel hibernates
        that long after unless it is used again."""
        if k.state != RUNNING or not k.can:  # (an MPS client cannot be checkpointed: no after-cell for it)
            return
        after = self.culler.rule(k).hibernate_after_cell
        if after is not None:
            self.agenda.push(now + after, A.AFTER_CELL, (k, k.used))

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

    def _stop_busy(self, k: Kernel, now: float) -> None:
        self.tally.busy(k.busy_share * (now - k.busy_at))
        self._busy_share -= k.busy_share
        k.busy = False
        if k.resume_wait is not None:  # the cell a resume made wait is done: how much longer it felt
            self.tally.resumed_cell(now - k.busy_at, k.resume_wait)
            k.resume_wait = None

    def _resume_waited(self, k: Kernel, seconds: float) -> None:
        """The cell that needed a resumed kernel waited ``seconds`` for it (queue and restore, less a hint's
        head start)."""
        self.tally.resume_delay(seconds)
        k.resume_wait, k.cell_at, k.hinted = seconds, None, False

    def _end(self, k: Kernel, now: float) -> None:
        if k.busy:
            self._stop_busy(k, now)
        if k.state == ASLEEP:
            self._asleep -= 1
        if k.lease is not None:
            self._drop(k, now)
            self._serve(now)
        k.state = DONE

    def _drop(self, k: Kernel, now: float) -> None:
        self.pool.release(k.lease, now)
        self.culler.leave(k)
        k.lease = None

    # -- asking for slices ----------------------------------------------------------------------

    def _ask(self, now: float, k: Kernel) -> None:
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

    def _start_ask(self, k: Kernel) -> Ask:
        return Ask(owner=k.s.user, kernel_id=f"{k.s.id}~{k.starts}" if k.starts else k.s.id,
                   profile=k.profile, groups=k.s.groups)

    def _try_start(self, k: Kernel, now: float) -> None:
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
            self.waiters.enqueue(k, now, ask.kernel_id, None)
        elif full and self.config.queue_timeout > 0:
            self.waiters.enqueue(k, now, ask.kernel_id, None)
            self.agenda.push(now + self.config.queue_timeout, A.TIMEOUT, (k, k.token))
        else:
            self._refused(k, now, reason)

    def _refused(self, k: Kernel, now: float, reason: str) -> None:
        self.tally.refused(k.s.id, now, reason, k.asking)
        if k.asking == FIRST:  # the cell fails; the kernel goes on without a slice, its next cell asks again
            k.state, k.pending = UNSLICED, None
            self._advance(k, now)
            return
        if k.s.retry is not None:
            self.agenda.push(now + k.s.retry, A.ASK, k)  # a synthetic user tries again
            return
        self.tally.unserved(k.s.id, now - k.ask_at, k.asking, k.s, k.ask_at)  # a recorded one went on without it
        k.state, k.pending = DONE, None

    def _timeout(self, now: float, item) -> None:
        k, token = item
        if k.waiter is None or k.token != token:
            return
        self.waiters.leave(k)
        self._refused(k, now, PoolExhausted.reason)
        self._serve(now)

    def _started(self, k: Kernel, ask: Ask, grant: Grant, now: float) -> None:
        k.lease = self.pool.take(ask, grant, now)
        k.token += 1
        k.starts += 1
        k.state = RUNNING
        k.kstate, k.busy_since, k.last_activity, k.use, k.reading = P.FRESH, None, None, None, (0, 0.0)
        k.resumed = None
        self.culler.join(k)
        self.tally.served(k.s.id, now - k.ask_at, k.asking, k.s, k.ask_at)
        if k.s.once:  # refused when recorded: its user went on without it
            self._drop(k, now)
            k.state = DONE
            self._serve(now)
            return
        self._unpause(k, now)

    def _try_resume(self, k: Kernel, now: float, waiter_id: str | None) -> None:
        ask = self.pool.resume_ask(k.lease, k.profile, same_gpu=k.s.declared)
        result = self.pool.ask(ask, now, waiter_id)
        if isinstance(result, PoolExhausted):
            move(k, M.NO_ROOM)  # it waits in the queue
            if k.waiter is None:
                self.waiters.enqueue(k, now, k.lease.kernel_id, k.lease.id)
            return
        if k.waiter is not None:
            self.waiters.leave(k)
        if isinstance(result, Grant):
            self._wake(k, ask, result, now)
            return
        self.tally.refused(k.s.id, now, result.reason, "resume")
        move(k, M.QUOTA_REFUSED)
        k.pending, k.cell_at = None, None  # the cell fails; the kernel sleeps on
        self._asleep += 1
        self._advance(k, now)

    def _wake(self, k: Kernel, ask: Ask, grant: Grant, now: float) -> None:
        """The resume has its slice: the restore starts (the model's RESTORE, only ever on a slice granted)."""
        restore = M.RESTORE in move(k, M.SLICE_GRANTED)
        k.lease = self.pool.take(ask, grant, now, k.lease)
        self.tally.served(k.s.id, now - k.ask_at, "resume", k.s, k.ask_at)
        self.tally.resumed += 1
        if restore:
            self.agenda.push(now + (0.0 if k.s.declared else self.costs.resume.seconds(k.moved())), A.RESTORED, k)

    def _hint(self, now: float, k: Kernel, hold: float | None = None) -> None:
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
        move(k, M.HINT)  # the model's one try, granted: declined, it would have slept on quietly (above)
        k.asking, k.ask_at, k.cell_at = "resume", now, None
        self._asleep -= 1
        self.tally.hints += 1
        k.hint_token += 1
        if hold is None:
            hold = (self.config.hint or Hint()).hold
        self.agenda.push(now + hold, A.HINT_END, (k, k.hint_token, hold))
        self._wake(k, ask, result, now)

    def _hint_end(self, now: float, item) -> None:
        """No cell came within the hint's hold: the kernel hibernates again, without a warning, on record
        as the live server's ``hint_unused`` (not the policy's: a dry-run policy does not stop it)."""
        k, token, hold = item
        if not k.hinted or token != k.hint_token:
            return
        if k.state == WAKING:  # (a restore longer than the hold) it is judged once it is there
            self.agenda.push(now + hold, A.HINT_END, item)
            return
        if k.state == RUNNING:
            self.tally.hints_unused += 1
            self.tally.decision(now, k.s.id, "act", HINT_UNUSED, P.HIBERNATE, False)
            self._act(k, now, P.HIBERNATE, M.HINT_UNUSED)
        k.hinted = False

    def _restored(self, now: float, k: Kernel) -> None:
        if k.state != WAKING:
            return
        if M.RESTART_IDLE_CLOCK in move(k, M.RESTORE_DONE):  # a resume its user asked for (not a hint's)
            k.resumed = now
        self.culler.touch(k)
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
        """Room may have freed: each waiter worth asking again (``Waiters.worth_asking``), in queue order, asks."""
        for k, w in self.waiters.worth_asking(now):
            if k.state == WAKING:
                self._try_resume(k, now, w.id)
                continue
            ask = self._start_ask(k)
            result = self.pool.ask(ask, now, w.id)
            if isinstance(result, PoolExhausted):
                continue
            self.waiters.leave(k)
            if isinstance(result, Grant):
                self._started(k, ask, result, now)
            else:
                self._refused(k, now, result.reason)

    # -- the moves (through the residency model) ----------------------------------------------------

    def _act(self, k: Kernel, now: float, action: str, event: str = M.IDLE) -> None:
        """Carry out the policy's ``action`` (or, by ``event``, its user's Release, an after-cell or an unused
        hint's hibernation)."""
        if action == P.HIBERNATE and k.state == RUNNING:
            if k.busy:  # the hibernator refuses a kernel running a cell, and it runs on
                self.tally.hibernations_refused += 1
                return
            if M.CHECKPOINT in move(k, event):  # its slice is held until the checkpoint is done
                cost = 0.0 if k.s.declared else self.costs.hibernate.seconds(k.moved())
                self.agenda.push(now + cost, A.HIBERNATED, k)
            return
        if k.busy:
            self._stop_busy(k, now)
        if k.state == ASLEEP:
            self._asleep -= 1
        k.hinted = False
        self.tally.shut_down += 1
        move(k, M.KERNEL_GONE)  # (LOST: a use of it starts another kernel)
        self._drop(k, now)
        self._serve(now)

    def _hibernated(self, now: float, k: Kernel) -> None:
        if k.state != HIBERNATING:
            return
        self.tally.host_bytes(k.moved())
        if M.GIVE_BACK in move(k, M.CHECKPOINT_DONE):  # its memory in host RAM: the slice goes back
            k.lease = self.pool.hibernate(k.lease, now)
        self.culler.touch(k)
        self._asleep += 1
        k.kstate = P.FRESH  # as the culler: the policy's memory of a hibernated kernel starts afresh
        self.tally.hibernated += 1
        if k.pending is not None:  # an event came during the checkpoint
            self._unpause(k, now)
        self._serve(now)

    # -- the record ---------------------------------------------------------------------------

    def _sample(self, now: float, _item) -> None:
        self.tally.sample(now, self.pool.held_share, self._busy_share, len(self.pool.queue), self._asleep)
        self.agenda.push(now + self._step, A.SAMPLE, None)


def replay(workload: Workload, config: Configuration, gpus, **kwargs) -> Tally:
    """One replay of ``workload`` under ``config`` on ``gpus``."""
    return Replay(workload, config, gpus, **kwargs).run()
