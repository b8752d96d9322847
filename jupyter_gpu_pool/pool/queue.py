"""The queue: requests waiting for room (a kernel start, or a hibernated kernel's resume).

Waiters are served in the order they came (unless the admin's sharing orders them otherwise:
``pool.sharing``); a later request may only take a slice that is left after every earlier waiter
that fits took its own (:func:`reserve_for_waiters`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .placement import GPUUsage, choose
from .slices import SliceSpec


@dataclass(frozen=True)
class Waiter:
    """A request waiting for room; ``position`` is 1 for the head of the queue."""

    id: str
    owner: str
    kernel_id: str
    lease_id: str | None  # set for a resume: the hibernated lease that waits
    profile: str
    slice: SliceSpec
    label: str
    enqueued: float
    heartbeat: float
    position: int = 0
    groups: tuple[str, ...] = ()  # its owner's groups (reservations' members, fair share's groups)
    why: str = ""  # why it is where it is, where sharing orders the queue ("3rd in the queue: ...")

    @property
    def for_resume(self) -> bool:
        return self.lease_id is not None

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "slice": self.slice.to_text()}


def ahead_of(waiters: tuple[Waiter, ...] | list[Waiter], waiter_id: str | None) -> list[Waiter]:
    """The waiters ahead of ``waiter_id`` in the queue (all of them when it has no place)."""
    waiters = list(waiters)
    if waiter_id is not None:
        for i, w in enumerate(waiters):  # (the head asks most: stop where it stands)
            if w.id == waiter_id:
                return waiters[:i]
    return waiters


def reserve_for_waiters(usage: list[GPUUsage], waiters: list[Waiter], placement: str) -> list[GPUUsage]:
    """Usage as it would be after each of ``waiters`` (in queue order) that fits took its slice."""
    sim = {u.gpu.uuid: u for u in usage}
    full: set[SliceSpec] = set()  # slices that fit nowhere: taking room never makes room, so they never will
    for w in waiters:
        if w.slice in full:
            continue
        picked = choose(list(sim.values()), w.slice, placement)
        if picked is None:
            full.add(w.slice)
        for g in picked or []:
            sim[g.uuid] = sim[g.uuid].plus(w.slice)
    return [sim[u.gpu.uuid] for u in usage]
