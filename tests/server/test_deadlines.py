"""A warning's deadline is when the culler acts, not the first culling pass after it.

A real jupyter_server with real kernels and a long ``cull_interval`` (8 s): the pass that warns is
the last pass before the action, so an action within a second of the deadline can only come from
the culler's timer for that kernel.  Keep alive or a cell before the deadline cancels it."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import time

import pytest
from server_helpers import GatedHibernator, body, execute, kernel_ids, start_kernel, subscribe, wait_until

pytestmark = pytest.mark.usefixtures("ext")

ME = ("gpu-pool", "api", "v1", "me")
INTERVAL = 8.0


def journal(pool_home, kernel_id: str) -> list:
    return [e for e in reversed(pool_home.ledger().journal(limit=500)) if e.kernel_id == kernel_id]


def my_kernel(me: dict, kernel_id: str) -> dict:
    return next(k for k in me["kernels"] if k["kernel_id"] == kernel_id)


async def run_cell(jp_fetch, jp_ws_fetch, kid: str, code: str = "pass") -> float:
    """Run a cell, close the tab and wait for the kernel to be idle: when it was last active."""
    tab = await execute(jp_ws_fetch, kid, code)
    while json.loads(await tab.read_message())["header"]["msg_type"] != "execute_reply":
        pass
    tab.close()

    async def settled():
        model = body(await jp_fetch("api", "kernels", kid))
        return model["execution_state"] == "idle" and model["connections"] == 0 and model

    model = await wait_until(settled, what="the kernel idle after its cell, its tab closed")
    return datetime.datetime.fromisoformat(model["last_activity"]).timestamp()


def next_pass(culler, after: float) -> float:
    """When the culler's first pass after ``after`` is due (its passes keep to a fixed grid)."""
    start, interval = culler.grid
    return start + (math.floor((after - start) / interval) + 1) * interval


async def pass_after(culler, after: float) -> None:
    """Wait until the culler's first pass due after ``after`` is done.  Its passes keep to a fixed grid, the
    first at its start, so that pass is the grid's next and the count of passes done says when it ended (a pass
    skipped or failed only makes this wait for a later one)."""
    start, interval = culler.grid
    index = math.floor((after - start) / interval) + 1
    await wait_until(lambda: culler.passes > index, timeout=3 * INTERVAL, interval=0.05,
                     what="the culler's next pass")


async def warned_after(events, kid: str, last: float, lead: float) -> dict:
    """The warning that follows the kernel's last activity (its deadline at least ``lead`` after it):
    start-up messages may have withdrawn an earlier one."""
    return await events.next(lambda e: e.get("action") == "warned" and e.get("kernel_id") == kid
                             and e["deadline"] >= last + lead - 0.05, timeout=3 * INTERVAL)


