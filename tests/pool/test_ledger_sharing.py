"""The SQLite ledger decides with the admin's sharing (reservations, a fair queue) by calling the same pure
decision: a non-member is kept from reserved room, a borrowed lease is on record as borrowed, waiters'
places and words follow the fair queue, and a share group's use is read from the ledger's GPU time."""

from __future__ import annotations

import datetime as dt
import sqlite3
from zoneinfo import ZoneInfo

import pytest
from ledger_helpers import NO_QUOTA, GiB, gpus, request

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.sharing import group_use
from jupyter_gpu_pool.pool import PoolExhausted, SliceSpec
from jupyter_gpu_pool.pool.fairshare import FAIR, FairShare, decayed
from jupyter_gpu_pool.pool.reservations import parse_reservations
from jupyter_gpu_pool.pool.sharing import Sharing

PARIS = ZoneInfo("Europe/Paris")
LAB = {"name": "ML 101 lab", "groups": ["ml101"], "days": ["tue"], "start": "10:00", "end": "12:00",
       "timezone": "Europe/Paris", "memory": "40GiB"}


def at(hour: int, minute: int = 0) -> float:
    return dt.datetime(2025, 3, 4, hour, minute, tzinfo=PARIS).timestamp()  # a Tuesday


@pytest.fixture
def shared(tmp_path, clock):
    def make(sharing: Sharing) -> Ledger:
        led = Ledger(tmp_path / "shared.sqlite", clock=clock, waiter_ttl=3600, sharing=sharing)
        led.sync_gpus(gpus(40, 40))
        return led
    return make


def test_the_ledger_keeps_reserved_room_from_a_non_member_and_records_what_is_borrowed(shared, clock):
    ledger = shared(Sharing(parse_reservations([LAB])))
    clock.now = at(9, 55)  # making room
    assert ledger.allocate(request("bob", "30GiB"), NO_QUOTA).gpus == ("GPU-1",)  # GPU 0 is kept for the class
    with pytest.raises(PoolExhausted) as refused:
        ledger.allocate(request("carl", "20GiB"), NO_QUOTA)
    assert "reserved (40 GiB reserved for ML 101 lab from 10:00 to 12:00)" in str(refused.value)
    member = ledger.allocate(request("ann", "20GiB", groups=("ml101",)), NO_QUOTA)
    assert member.borrowed == () and member.gpus == ("GPU-0",)
    clock.now = at(10, 30)  # open for the lead time already, nobody of the class waits: carl may borrow
    borrowed = ledger.allocate(request("carl", "20GiB"), NO_QUOTA)
    assert borrowed.gpus == ("GPU-0",) and borrowed.borrowed == ("ML 101 lab",)
    assert ledger.get(borrowed.id).borrowed == ("ML 101 lab",)  # on record, as every server reads it
    clock.now = at(12, 30)
    assert ledger.allocate(request("dan", "10GiB"), NO_QUOTA).borrowed == ()


def test_a_member_waiting_keeps_non_members_from_borrowing_and_goes_first(shared, clock):
    ledger = shared(Sharing(parse_reservations([LAB])))
    clock.now = at(10, 30)
    ledger.allocate(request("bob", "40GiB"), NO_QUOTA)
    ledger.allocate(request("eve", "30GiB", groups=("ml101",)), NO_QUOTA)
    carl = ledger.enqueue("carl", "kc", "p", SliceSpec.parse("10GiB"))
    ann = ledger.enqueue("ann", "ka", "p", SliceSpec.parse("10GiB"), groups=("ml101",))
    assert [(w.owner, w.position) for w in ledger.waiters()] == [("ann", 1), ("carl", 2)]
    assert ledger.heartbeat(ann.id).why == "1st in the queue: going first into the room reserved for ML 101 lab"
    assert ledger.heartbeat(carl.id).why == "2nd in the queue: 1 ahead is going first into room reserved for them"
    with pytest.raises(PoolExhausted):  # 10 GiB are free, but a member waits for them
        ledger.allocate(request("dan", "10GiB"), NO_QUOTA)
    assert ledger.allocate(request("ann", "10GiB", kernel="ka", groups=("ml101",)), NO_QUOTA, waiter_id=ann.id)


def test_fair_places_come_from_the_ledgers_gpu_time(shared, clock):
    fair = FairShare(weights={"ml101": 1.0, "research": 1.0}, half_life=3600.0)
    ledger = shared(Sharing(order=FAIR, fair=fair))
    clock.now = 1_000_000.0
    held = ledger.allocate(request("rita", "40GiB", groups=("research",)), NO_QUOTA)
    clock.advance(1800)
    ledger.release(held.id)
    ledger.allocate(request("rob", "40GiB", groups=("research",)), NO_QUOTA)
    ledger.allocate(request("amy", "40GiB", groups=("ml101",)), NO_QUOTA)
    clock.advance(600)
    first = ledger.enqueue("rita", "k1", "p", SliceSpec.parse("10GiB"), groups=("research",))
    clock.advance(1)
    second = ledger.enqueue("ann", "k2", "p", SliceSpec.parse("10GiB"), groups=("ml101",))
    with ledger.db.read() as db:
        use = group_use(db, fair, clock.now)
    assert use["research"] == pytest.approx(decayed([(40 * GiB, 1_000_000.0, 1_001_800.0),
                                                     (40 * GiB, 1_001_800.0, None)], clock.now, 3600.0))
    assert use["ml101"] == pytest.approx(decayed([(40 * GiB, 1_001_800.0, None)], clock.now, 3600.0))
    assert [(w.owner, w.position) for w in ledger.waiters()] == [("ann", 1), ("rita", 2)]
    assert ledger.heartbeat(first.id).why.startswith("2nd in the queue: group 'research' has used more than its share")
    assert ledger.heartbeat(second.id).position == 1


def test_a_ledger_of_the_last_version_gains_the_waiters_groups_and_what_a_lease_borrows(tmp_path):
    fresh = tmp_path / "v5.sqlite"
    from jupyter_gpu_pool.local.database import SCHEMA
    db = sqlite3.connect(fresh)
    for version, script in enumerate(SCHEMA[:5], start=1):
        db.executescript(script + f"; PRAGMA user_version={version};")
    db.close()
    ledger = Ledger(fresh)  # migrated to version 6 as it opens
    ledger.sync_gpus(gpus(40))
    w = ledger.enqueue("ann", "k", "p", SliceSpec.parse("10GiB"), groups=("ml101",))
    assert w.groups == ("ml101",) and ledger.allocate(request("bob"), NO_QUOTA).borrowed == ()
