"""The replay's queue, as the replay keeps it beside the virtual pool's: each waiter's kernel, the starts in it
that only room can refuse (by slice) and the others, and which waiters are worth asking again when room frees."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

from ..pool import Waiter
from ..pool.placement import choose
from .kernels import WAKING, Kernel, plain_start
from .virtual_pool import VirtualPool


class Waiters:
    def __init__(self, pool: VirtualPool, placement: str):
        self.pool, self.placement = pool, placement
        self._ids = itertools.count(1)
        self._kernels: dict[str, Kernel] = {}  # waiter id -> its kernel
        # The queue's starts that only room can refuse, by slice, and the other waiters: worth_asking stops
        # where everyone left asks for a slice that fits nowhere.
        self._starts: Counter = Counter()
        self._others = 0

    def enqueue(self, k: Kernel, now: float, kernel_id: str, lease_id: str | None) -> None:
        """``k`` takes a place in the queue (``lease_id``: a resume's)."""
        spec = k.lease.slice if k.lease is not None else k.profile.slice
        k.waiter = Waiter(id=f"w{next(self._ids)}", owner=k.s.user, kernel_id=kernel_id, lease_id=lease_id,
                          profile=k.profile.name, slice=spec, label="", enqueued=now, heartbeat=now, groups=k.s.groups)
        self._kernels[k.waiter.id] = k
        self.pool.enqueue(k.waiter)
        if plain_start(k, k.waiter):
            self._starts[k.waiter.slice] += 1
        else:
            self._others += 1

    def leave(self, k: Kernel) -> None:
        if plain_start(k, k.waiter):
            self._starts[k.waiter.slice] -= 1
        else:
            self._others -= 1
        self.pool.dequeue(k.waiter.id)
        self._kernels.pop(k.waiter.id, None)
        k.waiter = None

    def kernel_of(self, waiter_id: str) -> Kernel | None:
        return self._kernels.get(waiter_id)

    def worth_asking(self, now: float) -> Iterator[tuple[Kernel, Waiter]]:
        """Room may have freed: each waiter in queue order worth asking again (a later one keeps what is left
        after every earlier waiter that fits took its slice: the queue's rules, in ``allocate``); the caller
        asks each before the next is looked at.

        A start whose slice fits nowhere in that room, and whom no quota or budget could refuse, would
        get ``PoolExhausted`` again: it is passed over without asking (the room is
        ``pool.queue.reserve_for_waiters``, folded one waiter at a time as ``allocate`` folds it; a
        waiter that does not fit leaves it as it was).  Without this, a queue of Q waiters cost Q asks
        of Q reservations each on every slice given back."""
        room, full = None, set()  # what is left after the waiters before this one; the slices that fit nowhere in it
        left, others = Counter(self._starts), self._others  # who is after this one
        placement = self.placement
        for w in self.pool.line(now):  # (in arrival order, unless sharing orders it otherwise)
            k = self._kernels.get(w.id)
            if k is None or k.waiter is None or k.waiter.id != w.id:  # (sharing's line holds copies)
                continue
            if plain_start(k, w):
                left[w.slice] -= 1
            else:
                others -= 1
            if k.state != WAKING and k.room_only:
                if room is None:
                    room = self.pool.room_before(w.id, placement)
                if w.slice in full or choose(room, w.slice, placement) is None:
                    full.add(w.slice)
                    if not others and all(n == 0 or s in full for s, n in left.items()):
                        return  # everyone after this one asks for a slice that fits nowhere: all refused for room
                    continue
            room, full = None, set()
            yield k, w
