"""A reservation on a real jupyter_server with real kernels, on the declared test pool (2 x 40 GiB):
the room is made before the window by hibernating non-members' idle kernels (warned with the reason,
variables kept), members start at once at the window, and a non-member that borrows unused room during
it is told so and is hibernated, warned, when a member asks.  Real kernels, a real ledger, the real queue.

The window opens seconds after the test's kernels are up: the reservation is given to the running pool
as its settings at a restart would give it (``reserve``), rather than written before the server starts
at a wall-clock minute the test would have to wait for."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import psutil
import pytest
from kernel_helpers import wait_until
from server_hibernation_helpers import texts
from test_declared_hibernation import HIBERNATE, jp_server_config, server  # noqa: F401 (the fixtures)
from traitlets.config import Config

from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.local import processes
from jupyter_gpu_pool.local.waiting import Place, wait_for_slice
from jupyter_gpu_pool.pool import HIBERNATED, LeaseRequest, PoolExhausted

CLASS_TIME = {**HIBERNATE, "name": "class-time", "warn": 2, "slice_at": "start"}
LEAD = 6  # the room is made from 6 s before the window (its kernels hibernated 2 s after their warning)
MEMBER = "ann"  # the reservation's member; the server's own kernels are a non-member's


def reserve(server, *, opens_in: float, lead: float, lasts: float) -> tuple[float, float]:
    """Reservation "ML 101 lab" of the whole pool for ``MEMBER``, opening ``opens_in`` seconds from now;
    its (start, end)."""
    now = time.time()
    start, end = int(now + opens_in), int(now + opens_in + lasts)
    moment = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    settings = load_settings(Config({"GPUPool": {"reservations": [
        {"name": "ML 101 lab", "users": [MEMBER], "start": moment(start), "end": moment(end), "timezone": "UTC",
         "memory": "80GiB", "lead": lead}]}}))
    pool = server.ext.backend.pool
    pool.settings, pool.ledger.sharing = settings, settings.sharing
    return start, end


def member_asks(pool, kernel: str) -> LeaseRequest:
    whole = pool.settings.profiles["whole"]
    return LeaseRequest(owner=MEMBER, kernel_id=kernel, profile=whole, groups=(), manager=processes.identify())


async def _warned(server, kid: str) -> dict | None:
    shown = await server.me_kernel(kid)
    return shown if (shown["warning"] or {}).get("reason") == "reserved" else None


def entries(pool, kid: str) -> list:
    return [e for e in reversed(pool.ledger.journal()) if e.kernel_id == kid and e.detail.get("source") == "policy"]


async def _room_made_of(server, events, kid: str, start: float) -> None:
    """The kernel is warned with the reservation's reason, then hibernated before the window opens."""
    await wait_until(lambda: server.lease(kid).state == HIBERNATED, timeout=60, what=f"{kid} hibernated")
    warned, hibernated = [e for e in entries(server.ext.backend.pool, kid) if e.kind in ("warned", "hibernated")][:2]
    assert warned.kind == "warned" and warned.reason == "reserved" and hibernated.kind == "hibernated"
    clock = dt.datetime.fromtimestamp(start, dt.timezone.utc).strftime("%H:%M")
    assert warned.detail["message"].startswith(f"The GPU room this kernel holds is reserved for ML 101 lab from "
                                               f"{clock}: this kernel will be hibernated")
    assert hibernated.at - warned.at >= 2 and hibernated.at < start  # warned the rule's time, done in time
    assert (await events.action("warned", kid))["reason"] == "reserved"


@pytest.mark.pool_settings(policy=[CLASS_TIME])
@pytest.mark.slow
async def test_a_reservation_makes_its_room_before_the_window_and_takes_borrowed_room_back(server, channels, events):
    pool = server.ext.backend.pool
    a, a_pid = await server.gpu_kernel()
    b, b_pid = await server.gpu_kernel()
    ch = await channels(a)
    await ch.replies(await ch.execute("x = 42"))
    start, end = reserve(server, opens_in=LEAD + 2, lead=LEAD, lasts=120)

    # while warned, GET me names the reservation in the warning and offers no Keep alive (a snooze is refused)
    shown = await wait_until(lambda: _warned(server, a), timeout=60, interval=0.1, what="a's warning in GET me")
    assert shown["warning"]["reservation"] == "ML 101 lab" and "snooze" not in shown["actions"]
    [listed] = (await server.pool())["reservations"]  # the admin's list: who it is for, its window as written
    assert (listed["name"], listed["users"], listed["groups"]) == ("ML 101 lab", [MEMBER], [])
    assert listed["window"].endswith("(UTC)") and listed["member"] is False

    # before the window: both idle kernels are warned with the reason, then hibernated (the least that
    # makes 80 GiB: both 10 GiB slices), their processes and variables kept
    for kid in (a, b):
        await _room_made_of(server, events, kid, start)
    assert psutil.pid_exists(a_pid) and psutil.pid_exists(b_pid)
    me = await server.me()
    assert me["reservations"][0]["words"].startswith("80 GiB reserved for ML 101 lab from")
    assert me["reservations"][0]["member"] is False

    # at the window: the member's kernel starts at once (a whole GPU of the room)
    await wait_until(lambda: time.time() >= start, timeout=30, what="the window")
    first = pool.ledger.allocate(member_asks(pool, "ann-1"), pool.settings.quotas)
    assert first.borrowed == ()

    # a lead time into the window, a non-member's new kernel borrows what the member leaves, and is told so
    await wait_until(lambda: time.time() >= start + LEAD, timeout=30, what="borrowing")
    c, _ = await server.gpu_kernel()
    assert server.lease(c).borrowed == ("ML 101 lab",)
    told = (await server.me_kernel(c))["borrowed"]
    assert told.startswith("Borrowed from the room reserved for ML 101 lab until") and "member needs" in told

    # the member asks for the other GPU: it waits, the borrowing kernel is warned and hibernated, she starts
    with pytest.raises(PoolExhausted):
        pool.ledger.allocate(member_asks(pool, "ann-2"), pool.settings.quotas)
    second, waited = await wait_for_slice(
        pool.ledger, lambda waiter: pool.ledger.allocate(member_asks(pool, "ann-2"), pool.settings.quotas,
                                                         waiter_id=waiter), Place(MEMBER, "ann-2", "whole",
                                                                                   first.slice), poll=0.2, timeout=60)
    assert server.lease(c).state == HIBERNATED and waited >= 2
    assert server.lease(c).borrowed == ("ML 101 lab",)  # the lease remembers; the user reads it gave the room back
    assert (await server.me_kernel(c))["borrowed"] is None
    warned = next(e for e in entries(pool, c) if e.kind == "warned")
    assert warned.reason == "reserved" and "and a member needs it" in warned.detail["message"]

    # the member leaves; a cell on the first kernel borrows the free room again: its variables are there
    for lease in (first, second):
        pool.ledger.release(lease.id, "shutdown")
    got = await ch.replies(await ch.execute("print(x)"), timeout=120)
    assert "42\n" in texts(got)
    assert server.lease(a).borrowed == ("ML 101 lab",) and time.time() < end
