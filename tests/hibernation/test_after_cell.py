"""A GPU held only while cells run: a rule's ``hibernate_after_cell``, through a real jupyter_server, real
ipykernels, real kernel websockets and the real ledger; only ``jupyter_gpu_pool.devices`` is the
stand-in machine (hibernation_standin.py).

After each cell ends, a kernel whose rule says ``hibernate_after_cell: 2s`` hibernates 2 s later
without a warning, unless another cell starts first; a long cell is never interrupted; the kernel's
own silent executes start nothing; its next cell resumes it with its variables; a kernel woken on a
hint that runs no cell sleeps again once; a kernel that cannot hibernate here is left alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

import pytest
from kernel_helpers import wait_until
from server_hibernation_helpers import API, Server, body, texts

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.hibernation import Kernels
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED

BETWEEN_CELLS = {"name": "between-cells", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
                 "action": "hibernate", "hibernate_after_cell": "2s"}


@pytest.fixture
def jp_server_config(standin_machine, request):
    """The server on the stand-in machine, its policy BETWEEN_CELLS (or the ``pool_settings`` marker's);
    the extension's settings from the ``extension`` marker."""
    from traitlets.config import Config

    from jupyter_gpu_pool.server_extension.sleep.hook import PoolHibernation

    settings = {"policy": [BETWEEN_CELLS], "unix_groups": False}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    standin_machine.configure(gpu_discovery="nvml", inventory=[], profiles=standin_machine.settings["profiles"],
                              **settings)
    ext = {"cull_interval": 0.3, "telemetry_interval": 0.5, "hibernator_class": PoolHibernation}
    marker = request.node.get_closest_marker("extension")
    if marker is not None:
        ext.update(marker.kwargs)
    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}}, "GPUPoolExtension": ext})


@pytest.fixture
def server(jp_fetch, ext, standin) -> Server:
    return Server(jp_fetch, ext, standin)


def policy_entries(server: Server, kid: str) -> list[tuple[str, str]]:
    """(kind, reason) of what the policy and the hook put on record for the kernel, oldest first."""
    return [(e.kind, e.reason) for e in reversed(server.ext.backend.pool.ledger.journal())
            if e.kernel_id == kid and e.detail.get("source") == "policy"]


async def run(ch, code: str) -> list:
    return await ch.replies(await ch.execute(code))


async def asleep(server: Server, kid: str, timeout: float = 20.0) -> float:
    """Wait until the kernel is hibernated and settled, and that is on record (the journal's entry is written
    just after the lease's state); the monotonic time it was first seen hibernated."""
    await wait_until(lambda: server.lease(kid).state == HIBERNATED and not server.lease(kid).phase, timeout=timeout,
                     interval=0.05, what="hibernated")
    seen = time.monotonic()
    await wait_until(lambda: policy_entries(server, kid)[-1:] and policy_entries(server, kid)[-1][0] == "hibernated",
                     timeout=10, interval=0.05, what="its hibernation on record")
    return seen


def awake(server: Server, kid: str) -> bool:
    lease = server.lease(kid)
    return lease.state == ACTIVE and not lease.phase


async def test_a_kernel_sleeps_unwarned_after_its_cell_and_its_next_cell_wakes_it_with_its_variables(
        server, channels, events, standin):
    kid, pid = await server.gpu_kernel()
    assert (await server.me_kernel(kid))["sleeps_after_cell"] == 2.0
    ch = await channels(kid)

    await run(ch, "x = 41")
    ended = time.monotonic()
    slept = await asleep(server, kid) - ended

    assert 1.9 <= slept < 6, slept
    lease = server.lease(kid)
    assert lease.gpus == () and standin.procs[pid].state == cp.ProcessState.CHECKPOINTED
    gpus = (await server.pool())["gpus"]
    assert all(g["used_memory"] == 0 for g in gpus), gpus  # its slice is free in the ledger
    hibernated = await events.action("hibernated", kid)
    assert hibernated["reason"] == "after_cell" and "Asleep between cells" in hibernated["message"]
    assert "warned" not in events.actions(kid)
    entry = next(e for e in server.ext.backend.pool.ledger.journal()
                 if e.kernel_id == kid and e.kind == "hibernated" and e.detail.get("source") == "policy")
    assert entry.reason == "after_cell" and entry.detail["rule"] == "between-cells"
    assert entry.detail["decided"] <= entry.at  # the activity trace's time of the act
    me = await server.me_kernel(kid)
    assert me["state"] == "hibernated" and me["sleeps_after_cell"] == 2.0

    got = await run(ch, "print(x + 1)")

    assert "42\n" in texts(got)
    assert any(t.startswith("Resuming") for t in texts(got))  # the cell resumed it, then ran
    assert standin.procs[pid].state == cp.ProcessState.RUNNING
    assert policy_entries(server, kid) == [("hibernated", "after_cell"), ("resumed", "cell")]
    await asleep(server, kid)  # and after that cell, asleep again
    assert policy_entries(server, kid)[-1] == ("hibernated", "after_cell")
    recent = (await server.me())["recent"]
    assert [r["reason"] for r in recent if r["kernel_id"] == kid][:1] == ["after_cell"]


