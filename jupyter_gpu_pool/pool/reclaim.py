"""Reclaim: which idle kernels give their slice back for the waiters in the queue now.

Pure.  Under pressure (someone waits in the queue for a slice) the pool takes back the least that
serves the waiters: for each waiter in queue order that the room left cannot serve, the set of
idle kernels whose slices would make room for it on a GPU it may take, chosen by, in order:

1. fewest kernels that would lose their state (an MPS kernel, or a rule whose action is shutdown;
   such a kernel is a candidate at all only where its rule's action is ``shutdown``);
2. fewest kernels;
3. the kernels warned for a waiter already (a choice holds while it still serves);
4. the least GPU memory taken back (a whole GPU is not taken for a 10 GiB waiter);
5. the longest idle.

A refused start is not a waiter (it left no place in the queue), and a waiter the room left serves
already needs nothing.  Kernels already on their way out (being hibernated or shut down) count as
room coming.

Reservations (``pool.reservations``) take their room back by the same choice
(:func:`choose_for_reservations`): from non-members' kernels on their GPUs, idle or not (a running
cell is left alone), from their lead time on, and during their window for a member who waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import combinations

from .allocation import gpu_usage, resume_candidates
from .gpus import GPU
from .leases import ACTIVE, Lease
from .placement import BINPACK, GPUUsage, choose
from .queue import Waiter
from .reservations import Slot, Unused
from .rules import SHUTDOWN, Rule
from .sharing import Line, Sharing

MAX_CANDIDATES = 12  # the longest-idle ones are weighed; more would only cost time


@dataclass(frozen=True, slots=True)
class Candidate:
    """One idle kernel that may give its slice back: its lease (GPUs, slice), what reclaiming it does
    (hibernate keeps its variables; shutdown loses them) and since when it is idle."""

    lease: Lease
    action: str  # hibernate or shutdown
    idle_since: float

    @property
    def kernel_id(self) -> str:
        return self.lease.kernel_id

    @property
    def loses_state(self) -> bool:
        return self.action == SHUTDOWN


@dataclass(frozen=True, slots=True)
class Need:
    """One waiter as reclaiming sees it: its slice and the GPUs it may take (None: any)."""

    waiter: Waiter
    only: tuple[str, ...] | None = None


def needs(waiters: Iterable[Waiter], usage: list[GPUUsage], resuming: Callable[[Waiter], Lease | None]) -> list[Need]:
    """Each waiter in queue order with the GPUs it may take: the resume of a hibernated lease
    (``resuming(waiter)``, None for a start) lands on its last GPUs' model (the ledger's rule)."""
    found = []
    for waiter in waiters:
        lease = resuming(waiter)
        only = None if lease is None else resume_candidates(usage, lease.last_gpus, same_gpu=False, same_model=True)
        found.append(Need(waiter, only))
    return found


@dataclass(frozen=True, slots=True)
class Choice:
    """One kernel to reclaim, the action, and the waiter it makes room for (or the reservation: ``slot``)."""

    kernel_id: str
    action: str
    waiter_id: str
    slot: Slot | None = None


def candidate(lease: Lease, rule: Rule, action: str, *, idle_since: float, busy: bool, now: float,
              snoozed_until: float = 0.0) -> Candidate | None:
    """The kernel as a candidate, or None where its rule does not let it be reclaimed now: it is busy,
    snoozed or not active, its rule has no idle timeout, it has been idle less than ``idle_timeout × pressure_factor``,
    or reclaiming would shut it down (its variables lost) and its rule's action is not shutdown."""
    if busy or snoozed_until > now or lease.state != ACTIVE or rule.idle_timeout is None:
        return None
    if now - idle_since < rule.idle_timeout * rule.pressure_factor:
        return None
    if action == SHUTDOWN and rule.action != SHUTDOWN:
        return None  # the rule keeps state (hibernate) and this kernel cannot: never lose it for a waiter
    return Candidate(lease, action, idle_since)


def _without(gpus: list[GPU], leases: Iterable[Lease], gone: set[str]) -> list[GPUUsage]:
    return gpu_usage(gpus, [lease for lease in leases if lease.kernel_id not in gone])


def _serves(usage: list[GPUUsage], need: Need, placement: str) -> list[GPU] | None:
    allowed = [u for u in usage if need.only is None or u.gpu.uuid in need.only]
    return choose(allowed, need.waiter.slice, placement)


