"""When each kernel of this server next goes back to sleep without a warning: one owner, one timer a kernel.

Two things put a kernel to sleep unwarned, because it loses nothing (its variables stay, its next cell
resumes it) and nothing it was using is taken away:

- its rule's ``hibernate_after_cell``: each cell's end starts the wait, a new cell (any execute request
  a kernel websocket sends that is not silent) cancels it, and a kernel that runs no cell for that long
  hibernates, recorded with reason ``after_cell``.  The GPU is then held about only while cells run;
- a hint that no cell followed (``GPUPoolExtension.hint_sleep_after``, the local hook's
  ``PoolHibernation``), recorded with reason ``hint_unused``.

Both are timers of one kind, so they live here, at most one per kernel: a new one replaces the
kernel's old one, a cell cancels it, and any other move of the kernel (a hibernation, a resume its user
asks for) cancels it too, so that two never compete for one kernel.  The culler's deadline timers
(``Culler.timers``) are another thing: the policy's, always warned first.

A cell's start and end are what the kernel websockets see (``hibernation_websocket``: an execute
request that is not silent, and its reply), so the kernel's own silent executes (the first cell's
environment, the framework cache's release before a checkpoint) start nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from ...hibernation import HibernationError, HibernationFailed, HibernationRefused
from ...pool import ACTIVE, HIBERNATED, Lease
from ...pool import policy as P

log = logging.getLogger(__name__)

AFTER_CELL = "after_cell"  # the reason of a hibernation after a cell, in the journal, events and the trace
HINT_UNUSED = "hint_unused"  # the reason of a hibernation of a kernel a hint woke and no cell used
BUSY_POLL = 1.0  # seconds between two looks at a kernel that is busy with something other than a cell
HINT_POLL = 1.0  # seconds between two looks at the waiters while a kernel woken on a hint waits for its cell


class SleepTimers:
    """The one timer per kernel that puts it back to sleep unwarned (built by a hibernation hook).

    ``hook``: the hibernation hook that moves the kernel (``hibernate``, ``shown``); ``extension``: the
    server extension, read when a timer runs (its backend, recorder, kernel manager and the culler's
    read-only context: the kernel's rule, whether it can hibernate here)."""

    def __init__(self, hook: Any, extension: Any):
        self.hook, self.extension = hook, extension
        self._timers: dict[str, tuple[str, asyncio.Task]] = {}  # kernel id -> (reason, its task)
        self._told: set[str] = set()  # kernels whose "cannot sleep between cells here" is logged already

    def pending(self, kernel_id: str) -> str | None:
        """The reason of the kernel's timer (``after_cell``, ``hint_unused``), or None (no I/O)."""
        found = self._timers.get(kernel_id)
        return found[0] if found is not None else None

    def set(self, kernel_id: str, reason: str, wait: Coroutine) -> None:
        """Put ``wait`` (it sleeps, then puts the kernel to sleep) in the kernel's one slot, in place of
        whatever timer it had."""
        self.cancel(kernel_id)
        task = asyncio.ensure_future(wait)
        self._timers[kernel_id] = (reason, task)
        task.add_done_callback(lambda t: self._ended(kernel_id, t))

    def _ended(self, kernel_id: str, task: asyncio.Task) -> None:
        found = self._timers.get(kernel_id)
        if found is not None and found[1] is task:
            del self._timers[kernel_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("GPU pool: kernel %s: putting it back to sleep failed", kernel_id, exc_info=task.exception())

    def cancel(self, kernel_id: str) -> None:
        """No timer for the kernel any more (a cell came, it moved).  A timer that is carrying its own
        hibernation out is not cancelled by that hibernation."""
        found = self._timers.pop(kernel_id, None)
        if found is not None and found[1] is not asyncio.current_task():
            found[1].cancel()

    # -- hints ---------------------------------------------------------------------------------------

    def after_hint(self, kernel_id: str, hold: float) -> None:
        """A hint woke the kernel: if no cell comes within ``hold`` seconds (or someone starts waiting for
        a slice first: the hook's ``others_waiting``), it goes back to sleep, recorded calmly, with no
        warning: nothing was used.  In the kernel's one slot (it replaces a timer left from before it slept)."""
        self.set(kernel_id, HINT_UNUSED, self._after_hint(kernel_id, hold))

    async def _after_hint(self, kernel_id: str, hold: float) -> None:
        deadline = time.monotonic() + hold
        why = None
        while why is None:
            await asyncio.sleep(max(min(deadline - time.monotonic(), HINT_POLL), 0))
            if not self.hook.hinted(kernel_id):
                return  # a cell came, or the kernel went to sleep or away by another path
            if time.monotonic() >= deadline:
                why = f"no cell ran within {hold:g} s"
            elif await self.hook.others_waiting(kernel_id):
                why = "someone is waiting for a GPU slice and no cell had run"
        decided = time.time()  # the act's time on the trace, as the culler's and an after-cell sleep's
        try:
            outcome = await self.hook.hibernate(kernel_id, HINT_UNUSED)
        except HibernationError as e:  # a cell came at that moment, or it shuts down: it stays as it is
            log.info("kernel %s woken on a hint stays awake: %s", kernel_id, e)
            return
        if outcome.lease is not None:
            await self.extension.recorder.record(
                "hibernated", outcome.lease, reason=HINT_UNUSED, action="hibernate", rule="hibernation",
                message=f"Back to sleep: it was woken in advance when its notebook was opened, but {why}, so its "
                        "GPU slice went back to the pool. Nothing was lost; a cell resumes it.",
                duration=round(outcome.duration, 3), bytes=outcome.bytes, declared=outcome.declared,
                extra={"decided": decided})

    # -- cells --------------------------------------------------------------------------------------

    def cell_started(self, kernel_id: str) -> None:
        self.cancel(kernel_id)

    def cell_ended(self, kernel_id: str) -> None:
        """A cell of the kernel ended: where its rule says ``hibernate_after_cell``, it sleeps that long from
        now unless another cell starts first (no rule of the policy says it: nothing happens)."""
        if not any(rule.hibernate_after_cell is not None for rule in self.extension.backend.policy.rules):
            return
        seen = self.extension.server_context.seen.get(kernel_id)  # its rule, as the last pass found it
        if seen is not None and seen.rule.hibernate_after_cell is None:
            self.cancel(kernel_id)
            return
        self.set(kernel_id, AFTER_CELL, self._after_cell(kernel_id, time.monotonic()))

    async def _kernel_and_rule(self, kernel_id: str) -> tuple[Lease, P.Rule] | None:
        context = self.extension.server_context
        kernel = context.kernel(kernel_id)
        if kernel is None:
            return None
        lease = (await self.extension.backend.snapshot()).lease_of_kernel(kernel_id)
        return (lease, context.rule_for(kernel, lease)) if lease is not None else None

    async def _after_cell(self, kernel_id: str, ended: float) -> None:
        found = await self._kernel_and_rule(kernel_id)
        if found is None or found[1].hibernate_after_cell is None:
            return
        lease, rule = found
        after = rule.hibernate_after_cell
        if not self._can(kernel_id, lease, rule):
            return
        await asyncio.sleep(max(ended + after - time.monotonic(), 0.0))
        context = self.extension.server_context
        # Busy with no cell started (a silent execute, a client outside this server's websockets): wait for it.
        while (kernel := context.kernel(kernel_id)) is not None and kernel.execution_state == "busy":
            await asyncio.sleep(BUSY_POLL)
        found = await self._kernel_and_rule(kernel_id)
        if found is None:
            return
        lease, rule = found
        if (lease.state == HIBERNATED or lease.phase or context.busy(kernel_id) or self.hook.hinted(kernel_id)
                or self.hook.shown(kernel_id) != ACTIVE or rule.hibernate_after_cell is None):
            return  # asleep already, a move or a shutdown under way, woken on a hint (that timer's), no rule
        if not self._can(kernel_id, lease, rule):
            return
        decided = time.time()
        try:
            outcome = await self.hook.hibernate(kernel_id, AFTER_CELL)
        except HibernationRefused as e:
            if not e.keep_running:
                self._cannot(kernel_id, rule, e.message)
            else:  # busy GPU, host RAM short, a cell at that moment: it runs on; its next cell's end tries again
                log.info("GPU pool: kernel %s stays on its GPU after its cell: %s", kernel_id, e.message)
            return
        except HibernationFailed as e:  # put back running where it could be; on record as the culler's would be
            log.warning("GPU pool: kernel %s: hibernation after its cell failed: %s", kernel_id, e)
            await self.extension.recorder.record(
                "hibernation_failed", lease, reason=e.reason, message=e.message, rule=rule.name,
                action=P.HIBERNATE, extra={"states": {str(p): s for p, s in e.states.items()}, "recovered": e.recovered})
            return
        if outcome.lease is not None:
            await self.extension.recorder.record(
                "hibernated", outcome.lease, reason=AFTER_CELL, action=P.HIBERNATE, rule=rule.name,
                message=f"Asleep between cells: no cell ran for {after:g} s after the last one ended, so its GPU "
                        "slice went back to the pool. Nothing was lost; its next cell wakes it.",
                duration=round(outcome.duration, 3), bytes=outcome.bytes, declared=outcome.declared,
                extra={"decided": decided})

    def _can(self, kernel_id: str, lease: Lease, rule: P.Rule) -> bool:
        can, why = self.extension.server_context.hibernation(lease)
        if not can:
            self._cannot(kernel_id, rule, why or "hibernation is unavailable")
        return can

    def _cannot(self, kernel_id: str, rule: P.Rule, why: str) -> None:
        """Left alone (no shutdown, no warning: its idle rule still governs it), said once in the log."""
        if kernel_id not in self._told:
            self._told.add(kernel_id)
            log.info("GPU pool: kernel %s keeps its GPU slice between cells although rule %r says "
                     "hibernate_after_cell: it cannot hibernate here (%s)", kernel_id, rule.name, why)

    async def stop(self) -> None:
        """A server that stops puts nothing back to sleep."""
        tasks = [task for _reason, task in self._timers.values()]
        self._timers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
