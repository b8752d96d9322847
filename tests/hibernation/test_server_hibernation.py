"""Hibernation in a real jupyter_server: the hook, the REST API, transparent resume over the kernel
websocket (both protocols JupyterLab may speak), events.  Real kernels, a real ledger; only
``jupyter_gpu_pool.devices`` is the stand-in machine (hibernation_standin.py): no GPU here.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1, serialize_msg_to_ws_v1
from kernel_helpers import wait_until
from tornado.httpclient import HTTPClientError

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.server_extension.events import SCHEMA_ID

MiB = 2**20
API = ("gpu-pool", "api", "v1")
V1 = "v1.kernel.websocket.jupyter.org"


@pytest.fixture
async def ext(jp_serverapp):
    """The extension, started as ``jupyter server`` starts it (pytest-jupyter runs no start hooks):
    the culler, the sampler and the hibernation upkeep run."""
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    yield app
    await app.stop_extension()


def body(response) -> dict:
    return json.loads(response.body.decode())


class Server:
    """One test's server: kernels over REST, the stand-in's view of their processes, GET me."""

    def __init__(self, jp_fetch, jp_ws_fetch, ext, standin):
        self.fetch, self.ws_fetch, self.ext, self.standin = jp_fetch, jp_ws_fetch, ext, standin

    async def gpu_kernel(self, gpu_bytes: int = 400 * MiB, profile: str = "small") -> tuple[str, int]:
        r = await self.fetch("api", "kernels", method="POST", body=json.dumps({"name": f"gpu-pool-{profile}"}))
        kid = body(r)["id"]
        pid = self.ext.serverapp.kernel_manager.get_kernel(kid).provisioner.pid
        lease = self.ext.backend.pool.ledger.by_kernel(kid)
        self.standin.add(pid, gpu_bytes, gpus=lease.gpus)
        return kid, pid

    async def me_kernel(self, kid: str) -> dict:
        me = body(await self.fetch(*API, "me"))
        return next(k for k in me["kernels"] if k["kernel_id"] == kid)

    async def post(self, kid: str, action: str, payload: dict | None = None):
        return await self.fetch(*API, "kernels", kid, action, method="POST", body=json.dumps(payload or {}))

    async def hibernate(self, kid: str) -> None:
        r = await self.post(kid, "release")
        assert r.code == 202 and body(r)["action"] == "hibernate"
        await wait_until(lambda: self.lease(kid).state == "hibernated", what="hibernated")

    def lease(self, kid: str):
        return self.ext.backend.pool.ledger.by_kernel(kid)


@pytest.fixture
def server(jp_fetch, jp_ws_fetch, ext, standin) -> Server:
    return Server(jp_fetch, jp_ws_fetch, ext, standin)


class Events:
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


@pytest.fixture
async def events(jp_ws_fetch):
    ws = await jp_ws_fetch("api", "events", "subscribe")
    yield Events(ws)
    ws.close()


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

    async def replies(self, msg_id: str, timeout: float = 60.0) -> list[tuple[str, str, dict]]:
        """(channel, msg_type, content) of every message for ``msg_id`` until its execute_reply and idle."""
        got: list[tuple[str, str, dict]] = []
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


@pytest.fixture
def channels(jp_ws_fetch):
    opened = []

    async def open_(kid: str, v1: bool = False) -> Channels:
        ws = await jp_ws_fetch("api", "kernels", kid, "channels", subprotocols=[V1] if v1 else None)
        opened.append(ws)
        return Channels(ws, v1)

    yield open_
    for ws in opened:
        ws.close()


def texts(got) -> list[str]:
    out = []
    for _channel, kind, content in got:
        if kind == "stream":
            out.append(content["text"])
        elif kind in ("display_data", "update_display_data"):
            out.append(content["data"]["text/plain"])
    return out


# -- the hook, the API, events ---------------------------------------------------------------------


async def test_release_hibernates_and_resume_brings_it_back_reported_everywhere(server, events, standin):
    kid, pid = await server.gpu_kernel(gpu_bytes=700 * MiB)
    before = await server.me_kernel(kid)
    assert before["state"] == "active" and before["can_hibernate"] and before["release_action"] == "hibernate"

    await server.hibernate(kid)
    hibernated = await events.action("hibernated", kid)
    assert hibernated["bytes"] == 700 * MiB and hibernated["duration"] >= 0 and "host RAM" in hibernated["message"]
    assert standin.procs[pid].state == cp.ProcessState.CHECKPOINTED
    me = await server.me_kernel(kid)
    assert me["state"] == "hibernated" and "resume" in me["actions"] and me["memory_used"] is None

    from jupyter_gpu_pool.cli import render_status

    pool = server.ext.backend.pool
    status = render_status(pool, pool.ledger.snapshot())
    assert "Hibernated (no GPU held; memory in host RAM):" in status and "700 MiB" in status

    r = await server.post(kid, "resume")
    assert r.code == 202 and body(r)["state"] in ("resuming", "active") and body(r)["kernel_id"] == kid
    resumed = await events.action("resumed", kid)
    assert resumed["bytes"] == 700 * MiB and resumed["duration"] >= 0
    await wait_until(lambda: server.lease(kid).state == "active" and server.lease(kid).phase == "")
    assert (await server.me_kernel(kid))["state"] == "active"
    assert standin.procs[pid].state == cp.ProcessState.RUNNING


async def test_resume_of_a_kernel_that_is_not_hibernated_is_refused_plainly(server):
    kid, _ = await server.gpu_kernel()
    with pytest.raises(HTTPClientError) as err:
        await server.post(kid, "resume")
    assert err.value.code == 409
    error = json.loads(err.value.response.body)
    assert error["reason"] == "not_hibernated" and "nothing to resume" in error["message"]
    with pytest.raises(HTTPClientError) as err:
        await server.post(kid, "resume", {"now": True})
    assert err.value.code == 400 and json.loads(err.value.response.body)["reason"] == "unknown_keys"
    with pytest.raises(HTTPClientError) as err:
        await server.post("no-such-kernel", "resume")
    assert err.value.code == 404


async def test_a_kernel_running_a_cell_is_not_hibernated_and_keeps_running(server, channels, standin):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid)
    msg_id = await ch.execute("import time; time.sleep(4); print('done')")
    km = server.ext.serverapp.kernel_manager
    await wait_until(lambda: km.get_kernel(kid).execution_state == "busy", what="busy")
    from jupyter_gpu_pool.hibernation import HibernationRefused

    with pytest.raises(HibernationRefused) as err:
        await server.ext.hibernator.hibernate(kid, "idle")
    assert err.value.reason == "busy" and err.value.keep_running
    assert standin.calls == [] or all(c[0] == "cuCheckpointProcessGetState" for c in standin.calls)
    assert "done\n" in texts(await ch.replies(msg_id))
    assert server.lease(kid).state == "active"


# -- transparent resume ----------------------------------------------------------------------------


@pytest.mark.parametrize("v1", [False, True], ids=["json-protocol", "v1-protocol"])
async def test_a_cell_run_on_a_hibernated_kernel_resumes_it_then_runs(server, channels, events, standin, v1):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid, v1=v1)
    first = await ch.execute("x = 41")
    await ch.replies(first)
    await server.hibernate(kid)

    msg_id = await ch.execute("print(x + 1)")
    got = await ch.replies(msg_id)

    kinds = [k for _c, k, _ in got]
    assert kinds[0] == "status" and got[0][2]["execution_state"] == "busy"  # the cell shows busy at once
    assert "Resuming this kernel" in texts(got)[0]  # and says why it waits
    assert kinds.index("clear_output") < kinds.index("execute_input")  # the notice goes before the cell runs
    assert "42\n" in texts(got)
    reply = next(c for _ch, k, c in got if k == "execute_reply")
    assert reply["status"] == "ok"
    assert standin.procs[pid].state == cp.ProcessState.RUNNING and server.lease(kid).state == "active"
    assert (await events.action("resumed", kid))["reason"] == "cell"


async def test_a_cell_waits_in_the_queue_says_its_place_and_runs_when_a_slice_frees(server, channels, standin):
    from jupyter_gpu_pool.pool import LeaseRequest, Profile, SliceSpec

    kid, pid = await server.gpu_kernel(profile="big")
    ch = await channels(kid)
    await server.hibernate(kid)
    ledger = server.ext.backend.pool.ledger
    quotas = server.ext.backend.pool.settings.quotas
    full = Profile("full", SliceSpec.parse("80GiB"), "soft", "full")
    blockers = [ledger.allocate(LeaseRequest(owner="bob", kernel_id=f"b{i}", profile=full), quotas) for i in (0, 1)]

    msg_id = await ch.execute("print('ran')")
    await wait_until(lambda: server.lease(kid).phase == "queued", what="queued")
    me = await server.me_kernel(kid)
    assert me["state"] == "queued" and me["queue_position"] == 1
    await asyncio.sleep(1.0)
    ledger.release(blockers[1].id)  # a slice frees up
    got = await ch.replies(msg_id)
    assert any("position 1 in the queue" in t for t in texts(got))
    assert "ran\n" in texts(got) and server.lease(kid).state == "active"


@pytest.mark.pool_settings(default_user_quota={"memory": "15GiB"})
async def test_a_cell_on_a_kernel_that_cannot_resume_gets_an_error_saying_why(server, channels, standin):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid)
    await server.hibernate(kid)
    other, _ = await server.gpu_kernel(gpu_bytes=0)  # takes the quota the first kernel gave back

    msg_id = await ch.execute("print('ran')")
    got = await ch.replies(msg_id)

    reply = next(c for _ch, k, c in got if k == "execute_reply")
    assert reply["status"] == "error" and reply["ename"] == "GPUPoolResumeError"
    assert "could not resume" in reply["evalue"] and "quota" in reply["evalue"]
    assert ("iopub", "status", {"execution_state": "idle"}) in got
    assert "ran\n" not in texts(got)
    assert server.lease(kid).state == "hibernated" and standin.procs[pid].state == cp.ProcessState.CHECKPOINTED


async def test_messages_to_an_awake_kernel_pass_straight_through(server, channels, standin):
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    got = await ch.replies(await ch.execute("print('hi')"))
    assert [k for _c, k, _ in got if k in ("display_data", "clear_output")] == []
    assert "hi\n" in texts(got)
    assert standin.calls == []  # nothing asked of the driver


@pytest.mark.pool_settings(hibernation_lock_timeout=0.5)
async def test_a_refusal_for_now_leaves_the_kernel_running_and_the_user_is_told_why(server, standin, events):
    kid, pid = await server.gpu_kernel()
    standin.busy_for(pid, 120)  # GPU work in flight that outlasts the lock timeout
    r = await server.post(kid, "release")
    assert r.code == 202 and body(r)["action"] == "hibernate"
    refused = await events.action("refused", kid)
    assert refused["reason"] == "gpu_busy" and "left running, untouched" in refused["message"]
    me = body(await server.fetch(*API, "me"))
    assert any(item["kind"] == "refused" and item["kernel_id"] == kid and item["reason"] == "gpu_busy"
               for item in me["recent"])
    assert kid in server.ext.serverapp.kernel_manager  # not shut down instead
    assert server.lease(kid).state == "active" and standin.procs[pid].state == cp.ProcessState.RUNNING
    assert (await server.me_kernel(kid))["state"] == "active"


async def test_the_hook_is_the_extensions_default_and_installs_transparent_resume(jp_serverapp):
    from jupyter_gpu_pool.server_extension.app import GPUPoolExtension
    from jupyter_gpu_pool.server_extension.hibernation_hook import PoolHibernation
    from jupyter_gpu_pool.server_extension.hibernation_websocket import TransparentResume

    assert GPUPoolExtension().hibernator_class is PoolHibernation
    assert issubclass(jp_serverapp.web_app.settings["kernel_websocket_connection_class"], TransparentResume)


async def test_shutting_down_a_hibernated_kernel_releases_its_lease_and_its_host_ram(server, jp_fetch):
    kid, pid = await server.gpu_kernel(gpu_bytes=500 * MiB)
    await server.hibernate(kid)
    pool = server.ext.backend.pool
    assert pool.ledger.host_bytes_on(pool.host) == 500 * MiB
    lease_id = server.lease(kid).id
    await jp_fetch("api", "kernels", kid, method="DELETE")
    released = pool.ledger.get(lease_id)
    assert released.state == "released" and pool.ledger.host_bytes_on(pool.host) == 0
    await wait_until(lambda: kid not in server.ext.hibernator.hibernator._kernels, what="forgotten at the next upkeep")
    assert not server.ext.hibernator.asleep(kid)


async def test_a_held_cell_is_answered_when_its_kernel_is_shut_down_while_queued(server, channels, jp_fetch):
    from jupyter_gpu_pool.pool import LeaseRequest, Profile, SliceSpec

    kid, _ = await server.gpu_kernel(profile="big")
    ch = await channels(kid)
    await server.hibernate(kid)
    ledger, quotas = server.ext.backend.pool.ledger, server.ext.backend.pool.settings.quotas
    full = Profile("full", SliceSpec.parse("80GiB"), "soft", "full")
    for i in (0, 1):
        ledger.allocate(LeaseRequest(owner="bob", kernel_id=f"b{i}", profile=full), quotas)
    msg_id = await ch.execute("print('ran')")
    await wait_until(lambda: server.lease(kid).phase == "queued", what="queued")
    await jp_fetch("api", "kernels", kid, method="DELETE")
    got = await ch.replies(msg_id)
    reply = next(c for _ch, k, c in got if k == "execute_reply")
    assert reply["status"] == "error" and "shut down before it could resume" in reply["evalue"]
    assert ledger.waiters() == []
