"""Reservations in the pure core: the admin's entries checked, the phases of a window, the room a
non-member may be admitted into (before, making room, open with and without a member waiting, after),
borrowing, the room taken back (the same least-that-serves choice as pressure reclaim) and overlaps
that cannot both fit the pool."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from ledger_helpers import GiB, NO_QUOTA, gpus

from jupyter_gpu_pool.pool import PoolExhausted, parse_profile
from jupyter_gpu_pool.pool.allocation import Ask, Grant, Holdings, allocate
from jupyter_gpu_pool.pool.leases import ACTIVE, Lease
from jupyter_gpu_pool.pool.queue import Waiter
from jupyter_gpu_pool.pool.reclaim import Candidate, choose_for_reservations, reservation_candidate, shortfall
from jupyter_gpu_pool.pool.reservations import (
    AFTER, BEFORE, MAKING_ROOM, OPEN, ReservationError, check_fit, hold_back, named_in, parse_reservations, unused)
from jupyter_gpu_pool.pool.rules import HIBERNATE, SHUTDOWN, Rule
from jupyter_gpu_pool.pool.sharing import Sharing
from jupyter_gpu_pool.pool.slices import SliceSpec

PARIS = ZoneInfo("Europe/Paris")
LAB = {"name": "ML 101 lab", "groups": ["ml101"], "days": ["tue", "thu"], "start": "10:00", "end": "12:00",
       "timezone": "Europe/Paris", "memory": "80GiB"}


def at(day: int, hour: int, minute: int = 0) -> float:
    """A time in March 2025 in Paris (the 4th is a Tuesday)."""
    return dt.datetime(2025, 3, day, hour, minute, tzinfo=PARIS).timestamp()


def lab(**changes) -> Sharing:
    return Sharing(parse_reservations([{**LAB, **changes}]))


def lease(n: int, owner: str, gpu: str, gib: int, groups=(), whole=False, state=ACTIVE) -> Lease:
    return Lease(id=f"l{n}", owner=owner, kernel_id=f"k{n}", profile="p", isolation="soft", memory=gib * GiB,
                 sm_percent=None, whole=whole, gpu_count=1, state=state, gpus=(gpu,) if state == ACTIVE else (),
                 last_gpus=(gpu,), groups=tuple(groups), label="", created=0.0, updated=0.0, state_since=0.0)


def ask(owner: str, gib: int | str = 40, groups=()) -> Ask:
    text = gib if isinstance(gib, str) else f"{gib}GiB"
    return Ask(owner=owner, kernel_id=f"{owner}-k", profile=parse_profile("p", text), groups=tuple(groups))


def waiter(n: int, owner: str, gib: int = 40, groups=(), enqueued: float = 0.0) -> Waiter:
    return Waiter(id=f"w{n}", owner=owner, kernel_id=f"wk{n}", lease_id=None, profile="p",
                  slice=SliceSpec.parse(f"{gib}GiB"), label="", enqueued=enqueued, heartbeat=enqueued,
                  position=n, groups=tuple(groups))


# -- the admin's entries ---------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"timezone": "Mars/Olympus"}, "[0] ('ML 101 lab').timezone: 'Mars/Olympus' is not a time zone"),
    ({"end": "09:00"}, "[0] ('ML 101 lab').end: the window ends at 09:00, before it starts at 10:00"),
    ({"start": "2025-03-04 10:00", "end": "2025-03-04 09:30", "days": None},
     "[0] ('ML 101 lab').end: the window ends at 2025-03-04 09:30, before it starts"),
    ({"days": ["tue", "someday"]}, "[0] ('ML 101 lab').days must be a list of days"),
    ({"start": "25:00"}, "[0] ('ML 101 lab').start: '25:00' is not a time of day"),
    ({"memory": None}, "[0] ('ML 101 lab') needs 'memory'"),
    ({"memory": "lots"}, "[0] ('ML 101 lab').memory: 'lots' is not a size"),
    ({"gpus": 0}, "[0] ('ML 101 lab').gpus must be a whole number of GPUs of at least 1"),
    ({"groups": []}, "[0] ('ML 101 lab') needs 'groups' or 'users'"),
    ({"timezone": None}, "[0] ('ML 101 lab') needs 'timezone'"),
    ({"lead": "soon"}, "[0] ('ML 101 lab').lead must be"),
    ({"room": "big"}, "[0] has unknown field(s) ['room']"),
    ({"name": ""}, "[0].name must be non-empty text"),
])
def test_a_bad_reservation_is_refused_naming_the_reservation_and_the_field(change, message):
    entry = {k: v for k, v in {**LAB, **change}.items() if v is not None}
    with pytest.raises(ReservationError) as e:
        parse_reservations([entry])
    assert message in str(e.value)


def test_two_reservations_of_one_name_are_refused():
    with pytest.raises(ReservationError, match=r"\[1\] \('ML 101 lab'\).name: 'ML 101 lab' is used by reservation 0"):
        parse_reservations([LAB, LAB])


@pytest.mark.parametrize("words, named", [
    ("reserved for ML 101 lab from 10:00", "ML 101 lab"),
    ("reserved for ML 101 lab B until 12:00", "ML 101 lab B"),  # a name that begins another's: the longest
    ("reserved for Research until 18:00", ""),  # a reservation not configured here
    ("idle for 2 minutes", ""),
])
def test_the_reservation_a_reclaims_words_name(words, named):
    both = parse_reservations([LAB, {**LAB, "name": "ML 101 lab B"}])
    assert named_in(words, both) == named


def test_a_reservation_is_read_with_its_defaults():
    [r] = parse_reservations([{**LAB, "days": "Tuesday", "models": "*H100*", "users": "teacher"}])
    assert (r.window.days, r.window.start, r.window.end, r.lead) == ((1,), dt.time(10), dt.time(12), 600.0)
    assert r.users == ("teacher",) and r.models == ("*H100*",) and r.memory == 80 * GiB and r.gpus is None
    assert r.member("teacher", ()) and r.member("ann", ("ml101",)) and not r.member("bob", ("research",))
    assert r.window.words() == "Tue 10:00-12:00 (Europe/Paris)"


# -- phases ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("now, phase, start", [
    (at(4, 9, 49), BEFORE, at(4, 10)),
    (at(4, 9, 50), MAKING_ROOM, at(4, 10)),
    (at(4, 10), OPEN, at(4, 10)),
    (at(4, 11, 59), OPEN, at(4, 10)),
    (at(4, 12), BEFORE, at(6, 10)),  # the next window, on Thursday
    (at(7, 12), BEFORE, at(11, 10)),  # Friday: next Tuesday
])
def test_a_weekly_window_is_before_making_room_or_open(now, phase, start):
    slot = lab().reservations[0].slot(now)
    assert (slot.phase, slot.start, slot.end - slot.start) == (phase, start, 7200)


def test_a_one_off_window_is_after_once_it_ended_and_its_times_are_the_zones_wall_clock():
    once = {k: v for k, v in LAB.items() if k != "days"}
    [r] = parse_reservations([{**once, "start": "2025-03-30 01:30", "end": "2025-03-30 04:00"}])
    # Paris moves its clocks from 02:00 to 03:00 that night: the window is 1.5 hours long
    assert r.slot(at(29, 12)).phase == BEFORE
    assert r.slot(at(30, 1, 25)).phase == MAKING_ROOM
    slot = r.slot(at(30, 3, 30))
    assert (slot.phase, slot.end - slot.start) == (OPEN, 5400)
    assert r.slot(at(30, 5)).phase == AFTER


def test_members_and_others_read_what_is_reserved_and_when():
    slot = lab().reservations[0].slot(at(4, 10, 30))
    assert slot.words(at(4, 10, 30), member=True) == "ML 101 lab: 80 GiB reserved until 12:00"
    assert slot.words(at(4, 10, 30), member=False) == "80 GiB reserved for ML 101 lab until 12:00"
    before = lab(gpus=1).reservations[0].slot(at(3, 15))
    assert before.words(at(3, 15), member=True) == "ML 101 lab: 1 GPU and 80 GiB reserved from Tue 10:00 to Tue 12:00"
    assert before.reason(at(4, 9, 50)) == "reserved for ML 101 lab from 10:00"


# -- the room a non-member is admitted into ------------------------------------------------------------------

TWO = gpus(80, 80)
BOB = lease(1, "bob", "GPU-0", 40, groups=("research",))


@pytest.mark.parametrize("now, who, groups, expected", [
    (at(4, 9), "carl", (), ["GPU-0"]),  # before: anywhere (binpack: the fuller first)
    (at(4, 9, 55), "carl", (), ["GPU-0"]),  # making room: only the room not reserved
    (at(4, 12, 30), "carl", (), ["GPU-0"]),  # after
    (at(4, 9, 55), "ann", ("ml101",), ["GPU-0"]),  # a member is never kept from her room
])
def test_a_40_gib_start_goes_where_the_room_is_not_reserved(now, who, groups, expected):
    grant = allocate(Holdings.of(TWO, [BOB]), ask(who, 40, groups), NO_QUOTA, now=now, sharing=lab())
    assert isinstance(grant, Grant) and [g.uuid for g in grant.gpus] == expected and grant.borrowed == ()


@pytest.mark.parametrize("now, verdict", [
    (at(4, 9), "granted"),
    (at(4, 9, 55), "refused"),  # making room: the free GPU is the reservation's
    (at(4, 10, 30), "borrowed"),  # open, nobody of the class waits: it may borrow
    (at(4, 12, 30), "granted"),
])
def test_a_non_member_asking_for_the_reserved_room(now, verdict):
    result = allocate(Holdings.of(TWO, [BOB]), ask("carl", 80), NO_QUOTA, now=now, sharing=lab())
    if verdict == "refused":
        assert isinstance(result, PoolExhausted)
        assert "reserved (80 GiB reserved for ML 101 lab from 10:00 to 12:00)" in str(result)
        assert result.to_dict()["reserved"] == "80 GiB reserved for ML 101 lab from 10:00 to 12:00"
    else:
        assert isinstance(result, Grant) and [g.uuid for g in result.gpus] == ["GPU-1"]
        assert result.borrowed == (("ML 101 lab",) if verdict == "borrowed" else ())


def test_a_non_member_may_not_borrow_while_a_member_waits():
    member = waiter(1, "ann", 40, groups=("ml101",))
    held = Holdings.of(TWO, [BOB, lease(2, "dan", "GPU-1", 50)], waiters=[member])
    assert isinstance(allocate(held, ask("carl", 20), NO_QUOTA, now=at(4, 10, 30), sharing=lab()), PoolExhausted)
    alone = Holdings.of(TWO, [BOB, lease(2, "dan", "GPU-1", 50)])
    grant = allocate(alone, ask("carl", 20), NO_QUOTA, now=at(4, 10, 30), sharing=lab())
    assert isinstance(grant, Grant) and grant.borrowed == ("ML 101 lab",)


def test_members_use_counts_against_the_room_kept():
    # ann (a member) holds 40 GiB of GPU 1: 40 GiB of the 80 reserved is left to keep from others
    held = [BOB, lease(2, "ann", "GPU-1", 40, groups=("ml101",))]
    assert unused(lab().reservations[0].slot(at(4, 9, 55)), Holdings.of(TWO, held).gpus, held).memory == 40 * GiB
    first = allocate(Holdings.of(TWO, held), ask("carl", 40), NO_QUOTA, now=at(4, 9, 55), sharing=lab())
    assert isinstance(first, Grant)  # 80 GiB are free, 40 of them kept
    held.append(lease(3, "carl", first.gpus[0].uuid, 40))
    assert isinstance(allocate(Holdings.of(TWO, held), ask("dan", 40), NO_QUOTA, now=at(4, 9, 55), sharing=lab()),
                      PoolExhausted)
    # a reservation of 40 GiB is all used by ann: dan may take the last 40
    assert isinstance(allocate(Holdings.of(TWO, held), ask("dan", 40), NO_QUOTA, now=at(4, 9, 55),
                               sharing=lab(memory="40GiB")), Grant)


def test_members_go_first_into_their_room_and_fifo_keeps_its_order_otherwise():
    queue = [waiter(1, "carl", 40, enqueued=1.0), waiter(2, "ann", 40, groups=("ml101",), enqueued=2.0),
             waiter(3, "dan", 40, enqueued=3.0)]
    line = lab().line(queue, now=at(4, 10, 5), gpus=Holdings.of(TWO, [BOB]).gpus, everyone=[BOB], use={})
    assert [w.owner for w in line.waiters] == ["ann", "carl", "dan"]
    assert [w.position for w in line.waiters] == [1, 2, 3]
    told = {w.owner: w.why for w in line.told()}
    assert told["ann"] == "1st in the queue: going first into the room reserved for ML 101 lab"
    assert told["carl"] == "2nd in the queue: 1 ahead is going first into room reserved for them"
    plain = Sharing().line(queue, now=at(4, 10, 5), gpus=None, everyone=[], use={})
    assert plain.waiters == tuple(queue)  # fifo and nothing reserved: the arrival order, untouched
    # a member whose room is used up waits in arrival order like anyone
    full = [BOB, lease(2, "eve", "GPU-1", 80, groups=("ml101",), whole=False)]
    line = lab().line(queue, now=at(4, 10, 5), gpus=Holdings.of(TWO, full).gpus, everyone=full, use={})
    assert [w.owner for w in line.waiters] == ["carl", "ann", "dan"]


def test_whole_gpus_are_kept_on_the_emptiest_gpus_and_memory_where_most_is_free():
    usage = Holdings.of(gpus(80, 80, 80), [lease(1, "bob", "GPU-0", 60), lease(2, "bob", "GPU-2", 10)]).gpus
    slot = lab(gpus=1, memory="30GiB").reservations[0].slot(at(4, 9, 55))
    need = unused(slot, usage, [])
    held = hold_back(list(usage), [need])
    assert held["GPU-1"].exclusive  # the empty GPU
    assert held["GPU-2"].memory == 40 * GiB and "GPU-0" not in held  # 30 GiB where 70 were free


def test_only_the_models_named_hold_the_room():
    pool = gpus(80, name="NVIDIA A100") + [g.__class__(**{**g.to_dict(), "uuid": "GPU-H", "name": "NVIDIA H100"})
                                          for g in gpus(80)]
    sharing = lab(models=["*H100*"])
    grant = allocate(Holdings.of(pool, []), ask("carl", 80), NO_QUOTA, now=at(4, 9, 55), sharing=sharing)
    assert [g.uuid for g in grant.gpus] == ["GPU-0"]  # the A100: the H100 is reserved


# -- taking the room back ----------------------------------------------------------------------------------

def candidates(leases, rule=Rule(), busy=(), action=HIBERNATE) -> list[Candidate]:
    found = []
    for lease_ in leases:
        c = reservation_candidate(lease_, rule, action, idle_since=lease_.created, busy=lease_.kernel_id in busy)
        if c is not None:
            found.append(c)
    return found


def choose(leases, now, queue=(), sharing=None, rule=Rule(), busy=(), action=HIBERNATE, warned=()):
    sharing = sharing or lab()
    held = Holdings.of(TWO, leases)
    line = sharing.line(list(queue), now=now, gpus=held.gpus, everyone=leases, use={})
    return choose_for_reservations(TWO, leases, line, candidates(leases, rule, busy, action), warned=warned)


def test_before_the_lead_time_nothing_is_taken_back_and_from_it_the_least_that_makes_the_room():
    leases = [lease(1, "bob", "GPU-1", 10), lease(2, "carl", "GPU-1", 30), lease(3, "dan", "GPU-1", 20),
              lease(4, "eve", "GPU-0", 60)]
    assert choose(leases, at(4, 9, 40), busy={"k4"}) == []
    # 80 GiB reserved, 40 free (20 on each GPU): 40 more to free, eve runs a cell; no one kernel frees it,
    # carl's 30 and bob's 10 or carl's and dan's 20 do: two kernels either way, the least memory decides
    picks = choose(leases, at(4, 9, 55), busy={"k4"})
    assert sorted(p.kernel_id for p in picks) == ["k1", "k2"]
    assert all(p.action == HIBERNATE and p.slot.reservation.name == "ML 101 lab" for p in picks)
    assert picks[0].slot.reason(at(4, 9, 55)) == "reserved for ML 101 lab from 10:00"


def test_members_kernels_are_never_taken_back_and_a_running_cell_is_left_alone():
    leases = [lease(1, "ann", "GPU-1", 40, groups=("ml101",)), lease(2, "carl", "GPU-1", 40),
              lease(3, "dan", "GPU-0", 40)]
    assert choose(leases, at(4, 9, 55)) == []  # ann uses 40 of the 80; GPU 0 has the 40 left free
    leases = [lease(1, "bob", "GPU-1", 40), lease(2, "carl", "GPU-1", 40), lease(3, "dan", "GPU-0", 40)]
    picks = choose(leases, at(4, 9, 55), busy={"k1"})
    assert [p.kernel_id for p in picks] == ["k2"]  # bob runs a cell: carl's kernel makes what room it can


def test_state_is_lost_last_and_only_where_the_rule_allows():
    leases = [lease(1, "bob", "GPU-1", 40), lease(2, "carl", "GPU-1", 40), lease(3, "dan", "GPU-0", 40)]
    assert choose(leases, at(4, 9, 55), action=SHUTDOWN) == []  # the rule keeps state: never shut down for it
    assert [p.kernel_id for p in choose(leases, at(4, 9, 55), rule=Rule(action=SHUTDOWN), action=SHUTDOWN)] == ["k1"]
    # bob's kernel would lose its state (an MPS slice), carl's hibernates: carl's goes, though bob's is larger
    leases = [lease(1, "bob", "GPU-1", 50), lease(2, "carl", "GPU-1", 30), lease(3, "dan", "GPU-0", 60)]
    rule = Rule(action=SHUTDOWN)
    found = [Candidate(leases[0], SHUTDOWN, 0.0), Candidate(leases[1], HIBERNATE, 0.0)]
    line = lab(memory="40GiB").line([], now=at(4, 9, 55), gpus=Holdings.of(TWO, leases).gpus, everyone=leases, use={})
    picks = choose_for_reservations(TWO, leases, line, found)
    assert [(p.kernel_id, p.action) for p in picks] == [("k2", HIBERNATE)]
    assert reservation_candidate(leases[0], rule, SHUTDOWN, idle_since=0.0, busy=False) is not None


def test_the_kernels_warned_already_are_kept_as_the_choice():
    leases = [lease(1, "bob", "GPU-1", 40), lease(2, "carl", "GPU-1", 40), lease(3, "dan", "GPU-0", 40)]
    assert [p.kernel_id for p in choose(leases, at(4, 9, 55), warned={"k2"})] == ["k2"]
    assert [p.kernel_id for p in choose(leases, at(4, 9, 55), warned={"k1"})] == ["k1"]


def test_during_the_window_borrowed_room_is_taken_back_only_for_a_member_who_waits():
    leases = [lease(1, "bob", "GPU-1", 40), lease(2, "carl", "GPU-1", 40), lease(3, "dan", "GPU-0", 80)]
    assert choose(leases, at(4, 10, 30)) == []  # borrowed, and no member asks
    picks = choose(leases, at(4, 10, 30), queue=[waiter(1, "ann", 40, groups=("ml101",))])
    assert len(picks) == 1 and picks[0].waiter_id == "w1"
    assert choose(leases, at(4, 12, 30), queue=[waiter(1, "ann", 40, groups=("ml101",))]) == []  # after


def test_shortfall_is_what_is_not_free_of_the_room_kept():
    usage = list(Holdings.of(TWO, [lease(1, "bob", "GPU-1", 30)]).gpus)
    need = unused(lab(gpus=1, memory="60GiB").reservations[0].slot(at(4, 9, 55)), usage, [])
    assert shortfall(usage, need) == (10 * GiB, 0)  # GPU 0 whole for its GPU, 50 of its 60 GiB free on GPU 1


# -- what the pool can hold ---------------------------------------------------------------------------------

def test_overlapping_reservations_that_cannot_both_fit_are_refused_naming_them():
    research = {"name": "Research block", "users": ["bob"], "days": ["tue"], "start": "11:30", "end": "14:00",
                "timezone": "Europe/Paris", "memory": "100GiB"}
    with pytest.raises(ReservationError) as e:
        check_fit(parse_reservations([LAB, research]), TWO, at(1, 0))
    assert "[1] ('Research block'): it overlaps 'ML 101 lab' from Tue 11:20 Europe/Paris" in str(e.value)
    assert "together they reserve 180 GiB on GPUs that hold 160 GiB" in str(e.value)
    # after the class (its lead time included), or on GPUs of their own, both fit
    check_fit(parse_reservations([LAB, {**research, "start": "12:10"}]), TWO, at(1, 0))
    check_fit(parse_reservations([{**LAB, "models": ["A*"]}, {**research, "models": ["B*"]}]),
              gpus(80, name="A100") + [g.__class__(**{**g.to_dict(), "uuid": "B", "name": "B200", "memory": 100 * GiB})
                                       for g in gpus(1)], at(1, 0))


def test_a_reservation_larger_than_its_gpus_or_on_no_gpu_is_refused():
    with pytest.raises(ReservationError, match=r"\[0\] \('ML 101 lab'\): it reserves 3 whole GPUs on 2 GPUs"):
        check_fit(lab(gpus=3, memory=None).reservations, TWO, at(1, 0))
    with pytest.raises(ReservationError, match=r"\[0\] \('ML 101 lab'\).models: no GPU of the pool is one of"):
        check_fit(lab(models=["*B200*"]).reservations, TWO, at(1, 0))
    with pytest.raises(ReservationError, match="it reserves 200 GiB on GPUs that hold 160 GiB"):
        check_fit(lab(memory="200GiB").reservations, TWO, at(1, 0))