def _least(left: list[Candidate], serves: Callable[[set[str]], object], warned: set[str]) -> tuple[tuple, object] | None:
    """The least set of ``left`` whose reclaim ``serves`` (returns what it serves with, None where it does
    not), by the order of this module's docstring; None where not even all of them serve."""
    if serves({c.kernel_id for c in left}) is None:
        return None  # taking more never makes less room
    best: tuple | None = None
    for size in range(1, len(left) + 1):
        if best is not None and best[0][0] == 0 and size > best[0][1]:
            break  # nothing larger beats a set that loses no state
        for combo in combinations(left, size):
            fit = serves({c.kernel_id for c in combo})
            if fit is None:
                continue
            key = (sum(c.loses_state for c in combo), size, -sum(c.kernel_id in warned for c in combo),
                   sum(c.lease.total_memory for c in combo), sum(c.idle_since for c in combo))
            if best is None or key < best[0]:
                best = (key, combo, fit)
    return None if best is None else (best[1], best[2])


def choose_reclaim(gpus: list[GPU], leases: list[Lease], needs: list[Need], candidates: list[Candidate], *,
                   freeing: Iterable[str] = (), warned: Iterable[str] = (), placement: str = BINPACK) -> list[Choice]:
    """The kernels to reclaim now for ``needs`` (the queue, in order), among ``candidates``.

    ``leases``: every held lease of the pool; ``freeing``: kernel ids whose slices are on the way back
    already (their room counts, and they are not chosen again); ``warned``: kernels warned for a waiter
    by an earlier pass (preferred among equals, so that a choice holds from pass to pass).  A waiter that
    no choice of candidates serves is passed over (the kernels it would take are not reclaimed in vain)."""
    gone = set(freeing)
    warned = set(warned)
    pool = {c.kernel_id: c for c in sorted(candidates, key=lambda c: c.idle_since) if c.kernel_id not in gone}
    weighed = list(pool.values())[:MAX_CANDIDATES]
    placed: list[Lease] = []  # the slices earlier waiters take, as leases on their GPUs
    chosen: list[Choice] = []
    for need in needs:
        usage = _without(gpus, [*leases, *placed], gone)
        fit = _serves(usage, need, placement)
        if fit is None:
            left = [c for c in weighed if c.kernel_id not in gone]
            held = [*leases, *placed]
            best = _least(left, lambda ids: _serves(_without(gpus, held, gone | ids), need, placement), warned)
            if best is None:
                continue
            combo, fit = best
            for c in combo:
                gone.add(c.kernel_id)
                chosen.append(Choice(c.kernel_id, c.action, need.waiter.id))
        placed.append(_placed(need.waiter, fit))
    return chosen


# -- reservations ------------------------------------------------------------------------------------------


def reservation_candidate(lease: Lease, rule: Rule, action: str, *, idle_since: float, busy: bool) -> Candidate | None:
    """The kernel as a candidate to give back reserved room, or None: it is busy (a running cell cannot be
    checkpointed), not active, or reclaiming would shut it down and its rule's action is not shutdown.
    Idle times and snoozes do not count: the room is reserved."""
    if busy or lease.state != ACTIVE:
        return None
    if action == SHUTDOWN and rule.action != SHUTDOWN:
        return None
    return Candidate(lease, action, idle_since)


def shortfall(usage: list[GPUUsage], need: Unused) -> tuple[int, int]:
    """What of ``need`` is not free on its GPUs: (bytes, whole GPUs).  Its whole GPUs are the empty ones
    (the emptiest first, as ``reservations.hold_back`` keeps them), its memory the free memory of the rest."""
    on = [u for u in usage if u.gpu.uuid in set(need.eligible)]
    empty = sorted((u for u in on if u.leases == 0 and not u.exclusive), key=lambda u: (u.memory, u.gpu.index))
    kept = {u.gpu.uuid for u in empty[: need.gpus]}
    free = sum(u.free_memory for u in on if u.gpu.uuid not in kept)
    return max(need.memory - free, 0), max(need.gpus - len(empty), 0)


