"""A resume its user asked for restarts the kernel's idle clock (issue 28): a kernel the user just asked for
is not judged idle for the time before it slept, so its next warning comes a whole idle time after the
resume, not seconds after it.  Real jupyter_server, real kernels, the real ledger and queue, declared GPUs."""

from __future__ import annotations

import re
import time

import pytest
from kernel_helpers import wait_until
from server_hibernation_helpers import body
from test_declared_hibernation import HIBERNATE, fill_pool, jp_server_config, server  # noqa: F401 (the declared pool's fixtures)

from jupyter_gpu_pool.pool import ACTIVE

IDLE, WARN = 3.0, 1.5  # a kernel idle 3 s is hibernated, warned 1.5 s ahead


async def _idle_past_its_time_asleep(server, channels) -> str:
    """A kernel that ran a cell, was released (hibernated) at once, and has slept past its idle time since."""
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await ch.replies(await ch.execute("x = 42"))
    ran = time.time()
    await server.hibernate(kid)
    await wait_until(lambda: time.time() > ran + IDLE + WARN, what="its last cell older than its idle time")
    return kid


@pytest.mark.pool_settings(policy=[{**HIBERNATE, "idle_timeout": IDLE, "warn": WARN}])
async def test_the_resume_button_restarts_the_idle_clock(server, channels, events):
    kid = await _idle_past_its_time_asleep(server, channels)

    asked = time.time()
    r = await server.post(kid, "resume")
    assert r.code == 202, body(r)
    await events.action("resumed", kid)
    warned = await events.action("warned", kid, timeout=60)  # it is warned again, a whole idle time later

    assert warned["deadline"] >= asked + IDLE, (warned, asked)  # not "hibernates in 0:01" at once
    idle = re.match(r"Idle for ([\d.]+)s:", warned["message"])
    assert idle and float(idle.group(1)) < IDLE, warned["message"]  # idle since the resume, not since the cell


@pytest.mark.pool_settings(policy=[{**HIBERNATE, "idle_timeout": IDLE, "warn": WARN}])
@pytest.mark.slow
async def test_a_resume_that_waited_in_the_queue_restarts_the_clock_when_it_has_its_slice(server, channels, events):
    kid = await _idle_past_its_time_asleep(server, channels)
    blockers = fill_pool(server.ext.backend.pool)
    r = await server.post(kid, "resume")
    assert r.code == 202, body(r)
    await wait_until(lambda: server.lease(kid).phase == "queued", what="its resume queued")
    waited = time.time()
    await wait_until(lambda: time.time() > waited + IDLE, what="a wait in the queue longer than its idle time")

    server.ext.backend.pool.ledger.release(blockers[0].id)
    await wait_until(lambda: server.lease(kid).state == ACTIVE and not server.lease(kid).phase, what="resumed")
    back = time.time()
    warned = await events.action("warned", kid, timeout=60)

    assert warned["deadline"] >= back + IDLE - 0.5, (warned, back)  # from when it had its slice, not the ask
