"""Transparent resume: a cell run on a hibernated kernel resumes it, then runs.

jupyter_server hands every kernel websocket to ``ServerApp.kernel_websocket_connection_class``;
this module subclasses the one in use.  When an ``execute_request`` (or a widget's ``comm_msg``)
arrives on the shell channel for a kernel that is hibernated (or hibernating, resuming, queued),
the connection holds it and every shell message after it, starts the resume, and tells the cell
what is happening: the kernel shows busy and the cell's output reads "Resuming…" (or its place in
the queue).  Once the kernel runs on its GPU again, the notice is cleared and the held messages go
to the kernel in their order.  If the resume is refused or fails, each held cell gets an error
saying why, and the kernel shows idle; nothing waits silently.

A kernel that started without a slice (its rule's ``slice_at: first-cell``) is held the same way:
its first cell takes a slice through the same path (queue, refusal), the slice's environment is set
in the kernel, then the cell runs; the words say it takes a GPU, not that it resumes.  The kernel's
state is read from the pool when a websocket opens, so that a kernel just started holds its first cell.

A kernel woken on a hint runs its cells at once; the first one tells the hook the hint was right
(``used``: the kernel no longer goes back to sleep).  Each cell's start (an execute request that is not
silent) and end (its reply) are told to the hook (``cell_started``, ``cell_ended``): a rule's
``hibernate_after_cell`` counts from there.  Other messages pass straight through: a
hibernated kernel answers ``kernel_info``, completion and
the like on its CPU.  Clients that talk to the kernel's ZMQ ports directly bypass this; they use
``POST …/resume``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1, serialize_msg_to_ws_v1
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from ...hibernation import HibernationError
from ...pool.phases import QUEUED

log = logging.getLogger(__name__)

SETTINGS_KEY = "gpu_pool_hibernation"
HOLD = {"execute_request", "comm_msg"}  # user code: it may touch the GPU
NOTICE_REDRAW = 5.0  # seconds: a held cell's notice is drawn again at least this often while it waits
V1 = "v1.kernel.websocket.jupyter.org"


class TransparentResume:
    """Mixin for a ``ZMQChannelsWebsocketConnection``: holds cells sent to a sleeping kernel."""

    _held: list | None = None
    _resumer: asyncio.Task | None = None
    _notice_id: str | None = None
    _first = False  # the held cells wait for the kernel's first slice, not for a resume
    _cells_sent: set | None = None

    @property
    def _cells(self) -> set:
        """The ids of the cells this connection sent that have not been answered yet."""
        if self._cells_sent is None:
            self._cells_sent = set()
        return self._cells_sent

    @property
    def _hook(self):
        return self.websocket_handler.settings.get(SETTINGS_KEY)

    async def connect(self):
        hook = self._hook
        if hook is not None:
            await hook.refresh(self.kernel_id)  # a kernel just started without a slice: hold its first cell
        connected = super().connect()  # type: ignore[misc]
        if connected is not None:  # jupyter_server awaits connect(); its own returns a future, or None
            await connected

    def handle_incoming_message(self, incoming_msg) -> None:
        hook = self._hook
        if hook is None:
            return super().handle_incoming_message(incoming_msg)  # type: ignore[misc]
        channel, header = self._peek(incoming_msg)
        if channel == "shell" and header.get("msg_type") == "execute_request" and not self._silent(incoming_msg):
            self._cells.add(header.get("msg_id"))  # a cell: its reply (handle_outgoing_message) is its end
            hook.cell_started(self.kernel_id)
        if self._held is None and not hook.asleep(self.kernel_id):
            if hook.hinted(self.kernel_id) and channel == "shell" and header.get("msg_type") in HOLD:
                hook.used(self.kernel_id)
            return super().handle_incoming_message(incoming_msg)  # type: ignore[misc]
        if channel != "shell" or (self._held is None and header.get("msg_type") not in HOLD):
            return super().handle_incoming_message(incoming_msg)  # type: ignore[misc]
        if self._held is None:
            self._held = []
            self._first = self._hook.first_slice(self.kernel_id)
            self._resumer = asyncio.ensure_future(self._resume_then_forward())
        self._held.append((incoming_msg, header))
        if header.get("msg_type") == "execute_request":
            self._send("iopub", "status", {"execution_state": "busy"}, header)
            self._send("iopub", "display_data", self._notice(), header, transient={"display_id": self._display_id})
        return None

    # -- the resume -----------------------------------------------------------------------------

    @property
    def _display_id(self) -> str:
        if self._notice_id is None:
            self._notice_id = f"gpu-pool-resume-{uuid.uuid4().hex}"
        return self._notice_id

    def _notice(self) -> dict:
        hook = self._hook
        text = hook.resume_notice(self.kernel_id) if hook is not None else "Resuming this kernel."
        return {"data": {"text/plain": text}, "metadata": {}}

    async def _resume_then_forward(self) -> None:
        hook, kernel_id = self._hook, self.kernel_id
        error: Exception | None = None
        try:
            task = hook.start_resume(kernel_id, "cell")
            shown = hook.shown(kernel_id)
            while not task.done():
                # the resume's end ends the wait too: a resume cancelled (the kernel shut down) changes nothing
                change = asyncio.ensure_future(hook.wait_change(kernel_id, NOTICE_REDRAW))
                await asyncio.wait((task, change), return_when=asyncio.FIRST_COMPLETED)
                change.cancel()
                changed = hook.shown(kernel_id)
                if changed != shown or changed == QUEUED:
                    shown = changed
                    self._update_notices()
            if task.cancelled():  # the kernel was shut down (or culled) while it waited
                error = RuntimeError("the kernel was shut down before it could resume")
            else:
                task.result()
        except asyncio.CancelledError:
            raise
        except HibernationError as e:
            error = e
        except Exception as e:  # a broken resume must still answer the held cells
            log.exception("kernel %s: transparent resume failed", kernel_id)
            error = e
        held, self._held = self._held or [], None
        for msg, header in held:  # no await in this loop: nothing can slip in between
            if header.get("msg_type") == "execute_request":
                self._send("iopub", "clear_output", {"wait": False}, header)
                if error is not None:
                    self._fail_cell(header, error)
                    continue
            if error is None:
                super().handle_incoming_message(msg)  # type: ignore[misc]

    def _update_notices(self) -> None:
        for _msg, header in self._held or []:
            if header.get("msg_type") == "execute_request":
                self._send("iopub", "update_display_data", self._notice(), header,
                           transient={"display_id": self._display_id})

    def _fail_cell(self, header: dict, error: Exception) -> None:
        self._cells.discard(header.get("msg_id"))  # answered here: never sent to the kernel
        if self._first:
            text = f"This cell did not run: the kernel could not take its GPU slice. {error}"
        else:
            text = f"The kernel could not resume, so this cell did not run: {error}"
        content = {"ename": "GPUPoolResumeError", "evalue": text, "traceback": [text]}
        self._send("iopub", "error", content, header)
        self._send("shell", "execute_reply", {"status": "error", "execution_count": None, **content}, header)
        self._send("iopub", "status", {"execution_state": "idle"}, header)

    def handle_outgoing_message(self, stream, outgoing_msg) -> None:
        """A reply to one of this connection's cells is the cell's end (shell replies come to their sender only)."""
        if self._cells_sent and getattr(stream, "channel", stream) == "shell":
            try:
                _idents, parts = self.session.feed_identities(outgoing_msg)
                header, parent = self.session.unpack(parts[1]), self.session.unpack(parts[2])
            except Exception:  # not ours to judge: jupyter_server handles it
                header, parent = {}, {}
            if header.get("msg_type") == "execute_reply" and parent.get("msg_id") in self._cells_sent:
                self._cells_sent.discard(parent["msg_id"])
                hook = self._hook
                if hook is not None:
                    hook.cell_ended(self.kernel_id)
        return super().handle_outgoing_message(stream, outgoing_msg)  # type: ignore[misc]

    # -- the wire -------------------------------------------------------------------------------

    def _peek(self, incoming_msg) -> tuple[str | None, dict]:
        """The channel and header of a message from the browser, in either websocket protocol."""
        try:
            if self.subprotocol == V1:
                channel, msg_list = deserialize_msg_from_ws_v1(incoming_msg)
                return channel, self.session.unpack(msg_list[0])
            msg = json.loads(incoming_msg) if isinstance(incoming_msg, str) else {}
            return msg.get("channel"), msg.get("header") or {}
        except Exception:  # not ours to judge: let jupyter_server handle (and log) it
            return None, {}

    def _silent(self, incoming_msg) -> bool:
        """Whether an execute request asks to run silently (a frontend's own code, not a cell)."""
        try:
            if self.subprotocol == V1:
                _channel, msg_list = deserialize_msg_from_ws_v1(incoming_msg)
                content = self.session.unpack(msg_list[3])
            else:
                content = json.loads(incoming_msg).get("content") or {}
            return bool(content.get("silent"))
        except Exception:
            return False

    def _send(self, channel: str, msg_type: str, content: dict, parent: dict, transient: dict | None = None) -> None:
        msg = self.session.msg(msg_type, content, parent=parent)
        if transient is not None:
            msg["content"]["transient"] = transient
        try:
            if self.subprotocol == V1:
                self.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack), binary=True)
            else:
                msg["channel"] = channel
                self.write_message(json.dumps(msg, default=str))
        except Exception as e:  # the browser went away: the held cells die with the connection
            log.debug("kernel %s: could not tell the browser (%s)", self.kernel_id, e)


def install_transparent_resume(serverapp, hook, extension_settings: dict | None = None) -> type | None:
    """Put transparent resume on the server's kernel websockets; returns the class in use, or None
    where another extension replaced the connection class with one we cannot extend.

    Called while the extension prepares its handlers (``initialize_handlers``), once its settings are
    the web app's: both are set, and jupyter_server reads the class from the web app's at each connection."""
    targets = [serverapp.web_app.settings] + ([extension_settings] if extension_settings is not None else [])
    base = serverapp.web_app.settings.get("kernel_websocket_connection_class") or ZMQChannelsWebsocketConnection
    if issubclass(base, TransparentResume):
        cls = base
    elif not issubclass(base, ZMQChannelsWebsocketConnection):
        log.warning("GPU pool: the kernel websocket class %s is not jupyter_server's; transparent resume is off "
                    "(users resume hibernated kernels with the Resume button)", base)
        return None
    else:
        cls = type("GPUPoolResumingConnection", (TransparentResume, base), {"__module__": __name__})
    for settings in targets:
        settings[SETTINGS_KEY] = hook
        settings["kernel_websocket_connection_class"] = cls
    serverapp.kernel_websocket_connection_class = cls
    return cls
