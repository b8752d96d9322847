"""A wait in the queue hears why its place is where it is, where the admin's sharing orders the queue
(the cell held for a resume says it: server_extension/sleep/hook.py), and each change of it: behind a
reservation's member going first, then first once the member left, then the slice."""

from __future__ import annotations

import asyncio
import datetime as dt
from zoneinfo import ZoneInfo

from ledger_helpers import NO_QUOTA, gpus, request

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.waiting import Place, wait_for_slice
from jupyter_gpu_pool.pool import SliceSpec
from jupyter_gpu_pool.pool.reservations import parse_reservations
from jupyter_gpu_pool.pool.sharing import Sharing

LAB = {"name": "ML 101 lab", "groups": ["ml101"], "days": ["tue"], "start": "10:00", "end": "12:00",
       "timezone": "Europe/Paris", "memory": "40GiB"}


async def until(predicate, what: str) -> None:
    for _ in range(400):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {what}")


def carl_waits(ledger: Ledger, slice_text: str) -> tuple[list[str], asyncio.Future]:
    """carl's wait for a slice, under way; what it hears of why its place is where it is."""
    heard: list[str] = []

    async def why(text: str) -> None:
        heard.append(text)

    ask = request("carl", slice_text, kernel="kc")
    wait = asyncio.ensure_future(wait_for_slice(
        ledger, lambda waiter: ledger.allocate(ask, NO_QUOTA, waiter_id=waiter),
        Place("carl", "kc", ask.profile.name, ask.profile.slice), poll=0.01, on_why=why))
    return heard, wait


async def test_a_wait_hears_why_it_is_where_it_is_and_each_change(tmp_path, clock):
    clock.now = dt.datetime(2025, 3, 4, 10, 30, tzinfo=ZoneInfo("Europe/Paris")).timestamp()  # the lab is open
    ledger = Ledger(tmp_path / "why.sqlite", clock=clock, waiter_ttl=3600, sharing=Sharing(parse_reservations([LAB])))
    ledger.sync_gpus(gpus(40, 40))
    bob = ledger.allocate(request("bob", "40GiB"), NO_QUOTA)
    ledger.allocate(request("eve", "30GiB", groups=("ml101",)), NO_QUOTA)
    ann = ledger.enqueue("ann", "ka", "p", SliceSpec.parse("10GiB"), groups=("ml101",))  # a member, first
    heard, wait = carl_waits(ledger, "20GiB")
    await until(lambda: heard, "why")
    assert heard == ["2nd in the queue: 1 ahead is going first into room reserved for them"]
    ledger.dequeue(ann.id)  # the member leaves: carl is first, first come first served, and still waits
    await until(lambda: len(heard) == 2, "a change of why")
    assert heard[1] == "" and not wait.done()
    ledger.release(bob.id)
    lease, waited = await asyncio.wait_for(wait, 10)
    assert lease.owner == "carl" and lease.gpus == bob.gpus and waited > 0  # the room bob gave back
    assert len(heard) == 2  # nothing more to hear


async def test_a_first_come_first_served_queue_says_nothing_of_why(tmp_path, clock):
    ledger = Ledger(tmp_path / "fifo.sqlite", clock=clock, waiter_ttl=3600)
    ledger.sync_gpus(gpus(40))
    held = ledger.allocate(request("bob", "40GiB"), NO_QUOTA)
    heard, wait = carl_waits(ledger, "10GiB")
    await until(lambda: [w.why for w in ledger.waiters()] == [""], "carl's place, with no why")
    ledger.release(held.id)
    await asyncio.wait_for(wait, 10)
    assert heard == []