async def test_the_activity_trace_records_it_as_the_policy_s_hibernation_at_its_moment(server, channels):
    """The planner's replay compares it: an ``act`` (hibernate) with reason after_cell and its rule, at the
    time the wait ended, between the cell's idle and the kernel's next busy."""
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await run(ch, "x = 41")
    ended = time.time()
    await asleep(server, kid)
    ledger = server.ext.backend.pool.ledger

    def acts() -> list:
        return [e for e in ledger.trace_export(owner=None)[0] if e.kernel_id == kid and e.kind == "act"]

    await wait_until(lambda: acts(), timeout=20, what="the act on the trace")

    [act] = acts()
    assert act.data == {"r": "after_cell", "a": "hibernate", "dry": False, "rule": "between-cells"}
    assert ended + 1.9 <= act.at <= ended + 4
    kinds = [e.kind for e in ledger.trace_export(owner=None)[0] if e.kernel_id == kid]
    assert "hibernated" in kinds  # the ledger's own entry: the slice free from then on


async def test_a_cell_started_within_the_time_cancels_it_and_the_wait_starts_again_at_its_end(server, channels):
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)

    await run(ch, "x = 1")
    await asyncio.sleep(1.2)
    await run(ch, "y = 2")  # within the 2 s
    second = time.monotonic()
    await asyncio.sleep(1.3)  # 2.5 s after the first cell's end, 1.3 s after the second's

    assert awake(server, kid)
    slept = await asleep(server, kid) - second
    assert 1.9 <= slept < 6, slept
    assert policy_entries(server, kid) == [("hibernated", "after_cell")]


async def test_a_cell_longer_than_the_time_is_never_interrupted(server, channels, standin):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid)
    await run(ch, "x = 1")  # its end starts the wait...
    started = time.monotonic()
    msg_id = await ch.execute("import time\ntime.sleep(4)\nprint('done', x)")  # ...this 4 s cell cancels it
    seen: list = []
    reading = asyncio.ensure_future(ch.replies(msg_id, seen=seen))

    await asyncio.sleep(3.0)  # past the 2 s, the cell still running
    assert not reading.done() and awake(server, kid)
    assert standin.procs[pid].state == cp.ProcessState.RUNNING
    got = await reading
    ended = time.monotonic()

    assert ended - started >= 3.9 and "done 1\n" in texts(got)
    assert not [t for t in texts(got) if t.startswith("Resuming")]
    assert [kind for _c, kind, content in got if kind == "execute_reply" and content["status"] == "ok"]
    slept = await asleep(server, kid) - ended  # and 2 s after it ended, asleep
    assert 1.9 <= slept < 6, slept
    assert policy_entries(server, kid) == [("hibernated", "after_cell")]


