"""The culler: gathers each pool kernel's facts, asks the policy, carries the decision out.

It runs on the server's event loop and never blocks it: the ledger and NVML are read in threads
(the backend, the telemetry sampler), deciding is pure and fast (``pool.policy.decide``), and
actions (shutdown, hibernation) run as their own tasks so that one slow checkpoint does not hold up
the pass (at most ``concurrency`` of the policy's at once).  A warned kernel is acted on at its
warning's deadline, not at the first pass after it: the culler sets a timer for that moment
(``Culler.timers``) which judges the kernel again then (its facts, the queue's waiters) and acts if
the policy still says so; a snooze, a release or a withdrawn warning cancels the timer.  What is
under way on a kernel is the ledger's to say (the lease's phase: a shutdown claims the lease by
compare-and-set, the hibernator claims it for a move), so a kernel with a phase is left alone; the
culler keeps only the policy's memory of each kernel (its warning and snoozes), its deadline timers
and its own running tasks, which it shows the REST views through a read-only :class:`ServerContext`.
Everything that acts, warns or is snoozed is put on record through the :class:`Recorder`; what a user
reads of an action done on request is written in ``messages``.  Admins' requests for this server's
kernels arrive on the pool's journal (``admin_requests``); its :class:`JournalWatch` reads them each pass and
they are carried out here (``act``), like a user's own.

A *pool kernel* is a kernel of this server that holds a lease.  Other kernels are left to
jupyter_server (and its own culler, if on).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from types import MappingProxyType
from typing import Any

from ..hibernation import HibernationFailed, HibernationRefused
from ..kernel_provisioner.base import PoolKernelProvisioner, shut_down
from ..periodic import every
from ..pool import HIBERNATED, Lease, Snapshot
from ..pool import culling as C
from ..pool import reclaim as R
from ..pool.liveness import SERVER_STOPPED
from ..pool.phases import HIBERNATING, STOPPING
from ..pool.budgets import Standing
from ..pool import policy as P
from ..pool.rules import Policy
from ..pool.reservations import named_in
from ..pool.units import unix_time
from ..pool.words import cannot_hibernate, shut_down_instead
from . import messages, metrics
from .activity import ActivityRecorder
from .backends.base import PoolBackend
from .context import Acting, Seen, ServerContext
from .journal_watch import JournalWatch
from .sleep.hook import HibernationHook
from .notebooks import Notebooks
from .recorder import Recorder

log = logging.getLogger(__name__)

# jupyter_server's culler reads a per-kernelspec ``cull_idle_timeout`` from the kernel's spec
# metadata; this value (ten years) exempts pool kernels from it.
SERVER_CULLER_EXEMPT = 10 * 365 * 86400


class Culler:
    def __init__(self, *, kernel_manager, backend: PoolBackend, sampler, recorder: Recorder,
                 web_settings: dict | None = None, hibernator_getter=HibernationHook,
                 exempt_server_culler: bool = True, clock=time.time, activity: ActivityRecorder | None = None,
                 concurrency: int = 10, notebooks: Notebooks | None = None):
        self.km = kernel_manager
        self.backend = backend
        self.sampler = sampler
        self.recorder = recorder
        self.web_settings = web_settings if web_settings is not None else {}
        self.exempt_server_culler = exempt_server_culler
        self.clock = clock
        self.activity = activity  # the planner's activity trace, where the pool keeps one
        self.states: dict[str, P.KernelState] = {}  # the policy's memory: warnings given, snoozes used
        self.busy_since: dict[str, float] = {}
        self.resumed: dict[str, float] = {}  # when a resume its user asked for last put each kernel on its slice
        self.acting: dict[str, Acting] = {}  # this server's actions under way, by kernel
        self.timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}  # warned kernels: (deadline, its call)
        self._deciding = asyncio.Lock()  # a pass and a deadline's check decide one at a time
        self.seen: dict[str, Seen] = {}
        self.last_snapshot: Snapshot | None = None
        self.passes = 0
        self.grid: tuple[float, float] | None = None  # (first pass, interval) once running
        self.slots = asyncio.Semaphore(concurrency)  # the policy's actions in flight at once
        self._deadline_tasks: set[asyncio.Task] = set()
        self.context = ServerContext(km=kernel_manager, backend=backend, sampler=sampler, hook=hibernator_getter,
                                     states=MappingProxyType(self.states), seen=MappingProxyType(self.seen),
                                     acting=MappingProxyType(self.acting), passes=lambda: self.passes,
                                     notebooks=notebooks or Notebooks())
        self.journal = JournalWatch(backend=backend, recorder=recorder, context=self.context, act=self.act)

    @property
    def policy(self) -> Policy:
        return self.backend.policy

    # -- facts ----------------------------------------------------------------------------

    def pool_kernels(self, snapshot: Snapshot) -> dict[str, tuple[Any, Lease]]:
        """This server's kernels that hold a lease: kernel id -> (kernel manager, lease)."""
        leases = {lease.kernel_id: lease for lease in snapshot.leases}
        found = {}
        for kid in list(self.km.list_kernel_ids()):
            lease = leases.get(kid)
            if lease is None:
                continue
            try:
                found[kid] = (self.km.get_kernel(kid), lease)
            except KeyError:  # shut down meanwhile
                continue
        return found

    def facts(self, kernel_id: str, kernel, lease: Lease, rule: P.Rule, now: float,
              budget: Standing | None = None) -> P.Facts:
        execution_state = kernel.execution_state or "unknown"
        last_activity = unix_time(kernel.last_activity)
        since = C.busy_since(self.busy_since.get(kernel_id), execution_state, last_activity, now)
        if since is None:
            self.busy_since.pop(kernel_id, None)
        else:
            self.busy_since[kernel_id] = since
        reading = self.sampler.reading(kernel_id)
        can, why = self.context.hibernation(lease)
        return C.kernel_facts(
            lease, execution_state=execution_state, last_activity=last_activity, busy_since=since,
            gpu_active=self.sampler.last_gpu_activity(kernel_id, rule.gpu_idle_threshold),
            gpu_idle_since=self.sampler.gpu_idle_since(kernel_id, rule.gpu_idle_threshold),
            memory_used=reading.memory_used if reading else None, can_hibernate=can, why=why, budget=budget,
            resumed=self.resumed.get(kernel_id))

    def user_resumed(self, kernel_id: str) -> None:
        """A resume the kernel's user asked for put it back on its slice (the hook says so: its Resume, a
        cell): its idle clock restarts now.  The policy's memory keeps its warnings and snoozes; its next
        judgement, with the clock restarted, withdraws a warning no longer due."""
        self.resumed[kernel_id] = self.clock()

    # -- one pass -----------------------------------------------------------------------------

    async def pass_once(self) -> None:
        await self.backend.reconcile()
        async with self._deciding:
            snapshot = await self.backend.snapshot()
            self.last_snapshot = snapshot
            now = self.clock()
            kernels = self.pool_kernels(snapshot)
            await self._follow_renames(kernels)
            self.sampler.track({kid: (k.provisioner.pid or -1, frozenset(lease.gpus))
                                for kid, (k, lease) in kernels.items()
                                if isinstance(k.provisioner, PoolKernelProvisioner)})
            judged, gpu_active = await self._judge(kernels, now)
            reclaimed = self.reclaim(snapshot, kernels, judged, now)
            reserved = await reserved_kernels(self.backend, self.context, self.states, kernels, judged)
            for kid, lease, rule, facts in judged:
                await self._decide(kid, lease, rule, facts, now, reclaim=kid in reclaimed, reserved=reserved.get(kid, ""))
            for gone in (set(self.states) | set(self.resumed)) - set(kernels):
                self.states.pop(gone, None)
                self.seen.pop(gone, None)
                self.busy_since.pop(gone, None)
                self.resumed.pop(gone, None)
                self._unschedule(gone)
        if gpu_active:
            self.report_gpu_activity()
        if self.activity is not None:
            await self.activity.observe(snapshot, kernels, now=now, context=self.context, grid=self.grid)
        await self.journal.follow(snapshot)
        self._update_metrics(snapshot, kernels)
        self.passes += 1

    async def _follow_renames(self, kernels: dict) -> None:
        """Give the pool the notebook's new name where its user renamed or moved it (jupyter_server's
        session path), so that other servers' views (an admin's dashboard) and the CLI show it too."""
        paths = await self.context.notebooks.paths()
        for kid, (_kernel, lease) in kernels.items():
            path = paths.get(kid)
            if path and path != lease.label:
                try:
                    await self.backend.relabel(lease, path)
                except Exception:  # a name is not worth a failed pass
                    log.exception("GPU pool: could not rename kernel %s's lease to %r", kid, path)

    async def _judge(self, kernels: dict, now: float) -> tuple[list[tuple[str, Lease, P.Rule, P.Facts]], bool]:
        """Each kernel's rule and facts (kernels with a move or an action under way left out), and whether
        any of them uses its GPU."""
        gpu_active = False
        budgets: dict[str, Standing | None] = {}  # per owner, once a pass
        judged: list[tuple[str, Lease, P.Rule, P.Facts]] = []
        for i, (kid, (kernel, lease)) in enumerate(kernels.items()):
            if i % 500 == 499:
                await asyncio.sleep(0)  # thousands of kernels: let requests in between
            self._exempt_from_server_culler(kernel)
            if lease.phase or self.context.busy(kid):
                continue  # a move or a shutdown is under way: the ledger's phase says which
            if lease.awaits_first_cell:
                continue  # it has held nothing yet: nothing to give back, and no hibernation to time out
            if self.context.hibernator.hinted(kid) or self.context.hibernator.resume_asked(kid):
                continue  # woken on a hint, no cell yet (back to sleep unwarned if none comes), or its user asked
                # for it awake: judged once it is, its idle clock restarted
            rule = self.context.rule_for(kernel, lease)
            if lease.owner not in budgets:
                budgets[lease.owner] = await self.backend.budget(lease.owner, lease.groups)
            facts = self.facts(kid, kernel, lease, rule, now, budgets[lease.owner])
            reading = self.sampler.reading(kid)
            if reading and reading.utilization is not None and reading.utilization >= rule.gpu_idle_threshold:
                gpu_active = True
            judged.append((kid, lease, rule, facts))
        return judged, gpu_active

    async def _decide(self, kid: str, lease: Lease, rule: P.Rule, facts: P.Facts, now: float, *,
                      reclaim: bool, reserved: str = "") -> None:
        """Ask the policy about one kernel, keep its answer, carry it out, and keep the kernel's deadline
        timer in step with its warning."""
        decision = P.decide(facts, rule, now, self.states.get(kid, P.FRESH), reclaim=reclaim,
                            dry_run=self.policy.dry_run, reserved=reserved,
                            reservation=named_in(reserved, self.backend.sharing.reservations) if reserved else "")
        self.states[kid] = decision.state
        self.seen[kid] = Seen(rule, facts, decision)
        if decision.verb != P.NONE:
            await self.apply(kid, lease, rule, decision, decided=now)
        self._schedule(kid)

    # -- deadlines ----------------------------------------------------------------------------------

    def _schedule(self, kid: str) -> None:
        """Keep one timer per warned kernel, at its warning's deadline (none without a warning)."""
        warning = self.states.get(kid, P.FRESH).warning
        if warning is None or kid in self.acting:
            self._unschedule(kid)
            return
        found = self.timers.get(kid)
        if found is not None and found[0] == warning.deadline:
            return
        self._unschedule(kid)
        # a few milliseconds after the deadline: the loop's clock and ours may differ by that much, and
        # decide never acts before the deadline (it would answer "not yet" and we would come back)
        delay = max(warning.deadline - self.clock(), 0.0) + 0.005
        handle = asyncio.get_running_loop().call_later(delay, self._due, kid, warning.deadline)
        self.timers[kid] = (warning.deadline, handle)

    def _unschedule(self, kid: str) -> None:
        found = self.timers.pop(kid, None)
        if found is not None:
            found[1].cancel()

    def _due(self, kid: str, deadline: float) -> None:
        found = self.timers.get(kid)
        if found is None or found[0] != deadline:
            return  # moved or cancelled meanwhile
        self.timers.pop(kid, None)
        task = asyncio.get_running_loop().create_task(self.at_deadline(kid))
        self._deadline_tasks.add(task)
        task.add_done_callback(self._deadline_tasks.discard)

    async def at_deadline(self, kid: str) -> None:
        """A warned kernel's deadline has come: judge it again now (its facts; for a kernel warned for a
        waiter, whether one still waits for its slice) and act if the policy says so, as a pass would."""
        try:
            async with self._deciding:
                if self.states.get(kid, P.FRESH).warning is None or self.context.busy(kid):
                    return  # snoozed, released or withdrawn meanwhile
                snapshot = await self.backend.snapshot()
                now = self.clock()
                kernels = self.pool_kernels(snapshot)
                if kid not in kernels:
                    return
                judged, _active = await self._judge(kernels, now)
                mine = [entry for entry in judged if entry[0] == kid]
                if not mine:
                    return
                reclaimed = self.reclaim(snapshot, kernels, judged, now)
                reserved = await reserved_kernels(self.backend, self.context, self.states, kernels, judged)
                _kid, lease, rule, facts = mine[0]
                await self._decide(kid, lease, rule, facts, now, reclaim=kid in reclaimed,
                                   reserved=reserved.get(kid, ""))
        except Exception:
            log.exception("GPU pool: kernel %s: acting at its deadline failed", kid)

    def reclaim(self, snapshot: Snapshot, kernels: dict, judged: list, now: float) -> set[str]:
        """The kernels of this server to give their slices back to the waiters in the queue now
        (``pool.reclaim``): fewest, hibernation before shutdown, on a GPU a waiter may take."""
        if not snapshot.waiters:
            return set()
        candidates = []
        for kid, lease, rule, facts in judged:
            action = P.release_action(rule, facts.can_hibernate, facts.hibernate_unavailable)[0]
            state = self.states.get(kid, P.FRESH)  # a failed hibernation's wait counts like a snooze
            found = R.candidate(lease, rule, action, idle_since=facts.last_activity,
                                busy=facts.execution_state == "busy", now=now,
                                snoozed_until=max(state.snoozed_until, state.retry_after))
            if found is not None:
                candidates.append(found)
        if not candidates:
            return set()
        hibernated = {lease.id: lease for lease in snapshot.leases if lease.state == HIBERNATED}
        usage = snapshot.gpus
        needs = R.needs(snapshot.waiters, usage, lambda w: hibernated.get(w.lease_id) if w.lease_id else None)
        freeing = {kid for kid, (_k, lease) in kernels.items() if self.context.busy(kid) or lease.phase in (
            HIBERNATING, STOPPING)}
        warned = {kid for kid, state in self.states.items() if state.warning and state.warning.reason == P.PRESSURE}
        chosen = R.choose_reclaim([u.gpu for u in usage], list(snapshot.leases), needs, candidates, freeing=freeing,
                                  warned=warned)
        return {c.kernel_id for c in chosen}

    def report_gpu_activity(self) -> None:
        """Count GPU use as server activity (``/api/status``, JupyterHub's idle culler): jupyter_server
        takes the latest of every setting whose name ends in ``_last_activity``."""
        self.web_settings["gpu_pool_last_activity"] = datetime.datetime.now(datetime.timezone.utc)

    def _exempt_from_server_culler(self, kernel) -> None:
        if not self.exempt_server_culler or not self.km.cull_idle_timeout:
            return
        spec = kernel.kernel_spec
        if spec is not None and spec.metadata.get("cull_idle_timeout") != SERVER_CULLER_EXEMPT:
            spec.metadata["cull_idle_timeout"] = SERVER_CULLER_EXEMPT

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Pass after pass until ``stop`` is set, on a fixed schedule (``grid``: its start and interval,
        which the activity trace records so that a replay passes when this culler did)."""
        self.grid = (self.clock(), interval)
        await every(interval, self.pass_once, stop, what="culling pass", start=self.grid[0], clock=self.clock)

    # -- carrying decisions out -----------------------------------------------------------------

    async def apply(self, kid: str, lease: Lease, rule: P.Rule, decision: P.Decision, *,
                    decided: float | None = None) -> None:
        if decision.verb == P.WITHDRAW:
            log.info("kernel %s: warning (%s) withdrawn, it is in use again", kid, decision.reason)
            return
        if decision.verb == P.WARN:  # told now, later than its pass decided: the whole warning time from now
            self.states[kid] = state = P.told(self.states[kid], self.clock())  # (its timer follows)
            await self.recorder.record("warned", lease, reason=decision.reason or "", message=decision.message,
                                       rule=rule.name, dry_run=decision.dry_run, deadline=state.warning.deadline,
                                       action=decision.action, note=decision.note)
            return
        if decision.dry_run:
            kind = "hibernated" if decision.action == P.HIBERNATE else "culled"
            await self.recorder.record(kind, lease, reason=decision.reason or "", message=decision.message,
                                       rule=rule.name, dry_run=True, action=decision.action, note=decision.note)
            return
        action = decision.action or P.SHUTDOWN
        self.spawn(kid, action, self._bounded(self.carry_out(kid, lease, rule, action,
                                                     decision.reason or "", decision.message, decision.note,
                                                     user_release=False, decided=decided)))

    async def _bounded(self, action) -> None:
        """Run one of the policy's actions once fewer than ``concurrency`` run (it shows as under way,
        ``busy``, from when it was decided, so no later pass decides it again)."""
        async with self.slots:
            await action

    def spawn(self, kid: str, action: str, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.acting[kid] = Acting(task, action, self.clock())
        self._unschedule(kid)  # under way: no deadline left to wait for
        task.add_done_callback(lambda _t: self.acting.pop(kid, None))

    async def carry_out(self, kid: str, lease: Lease, rule: P.Rule, action: str, reason: str, message: str,
                        note: str | None, user_release: bool, *, decided: float | None = None) -> None:
        """Hibernate or shut the kernel down as decided, and put what happened on record (``decided``: when
        the pass decided it, on record beside when it was done)."""
        expect: str | None = lease.phase
        when = {"decided": decided} if decided is not None else None
        try:
            if action == P.HIBERNATE:
                try:
                    outcome = await self.context.hibernator.hibernate(kid, reason)
                except HibernationRefused as e:
                    if e.keep_running:  # refused for now (busy GPU, host RAM): leave it be
                        log.info("kernel %s: not hibernated now, it keeps running: %s", kid, e)
                        await self.recorder.record("refused", lease, reason=e.reason, message=e.message,
                                                   rule=rule.name, action=P.HIBERNATE)
                        return
                    note = shut_down_instead(e.message)
                except HibernationFailed as e:
                    extra = {"states": {str(p): s for p, s in e.states.items()}, "recovered": e.recovered}
                    if e.recovered and not user_release:  # our failure: the kernel runs on, its variables kept
                        state = P.hibernation_failed(self.states.get(kid, P.FRESH), rule, self.clock())
                        self.states[kid] = state
                        log.warning("kernel %s: hibernation failed (%s); it keeps running", kid, e)
                        await self.recorder.record("hibernation_failed", lease, reason=e.reason, rule=rule.name,
                                                   message=messages.hibernation_failed(
                                                       e.message, state.retry_after, self.clock()),
                                                   action=P.HIBERNATE, extra=extra)
                        return
                    log.warning("kernel %s: hibernation failed (%s); shutting it down instead", kid, e)
                    await self.recorder.record("hibernation_failed", lease, reason=e.reason, message=e.message,
                                               rule=rule.name, action=P.HIBERNATE, extra=extra)
                    note = f"hibernation failed ({e.message}), so shut down instead"
                    expect = None  # the failed move left its phase: the shutdown takes the lease from it
                else:
                    self.states[kid] = P.FRESH
                    await self.recorder.record("hibernated", outcome.lease or lease,
                                               reason=reason, message=f"{message} {outcome.message}".strip(),
                                               rule=rule.name, action=P.HIBERNATE,
                                               duration=round(outcome.duration, 3), bytes=outcome.bytes,
                                               declared=outcome.declared, extra=when)
                    return
            why = "released by its user" if user_release else f"culled: {reason} ({rule.described})"
            name = await self.context.notebooks.name(lease)  # its session ends with it
            if not await self.shutdown(kid, why, lease, expect=expect):
                return
            if user_release and note:
                message = messages.on_request(P.SHUTDOWN)
            if note:
                message = f"{message} ({note})"
            await self.recorder.record("released" if user_release else "culled", lease, reason=reason,
                                       message=message, rule=rule.name, action=P.SHUTDOWN, note=note, name=name,
                                       extra=when)
        except Exception:
            log.exception("kernel %s: %s (%s) failed", kid, action, reason)

    async def shutdown(self, kid: str, release_reason: str, lease: Lease, *, expect: str | None = "") -> bool:
        """Claim the lease for a shutdown (from phase ``expect``; None: from whatever phase) and shut
        the kernel down through jupyter_server; its provisioner releases the lease with our reason.
        False when another move holds the lease, or the kernel is gone."""
        if expect is not None and not await self.backend.claim_stop(lease):
            log.info("kernel %s: not shut down, another move holds its lease", kid)
            return False
        log.info("GPU pool: shutting down kernel %s (%s)", kid, release_reason)
        return await shut_down(self.km, kid, release_reason)

    # -- user requests ----------------------------------------------------------------------------

    async def snooze(self, kid: str, lease: Lease, rule: P.Rule, seconds: float | None) -> P.KernelState:
        now = self.clock()
        state = self.states.get(kid, P.FRESH)
        seen = self.seen.get(kid)
        over = bool(seen and seen.facts.memory_used is not None and seen.facts.memory_limit is not None
                    and seen.facts.isolation == "soft" and seen.facts.memory_used > seen.facts.memory_limit)
        new = P.snooze(state, rule, now, seconds, over_memory=over)  # raises SnoozeRefused
        self.states[kid] = new
        self._unschedule(kid)  # kept alive: nothing happens at the old deadline
        await self.recorder.record("snoozed", lease, reason="user", message=self._kept_alive(lease, rule, new),
                                   rule=rule.name, deadline=new.snoozed_until)
        return new

    def _kept_alive(self, lease: Lease, rule: P.Rule, state: P.KernelState) -> str:
        """What a Keep alive did, said once: until when, and what follows if the kernel stays idle."""
        seen = self.seen.get(lease.kernel_id)
        found = P.next_action(seen.facts, rule, state) if seen is not None else None
        then = None if found is None or found[0] > state.snoozed_until + 60 else found[2]
        return messages.kept_alive(state.snoozed_until, self.clock(), P.snoozes_left(state, rule), then)

    def release(self, kid: str, lease: Lease, rule: P.Rule) -> str:
        """Give the slice back now, as the rule says (hibernate where it can, else shut down)."""
        can, why = self.context.hibernation(lease)
        action, note = P.release_action(rule, can, why)
        self.states[kid] = P.FRESH
        self.spawn(kid, action, self.carry_out(kid, lease, rule, action, "user", messages.on_request(action), note,
                                       user_release=True))
        return action

    def act(self, lease: Lease, action: str, by: str | None) -> str:
        """Start ``action`` (one of ``admin_requests.ACTIONS``) on a kernel of this server; return what is
        done (hibernate or shutdown).

        ``by``: the admin who asked (None: the kernel's own user).  ``release`` is what the kernel's rule
        says (hibernate where it can, else shut down); a ``hibernate`` the kernel cannot do is refused
        (ValueError, saying why)."""
        kid = lease.kernel_id
        rule = self.context.rule_for(self.km.get_kernel(kid), lease)
        if action == "release" and by is None:
            return self.release(kid, lease, rule)  # the user's own Release GPU
        can, why = self.context.hibernation(lease)
        note = None
        if action == "hibernate":
            if lease.state == HIBERNATED:
                raise ValueError("it is hibernated already")
            if not can:
                raise ValueError(cannot_hibernate(why or "for a reason not known"))
            done = P.HIBERNATE
        elif action == "release":
            done, note = P.release_action(rule, can, why)
        else:
            done = P.SHUTDOWN
        self.states[kid] = P.FRESH
        self.spawn(kid, done, self.carry_out(kid, lease, rule, done, "user" if by is None else "admin",
                                       messages.on_request(done, by), note, user_release=True))
        return done

    def _update_metrics(self, snapshot: Snapshot, kernels: dict) -> None:
        per_kernel = {}
        for kid, (_, lease) in kernels.items():
            r = self.sampler.reading(kid)
            per_kernel[kid] = (lease.owner, lease.profile, r.utilization if r else None, r.memory_used if r else None)
        devices = {u.gpu.uuid: d for u in snapshot.gpus
                   if (d := self.sampler.device_utilization(u.gpu.uuid)) is not None}
        metrics.COLLECTOR.view = metrics.MetricsView(snapshot, self.backend.profiles(), devices, per_kernel)

    async def server_stopping(self) -> None:
        """The server stops: jupyter_server shuts every kernel down next (``shutdown_all``).  Each pool
        kernel's slice goes back with the reason on record, and its user's "What happened" says that
        it ended with the server (a hibernated kernel's variables are not kept past it)."""
        try:
            snapshot = await self.backend.snapshot()
        except Exception:  # the pool is unreachable: its reconcile names the reason when it sees us gone
            log.exception("GPU pool: could not read the pool as the server stops")
            return
        for kid, (kernel, lease) in self.pool_kernels(snapshot).items():
            if isinstance(kernel.provisioner, PoolKernelProvisioner):
                kernel.provisioner.release(SERVER_STOPPED)
            await self.recorder.record("released", lease, reason=SERVER_STOPPED, message=messages.SERVER_STOPPED,
                                       action=P.SHUTDOWN)

    async def stop(self) -> None:
        for kid in list(self.timers):
            self._unschedule(kid)
        for task in [doing.task for doing in self.acting.values()] + list(self._deadline_tasks):
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=30)
            except Exception:
                task.cancel()


async def reserved_kernels(backend: PoolBackend, context: ServerContext, states, kernels: dict,
                           judged: list) -> dict[str, str]:
    """The kernels of this server to give back room a reservation keeps now, each with why in words
    (``pool.reclaim.reserved_for`` on the whole pool, through the backend: non-members' idle kernels,
    hibernation first, fewest).  ``states``: the policy's memory of each kernel (who was warned already)."""
    if not backend.sharing.reservations:
        return {}
    candidates = [c for kid, lease, rule, facts in judged if (c := R.reservation_candidate(
        lease, rule, P.release_action(rule, facts.can_hibernate, facts.hibernate_unavailable)[0],
        idle_since=facts.last_activity, busy=facts.execution_state == "busy")) is not None]
    freeing = tuple(kid for kid, (_k, lease) in kernels.items() if context.busy(kid) or lease.phase in (
        HIBERNATING, STOPPING))
    warned = tuple(kid for kid, state in states.items() if state.warning and state.warning.reason == P.RESERVED)
    return await backend.reserved(candidates, freeing, warned)
