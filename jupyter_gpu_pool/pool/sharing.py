"""How the pool is shared beyond first come, first served: reservations and the queue's order.  Pure.

:class:`Sharing` is the admin's choice (``GPUPool.reservations``, ``GPUPool.queue_order`` and the fair
share's settings); :meth:`Sharing.line` reads the queue as it stands at one moment into a :class:`Line`:

- the waiters in the order they are served: by arrival (``fifo``) or by fair share (``fair``,
  :mod:`.fairshare`), and then, ahead of everyone, the members of a reservation in its lead time or
  window while its room is not used up (they are admitted into their room first);
- the room each such reservation keeps from non-members (:class:`~.reservations.Unused`), and
  :meth:`Line.room`: what of it a given non-member may not take (all of it from the lead time on;
  from the lead time after the window opens, what members leave unused may be *borrowed* while no
  member waits).

``pool.allocation.allocate`` asks it; so do the stores for the places they show (the ledger's queue).
With no reservation and ``fifo`` (the default) nothing here runs: the queue is the arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .fairshare import FAIR, FIFO, FairShare, key, ordinal, ratios, why
from .leases import Lease
from .placement import GPUUsage
from .queue import Waiter
from .reservations import AFTER, OPEN, Reservation, Slot, Unused, hold_back, unused


@dataclass(frozen=True)
class Room:
    """What of the reserved room one non-member may not take: ``strict`` keeps every reservation's unused
    room, ``lenient`` only the room it may not borrow (each GPU whose usage a hold changes, as a
    non-member sees it); ``borrowable`` the reservations it may borrow from, ``held`` those it is kept from."""

    strict: Mapping[str, GPUUsage] = field(default_factory=dict)
    lenient: Mapping[str, GPUUsage] = field(default_factory=dict)
    borrowable: tuple[Unused, ...] = ()
    held: tuple[Unused, ...] = ()


NO_ROOM_HELD = Room()


@dataclass(frozen=True)
class Line:
    """The queue at one moment, as sharing orders it, and the reserved room members leave unused.
    ``groups``: each waiter's share group and its ratio (``fair``); ``first``: the waiters going first
    into a reservation's room, and its name."""

    waiters: tuple[Waiter, ...]
    unused: tuple[Unused, ...] = ()
    groups: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    first: Mapping[str, str] = field(default_factory=dict)

    def told(self) -> tuple[Waiter, ...]:
        """The waiters with the words each reads about its place (``why``)."""
        if not self.groups and not self.first:
            return self.waiters
        seen: dict[str, list[float]] = {}  # share group -> ratios of the waiters ahead that are not going first
        told, first = [], 0
        for w in self.waiters:
            if w.id in self.first:
                words = f"{ordinal(w.position)} in the queue: going first into the room reserved for {self.first[w.id]}"
            elif w.id in self.groups:
                group, ratio = self.groups[w.id]
                ahead = [(g, r, False) for g, rs in seen.items() for r in rs] + [("", 0.0, True)] * first
                words = why(w.position, group, ratio, ahead)
            else:
                words = (f"{ordinal(w.position)} in the queue: {first} ahead {'is' if first == 1 else 'are'} going "
                         "first into room reserved for them") if first else ""
            if w.id in self.first:
                first += 1
            elif w.id in self.groups:
                seen.setdefault(self.groups[w.id][0], []).append(self.groups[w.id][1])
            told.append(replace(w, why=words))
        return tuple(told)

    def member_waits(self, reservation: Reservation, but: str | None = None) -> bool:
        """Whether a member of ``reservation`` (other than the waiter ``but``) waits in the queue."""
        return any(w.id != but and reservation.member(w.owner, w.groups) for w in self.waiters)

    def room(self, owner: str, groups: tuple[str, ...], usage: list[GPUUsage], ahead: Sequence[Waiter],
             waiter_id: str | None = None) -> Room:
        """What a non-member ``owner`` may not take of the reserved room, on ``usage`` (each GPU after the
        waiters ``ahead`` took their slices).  Members' waiters ahead take their slices from their room."""
        strict, borrow = [], []
        for need in self.unused:
            r = need.slot.reservation
            if r.member(owner, groups):
                continue
            theirs = [w.slice for w in ahead if r.member(w.owner, w.groups)]
            need = need.less(sum(s.memory or 0 for s in theirs if not s.whole),
                             sum(s.gpu_count for s in theirs if s.whole))
            if not need.memory and not need.gpus:
                continue
            if need.slot.borrowing and not self.member_waits(r, waiter_id):
                borrow.append(need)
            else:
                strict.append(need)
        if not strict and not borrow:
            return NO_ROOM_HELD
        kept = hold_back(usage, [*strict, *borrow])
        return Room(kept, hold_back(usage, strict) if borrow else kept, tuple(borrow), tuple(strict))