@pytest.mark.policy(rules=[{"idle_timeout": 2, "gpu_idle_timeout": None, "warn": 2, "action": "hibernate"}])
@pytest.mark.extension(cull_interval=INTERVAL, hibernator_class=GatedHibernator)
@pytest.mark.slow
async def test_a_warned_kernel_is_acted_on_at_its_deadline_not_at_the_next_pass(jp_fetch, jp_ws_fetch, ext,
                                                                                 pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    last = await run_cell(jp_fetch, jp_ws_fetch, kid)
    warned = await warned_after(events, kid, last, 2)
    following = next_pass(ext.culler, time.time())
    deadline = warned["deadline"]
    assert deadline - time.time() > 0.5  # announced ahead

    # At the deadline the hibernation is under way (held at the test's gate): the card says so, offers
    # no Keep alive, shows no countdown; and this happened between passes.
    async def under_way():
        kernel = my_kernel(body(await jp_fetch(*ME)), kid)
        return kernel["state"] == "hibernating" and kernel
    kernel = await wait_until(under_way, timeout=deadline - time.time() + 1.0, interval=0.05,
                              what="the hibernation under way at the deadline")
    began = time.time()
    assert began >= deadline  # never earlier than announced
    assert began - deadline < 1.0
    assert kernel["actions"] == [] and kernel["warning"] is None and kernel["next_action"] is None
    assert began < following - 1  # no pass came between the warning and the action
    assert GatedHibernator.in_flight == 1  # held at the gate

    GatedHibernator.gate.set()
    hibernated = await events.pool_action("hibernated", kid, timeout=5)
    assert GatedHibernator.calls == [(kid, "idle")]
    assert hibernated["reason"] == "idle"
    entries = [e for e in journal(pool_home, kid) if e.kind in ("warned", "hibernated")
               and e.detail.get("source") == "policy"]  # (the ledger journals the hibernation too)
    assert [e.kind for e in entries if e.at > last] == ["warned", "hibernated"]  # one warning, then the action
    assert entries[-1].detail["decided"] >= deadline and entries[-1].detail["decided"] - deadline < 1.0
    # The next pass finds it hibernated and warns of nothing new.
    await pass_after(ext.culler, time.time())
    assert [e.kind for e in journal(pool_home, kid) if e.kind == "warned" and e.at > last] == ["warned"]
    assert my_kernel(body(await jp_fetch(*ME)), kid)["state"] == "hibernated"
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": 3, "gpu_idle_timeout": None, "warn": 2.5, "snooze": 30,
                            "action": "shutdown"}])
@pytest.mark.extension(cull_interval=INTERVAL, hibernator_class=None)
@pytest.mark.slow
async def test_keep_alive_before_the_deadline_cancels_the_action(jp_fetch, jp_ws_fetch, ext, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    last = await run_cell(jp_fetch, jp_ws_fetch, kid)
    warned = await warned_after(events, kid, last, 2.5)
    assert kid in ext.culler.timers  # the action is set for the deadline

    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "snooze", method="POST", body="{}")
    assert r.code == 200 and body(r)["warning"] is None
    assert kid not in ext.culler.timers  # Keep alive took it off
    snoozed = [e for e in journal(pool_home, kid) if e.kind == "snoozed"]
    # said once: until when, and what follows if it stays idle (not "kept alive until 19:25 · will be
    # hibernated at 19:25 if still idle")
    assert len(snoozed) == 1 and snoozed[0].detail["message"].startswith("Kept alive until ")
    assert ", then shut down if still idle; " in snoozed[0].detail["message"]

    await asyncio.sleep(max(warned["deadline"] - time.time(), 0) + 1.5)
    assert kid in await kernel_ids(jp_fetch)
    assert not [e for e in journal(pool_home, kid) if e.kind in ("culled", "hibernated", "released")]
    events.close()


@pytest.mark.policy(rules=[{"idle_timeout": 6, "gpu_idle_timeout": None, "warn": 2.5, "action": "shutdown"}])
@pytest.mark.extension(cull_interval=INTERVAL, hibernator_class=None)
@pytest.mark.slow
async def test_a_cell_before_the_deadline_cancels_the_action_and_withdraws_the_warning(jp_fetch, jp_ws_fetch, ext,
                                                                                        pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    last = await run_cell(jp_fetch, jp_ws_fetch, kid)
    warned = await warned_after(events, kid, last, 2.5)
    following = next_pass(ext.culler, time.time())
    await run_cell(jp_fetch, jp_ws_fetch, kid, "x = 1")  # used again before the deadline

    await asyncio.sleep(max(warned["deadline"] - time.time(), 0) + 1.0)
    assert time.time() < following  # what follows came from the deadline's check, not a pass
    assert kid in await kernel_ids(jp_fetch)
    assert my_kernel(body(await jp_fetch(*ME)), kid)["warning"] is None  # withdrawn at the deadline
    assert kid not in ext.culler.timers
    assert not [e for e in journal(pool_home, kid) if e.kind in ("culled", "released")]
    events.close()