async def silent_execute(ch, code: str) -> str:
    """An execute request with ``silent: true``, as a frontend's own code (not a cell) sends it."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": "u",
              "session": uuid.uuid4().hex, "date": "", "version": "5.3"}
    content = {"code": code, "silent": True, "store_history": False, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": False}
    await ch.ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                          "buffers": [], "channel": "shell"}))
    return header["msg_id"]


async def test_silent_executes_do_not_start_the_wait(server, channels):
    """The kernel's own silent code (the first cell's environment, the cache release) and a frontend's
    silent request are not cells: the kernel stays on its GPU after them."""
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)

    await ch.replies(await silent_execute(ch, "a = 1"))
    assert await Kernels(server.ext.serverapp.kernel_manager).run_silently(kid, "b = 2", 10) == "ran"
    await asyncio.sleep(3.5)

    assert awake(server, kid) and policy_entries(server, kid) == []
    await run(ch, "print(a + b)")  # a cell does
    await asleep(server, kid)
    assert policy_entries(server, kid) == [("hibernated", "after_cell")]


@pytest.mark.pool_settings(policy=[{**BETWEEN_CELLS, "hibernate_after_cell": None}])
async def test_off_by_default_nothing_happens_after_a_cell(server, channels):
    kid, _ = await server.gpu_kernel()
    assert (await server.me_kernel(kid))["sleeps_after_cell"] is None
    ch = await channels(kid)

    await run(ch, "x = 1")
    await asyncio.sleep(3.5)

    assert awake(server, kid) and policy_entries(server, kid) == []
    assert server.ext.hibernator.timers.pending(kid) is None


async def test_a_kernel_that_cannot_hibernate_here_is_left_alone_and_said_so_once(server, channels, standin, caplog):
    standin.available, standin.reason = False, "libcuda.so.1 not found"
    kid, _ = await server.gpu_kernel()
    assert (await server.me_kernel(kid))["sleeps_after_cell"] is None  # the card does not promise it
    ch = await channels(kid)
    caplog.set_level(logging.INFO, logger="jupyter_gpu_pool.server_extension.sleep.timers")

    await run(ch, "x = 1")
    await run(ch, "y = 2")
    await asyncio.sleep(3.0)

    assert awake(server, kid)  # not shut down, not warned
    assert policy_entries(server, kid) == []
    said = [r.getMessage() for r in caplog.records if "cannot hibernate here" in r.getMessage()]
    assert len(said) == 1 and "libcuda.so.1 not found" in said[0] and "between-cells" in said[0]


@pytest.mark.extension(hint_sleep_after=2.5)
async def test_a_kernel_woken_on_a_hint_that_runs_no_cell_sleeps_again_once(server, channels, events):
    """Its cell's wait is cancelled when it is hibernated at its user's request; the hint then wakes it,
    and with no cell it goes back to sleep once, as an unused hint: not a second time for its old cell."""
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await run(ch, "x = 41")
    await server.hibernate(kid)  # within the 2 s: Release GPU

    r = await server.post(kid, "hint")
    assert r.code == 202 and body(r)["woken"] is True
    # one timer, the hint's (set once its resume is on record)
    await wait_until(lambda: awake(server, kid) and server.ext.hibernator.timers.pending(kid) == "hint_unused",
                     what="awake, to sleep again if no cell comes")
    await asleep(server, kid)
    await asyncio.sleep(3.0)  # nothing else comes

    assert policy_entries(server, kid) == [("hibernated", "user"), ("resumed", "hint"), ("hibernated", "hint_unused")]
    assert "warned" not in events.actions(kid)

    got = await run(ch, "print(x + 1)")  # a cell wakes it; after it, asleep between cells again
    assert "42\n" in texts(got)
    await asleep(server, kid)
    assert policy_entries(server, kid)[-2:] == [("resumed", "cell"), ("hibernated", "after_cell")]


@pytest.mark.extension(hint_sleep_after=30)
async def test_a_cell_on_a_kernel_woken_on_a_hint_hands_its_sleep_to_the_cell_rule(server, channels):
    """hint_sleep_after is 30 s: the kernel sleeps 2 s after the cell, by its rule, and only once."""
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await run(ch, "x = 41")
    await asleep(server, kid)
    assert (await server.post(kid, "hint")).code == 202
    await wait_until(lambda: awake(server, kid) and server.ext.hibernator.hinted(kid), what="awake on the hint")

    got = await run(ch, "print(x + 1)")
    ended = time.monotonic()

    assert "42\n" in texts(got) and not server.ext.hibernator.hinted(kid)
    slept = await asleep(server, kid) - ended
    assert 1.9 <= slept < 6, slept
    await asyncio.sleep(1.0)
    assert policy_entries(server, kid) == [("hibernated", "after_cell"), ("resumed", "hint"),
                                           ("hibernated", "after_cell")]


@pytest.mark.pool_settings(policy=[{**BETWEEN_CELLS, "slice_at": "first-cell"}])
async def test_a_kernel_that_takes_its_slice_at_its_first_cell_sleeps_after_it_and_not_before(
        server, channels, jp_fetch):
    """Its slice's environment is set by silent code before the first cell runs: that starts nothing;
    the first cell's end does."""
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "lab.ipynb", "name": "lab.ipynb", "type": "notebook", "kernel": {"name": "gpu-pool-small"}}))
    kid = body(r)["kernel"]["id"]
    assert server.lease(kid).awaits_first_cell
    ch = await channels(kid)

    got = await run(ch, "import os\nx = 41\nprint(os.environ['CUDA_VISIBLE_DEVICES'] != '')")
    ended = time.monotonic()

    assert "True\n" in texts(got)  # it ran on its slice, its environment set first
    assert server.ext.hibernator.timers.pending(kid) == "after_cell"
    slept = await asleep(server, kid) - ended
    assert 1.9 <= slept < 6, slept
    assert [entry for entry in policy_entries(server, kid) if entry[0] == "hibernated"] == [
        ("hibernated", "after_cell")]
    got = await run(ch, "print(x + 1)")
    assert "42\n" in texts(got)


@pytest.mark.extension(hint_sleep_after=1.0)
async def test_sleeps_between_cells_and_after_an_unused_hint_are_logged_at_info_a_release_at_warning(
        server, channels, caplog):
    """A line per cell at WARNING would drown what an admin must read: the quiet sleeps, which lose nothing
    and warn nobody, are INFO; a hibernation its user asked for (or the policy's) stays a WARNING."""
    caplog.set_level(logging.INFO, logger="jupyter_gpu_pool.server_extension.recorder")
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await run(ch, "x = 41")
    await asleep(server, kid)  # after its cell
    assert (await server.post(kid, "hint")).code == 202
    await wait_until(lambda: policy_entries(server, kid)[-1:] == [("hibernated", "hint_unused")],
                     what="asleep again after the unused hint")
    await run(ch, "y = 1")  # wakes it
    await server.hibernate(kid)  # Release GPU, within the 2 s
    await wait_until(lambda: policy_entries(server, kid)[-1:] == [("hibernated", "user")], what="on record")

    assert [e for e in policy_entries(server, kid) if e[0] == "hibernated"] == [
        ("hibernated", "after_cell"), ("hibernated", "hint_unused"), ("hibernated", "user")]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name.endswith(".recorder") and "GPU pool hibernated" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.INFO, logging.INFO, logging.WARNING], lines
    assert "Asleep between cells" in lines[0][1] and "Back to sleep" in lines[1][1]
