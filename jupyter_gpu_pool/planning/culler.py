"""The replay's culler: each server's culling passes on its schedule (a grid: phase and interval), a warned
kernel judged again at its deadline, the kernels given back to the queue's waiters or to a reservation, each
kernel's facts and the policy's answer, as the live culler reads and asks them (``pool.culling``,
``pool.reclaim``, ``pool.policy``).  What the answer does to a kernel is the replay's (``act``)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from ..pool import HIBERNATED, SOFT, Waiter
from ..pool import culling as C
from ..pool import policy as P
from ..pool import reclaim as R
from ..pool import residency as M
from .agenda import DEADLINE, PASS, Agenda
from .configuration import Configuration
from .kernels import HIBERNATING, RUNNING, ASLEEP, Kernel, started_first
from .metrics import Tally
from .reserving import Reserving
from .virtual_pool import VirtualPool
from .waiters import Waiters

_NOBODY: frozenset = frozenset()  # no kernel chosen for a waiter
Grid = tuple[float, float]


class Culler:
    def __init__(self, config: Configuration, pool: VirtualPool, tally: Tally, agenda: Agenda, waiters: Waiters,
                 act: Callable[[Kernel, float, str, str], None], *, every_pass: bool):
        """``act``: carry out an action on a kernel, as asked by an event of the residency model (the policy's
        ``idle``, its user's ``release``); ``every_pass``: judge every kernel on every
        pass instead of skipping those ``policy.quiet_until`` says cannot change."""
        self.pool, self.tally, self.agenda, self.waiters, self.act = pool, tally, agenda, waiters, act
        self.policy = config.policy
        self.thresholds = self.policy.thresholds
        self._grids: dict[Grid, dict[Kernel, None]] = {}  # each culler's kernels holding a lease
        self._due: dict[Grid, list] = {}  # per grid: (wake, seq, kernel), the earliest first
        self._judge_all = every_pass or bool(config.budgets.budgets)
        self._idle_rules = False  # a kernel started under a rule with an idle timeout (only such are reclaimed)
        # per grid: the kernels chosen for a waiter at its last pass
        self._reclaimed: dict[Grid, frozenset[Kernel] | set[Kernel]] = {}
        # reservations: their room, and per grid the kernels chosen to give it back at its last pass (and why)
        self.reserving = Reserving(config.sharing, pool, config.placement) if config.sharing.reservations else None
        self._reserved: dict[Grid, dict[Kernel, str]] = {}

    def start(self, grids, at: float) -> None:
        """Each grid's first pass, the first of its schedule from ``at``."""
        for phase, interval in dict.fromkeys(grids):
            self._grids[(phase, interval)] = {}
            self._due[(phase, interval)] = []
            self.agenda.push(at + (phase - at) % interval, PASS, (phase, interval))

    def join(self, k: Kernel) -> None:
        """``k`` holds a lease from now: its culler judges it at its next pass."""
        self._grids[k.grid][k] = None
        self._idle_rules = self._idle_rules or self.rule(k).idle_timeout is not None
        k.wake = 0.0
        heapq.heappush(self._due[k.grid], (0.0, next(self.agenda.seq), k))

    def leave(self, k: Kernel) -> None:
        self._grids[k.grid].pop(k, None)

    def touch(self, k: Kernel) -> None:
        """The kernel's facts changed: the next pass judges it."""
        if k.wake:
            k.wake = 0.0
            if k.lease is not None:
                heapq.heappush(self._due[k.grid], (0.0, next(self.agenda.seq), k))

    def rule(self, k: Kernel) -> P.Rule:
        lease = k.lease
        return self.policy.rule_for(lease.owner, lease.groups, lease.profile, k.s.kernelspec)

    def snooze(self, k: Kernel, now: float, seconds: float) -> None:
        """Its user's Keep alive, as the policy allows it (never of a kernel over its memory)."""
        if k.state not in (RUNNING, ASLEEP):
            return
        rule = self.rule(k)
        memory, limit = k.reading[0], k.lease.total_memory
        over = k.lease.isolation == SOFT and k.use is not None and memory is not None and memory > limit
        try:
            k.kstate = P.snooze(k.kstate, rule, now, min(seconds, rule.snooze), over_memory=over)
            self.tally.snoozes += 1
        except P.SnoozeRefused:
            self.tally.snoozes_refused += 1

    def release(self, k: Kernel, now: float) -> None:
        """Its user (or an admin) asked for its hibernation: a shutdown where it cannot hibernate, as the
        culler's ``release`` falls back; the checkpoint is refused while a cell runs, as the hibernator does."""
        if k.can and k.busy:
            self.tally.hibernations_refused += 1
            return
        self.tally.requested += 1
        self.act(k, now, P.HIBERNATE if k.can else P.SHUTDOWN, M.RELEASE)

    def pass_once(self, now: float, grid: Grid) -> None:
        self.agenda.push(now + grid[1], PASS, grid)
        members = self._grids[grid]
        if not members:
            return
        budgets: dict[str, object] = {}
        facts: dict[Kernel, tuple[P.Rule, P.Facts]] = {}  # this pass's, each kernel's read once
        judged = self._judged(grid, now)
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
        judged.sort(key=started_first)  # as the culler goes through its kernels: the oldest first
        due = self._due[grid]
        for k in judged:
            if k.state not in (RUNNING, ASLEEP) or k.hinted:
                k.wake = 0.0
                heapq.heappush(due, (0.0, next(self.agenda.seq), k))
                continue  # a move is under way (its lease has a phase), or a hint woke it and no cell came yet
                # (it goes back to sleep, unwarned, if none comes): the culler leaves it alone
            rule, f = facts.get(k) or self._facts(k, now, budgets)
            self._decide(k, now, rule, f, k in reclaimed, reserved.get(k, ""))

    def _judged(self, grid: Grid, now: float) -> list[Kernel]:
        """The kernels this pass judges: a kernel whose facts did not change since the policy said until when
        it stays quiet is skipped until then (policy.quiet_until); budget facts move with every lease of their
        owner, so with budgets every kernel is judged every pass."""
        members, due = self._grids[grid], self._due[grid]
        if self._judge_all:
            due.clear()
            return list(members)
        judged = []
        while due and due[0][0] <= now:
            wake, _, k = heapq.heappop(due)
            if wake == k.wake and k in members:
                judged.append(k)
        return judged

    def _decide(self, k: Kernel, now: float, rule: P.Rule, f: P.Facts, chosen: bool, reserved: str = "") -> None:
        """Ask the policy about one kernel and carry its answer out, as the culler's ``_decide``; a warned
        kernel is judged again at its warning's deadline (``deadline``), as the culler's timer does."""
        dry_run = self.policy.dry_run
        decision = P.decide(f, rule, now, k.kstate, reclaim=chosen, dry_run=dry_run, reserved=reserved)
        k.kstate = decision.state
        k.wake = max(P.quiet_until(f, rule, now, k.kstate, reclaim=chosen, dry_run=dry_run, reserved=reserved),
                     now + 1e-6)
        if k.wake != math.inf:
            heapq.heappush(self._due[k.grid], (k.wake, next(self.agenda.seq), k))
        if decision.verb == P.WARN:
            self.tally.decision(now, k.s.id, "warn", decision.reason, decision.action, decision.dry_run)
        elif decision.verb == P.ACT:
            self.tally.decision(now, k.s.id, "act", decision.reason, decision.action, decision.dry_run)
            if not decision.dry_run:
                self.act(k, now, decision.action, M.IDLE)
        warning = k.kstate.warning
        if warning is None:
            k.deadline = None
        elif warning.deadline != k.deadline and k.state in (RUNNING, ASLEEP):
            k.deadline = warning.deadline
            self.agenda.push(warning.deadline, DEADLINE, (k, warning.deadline))

    def deadline(self, now: float, item) -> None:
        """A warned kernel's deadline: judged again now (its facts, whether a waiter still needs its slice)."""
        k, deadline = item
        warning = k.kstate.warning
        if (k.deadline != deadline or warning is None or warning.deadline != deadline
                or k.state not in (RUNNING, ASLEEP) or k.hinted or k not in self._grids[k.grid]):
            return  # moved, withdrawn, snoozed, released, acted on or woken on a hint meanwhile
        k.deadline = None
        budgets: dict[str, object] = {}
        facts: dict[Kernel, tuple[P.Rule, P.Facts]] = {}
        members = self._grids[k.grid]
        reclaimed = self._reclaim(members, now, facts, budgets) if self.pool.queue and self._idle_rules else _NOBODY
        reserved = self._reserve(members, now, facts, budgets)
        rule, f = facts.get(k) or self._facts(k, now, budgets)
        self._decide(k, now, rule, f, k in reclaimed, reserved.get(k, ""))

    def _facts(self, k: Kernel, now: float, budgets: dict) -> tuple[P.Rule, P.Facts]:
        """The kernel's rule and facts at this pass, as the culler reads them (the sampler's latest reading
        recorded first)."""
        lease = k.lease
        rule = self.rule(k)
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
            budget=budgets[lease.owner], resumed=k.resumed)

    def _reclaim(self, members, now: float, facts: dict, budgets: dict) -> frozenset[Kernel] | set[Kernel]:
        """The kernels of this culler's server to give their slices back to the queue's waiters now, as
        the culler's ``reclaim`` chooses them (``pool.reclaim.choose_reclaim``, the same inputs): the
        candidates among its idle kernels, the whole pool's leases, each waiter with the GPUs it may take,
        its kernels being hibernated as room coming, and those warned for a waiter already."""
        candidates, freeing, warned = [], set(), set()
        for k in members:
            if k.state == HIBERNATING:
                freeing.add(k.lease.kernel_id)
                continue
            if k.state != RUNNING or k.busy or k.hinted or k.kstate.snoozed_until > now:
                continue  # not a candidate whatever its facts (pool.reclaim.candidate; a hinted one is not judged)
            rule = self.rule(k)
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
            waiting = self.waiters.kernel_of(w.id) if w.lease_id is not None else None
            if waiting is not None and waiting.lease is not None and waiting.lease.state == HIBERNATED:
                return waiting.lease
            return None

        needs = R.needs(pool.queue, usage, resuming)
        leases = list({lease.id: lease for held in pool.on_gpu.values() for lease in held.values()}.values())
        chosen = R.choose_reclaim([u.gpu for u in usage], leases, needs, candidates, freeing=freeing, warned=warned)
        ids = {c.kernel_id for c in chosen}
        return {k for k in members if k.lease is not None and k.lease.kernel_id in ids}

    def _reserve(self, members, now: float, facts: dict, budgets: dict) -> dict[Kernel, str]:
        """The kernels of this culler's server to give back room a reservation keeps, and why (as the
        culler's: candidates from ``pool.reclaim.reservation_candidate``, chosen by ``Reserving``)."""
        if self.reserving is None or not self.reserving.active(now):
            return {}
        found, freeing, warned = [], set(), set()
        for k in members:
            if k.state == HIBERNATING:
                freeing.add(k.lease.kernel_id)
            if k.state != RUNNING or k.busy or k.hinted:
                continue
            rule, f = facts[k] = facts.get(k) or self._facts(k, now, budgets)
            if k.kstate.warning is not None and k.kstate.warning.reason == P.RESERVED:
                warned.add(k.lease.kernel_id)
            action = P.release_action(rule, f.can_hibernate, f.hibernate_unavailable)[0]
            c = R.reservation_candidate(k.lease, rule, action, idle_since=f.last_activity, busy=False)
            if c is not None:
                found.append((k, c))
        return self.reserving.choose(found, now, freeing=freeing, warned=warned)
