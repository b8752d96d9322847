"""``POST gpu-pool/api/v1/kernels/{kernel_id}/resume`` (docs/api.md): resume a hibernated kernel.

Answers 202 at once with the kernel's object, its ``state`` ``resuming`` or ``queued`` (with
``queue_position``); the resume goes on in the server, and the UI follows it through ``GET me``
and the ``resumed`` event.  The same authentication, ownership checks and error shape as the other
handlers of the API.
"""

from __future__ import annotations

import asyncio
import time

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..hibernation.phases import IN_FLIGHT, QUEUED, RESUMING
from ..pool import HIBERNATED
from .handlers import _KERNEL_ID, API, PoolAPIHandler, _error

SETTLE = 0.5  # seconds to let the resume say whether it runs or waits in the queue before answering


class ResumeHandler(PoolAPIHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        self.json_body(set())
        _caller, lease, _rule = await self.own_kernel(kernel_id)
        hook = self.ext.hibernator
        if hook is None or getattr(hook, "start_resume", None) is None:
            raise _error(409, "no_hibernation", "Hibernation is not enabled on this server, so there is nothing "
                                                "to resume.")
        if lease.state != HIBERNATED and lease.phase not in IN_FLIGHT:
            raise _error(409, "not_hibernated", f"This kernel is {lease.state}, not hibernated: there is nothing "
                                                "to resume.")
        task = hook.start_resume(kernel_id, "user")
        hibernator = hook.hibernator
        if hibernator.shown(kernel_id) not in (RESUMING, QUEUED):
            await hibernator.wait_change(kernel_id, SETTLE)
        if task.done() and task.exception() is not None:
            err = task.exception()
            raise _error(getattr(err, "status", 409), getattr(err, "reason", "resume_failed"), str(err))
        await asyncio.sleep(0)  # let a queue position land
        snapshot = await self.ext.backend.snapshot()
        from . import views

        current = next((x for x in snapshot.leases if x.kernel_id == kernel_id), lease)
        body = views.kernel_object(current, backend=self.ext.backend, culler=self.ext.culler, snapshot=snapshot,
                                   now=time.time())
        shown = hibernator.shown(kernel_id)
        if shown in (RESUMING, QUEUED):
            body["state"] = shown
            body["queue_position"] = hibernator.queue_position(kernel_id)
        self.send(body, status=202)


def resume_handlers() -> list[tuple[str, type]]:
    return [(rf"/{API}/kernels/{_KERNEL_ID}/resume", ResumeHandler)]
