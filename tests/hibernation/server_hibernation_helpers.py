"""Helpers for hibernation through a real jupyter_server: kernels over REST, GET me, the events
websocket and kernel websockets as JupyterLab opens them (both wire protocols)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1, serialize_msg_to_ws_v1
from kernel_helpers import answering, wait_until

from jupyter_gpu_pool.server_extension.events import SCHEMA_ID

MiB = 2**20
API = ("gpu-pool", "api", "v1")
V1 = "v1.kernel.websocket.jupyter.org"


def body(response) -> dict:
    return json.loads(response.body.decode())


def extension_config():
    """The server config of these tests: the GPU pool extension with the hibernation hook, culling passes
    every 0.3 s and telemetry every 0.5 s (pytest-jupyter's ``jp_server_config``)."""
    from traitlets.config import Config

    from jupyter_gpu_pool.server_extension.sleep.hook import PoolHibernation

    return Config({
        "ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}},
        "GPUPoolExtension": {"cull_interval": 0.3, "telemetry_interval": 0.5, "hibernator_class": PoolHibernation},
    })


class Server:
    """One test's server: kernels over REST, GET me and GET pool, the ledger's view of a kernel; on the
    stand-in machine (``standin``) each kernel's process is given the GPU memory a test asks for."""

    def __init__(self, jp_fetch, ext, standin=None):
        self.fetch, self.ext, self.standin = jp_fetch, ext, standin

    async def gpu_kernel(self, gpu_bytes: int = 400 * MiB, profile: str = "small") -> tuple[str, int]:
        r = await self.fetch("api", "kernels", method="POST", body=json.dumps({"name": f"gpu-pool-{profile}"}))
        kid = body(r)["id"]
        # a running kernel, as a user's notebook has: it has answered kernel_info (after a restart, if it lost
        # a race for a port at launch, its new process)
        pid = await answering(self.ext.serverapp.kernel_manager, kid)
        if self.standin is not None:
            self.standin.add(pid, gpu_bytes, gpus=self.lease(kid).gpus)
        return kid, pid

    async def me(self) -> dict:
        return body(await self.fetch(*API, "me"))

    async def me_kernel(self, kid: str) -> dict:
        return next(k for k in (await self.me())["kernels"] if k["kernel_id"] == kid)

    async def pool(self) -> dict:
        return body(await self.fetch(*API, "pool"))

    async def post(self, kid: str, action: str, payload: dict | None = None):
        return await self.fetch(*API, "kernels", kid, action, method="POST", body=json.dumps(payload or {}))

    async def hibernate(self, kid: str) -> None:
        """Release GPU as its card's button is pressed: once the server has the kernel idle.  (A release that
        comes between a cell's reply and its idle status is refused as "a cell was started": a known gap, which
        a loaded run met.)"""
        kernel = self.ext.serverapp.kernel_manager.get_kernel(kid)
        await wait_until(lambda: kernel.execution_state == "idle", what="the kernel idle, its cell's end seen")
        r = await self.post(kid, "release")
        assert r.code == 202 and body(r)["action"] == "hibernate"
        await wait_until(lambda: self.lease(kid).state == "hibernated", what="hibernated")

    def lease(self, kid: str):
        return self.ext.backend.pool.ledger.by_kernel(kid)


class Events:
    """The server's events, through /api/events/subscribe, as JupyterLab receives them."""

    def __init__(self, ws):
        self.ws, self.seen = ws, []

    async def action(self, action: str, kid: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.seen:
                if e.get("schema_id") == SCHEMA_ID and e.get("action") == action and e.get("kernel_id") == kid:
                    return e
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {action} event for {kid}; saw {[e.get('action') for e in self.seen]}")
            try:
                message = await asyncio.wait_for(self.ws.read_message(), left)
            except asyncio.TimeoutError:
                continue
            self.seen.append(json.loads(message))

    def actions(self, kid: str) -> list[str]:
        return [e["action"] for e in self.seen if e.get("schema_id") == SCHEMA_ID and e.get("kernel_id") == kid]


class Channels:
    """A kernel websocket as JupyterLab opens it, in the legacy JSON or the v1 binary protocol."""

    def __init__(self, ws, v1: bool):
        self.ws, self.v1 = ws, v1
        self.session = Session(key=b"")

    async def execute(self, code: str) -> str:
        header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "u",
                  "session": uuid.uuid4().hex, "date": "", "version": "5.3"}
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}
        msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "buffers": []}
        if self.v1:
            await self.ws.write_message(serialize_msg_to_ws_v1(msg, "shell", self.session.pack), binary=True)
        else:
            await self.ws.write_message(json.dumps({**msg, "channel": "shell"}))
        return header["msg_id"]

    async def replies(self, msg_id: str, timeout: float = 60.0, seen: list | None = None) -> list[tuple[str, str, dict]]:
        """(channel, msg_type, content) of every message for ``msg_id`` until its execute_reply and idle;
        each is also appended to ``seen`` as it arrives (for a test to watch a cell still waiting)."""
        got: list[tuple[str, str, dict]] = [] if seen is None else seen
        deadline = time.monotonic() + timeout
        replied = idle = False
        while not (replied and idle):
            raw = await asyncio.wait_for(self.ws.read_message(), max(deadline - time.monotonic(), 0.01))
            assert raw is not None, "the kernel websocket closed"
            if self.v1:
                channel, parts = deserialize_msg_from_ws_v1(raw)
                header, parent, content = (self.session.unpack(parts[i]) for i in (0, 1, 3))
            else:
                m = json.loads(raw)
                channel, header, parent, content = m["channel"], m["header"], m["parent_header"], m["content"]
            if parent.get("msg_id") != msg_id:
                continue
            got.append((channel, header["msg_type"], content))
            replied = replied or header["msg_type"] == "execute_reply"
            idle = idle or (header["msg_type"] == "status" and content["execution_state"] == "idle")
        return got


def texts(got) -> list[str]:
    """The text a cell showed: its streams and displays (the resume notices among them)."""
    out = []
    for _channel, kind, content in got:
        if kind == "stream":
            out.append(content["text"])
        elif kind in ("display_data", "update_display_data"):
            out.append(content["data"]["text/plain"])
    return out