def choose_for_reservations(gpus: list[GPU], leases: list[Lease], line: Line, candidates: list[Candidate], *,
                            freeing: Iterable[str] = (), warned: Iterable[str] = (),
                            placement: str = BINPACK) -> list[Choice]:
    """The kernels of non-members to reclaim now for the reservations keeping room (``line.unused``).

    From a reservation's lead time to as long after its window opens, the room its members leave unused
    is made free: the least set of candidates on its GPUs whose slices make it (this module's order:
    hibernation first, fewest, warned already, least memory, longest idle); where not even the weighed
    ones make all of it, all that do make some, in that order (members come one by one).  Later in the
    window, borrowed room is taken back only for members waiting in the queue: ``choose_reclaim`` for
    those waiters, among the non-members' kernels on its GPUs.  Each choice names its reservation
    (``Choice.slot``)."""
    gone = set(freeing)
    warned = set(warned)
    chosen: list[Choice] = []
    for need in line.unused:
        r = need.slot.reservation
        on = set(need.eligible)
        theirs = [c for c in candidates if c.kernel_id not in gone and not r.member(c.lease.owner, c.lease.groups)
                  and on & set(c.lease.gpus)]
        if need.slot.borrowing:
            members = [Need(w, tuple(on)) for w in line.waiters if r.member(w.owner, w.groups)]
            picks = choose_reclaim(gpus, leases, members, theirs, freeing=gone, warned=warned, placement=placement)
        else:
            picks = _make_room(gpus, leases, need, theirs, gone, warned)
        for pick in picks:
            gone.add(pick.kernel_id)
            chosen.append(replace(pick, slot=need.slot))
    return chosen


def reserved_for(sharing: Sharing, usage: list[GPUUsage], leases: list[Lease], waiters: list[Waiter],
                 candidates: list[Candidate], now: float, *, freeing: Iterable[str] = (), warned: Iterable[str] = (),
                 placement: str = BINPACK) -> dict[str, str]:
    """What a culler (live or replayed) asks: of ``candidates`` (its idle kernels, from
    :func:`reservation_candidate`), those to give back room the reservations keep now, each with the
    reason in words ("reserved for ML 101 lab from 10:00"); ``usage``, ``leases`` and ``waiters``: the pool."""
    if not candidates or not sharing.needs_everyone(now):
        return {}
    line = sharing.line(waiters, now=now, gpus=usage, everyone=leases, use={})
    chosen = choose_for_reservations([u.gpu for u in usage], leases, line, candidates, freeing=freeing,
                                     warned=warned, placement=placement)
    return {c.kernel_id: c.slot.reason(now) for c in chosen}


def _make_room(gpus: list[GPU], leases: list[Lease], need: Unused, candidates: list[Candidate], gone: set[str],
               warned: set[str]) -> list[Choice]:
    def made(ids: set[str]) -> bool | None:
        return True if shortfall(_without(gpus, leases, gone | ids), need) == (0, 0) else None

    if made(set()):
        return []
    ordered = sorted(candidates, key=lambda c: (c.loses_state, c.kernel_id not in warned, -c.lease.total_memory,
                                                c.idle_since))
    best = _least(ordered[:MAX_CANDIDATES], made, warned)
    if best is not None:
        return [Choice(c.kernel_id, c.action, "") for c in best[0]]
    picks: list[Choice] = []
    for c in ordered:
        before = shortfall(_without(gpus, leases, gone | {p.kernel_id for p in picks}), need)
        after = shortfall(_without(gpus, leases, gone | {p.kernel_id for p in picks} | {c.kernel_id}), need)
        if after < before:
            picks.append(Choice(c.kernel_id, c.action, ""))
        if after == (0, 0):
            break
    return picks


def _placed(waiter: Waiter, gpus: list[GPU]) -> Lease:
    """The waiter's slice as a lease on the GPUs it would take (so later waiters see that room taken)."""
    spec = waiter.slice
    return Lease(id=f"waiter:{waiter.id}", owner=waiter.owner, kernel_id=f"waiter:{waiter.id}", profile=waiter.profile,
                 isolation="", memory=spec.memory or 0, sm_percent=spec.sm_percent, whole=spec.whole,
                 gpu_count=spec.gpu_count, state=ACTIVE, gpus=tuple(g.uuid for g in gpus), last_gpus=(), groups=(),
                 label="", created=0.0, updated=0.0, state_since=0.0)

