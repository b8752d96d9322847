"""Waiting in the pool's queue for a slice: the one loop a kernel start and a resume both run.

Try; while the pool is full, hold a place in the ledger's queue (a heartbeat every ``poll``
seconds keeps it; a place lost to a stall longer than the queue's TTL is taken again at the end)
and try again with it, so that earlier waiters are served first.  Every position change, every
change of the reason it waits, and every change of why it is where it is (where the admin's sharing
orders the queue), is reported to the caller (the UI shows them); the place is given up however the
wait ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..pool import Lease, PoolExhausted, SliceSpec, Waiter
from .store import LeaseStore


@dataclass(frozen=True)
class Place:
    """What a waiting request says about itself in the queue."""

    owner: str
    kernel_id: str
    profile: str
    slice: SliceSpec
    lease_id: str | None = None  # a resume: the hibernated lease that waits
    label: str = ""
    groups: tuple[str, ...] = ()  # its owner's (reservations' members, fair share's groups)


class QueueTimeout(Exception):
    """No slice freed up within the wait allowed; ``refusal`` is the last answer of the pool."""

    def __init__(self, waited: float, refusal: PoolExhausted):
        super().__init__(f"Waited {waited:.0f}s in the GPU queue without a free slice. {refusal}")
        self.waited, self.refusal = waited, refusal


async def wait_for_slice(ledger: LeaseStore, attempt: Callable[[str | None], Lease], place: Place, *,
                         poll: float = 1.0, timeout: float | None = None,
                         on_position: Callable[[int], Awaitable[None]] | None = None,
                         on_refusal: Callable[[PoolExhausted], Awaitable[None]] | None = None,
                         on_why: Callable[[str], Awaitable[None]] | None = None) -> tuple[Lease, float]:
    """Run ``attempt(waiter_id)`` (in a thread) until it grants a lease; return it and the seconds
    spent in the queue.  ``attempt`` raises :class:`PoolExhausted` while there is no room (any other
    refusal ends the wait); ``on_refusal`` hears the first and each whose message differs from the
    one before; ``on_why`` each new reading of why the place is where it is ("2nd in the queue: …";
    only where sharing orders the queue).  ``timeout`` None: wait as long as it takes."""
    try:
        return await asyncio.to_thread(attempt, None), 0.0
    except PoolExhausted as first:
        refusal = first
    if on_refusal is not None:
        await on_refusal(refusal)
    started = time.monotonic()
    waiter = await asyncio.to_thread(_enqueue, ledger, place)
    position, why = waiter.position, ""
    try:
        if on_position is not None:
            await on_position(position)
        if on_why is not None and waiter.why:
            why = waiter.why
            await on_why(why)
        while timeout is None or time.monotonic() - started < timeout:
            await asyncio.sleep(poll)
            current = await asyncio.to_thread(ledger.heartbeat, waiter.id)
            if current is None:  # pruned after a stall: back in line, at the end
                current = waiter = await asyncio.to_thread(_enqueue, ledger, place)
            try:
                lease = await asyncio.to_thread(attempt, waiter.id)
            except PoolExhausted as e:
                if on_refusal is not None and str(e) != str(refusal):
                    await on_refusal(e)
                refusal = e
            else:
                waiter = None  # the ledger took it off the queue with the grant
                return lease, time.monotonic() - started
            if current.position != position and on_position is not None:
                position = current.position
                await on_position(position)
            if on_why is not None and current.why != why:
                why = current.why
                await on_why(why)
        raise QueueTimeout(time.monotonic() - started, refusal)
    finally:
        if waiter is not None:
            await asyncio.to_thread(ledger.dequeue, waiter.id)


def _enqueue(ledger: LeaseStore, place: Place) -> Waiter:
    return ledger.enqueue(place.owner, place.kernel_id, place.profile, place.slice, lease_id=place.lease_id,
                          label=place.label, groups=place.groups)
