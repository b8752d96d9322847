"""``POST gpu-pool/api/v1/kernels/{kernel_id}/resume`` (docs/api.md): resume a hibernated kernel.

Answers 202 at once with the kernel's object, its ``state`` ``resuming`` or ``queued`` (with
``queue_position``); the resume goes on in the server, and the UI follows it through ``GET me``
and the ``resumed`` event.  The same authentication, ownership checks and error shape as the other
handlers of the API.
"""

from __future__ import annotations

import time

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..hibernation import HibernationError
from ..pool.phases import IN_FLIGHT, PhaseConflict
from ..pool import HIBERNATED, PoolError
from . import views
from .handlers import API, KERNEL_ID, PoolAPIHandler, api_error

SETTLE = 0.5  # seconds to let the resume say whether it runs or waits in the queue before answering


class ResumeHandler(PoolAPIHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        self.json_body(set())
        _caller, lease, _rule = await self.own_kernel(kernel_id)
        hook = self.ext.hibernator
        if not hook.enabled:
            raise api_error(409, "no_hibernation", "Hibernation is not enabled on this server, so there is "
                                                   "nothing to resume.")
        if lease.state != HIBERNATED and lease.phase not in IN_FLIGHT:
            raise api_error(409, "not_hibernated", f"This kernel is {lease.state}, not hibernated: there is "
                                                   "nothing to resume.")
        task = hook.start_resume(kernel_id, "user")
        await hook.settle(kernel_id, SETTLE)
        if task.done() and not task.cancelled() and task.exception() is not None:
            err = task.exception()
            if isinstance(err, HibernationError):
                raise api_error(err.status, err.reason, str(err))
            if isinstance(err, PoolError):  # the pool service down (503), or its refusal of the request
                raise api_error(err.status or 409, err.reason, str(err))
            if isinstance(err, PhaseConflict):
                raise api_error(409, "in_progress", f"{err}: try again when that is done.")
            raise api_error(500, "resume_failed", f"The resume failed: {err}")
        snapshot = await self.ext.backend.snapshot()
        current = snapshot.lease_of_kernel(kernel_id) or lease
        context = self.ext.server_context
        self.send(views.kernel_object(current, backend=self.ext.backend, context=context, snapshot=snapshot,
                                      now=time.time(), notebooks=await context.notebooks.paths()), status=202)


def resume_handlers() -> list[tuple[str, type]]:
    return [(rf"/{API}/kernels/{KERNEL_ID}/resume", ResumeHandler)]
