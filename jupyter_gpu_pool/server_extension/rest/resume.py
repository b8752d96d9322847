"""``POST gpu-pool/api/v1/kernels/{kernel_id}/resume`` and ``…/hint`` (docs/api.md).

``resume`` answers 202 at once with the kernel's object, its ``state`` ``resuming`` or ``queued``
(with ``queue_position``); the resume goes on in the server, and the UI follows it through ``GET me``
and the ``resumed`` event.  ``hint`` (the user opened the notebook of a hibernated kernel, or started
typing in it) wakes the kernel only if a slice is free now and nobody waits, and says whether it did;
rate-limited per user (``GPUPoolExtension.hint_rate_limit``).  The same authentication, ownership
checks and error shape as the other handlers of the API.
"""

from __future__ import annotations

import time

from jupyter_server.auth.decorator import authorized
from tornado import web

from ...hibernation import HibernationError
from ...pool.phases import PhaseConflict, PhaseError, display_state
from ...pool import Lease, PoolError
from ...pool import residency as M
from . import views
from .handlers import API, KERNEL_ID, PoolAPIHandler, api_error
from .hints import retry_after

SETTLE = 0.5  # seconds to let the resume say whether it runs or waits in the queue before answering


def refusal(lease: Lease, request: str) -> tuple[str, str] | None:
    """Why the residency model refuses the user's ``request`` (``RESUME``, ``HINT``) for the kernel of
    ``lease`` (``residency.asked_to_wake``), as (reason, message); None where it may go on."""
    try:
        M.asked_to_wake(M.residency_of(lease), request)
        return None
    except M.Refused as refused:
        reason = refused.reason
    except PhaseError:  # a lease no residency shows as: a move under way that this server does not know
        reason = "in_progress"
    shown = display_state(lease).replace("_", " ")
    nothing = "nothing to resume" if request == M.RESUME else "nothing to wake"
    words = {"not_hibernated": (f"This kernel is {lease.state}, not hibernated: there is nothing to resume."
                                if request == M.RESUME else "This kernel is not sleeping: there is nothing to wake."),
             "no_gpu_yet": "This kernel has held no GPU yet: it takes one when a cell runs.",
             "evicting": "This kernel is to be shut down to make room in host RAM: a cell resumes it, not a guess.",
             "stopping": f"This kernel is shutting down; there is {nothing}.",
             "failed": f"This kernel's last move could be neither finished nor undone; there is {nothing}: shut it "
                       "down to give its GPU slice back."}
    return reason, words.get(reason) or f"This kernel is {lease.phase or shown} already; there is {nothing} now."


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
        refused = refusal(lease, M.RESUME)
        if refused is not None:
            raise api_error(409, *refused)
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


class HintHandler(PoolAPIHandler):
    """A guess that a cell is coming: 202 ``{"woken": true}`` when a resume started, else 200 with
    ``"woken": false`` and why (``reason``, ``message``): never a queue place, never an error for a
    kernel awake already."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        self.json_body(set())
        caller = self.caller()
        wait = self.ext.hint_limiter.allow(caller.user)
        if wait is not None:
            self.set_header("Retry-After", retry_after(wait))
            limit = self.ext.hint_rate_limit
            return self.send({"reason": "too_many_hints", "message": f"Too many hints: at most {limit} a minute "
                              f"for each user; try again in {retry_after(wait)} s."}, status=429)
        _caller, lease, _rule = await self.own_kernel(kernel_id)
        if lease.owner != caller.user:  # an admin may act on others' kernels, but a hint is its user's guess
            raise api_error(403, "not_yours", f"Kernel {kernel_id!r} is not yours; only its user's own notebook "
                                              "wakes it in advance.")
        hook = self.ext.hibernator
        answer = {"kernel_id": kernel_id, "woken": False}
        refused = refusal(lease, M.HINT)  # (a restored tab's kernel with no GPU yet takes one when a cell runs)
        if refused is not None:
            return self.send({**answer, "state": display_state(lease), "reason": refused[0], "message": refused[1]})
        task = hook.start_resume(kernel_id, "hint", hint=True)
        if not task.done():  # a hint declined at once has nothing to settle
            await hook.settle(kernel_id, SETTLE)
        if task.done() and not task.cancelled() and task.exception() is not None:
            err = task.exception()
            if isinstance(err, HibernationError):
                return self.send({**answer, "state": "hibernated", "reason": err.reason, "message": str(err)})
            if isinstance(err, PhaseConflict):  # another move claimed it first: that one says what happens
                return self.send({**answer, "state": display_state(lease), "reason": "in_progress",
                                  "message": f"{err}."})
            raise api_error(500, "resume_failed", f"The resume failed: {err}")
        snapshot = await self.ext.backend.snapshot()
        current = snapshot.lease_of_kernel(kernel_id) or lease
        self.send({**answer, "woken": True, "state": display_state(current),
                   "message": "Waking up: the kernel takes its GPU slice again before your next cell."}, status=202)


def resume_handlers() -> list[tuple[str, type]]:
    return [(rf"/{API}/kernels/{KERNEL_ID}/resume", ResumeHandler),
            (rf"/{API}/kernels/{KERNEL_ID}/hint", HintHandler)]
