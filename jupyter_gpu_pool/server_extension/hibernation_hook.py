"""Hibernation plugged into the server extension: ``GPUPoolExtension.hibernator_class``.

Built by the extension as ``PoolHibernation(parent=extension)``.  It gives the culler the hook it
calls (``can_hibernate`` / ``hibernate`` / ``resume``, docs/server-extension.md), adds the
``POST kernels/{id}/resume`` handler, installs transparent resume on the kernel websockets (a cell
run on a hibernated kernel resumes it and then runs), and runs the hibernator's upkeep (evictions
past the host-RAM cap, kernels a previous server left mid-move).
"""

from __future__ import annotations

import asyncio
import logging

from tornado.ioloop import IOLoop

from ..hibernation import Hibernator, Kernels
from ..pool import Lease
from . import events
from .hibernation_handlers import resume_handlers
from .hibernation_websocket import install_transparent_resume

log = logging.getLogger(__name__)

# Events the culler or the ledger's journal already announce (emitting them here would double them):
# "queued" (the culler emits one per new waiter), refusals the ledger journals (quota, pool full),
# and refusals of a hibernation the culler asked for (it records them as "refused" itself).
_ANNOUNCED_ELSEWHERE = {("queued", None), ("refused", "quota_exceeded"), ("refused", "pool_exhausted"),
                        ("refused", "host_memory")}
# Events only this hook knows of: journaled so that the user's "recent" list explains them.
_JOURNALED = {"warned", "culled", "refused"}


class PoolHibernation:
    """The hibernation hook of one Jupyter server."""

    emits_events = True  # the culler journals and counts "hibernated"; the event (duration, bytes) is ours

    def __init__(self, parent, upkeep_interval: float = 5.0):
        self.extension = parent
        backend = parent.backend
        pool = getattr(backend, "pool", None)  # None where the pool is misconfigured (NoPool)
        self.note = getattr(backend, "note", "")
        self.hibernator = (Hibernator(pool, Kernels(parent.serverapp.kernel_manager), emit=self._emit)
                           if pool is not None else None)
        self.upkeep_interval = min(upkeep_interval, getattr(parent, "cull_interval", upkeep_interval))
        self._task: asyncio.Task | None = None
        self._pending: set[asyncio.Future] = set()
        parent.handlers.extend(resume_handlers())
        install_transparent_resume(parent.serverapp, self, getattr(parent, "settings", None))
        IOLoop.current().add_callback(self._start)

    # -- the culler's hook ------------------------------------------------------------------------

    def can_hibernate(self, kernel_id: str, lease: Lease | None = None) -> tuple[bool, str | None]:
        if self.hibernator is None:
            return False, f"the GPU pool is unavailable: {self.note}"
        return self.hibernator.can_hibernate(kernel_id, lease)

    async def hibernate(self, kernel_id: str, reason: str) -> dict:
        return (await self._need().hibernate(kernel_id, reason)).to_dict()

    async def resume(self, kernel_id: str, reason: str = "user") -> dict:
        return (await self._need().resume(kernel_id, reason)).to_dict()

    def start_resume(self, kernel_id: str, reason: str = "user") -> asyncio.Task:
        return self._need().start_resume(kernel_id, reason)

    def shown(self, kernel_id: str) -> str | None:
        """The state the UI shows while this server moves the kernel (views.kernel_object reads it)."""
        return self.hibernator.shown(kernel_id) if self.hibernator is not None else None

    def asleep(self, kernel_id: str) -> bool:
        return self.hibernator is not None and self.hibernator.asleep(kernel_id)

    def _need(self) -> Hibernator:
        if self.hibernator is None:
            from ..hibernation import HibernationRefused

            raise HibernationRefused("no_pool", f"The GPU pool is unavailable: {self.note}", keep_running=False)
        return self.hibernator

    # -- events -------------------------------------------------------------------------------

    def _emit(self, event: dict) -> None:
        action, reason = event["action"], event.get("reason")
        if (action, None) in _ANNOUNCED_ELSEWHERE or (action, reason) in _ANNOUNCED_ELSEWHERE:
            return
        data = events.kernel_action(action, kernel_id=event["kernel_id"], user=event["user"], reason=reason or "",
                                    message=event["message"], profile=event.get("profile"),
                                    deadline=event.get("deadline"), duration=event.get("duration"),
                                    bytes=event.get("bytes"))
        events.emit(getattr(self.extension.serverapp, "event_logger", None), data)
        if action in _JOURNALED:
            future = asyncio.ensure_future(self._journal(event))
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)

    async def _journal(self, event: dict) -> None:
        kernel_id = event["kernel_id"]
        lease = await asyncio.to_thread(self.hibernator.ledger.by_kernel, kernel_id) if self.hibernator else None
        detail = {"source": "policy", "message": event["message"], "rule": "hibernation",
                  "profile": event.get("profile"), "name": lease.label if lease else ""}
        if event.get("deadline") is not None:
            detail["deadline"] = event["deadline"]
        try:
            await self.extension.backend.record(event["action"], lease_id=lease.id if lease else None,
                                                kernel_id=kernel_id, owner=event["user"],
                                                reason=event.get("reason") or "", detail=detail)
        except Exception:  # the journal explains; its failure must not break a hibernation
            log.exception("could not journal the %s of kernel %s", event["action"], kernel_id)

    # -- upkeep -------------------------------------------------------------------------------

    def _start(self) -> None:
        if self.hibernator is not None and self._task is None:
            self._task = asyncio.ensure_future(self._upkeep())

    async def _upkeep(self) -> None:
        # Load libcuda and cuInit once, in a thread, before the culler's first can_hibernate asks for it.
        await asyncio.to_thread(self.hibernator.driver.info)  # type: ignore[union-attr]
        while True:
            try:
                await self.hibernator.tick()  # type: ignore[union-attr]
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad pass must not end the upkeep for good
                log.exception("GPU pool hibernation upkeep failed")
            await asyncio.sleep(self.upkeep_interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        for future in list(self._pending):
            await asyncio.gather(future, return_exceptions=True)
