"""Helpers for the server tests: kernels over REST and websockets, events, scripted GPU readings."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import psutil
from kernel_helpers import wait_until  # noqa: F401  (re-exported for the tests)

from jupyter_gpu_pool.devices.telemetry import ProcessReading
from jupyter_gpu_pool.hibernation import Outcome
from jupyter_gpu_pool.server_extension.sleep.hook import HibernationHook


class ScriptedReadings:
    """Stands in for NVML, which this machine lacks (the same readings on a GPU machine come from
    ``NVMLSource``, tested by the ``gpu`` tests).  Reports every child process of this test
    process (the kernels) on every GPU asked about, with the memory and utilization a test sets.
    ``memory = None`` means no process is on the GPU at all."""

    memory: int | None = None
    utilization: float = 0.0
    device: float | None = None

    @classmethod
    def reset(cls) -> None:
        cls.memory, cls.utilization, cls.device = None, 0.0, None

    @classmethod
    def set(cls, memory: int | None, utilization: float = 0.0) -> None:
        cls.memory, cls.utilization = memory, utilization

    def available(self) -> tuple[bool, str]:
        return True, ""

    def read(self, gpu_uuids):
        if self.memory is None:
            return {uuid: {} for uuid in gpu_uuids}
        pids = [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]
        return {uuid: {pid: ProcessReading(self.memory, self.utilization) for pid in pids} for uuid in gpu_uuids}

    def device_utilization(self, gpu_uuids):
        return {uuid: self.device for uuid in gpu_uuids} if self.device is not None else {}


GiB = 2**30
BOB = {"Authorization": "token bob-token"}
ROOT = {"Authorization": "token root-token"}


def body(response) -> dict:
    return json.loads(response.body.decode())


async def start_kernel(jp_fetch, name: str = "gpu-pool-small", headers=None) -> str:
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}), headers=headers)
    return body(r)["id"]


async def kernel_ids(jp_fetch) -> set[str]:
    return {k["id"] for k in body(await jp_fetch("api", "kernels"))}


async def wait_idle(ext, kernel_id: str, timeout: float = 60.0) -> None:
    km = ext.serverapp.kernel_manager
    await wait_until(lambda: getattr(km.get_kernel(kernel_id), "execution_state", "") == "idle", timeout,
                     what=f"kernel {kernel_id} idle")


class EventStream:
    """The server's events, through /api/events/subscribe, as a real frontend receives them."""

    def __init__(self, ws):
        self.ws = ws
        self.received: list[dict] = []

    async def next(self, predicate, timeout: float = 60.0) -> dict:
        for event in self.received:
            if predicate(event):
                self.received.remove(event)
                return event
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event within {timeout}s; got {self.received}")
            try:
                message = await asyncio.wait_for(self.ws.read_message(), left)
            except asyncio.TimeoutError:
                continue
            if message is None:
                raise AssertionError("the events websocket closed")
            event = json.loads(message)
            if predicate(event):
                return event
            self.received.append(event)

    async def pool_action(self, action: str, kernel_id: str, timeout: float = 60.0) -> dict:
        from jupyter_gpu_pool.server_extension.events import SCHEMA_ID

        return await self.next(lambda e: e.get("schema_id") == SCHEMA_ID and e.get("action") == action
                               and e.get("kernel_id") == kernel_id, timeout)

    async def through(self, action: str, kernel_id: str, timeout: float = 60.0) -> list[dict]:
        """This kernel's pool events, in order, up to and including the first ``action``."""
        from jupyter_gpu_pool.server_extension.events import SCHEMA_ID

        seen = []
        while not seen or seen[-1]["action"] != action:
            seen.append(await self.next(lambda e: e.get("schema_id") == SCHEMA_ID and e.get("kernel_id") == kernel_id,
                                        timeout))
        return seen

    async def drain(self, quiet: float = 0.5) -> None:
        """Read whatever has arrived (into ``received``) until nothing comes for ``quiet`` seconds."""
        while True:
            try:
                message = await asyncio.wait_for(self.ws.read_message(), quiet)
            except asyncio.TimeoutError:
                return
            if message is None:
                return
            self.received.append(json.loads(message))

    def pool_actions(self, kernel_id: str) -> list[str]:
        from jupyter_gpu_pool.server_extension.events import SCHEMA_ID

        return [e["action"] for e in self.received if e.get("schema_id") == SCHEMA_ID
                and e.get("kernel_id") == kernel_id]

    def close(self) -> None:
        self.ws.close()


async def subscribe(jp_ws_fetch) -> EventStream:
    return EventStream(await jp_ws_fetch("api", "events", "subscribe"))


async def execute(jp_ws_fetch, kernel_id: str, code: str):
    """Send code to the kernel over its websocket, as JupyterLab does; return the open socket."""
    ws = await jp_ws_fetch("api", "kernels", kernel_id, "channels")
    session = uuid.uuid4().hex
    msg = {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "alice",
                   "session": session, "date": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }
    await ws.write_message(json.dumps(msg))
    return ws


class LedgerOnlyHibernator(HibernationHook):
    """Plays the hibernation engineer's part through the hook's interface, minus the CUDA checkpoint
    (there is no GPU memory to move on declared GPUs): it marks the lease hibernated in the real
    ledger, which gives the slice back, exactly as the real hibernator must."""

    enabled = True
    refuse: str | None = None
    calls: list = []

    def __init__(self, parent=None):
        super().__init__(parent)
        self.ext = parent
        type(self).calls = []

    def can_hibernate(self, lease):
        return (False, self.refuse) if self.refuse else (True, None)

    async def hibernate(self, kernel_id, reason):
        type(self).calls.append((kernel_id, reason))
        ledger = self.ext.backend.pool.ledger
        lease = await asyncio.to_thread(ledger.by_kernel, kernel_id)
        lease = await asyncio.to_thread(ledger.hibernate, lease.id, 0, reason)
        return Outcome(kernel_id, "hibernated", duration=0.01, lease=lease)

    async def resume(self, kernel_id):
        pool = self.ext.backend.pool
        lease = await asyncio.to_thread(pool.ledger.by_kernel, kernel_id)
        return await asyncio.to_thread(pool.ledger.resume, lease.id, pool.settings.quotas)


class GatedHibernator(LedgerOnlyHibernator):
    """A :class:`LedgerOnlyHibernator` whose hibernations wait at a gate the test opens, counting how
    many are in flight at once (the culler's ``cull_concurrency`` bounds that)."""

    gate: asyncio.Event
    in_flight = 0
    most_in_flight = 0

    def __init__(self, parent=None):
        super().__init__(parent)
        cls = type(self)
        cls.gate, cls.in_flight, cls.most_in_flight = asyncio.Event(), 0, 0

    async def hibernate(self, kernel_id, reason):
        cls = type(self)
        cls.in_flight += 1
        cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            await cls.gate.wait()
            return await super().hibernate(kernel_id, reason)
        finally:
            cls.in_flight -= 1
