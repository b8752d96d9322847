"""This server's own handles on its kernels: each one's move lock and resume task, what its mover must
remember that the ledger does not keep (a first slice under way, a hint's resume), and a cache of what
the UI is shown of it, read on every websocket message (no I/O here: the ledger is read elsewhere)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..pool import ACTIVE
from ..pool import residency as M
from ..pool.phases import NO_GPU_YET, QUEUED

# What is shown while a cell sent now waits for a resume (or a first slice): the UI's words of the
# residencies that are asleep.
ASLEEP = tuple(s.stage for s in M.STATES if s.asleep and s == M.Residency(s.stage))


@dataclass
class Handle:
    """One kernel's: its move lock and resume task, and a cache of its ledger state for the websocket."""

    guard: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    seen: str = ACTIVE  # display_state of the lease as last read or written by this server
    position: int | None = None  # its place in the queue while queued
    wait_reason: str | None = None  # why it waits there, where the pool is not simply full
    queue_why: str | None = None  # why it is where it is in the queue, where sharing orders it
    resume_task: asyncio.Task | None = None
    placed: asyncio.Event = field(default_factory=asyncio.Event)  # the resume under way has a slice or a queue place
    resume_wanted: bool = False  # a cell arrived while hibernating: give up the hibernation if not too late
    warned_eviction: float | None = None  # the eviction deadline its owner was told of
    taking_first: bool = False  # the move under way takes the kernel's first slice (nothing to restore)
    hint_only: bool = False  # resumed (or resuming) on a hint, and no cell has come for it yet


class Handles:
    """The handles of this server's kernels, made on first use."""

    def __init__(self):
        self._all: dict[str, Handle] = {}

    def __getitem__(self, kernel_id: str) -> Handle:
        handle = self._all.get(kernel_id)
        if handle is None:
            handle = self._all[kernel_id] = Handle()
        return handle

    def __contains__(self, kernel_id: str) -> bool:
        return kernel_id in self._all

    def find(self, kernel_id: str) -> Handle | None:
        return self._all.get(kernel_id)

    def pop(self, kernel_id: str) -> Handle | None:
        return self._all.pop(kernel_id, None)

    def ids(self) -> list[str]:
        return list(self._all)

    async def show(self, kernel_id: str, seen: str, position: int | None = None, reason: str | None = None,
                   why: str | None = None) -> None:
        """Cache what the UI shows of the kernel, and wake whoever waits for a change of it."""
        k = self[kernel_id]
        if (k.seen, k.position, k.wait_reason, k.queue_why) == (seen, position, reason, why):
            return
        k.seen, k.position, k.wait_reason, k.queue_why = seen, position, reason, why
        async with k.changed:
            k.changed.notify_all()

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        """Wait up to ``timeout`` for the kernel's shown state or queue position to change."""
        k = self[kernel_id]
        async with k.changed:
            try:
                await asyncio.wait_for(k.changed.wait(), timeout)
            except TimeoutError:
                pass
        return k.seen

    def shown(self, kernel_id: str) -> str:
        k = self._all.get(kernel_id)
        return k.seen if k else ACTIVE

    def queue_position(self, kernel_id: str) -> int | None:
        k = self._all.get(kernel_id)
        return k.position if k and k.seen == QUEUED else None

    def queue_reason(self, kernel_id: str) -> str | None:
        k = self._all.get(kernel_id)
        return k.wait_reason if k and k.seen == QUEUED else None

    def queue_why(self, kernel_id: str) -> str | None:
        k = self._all.get(kernel_id)
        return k.queue_why if k and k.seen == QUEUED else None

    def first_slice(self, kernel_id: str) -> bool:
        k = self._all.get(kernel_id)
        return k is not None and (k.seen == NO_GPU_YET or k.taking_first)

    def hinted(self, kernel_id: str) -> bool:
        k = self._all.get(kernel_id)
        return bool(k and k.hint_only)