@dataclass(frozen=True)
class Sharing:
    """The admin's reservations and queue order (``fifo``: arrival; ``fair``: fair share)."""

    reservations: tuple[Reservation, ...] = ()
    order: str = FIFO
    fair: FairShare = field(default_factory=FairShare)

    @property
    def plain(self) -> bool:
        """First come, first served, and nothing reserved: the queue as it was before sharing."""
        return not self.reservations and self.order == FIFO

    def slots(self, now: float) -> tuple[Slot, ...]:
        """Every reservation where it stands at ``now``."""
        return tuple(r.slot(now) for r in self.reservations)

    def active(self, now: float) -> tuple[Slot, ...]:
        """The reservations keeping room at ``now`` (from their lead time to their end)."""
        return tuple(s for s in self.slots(now) if s.active)

    def needs_everyone(self, now: float) -> bool:
        """Whether a decision at ``now`` needs every held lease (members' use of reserved room)."""
        return any(s.active for s in self.slots(now))

    def shown(self, now: float, user: str, groups: Iterable[str]) -> list[dict]:
        """The reservations as ``user`` (in ``groups``) reads them at ``now``: each one not over, with its phase,
        times and words (members: "ML 101 lab: 160 GiB reserved until 12:00"; others what and when)."""
        groups = tuple(groups)
        return [s.to_dict(now, s.reservation.member(user, groups)) for s in self.slots(now) if s.phase != AFTER]

    def borrowed(self, lease: Lease, now: float) -> str:
        """The words of a lease that borrowed reserved room, while that room's window is open ("" otherwise)."""
        slots = {s.reservation.name: s for s in self.slots(now)} if lease.borrowed else {}
        return next((slots[n].borrowed(now) for n in lease.borrowed if n in slots and slots[n].phase == OPEN), "")

    def share_group(self, groups: Iterable[str]) -> str:
        return self.fair.group_of(groups)

    def line(self, waiters: Sequence[Waiter], *, now: float, gpus: Sequence[GPUUsage] | None,
             everyone: Iterable[Lease], use: Mapping[str, float]) -> Line:
        """The queue as served at ``now``: ``waiters`` in arrival order, ``gpus`` each GPU's usage, ``everyone``
        the held leases (members' use), ``use`` each share group's decayed use (``fair``)."""
        needs = tuple(unused(s, gpus, everyone) for s in self.active(now)) if gpus is not None else ()
        needs = tuple(n for n in needs if n.memory or n.gpus)
        groups: dict[str, tuple[str, float]] = {}
        order = list(waiters)
        if self.order == FAIR and waiters:
            fair = self.fair
            share = {w.id: fair.group_of(w.groups) for w in waiters}
            ratio = ratios(use, share.values(), fair)
            groups = {w.id: (share[w.id], ratio[share[w.id]]) for w in waiters}
            order.sort(key=lambda w: (key(groups[w.id][1], now - w.enqueued, fair), w.enqueued, w.id))
        first = _members_first(order, needs)
        if self.order == FIFO and not first:
            return Line(tuple(waiters), needs)
        order = [w for w in order if w.id in first] + [w for w in order if w.id not in first]
        return Line(tuple(replace(w, position=i) for i, w in enumerate(order, start=1)), needs, groups, first)


def _members_first(order: list[Waiter], needs: tuple[Unused, ...]) -> dict[str, str]:
    """The waiters that go first into their reservation's unused room (in order, until it is taken), each
    with the reservation's name."""
    left = {n.name: [n.memory, n.gpus] for n in needs}
    first = {}
    for w in order:
        into = next((n for n in needs if n.slot.reservation.member(w.owner, w.groups)
                     and (left[n.name][1] if w.slice.whole else left[n.name][0]) > 0), None)
        if into is None:
            continue
        if w.slice.whole:
            left[into.name][1] -= w.slice.gpu_count
        else:
            left[into.name][0] -= w.slice.memory or 0
        first[w.id] = into.name
    return first
