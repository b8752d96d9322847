"""Hibernation in a real jupyter_server: the hook, the REST API, transparent resume over the kernel
websocket (both protocols JupyterLab may speak), events.  Real kernels, a real ledger; only
``jupyter_gpu_pool.devices`` is the stand-in machine (hibernation_standin.py): no GPU here.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hibernation_standin import STANDIN_GPUS
from kernel_helpers import kernelspec_wrapping, wait_until
from server_hibernation_helpers import MiB, API, Server, body, texts
from tornado.httpclient import HTTPClientError

from jupyter_gpu_pool.devices import checkpoint as cp


@pytest.fixture
def server(jp_fetch, ext, standin) -> Server:
    return Server(jp_fetch, ext, standin)


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


@pytest.mark.pool_settings(hibernation_lock_timeout=1)
async def test_a_release_right_after_a_slow_start_waits_for_the_kernel_and_hibernates(server, standin, monkeypatch):
    """CI under load: a Release in the seconds after a start timed out on the cache release (the kernel
    had not answered yet) and was refused as 'GPU work did not finish'.  The lock's timeout is for the
    kernel's GPU work; a kernel still starting is waited for first."""
    monkeypatch.setattr("jupyter_gpu_pool.pool.hibernation.ANSWER_GRACE", 1.0)  # (5 s otherwise)
    # it answers 3 s and more after its start: past the cache release's bound (the lock's 1 s + 1 s of grace)
    kernelspec_wrapping("gpu-pool-small", "gpu-pool-slow", "sleep 3")
    kid, pid = await server.gpu_kernel(gpu_bytes=300 * MiB, profile="slow")
    await server.hibernate(kid)
    assert standin.procs[pid].state == cp.ProcessState.CHECKPOINTED


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


async def test_a_kernel_running_a_cell_is_not_hibernated_and_keeps_running(server, channels, standin, tmp_path):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid)
    go = tmp_path / "go"  # the cell runs until the test has tried to hibernate the kernel
    msg_id = await ch.execute(f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done')")
    km = server.ext.serverapp.kernel_manager
    await wait_until(lambda: km.get_kernel(kid).execution_state == "busy", what="busy")
    from jupyter_gpu_pool.hibernation import HibernationRefused

    with pytest.raises(HibernationRefused) as err:
        await server.ext.hibernator.hibernate(kid, "idle")
    assert err.value.reason == "busy" and err.value.keep_running
    assert standin.calls == [] or all(c[0] == "cuCheckpointProcessGetState" for c in standin.calls)
    go.touch()
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


async def test_a_cell_waits_while_its_gpu_lacks_the_memory_and_its_user_is_told_why(server, channels, standin_memory):
    kid, _ = await server.gpu_kernel(gpu_bytes=600 * MiB)
    ch = await channels(kid)
    await server.hibernate(kid)
    for gpu in STANDIN_GPUS:  # another process fills both GPUs beyond any slice: 1 GiB is left on each
        standin_memory.held_elsewhere[gpu.uuid] = gpu.memory - 2**30

    seen: list = []
    cell = asyncio.ensure_future(ch.replies(await ch.execute("print('ran')"), timeout=120, seen=seen))
    await wait_until(lambda: any("of GPU memory to be free" in t for t in texts(seen)), what="the reason shown")

    me = await server.me_kernel(kid)
    assert me["state"] == "queued" and me["queue_position"] == 1
    assert me["queue_reason"].startswith("waiting for 1.6 GiB of GPU memory to be free on GPU 0 or GPU 1")
    assert any("Position 1 in the queue" in t for t in texts(seen)) and not cell.done()
    standin_memory.held_elsewhere.clear()
    got = await asyncio.wait_for(cell, 120)
    assert "ran\n" in texts(got) and server.lease(kid).state == "active"
    assert (await server.me_kernel(kid))["queue_reason"] is None


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
    from jupyter_gpu_pool.server_extension.sleep.hook import PoolHibernation
    from jupyter_gpu_pool.server_extension.sleep.websocket import TransparentResume

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
    await wait_until(lambda: kid not in server.ext.hibernator.hibernator.handles, what="forgotten at the next upkeep")
    assert not server.ext.hibernator.asleep(kid)


async def test_a_held_cell_is_answered_when_its_kernel_is_shut_down_while_queued(server, channels, jp_fetch,
                                                                                 monkeypatch):
    """At once: its wait ends with the resume, not at the next redraw of its notice (once a minute here; the
    cell was answered only then)."""
    from jupyter_gpu_pool.pool import LeaseRequest, Profile, SliceSpec

    monkeypatch.setattr("jupyter_gpu_pool.server_extension.sleep.websocket.NOTICE_REDRAW", 60.0)

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
    got = await ch.replies(msg_id, timeout=30)
    reply = next(c for _ch, k, c in got if k == "execute_reply")
    assert reply["status"] == "error" and "shut down before it could resume" in reply["evalue"]
    assert ledger.waiters() == []
