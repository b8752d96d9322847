"""REST handlers under ``<base_url>gpu-pool/api/v1/`` (the contract is docs/api.md).

Every handler authenticates and authorizes through jupyter_server (token,
cookie or JupyterHub; its Authorizer), never counts as user activity (the UI
polls them), answers errors as ``{"message", "reason"}``, and lets a user see
and act on their own kernels only.
"""

from __future__ import annotations

import json
import math
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from ...compat import VerbatimHTTPError
from ...pool import HIBERNATED, Lease
from ...pool import policy as P
from ...pool.words import not_done
from .. import admin_requests
from . import dashboard
from . import views
from .identity import Caller, caller_of

AUTH_RESOURCE = "kernels"
API = "gpu-pool/api/v1"
KERNEL_ID = r"(?P<kernel_id>[^/]+)"


class PoolAPIHandler(ExtensionHandlerMixin, APIHandler):
    """Shared plumbing: the extension, the caller, JSON bodies."""

    auth_resource = AUTH_RESOURCE
    _track_activity = False  # polled by the UI: must not keep the server or a kernel "active"

    @property
    def ext(self):
        return self.extensionapp

    def caller(self) -> Caller:
        ext = self.ext
        return caller_of(self.current_user, personal=ext.personal_server, owner=ext.backend.owner,
                         admin_users=set(ext.admin_users), owner_admin=ext.backend.owner_admin)

    def admin(self, what: str) -> Caller:
        """The caller, where they are one of the pool's admins; else 403 saying what (``what``: "The pool
        view is") is theirs only."""
        caller = self.caller()
        if not caller.admin:
            raise api_error(403, "not_admin", f"{what} for the pool's admins (GPUPoolExtension.admin_users, or "
                                              "JupyterHub admins).")
        return caller

    def json_body(self, allowed: set[str]) -> dict:
        raw = self.request.body or b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise api_error(400, "bad_json", f"The request body is not valid JSON ({e}); send {{}} or an object.")
        except RecursionError:
            raise api_error(400, "bad_json", "The request body nests too deeply; send {} or a flat object.") from None
        if not isinstance(body, dict):
            raise api_error(400, "bad_body", f"The request body must be a JSON object, not {type(body).__name__}.")
        unknown = set(body) - allowed
        if unknown:
            known = f"the allowed key is {', '.join(sorted(allowed))}" if allowed else "send {} (no keys)"
            raise api_error(400, "unknown_keys", f"Unknown key(s) {sorted(unknown)} in the request body; {known}.")
        return body

    def send(self, payload: dict, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    async def callers_lease(self, kernel_id: str) -> tuple[Caller, Lease]:
        """The caller and the lease of their (or, for an admin, anyone's) pool kernel, in any server of the
        pool, or the right 4xx."""
        ext = self.ext
        caller = self.caller()
        if not ext.backend.enabled:
            raise api_error(409, "no_pool", f"This server has no GPU pool: {ext.backend.note}")
        lease = (await ext.backend.snapshot()).lease_of_kernel(kernel_id)
        if lease is None:
            raise api_error(404, "no_such_kernel", f"No GPU kernel {kernel_id!r} holds a slice of the pool "
                                                   "(it ended, or it is not a GPU pool kernel).")
        if lease.owner != caller.user and not caller.admin:
            raise api_error(403, "not_yours", f"Kernel {kernel_id!r} is not yours; you can act on your own kernels "
                                              "only.")
        return caller, lease

    async def own_kernel(self, kernel_id: str) -> tuple[Caller, Lease, P.Rule]:
        """The caller's (or, for an admin, anyone's) pool kernel in this server, or the right 4xx."""
        caller, lease = await self.callers_lease(kernel_id)
        context = self.ext.server_context
        if kernel_id not in context.km:
            raise api_error(409, "other_server", f"Kernel {kernel_id!r} runs in another Jupyter server; act on it "
                                                 "from that server.")
        kernel = context.km.get_kernel(kernel_id)
        return caller, lease, context.rule_for(kernel, lease)


def _seconds(value, rule: P.Rule) -> float:
    """A number of seconds from a JSON body, or a 400 in the rule's words (a bool, text, NaN, a number no
    clock holds; one the rule does not allow is refused by ``policy.snooze``, in the same words)."""
    shown = repr(value) if len(repr(value)) < 40 else f"{repr(value)[:30]}… ({len(repr(value))} characters)"
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError
    except (ValueError, OverflowError):
        raise api_error(400, "bad_snooze", P.bad_snooze(rule, shown).message) from None
    return seconds


def api_error(status: int, reason: str, message: str) -> web.HTTPError:
    """An error the API answers as {"message", "reason"}, the message as written (every handler of the
    API raises these, the resume handler's too)."""
    return VerbatimHTTPError(status, message, reason=reason)


class MeHandler(PoolAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        caller = self.caller()
        self.ext.starting.ask()  # a kernel no client talked to yet: its own state from the next read on
        self.send(await views.me(caller.user, caller.admin, backend=self.ext.backend, context=self.ext.server_context))


class PoolHandler(PoolAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.admin("The pool view is")
        self.send(await views.pool(backend=self.ext.backend, context=self.ext.server_context))


class SnoozeHandler(PoolAPIHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        body = self.json_body({"seconds"})
        caller, lease, rule = await self.own_kernel(kernel_id)
        seconds = body.get("seconds")
        if seconds is not None:
            seconds = _seconds(seconds, rule)
        culler, context = self.ext.culler, self.ext.server_context
        if lease.phase or context.busy(kernel_id):
            raise api_error(409, "in_progress", f"This kernel is {lease.phase or 'being released'} already.")
        if lease.awaits_first_cell:
            raise api_error(409, "nothing_to_snooze", "This kernel holds no GPU yet (it takes one when a cell runs): "
                                                      "nothing is pending for it.")
        if lease.state == HIBERNATED and rule.max_hibernated is None:
            raise api_error(409, "nothing_to_snooze", "This kernel is hibernated and nothing is pending for it.")
        try:
            await culler.snooze(kernel_id, lease, rule, seconds)
        except P.SnoozeRefused as e:
            raise api_error(e.status, e.reason, e.message) from None
        snapshot = await self.ext.backend.snapshot()
        self.send(views.kernel_object(lease, backend=self.ext.backend, context=context, snapshot=snapshot,
                                      now=time.time(), notebooks=await context.notebooks.paths()))


class KernelActionHandler(PoolAPIHandler):
    """``POST kernels/{id}/release|hibernate|shutdown``: a user's on their own kernel, an admin's on
    anyone's.  A kernel of another server of the pool is asked of that server (admins only), which
    carries the action out at its next culling pass (``admin_requests``)."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        self.json_body(set())
        ext, context = self.ext, self.ext.server_context
        caller, lease = await self.callers_lease(kernel_id)
        if lease.phase or context.busy(kernel_id):
            raise api_error(409, "in_progress", f"This kernel is {lease.phase or 'being released'} already.")
        if lease.awaits_first_cell and action != "shutdown":
            raise api_error(409, "not_holding", "This kernel holds no GPU slice yet: it takes one when a cell runs. "
                                                "Shut it down from the kernel menu if you no longer need it.")
        if lease.state == HIBERNATED and action != "shutdown":
            raise api_error(409, "not_holding", "This kernel is hibernated: it holds no GPU slice. "
                                                "Shut it down from the kernel menu if you no longer need it.")
        by = caller.user if lease.owner != caller.user else None
        if kernel_id not in context.km:
            if not caller.admin:
                raise api_error(409, "other_server", f"Kernel {kernel_id!r} runs in another Jupyter server; act on "
                                                     "it from that server.")
            await admin_requests.ask(ext.backend, lease, action, caller.user)
            self.send({"action": action, "kernel_id": kernel_id, "requested": True}, status=202)
            return
        try:
            done = ext.culler.act(lease, action, by)
        except ValueError as e:
            raise api_error(409, "cannot_hibernate", not_done(action, str(e))) from None
        self.send({"action": done, "kernel_id": kernel_id}, status=202)


class TelemetryHandler(PoolAPIHandler):
    """``GET pool/telemetry?window=600``: readings over time for the admins' dashboard."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.admin("The pool's readings are")
        raw = self.get_argument("window", "600")
        try:
            window = float(raw)
            if not 0 < window <= dashboard.WINDOW_MAX:
                raise ValueError
        except ValueError:
            shown = raw if len(raw) < 40 else f"{raw[:30]}… ({len(raw)} characters)"
            raise api_error(400, "bad_window", f"'window' must be a number of seconds above 0 and at most "
                                               f"{dashboard.WINDOW_MAX:g}, not {shown!r}.") from None
        snapshot = await self.ext.backend.snapshot()
        context = self.ext.server_context
        entries = await self.ext.backend.journal(since=time.time() - window, kinds=dashboard.HOLD_KINDS,
                                                 limit=dashboard.JOURNAL_LIMIT)
        self.send(dashboard.telemetry(backend=self.ext.backend, context=context, snapshot=snapshot, window=window,
                                      notebooks=await context.notebooks.paths(), entries=entries))


def handlers() -> list[tuple[str, type]]:
    return [
        (rf"/{API}/me", MeHandler),
        (rf"/{API}/pool", PoolHandler),
        (rf"/{API}/kernels/{KERNEL_ID}/snooze", SnoozeHandler),
        (rf"/{API}/pool/telemetry", TelemetryHandler),
        (rf"/{API}/kernels/{KERNEL_ID}/(?P<action>release|hibernate|shutdown)", KernelActionHandler),
    ]
