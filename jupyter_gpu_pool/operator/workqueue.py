"""The operator's work queue: what to reconcile, each key once, by a few workers.

The watches only keep what they hear (``cache.py``) and mark the kernel it concerns; the workers
reconcile the marked kernels from what is kept then.  So the work per event is bounded:

- a key is in the queue at most once, however many events mark it meanwhile, and its pass reads the
  latest state (a burst of events about one kernel costs one pass, not one per event);
- a key is never worked on by two workers at once: marked during its pass, it goes back in once that
  pass ends (the pass may have read what changed just before);
- three lanes, taken in order: work that finishes what is under way (``first``: a kernel admitted
  already, whose pod or asks changed), then new work (a kernel not yet admitted, a timer, a retry),
  then the sweep's marks (it marks every kernel).  So in a class's burst a kernel whose pod runs is
  written Running at once, not behind every admission still waiting (which would have every kernel of
  the burst wait for the last one's admission), and a sweep over thousands of kernels never holds up
  a kernel that is starting;
- "look again in N s" is one timer per key (the earliest wins), not a task per kernel; each pass
  decides anew when its key is looked at next;
- a pass that fails is tried again after a wait that doubles up to ``retry_max``.

Which loop it runs on is the caller's: :meth:`start` inside it, :meth:`stop` to end the workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Awaitable, Callable, Hashable

log = logging.getLogger("jupyter_gpu_pool.operator")

FIRST, NEW, SWEEP = 0, 1, 2  # the lanes, in the order they are taken


class WorkQueue:
    def __init__(self, work: Callable[[Hashable], Awaitable[None]], workers: int, *, retry_first: float = 1.0,
                 retry_max: float = 30.0, failed: Callable[[Hashable, BaseException], None] | None = None):
        self.work = work
        self.workers = max(workers, 1)
        self.retry_first, self.retry_max = retry_first, max(retry_max, retry_first)
        self.failed = failed
        self._lanes: tuple[deque, ...] = (deque(), deque(), deque())  # FIRST, NEW, SWEEP: taken in that order
        self._queued: dict[Hashable, int] = {}  # key -> the lane it is in (its earliest mark)
        self._active: set = set()
        self._again: dict[Hashable, int] = {}  # marked while worked on -> the earliest lane asked
        self._timers: dict[Hashable, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[Hashable, int] = {}
        self._ready: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []

    def __len__(self) -> int:
        return len(self._queued)

    def start(self) -> None:
        self._ready = asyncio.Event()
        if self._queued:
            self._ready.set()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]

    async def stop(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def add(self, key: Hashable, *, first: bool = False, sweep: bool = False) -> None:
        """Mark ``key`` for a pass (``first``: before new work, it finishes what is under way; ``sweep``:
        behind every key an event marked)."""
        lane = FIRST if first else SWEEP if sweep else NEW
        if key in self._active:
            self._again[key] = min(lane, self._again.get(key, lane))
            return
        if self._queued.get(key, SWEEP + 1) <= lane:
            return  # in the queue already, as early as this mark would put it
        self._queued[key] = lane  # an earlier lane's mark passes a later one's: the later entry is skipped
        self._lanes[lane].append(key)
        if self._ready is not None:
            self._ready.set()

    def later(self, key: Hashable, delay: float) -> None:
        """Mark ``key`` in ``delay`` seconds (unless it is to be looked at sooner already)."""
        loop = asyncio.get_running_loop()
        at = loop.time() + max(delay, 0.0)
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= at:
                return
            current[1].cancel()
        self._timers[key] = (at, loop.call_at(at, self._due, key))

    def cancel_later(self, key: Hashable) -> None:
        current = self._timers.pop(key, None)
        if current is not None:
            current[1].cancel()

    def _due(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _take(self) -> Hashable | None:
        for lane, keys in enumerate(self._lanes):
            while keys:
                key = keys.popleft()
                if self._queued.get(key) == lane:  # else a stale entry: it moved up a lane, or was taken
                    del self._queued[key]
                    return key
        return None

    async def _worker(self) -> None:
        assert self._ready is not None
        while True:
            key = self._take()
            if key is None:
                self._ready.clear()
                await self._ready.wait()
                continue
            self._active.add(key)
            self.cancel_later(key)  # the pass decides when its key is looked at next
            try:
                await self.work(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (one kernel's failure must not stop the others')
                tries = self._failures[key] = self._failures.get(key, 0) + 1
                if self.failed is not None:
                    self.failed(key, e)
                self.later(key, min(self.retry_first * 2 ** (tries - 1), self.retry_max))
            finally:
                self._active.discard(key)
                if key in self._again:
                    lane = self._again.pop(key)
                    self.add(key, first=lane == FIRST, sweep=lane == SWEEP)
            await asyncio.sleep(0)  # a pass that did not wait still lets the watches in

    def forget(self, key: Hashable) -> None:
        """Drop a key's timer and failure count (its kernel is gone)."""
        self.cancel_later(key)
        self._failures.pop(key, None)
