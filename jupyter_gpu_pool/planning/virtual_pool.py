"""The pool in virtual time: what is held where, the queue, and the GPU time spent, in memory.

A store like the SQLite ledger, and like it an adapter only: each request is judged by
``pool.allocation.allocate`` (with the queue's rules of ``pool.queue`` and the admin's sharing:
reservations, the fair queue's order from each share group's decayed use), a resume's GPUs by
``resume_candidates``, budgets by ``BudgetBook.standing`` over the spent intervals, a slice's cost by
``budgets.share_of`` and each GPU's usage by ``allocation.gpu_usage``.  It keeps per-GPU usage, per
owner and per group holdings up to date as leases change, so that one request costs what the GPUs
and the asker's own leases cost, not what the whole pool holds.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from ..pool import ACTIVE, HIBERNATED, MPS, GPU, Lease, PoolError, Waiter
from ..pool.allocation import Ask, Grant, Holdings, allocate, gpu_usage, mps_users, resume_candidates
from ..pool.budgets import Interval, Scope, Standing, hours_spent, share_of
from ..pool.fairshare import FAIR, Decaying
from ..pool.placement import GPUUsage
from ..pool.queue import ahead_of, reserve_for_waiters
from ..pool.quotas import Quota
from .configuration import Configuration


class VirtualPool:
    def __init__(self, config: Configuration, gpus: list[GPU]):
        self.config = config
        self.gpus = {g.uuid: g for g in gpus}
        self.usage = {g.uuid: u for g, u in zip(gpus, gpu_usage(gpus, []))}
        self.on_gpu: dict[str, dict[str, Lease]] = {g.uuid: {} for g in gpus}
        self.by_owner: dict[str, dict[str, Lease]] = defaultdict(dict)
        self.by_group: dict[str, dict[str, Lease]] = defaultdict(dict)
        self.mps: dict[str, Lease] = {}  # active MPS leases
        self.queue: list[Waiter] = []
        self._budgets = bool(config.budgets.budgets)
        self._spent: dict[str, list[Interval]] = defaultdict(list)  # per owner, and per group for shared budgets
        self._open: dict[str, list[tuple[list[Interval], int]]] = {}  # lease id -> where its open intervals are
        self.held_share = 0.0  # GPUs' worth held by active slices now
        self.peak_share = 0.0
        self.held_seconds = 0.0  # GPU-seconds held by slices that were given back
        self._held: dict[str, tuple[float, float]] = {}  # active lease id -> (share, since)
        self._tail: tuple[list[GPUUsage], str] | None = None  # room_after_queue's answer, while it holds
        self.sharing = config.sharing
        self._use: dict[str, Decaying] = defaultdict(lambda: Decaying(config.sharing.fair.half_life))  # fair queue

    # -- the decision's inputs ---------------------------------------------------------------

    def holdings(self, ask: Ask, now: float) -> Holdings:
        leases = dict(self.by_owner.get(ask.owner, {}))
        for group in self.config.quotas.limited_groups(ask.groups):
            leases.update(self.by_group.get(group, {}))
        return Holdings(leases=tuple(leases.values()), gpus=tuple(self.usage.values()), waiters=tuple(self.queue),
                        mps_users=mps_users(self.mps.values()) if ask.profile.isolation == MPS else {},
                        budget=self.standing(ask.owner, ask.groups, now), **self.shared(now))

    def shared(self, now: float) -> dict:
        """What sharing needs of the pool at ``now``: every active lease while a reservation keeps room,
        each share group's decayed use in a fair queue."""
        if self.sharing.plain:
            return {}
        found: dict = {}
        if self.sharing.needs_everyone(now):
            found["everyone"] = self.active()
        if self.sharing.order == FAIR and self.queue:
            found["group_use"] = {g: use.at_time(now) for g, use in self._use.items()}
        return found

    def active(self) -> tuple[Lease, ...]:
        """Every active lease."""
        return tuple({lease.id: lease for held in self.on_gpu.values() for lease in held.values()}.values())

    def line(self, now: float) -> tuple[Waiter, ...]:
        """The queue in the order it is served at ``now`` (sharing's, else arrival)."""
        if self.sharing.plain:
            return tuple(self.queue)
        shared = self.shared(now)
        return self.sharing.line(self.queue, now=now, gpus=tuple(self.usage.values()), use=shared.get("group_use", {}),
                                 everyone=shared.get("everyone", self.active())).waiters

    def standing(self, owner: str, groups: tuple[str, ...], now: float) -> Standing | None:
        if not self._budgets:
            return None
        book = self.config.budgets
        if not book.scopes(owner, groups):
            return None
        return book.standing(owner, groups, lambda scope, start: hours_spent(self._intervals(scope, owner), start, now),
                             lambda scope: sum(i.share for i in self._intervals(scope, owner) if i.end is None), now)

    def _intervals(self, scope: Scope, owner: str) -> list[Interval]:
        return self._spent[f"group:{scope.name}" if scope.kind == "shared" else owner]

    def ask(self, ask: Ask, now: float, waiter_id: str | None = None) -> Grant | PoolError:
        return allocate(self.holdings(ask, now), ask, self.config.quotas, now=now, placement=self.config.placement,
                        waiter_id=waiter_id, sharing=self.sharing)

    def resume_ask(self, lease: Lease, profile, same_gpu: bool) -> Ask:
        """A hibernated lease's request, as the ledger builds it: its last GPUs first, else one of their model."""
        only = resume_candidates(list(self.usage.values()), lease.last_gpus, same_gpu=same_gpu, same_model=True)
        return Ask(owner=lease.owner, kernel_id=lease.kernel_id, groups=lease.groups, new_kernel=False,
                   profile=dataclasses.replace(profile, slice=lease.slice), prefer=lease.last_gpus, only=only)

    # -- changes -----------------------------------------------------------------------------

    def take(self, ask: Ask, grant: Grant, now: float, lease: Lease | None = None) -> Lease:
        """Hold the granted slice: a new lease, or ``lease`` (hibernated) active again."""
        gpus = tuple(g.uuid for g in grant.gpus)
        if lease is None:
            spec = ask.profile.slice
            lease = Lease(id=ask.kernel_id, owner=ask.owner, kernel_id=ask.kernel_id, profile=ask.profile.name,
                          isolation=ask.profile.isolation, memory=grant.memory, sm_percent=spec.sm_percent,
                          whole=spec.whole, gpu_count=spec.gpu_count, state=ACTIVE, gpus=gpus, last_gpus=gpus,
                          groups=ask.groups, label="", created=now, updated=now, state_since=now)
        else:
            lease = dataclasses.replace(lease, state=ACTIVE, gpus=gpus, last_gpus=gpus, updated=now, state_since=now)
        self._hold(lease)
        self._place(lease, gpus)
        share = share_of(lease, grant.gpus[0].memory)
        self.held_share += share
        self.peak_share = max(self.peak_share, self.held_share)
        self._held[lease.id] = (share, now)
        if self.sharing.order == FAIR:
            self._use[self.sharing.share_group(lease.groups)].change(now, lease.total_memory)
        if self._budgets:
            spots = []
            for key in (lease.owner, *(f"group:{g}" for g in lease.groups)):
                spent = self._spent[key]
                spent.append(Interval(share, now))
                spots.append((spent, len(spent) - 1))
            self._open[lease.id] = spots
        return lease

    def release(self, lease: Lease, now: float) -> None:
        if lease.state == ACTIVE:
            self._unplace(lease, now)
        self.by_owner[lease.owner].pop(lease.id, None)
        for group in lease.groups:
            self.by_group[group].pop(lease.id, None)

    def hibernate(self, lease: Lease, now: float) -> Lease:
        """The slice goes back; the lease stays held (it counts as a kernel against quotas)."""
        self._unplace(lease, now)
        lease = dataclasses.replace(lease, state=HIBERNATED, gpus=(), last_gpus=lease.gpus, updated=now,
                                    state_since=now)
        self._hold(lease)
        return lease

    def share(self, lease: Lease) -> float:
        """What the lease's slice costs per hour (its share of its GPUs), 0 while hibernated."""
        held = self._held.get(lease.id)
        return held[0] if held else 0.0

    def held_until(self, now: float) -> float:
        """GPU-seconds held by every slice so far, the ones still held counted up to ``now``."""
        return self.held_seconds + sum(share * (now - since) for share, since in self._held.values())

    def _hold(self, lease: Lease) -> None:
        self.by_owner[lease.owner][lease.id] = lease
        for group in lease.groups:
            self.by_group[group][lease.id] = lease

    def _place(self, lease: Lease, gpus: tuple[str, ...]) -> None:
        for uuid in gpus:
            self.on_gpu[uuid][lease.id] = lease
            self._recount(uuid)
        if lease.isolation == MPS:
            self.mps[lease.id] = lease

    def _unplace(self, lease: Lease, now: float) -> None:
        share, since = self._held.pop(lease.id)
        if self.sharing.order == FAIR:
            self._use[self.sharing.share_group(lease.groups)].change(now, -lease.total_memory)
        self.held_share -= share
        self.held_seconds += share * (now - since)
        for uuid in lease.gpus:
            self.on_gpu[uuid].pop(lease.id, None)
            self._recount(uuid)
        self.mps.pop(lease.id, None)
        for spent, index in self._open.pop(lease.id, ()):
            i = spent[index]
            spent[index] = Interval(i.share, i.start, now)

    def _recount(self, uuid: str) -> None:
        self._tail = None
        [self.usage[uuid]] = gpu_usage([self.gpus[uuid]], list(self.on_gpu[uuid].values()))

    # -- the queue ---------------------------------------------------------------------------

    def enqueue(self, waiter: Waiter) -> None:
        self.queue.append(waiter)
        if self._tail is not None:  # the waiter at the end takes its slice from what the others left
            self._tail = reserve_for_waiters(self._tail[0], [waiter], self._tail[1]), self._tail[1]

    def dequeue(self, waiter_id: str) -> None:
        for i, w in enumerate(self.queue):  # (mostly the head: stop where it stands)
            if w.id == waiter_id:
                del self.queue[i]
                break
        self._tail = None

    def room_after_queue(self, placement: str) -> list[GPUUsage]:
        """Each GPU's usage after every waiter that fits took its slice: the room ``allocate`` gives a
        start that has no place in the queue.  Kept from one ask to the next while only waiters join."""
        if self._tail is None or self._tail[1] != placement:
            self._tail = reserve_for_waiters(list(self.usage.values()), self.queue, placement), placement
        return self._tail[0]

    def room_before(self, waiter_id: str, placement: str) -> list[GPUUsage]:
        """Each GPU's usage after every waiter ahead of ``waiter_id`` that fits took its slice: the room
        ``allocate`` gives that waiter's start (the queue's rules)."""
        return reserve_for_waiters(list(self.usage.values()), ahead_of(self.queue, waiter_id), placement)

    def only_room_refuses(self, owner: str, groups: tuple[str, ...]) -> bool:
        """Whether the only refusal a start of ``owner`` can get is for room (no quota limits them, no
        budget applies) and the room is the plain queue's (no sharing): then a start that fits nowhere in the
        room the waiters ahead leave is refused for room, and nothing else."""
        quotas = self.config.quotas
        return (self.sharing.plain and quotas.user_quota(owner) == Quota() and not quotas.limited_groups(groups)
                and not (self._budgets and self.config.budgets.scopes(owner, groups)))
