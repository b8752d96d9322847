"""Reservations in a replay: when their room changes hands, and which kernels each culling pass takes
back for them, chosen as the live culler chooses them (``pool.reclaim.reserved_for`` on the virtual
pool's leases and queue, the candidates from ``pool.reclaim.reservation_candidate``)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from ..pool import reclaim as R
from ..pool.sharing import Sharing
from .virtual_pool import VirtualPool


class Reserving:
    def __init__(self, sharing: Sharing, pool: VirtualPool, placement: str):
        self.sharing, self.pool, self.placement = sharing, pool, placement

    def boundaries(self, start: float, end: float) -> list[float]:
        """The times within [start, end] at which a reservation starts keeping its room, opens, lets others
        borrow, or ends."""
        found = set()
        for r in self.sharing.reservations:
            for begin, finish in r.window.occurrences(start, end + r.lead):
                found.update(t for t in (begin - r.lead, begin, begin + r.lead, finish) if start <= t <= end)
        return sorted(found)

    def active(self, now: float) -> bool:
        return self.sharing.needs_everyone(now)

    def choose(self, found: Iterable[tuple[Hashable, R.Candidate]], now: float, *, freeing: Iterable[str] = (),
               warned: Iterable[str] = ()) -> dict:
        """Of ``found`` (a kernel and its candidate), those to give back reserved room now, each with the
        reason in words ("reserved for ML 101 lab from 10:00")."""
        found = list(found)
        pool = self.pool
        chosen = R.reserved_for(self.sharing, list(pool.usage.values()), list(pool.active()), list(pool.queue),
                                [c for _, c in found], now, freeing=freeing, warned=warned, placement=self.placement)
        kernels = {c.kernel_id: k for k, c in found}
        return {kernels[kid]: words for kid, words in chosen.items()}
