"""The one loop behind every periodic job of the pool (culling passes, telemetry, hibernation upkeep)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(interval: float, work: Callable[[], Awaitable[object]], stop: asyncio.Event, *, what: str) -> None:
    """Run ``work`` now, then every ``interval`` seconds, until ``stop`` is set.

    A run under way always finishes (its blocking parts run in threads, which a cancellation would
    leave running behind a closed ledger); a run that fails is logged and the next one goes on, so
    that one bad pass never ends the job for good."""
    while not stop.is_set():
        try:
            await work()
        except Exception:
            log.exception("GPU pool: %s failed", what)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass
