"""The one loop behind every periodic job of the pool (culling passes, telemetry, hibernation upkeep)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(interval: float, work: Callable[[], Awaitable[object]], stop: asyncio.Event, *, what: str,
                start: float | None = None, clock: Callable[[], float] = time.time) -> None:
    """Run ``work`` now, then every ``interval`` seconds, until ``stop`` is set.

    With ``start`` (a time on ``clock``), runs keep to the fixed schedule ``start + k * interval``
    however long each takes (a run that overruns skips the times it missed): the culler's passes, so
    that a replay of its trace passes when it did.  Without it, each run waits ``interval`` after
    the last one ended.  A run under way always finishes (its blocking parts run in threads, which a
    cancellation would leave running behind a closed ledger); a run that fails is logged and the
    next one goes on, so that one bad pass never ends the job for good."""
    due = start
    while not stop.is_set():
        try:
            await work()
        except Exception:
            log.exception("GPU pool: %s failed", what)
        delay = interval
        if due is not None:
            now = clock()
            due += interval * max(1, (now - due) // interval + 1)
            delay = due - now
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass
