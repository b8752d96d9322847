"""A kernel's first slice (its rule's ``slice_at: first-cell``): it started holding nothing ("no GPU yet"),
and its first cell takes a slice the way a resume does (the same claim, allocation decision and queue:
``resuming (first)``, ``queued (first)``), with nothing to restore; then, before the cell runs, the slice's
environment goes into the running kernel (CUDA reads it when the process first initialises it).  Where
that fails, or the kernel's ask ends first, the slice goes back and the kernel holds nothing, as before.
"""

from __future__ import annotations

import logging
import time

from ..pool import ACTIVE, Lease
from ..pool import residency as M
from ..pool.leases import FIRST_CELL
from .errors import HibernationRefused
from .handles import Handles
from .kernels import Kernels
from .outcomes import Outcome
from .room import Room, gpus_of
from .steps import Steps

log = logging.getLogger(__name__)

# Seconds for a kernel to run its first cell's environment code (silent, no GPU work: nothing to wait for but
# the kernel itself, which may still be starting on a loaded machine; its cell waits meanwhile either way).
ENVIRONMENT_TIMEOUT = 60.0


class FirstSlice:
    """Takes this server's kernels' first slices."""

    def __init__(self, pool, kernels: Kernels, handles: Handles, steps: Steps, room: Room):
        self.pool, self.kernels, self.handles, self.steps, self.room = pool, kernels, handles, steps, room

    async def take(self, kernel_id: str, lease: Lease, asked: M.Step, started: float) -> Outcome:
        """Claim the kernel (``asked``: its first cell's step, resuming first) and take its first slice."""
        await self.steps.claim(lease, asked, HibernationRefused(
            "stopping", "This kernel is shutting down; it takes no GPU slice."))
        self.handles[kernel_id].taking_first = True
        try:
            return await self._take(kernel_id, lease, started)
        finally:
            self.handles[kernel_id].taking_first = False

    async def _take(self, kernel_id: str, lease: Lease, started: float) -> Outcome:
        try:
            new, waited = await self.room.take(lease, False, 0, refusal="")
            code = await self.kernels.environment_code(kernel_id, new)
            ran = await self.kernels.run_silently(kernel_id, code, ENVIRONMENT_TIMEOUT) if code else "ran"
        except BaseException as e:  # refused, cancelled (the kernel shut down), or the pool unreachable
            await self._give_back(kernel_id, e)
            raise
        if ran != "ran":
            await self._give_back(kernel_id, None)
            raise HibernationRefused("environment_failed", f"This kernel took its GPU slice but could not be given "
                                     f"the slice's environment ({ran}), so the slice was given back. Run the cell "
                                     "again, or restart the kernel.")
        settled, done = await self.steps.report(kernel_id, M.RESTORE_DONE, was=M.RESTORING)
        gpus = ", ".join(g.label for g in gpus_of(self.pool, new)) or "the pool"
        queued = f" after {waited:.0f} s in the queue" if waited >= 1 else ""
        log.info("kernel %s took its GPU slice at its first cell on %s%s", kernel_id, new.gpus, queued)
        return Outcome(kernel_id, "took_slice", time.monotonic() - started, gpus=new.gpus, waited=waited,
                       lease=settled or new, message=f"This kernel took its GPU slice ({new.slice}) on {gpus}{queued}.",
                       declared=self.pool.inventory.declared, effects=done.effects if done else ())

    async def _give_back(self, kernel_id: str, error: BaseException | None) -> None:
        """A first slice given up: its environment not set (a slice taken: ``RESTORE_UNDONE``), its quota
        refused it, or its ask ended (cancelled: the kernel shut down; the pool unreachable): the kernel
        holds nothing, as before."""
        current = await self.steps.lease(kernel_id)
        if current is not None and current.state == ACTIVE:
            event, was = M.RESTORE_UNDONE, M.RESTORING
        elif isinstance(error, HibernationRefused) and error.status == 403:
            event, was = M.QUOTA_REFUSED, M.RESUMING
        else:
            event, was = M.INTERRUPTED, M.RESUMING
        await self.steps.report(kernel_id, event, was=was, reason=FIRST_CELL, last_gpus=())
