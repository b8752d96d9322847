"""Properties of sharing, on generated pools and queues: the room a reservation keeps is never given to
a non-member while a member waits for it (or from its lead time to its window), and no one waits
forever in a fair queue."""

from __future__ import annotations

import dataclasses
import datetime as dt
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st
from ledger_helpers import GiB, NO_QUOTA, gpus

from jupyter_gpu_pool.pool import parse_profile
from jupyter_gpu_pool.pool.allocation import Ask, Grant, Holdings, allocate
from jupyter_gpu_pool.pool.fairshare import FAIR, FairShare
from jupyter_gpu_pool.pool.leases import ACTIVE, Lease
from jupyter_gpu_pool.pool.placement import BINPACK
from jupyter_gpu_pool.pool.queue import Waiter, ahead_of, reserve_for_waiters
from jupyter_gpu_pool.pool.reservations import free_on, parse_reservations, unused
from jupyter_gpu_pool.pool.sharing import Sharing
from jupyter_gpu_pool.pool.slices import SliceSpec

PARIS = ZoneInfo("Europe/Paris")
MAKING = dt.datetime(2025, 3, 4, 9, 55, tzinfo=PARIS).timestamp()
DURING = dt.datetime(2025, 3, 4, 10, 30, tzinfo=PARIS).timestamp()
SIZES = [10, 20, 30, 40, 80]


def reservation(gib: int) -> Sharing:
    return Sharing(parse_reservations([{"name": "lab", "groups": ["class"], "days": ["tue"], "start": "10:00",
                                        "end": "12:00", "timezone": "Europe/Paris", "memory": f"{gib}GiB"}]))


def groups_of(member: bool) -> tuple[str, ...]:
    return ("class",) if member else ("others",)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_reserved_room_is_never_given_to_a_non_member_while_a_member_waits_for_it(data):
    pool = gpus(*data.draw(st.lists(st.sampled_from([40, 80]), min_size=1, max_size=3)))
    sharing = reservation(data.draw(st.integers(1, sum(g.memory for g in pool) // GiB)))
    now = data.draw(st.sampled_from([MAKING, DURING]))
    leases: list[Lease] = []
    for n, (member, gpu, gib) in enumerate(data.draw(st.lists(st.tuples(
            st.booleans(), st.integers(0, len(pool) - 1), st.sampled_from(SIZES)), max_size=6))):
        used = sum(lease.memory for lease in leases if lease.gpus == (pool[gpu].uuid,))
        if used + gib * GiB <= pool[gpu].memory:
            leases.append(Lease(id=f"l{n}", owner=f"u{n}", kernel_id=f"k{n}", profile="p", isolation="soft",
                                memory=gib * GiB, sm_percent=None, whole=False, gpu_count=1, state=ACTIVE,
                                gpus=(pool[gpu].uuid,), last_gpus=(), groups=groups_of(member), label="",
                                created=0.0, updated=0.0, state_since=0.0))
    queue = [Waiter(id=f"w{n}", owner=f"q{n}", kernel_id=f"qk{n}", lease_id=None, profile="p",
                    slice=SliceSpec(memory=gib * GiB), label="", enqueued=float(n), heartbeat=float(n), position=n + 1,
                    groups=groups_of(member))
             for n, (member, gib) in enumerate(data.draw(st.lists(st.tuples(st.booleans(), st.sampled_from(SIZES)),
                                                                  max_size=4)))]
    mine = data.draw(st.sampled_from([None, *[w.id for w in queue if "class" not in w.groups]]))
    asker = next((w for w in queue if w.id == mine), None)
    gib = asker.slice.memory // GiB if asker else data.draw(st.sampled_from(SIZES))
    ask = Ask(owner=asker.owner if asker else "stranger", kernel_id="k", profile=parse_profile("p", f"{gib}GiB"),
              groups=("others",))
    held = dataclasses.replace(Holdings.of(pool, leases, queue), everyone=tuple(leases))  # every lease is held
    result = allocate(held, ask, NO_QUOTA, now=now, sharing=sharing, waiter_id=mine)
    if not isinstance(result, Grant):
        return
    free_after, required = _room_left(sharing, held, queue, ask, result, now, mine)
    member_waits = any("class" in w.groups for w in queue)
    if result.borrowed:
        assert now == DURING and not member_waits  # borrowing: only in the window, while no member waits
    else:
        assert free_after >= required
    if member_waits or now == MAKING:
        assert not result.borrowed


def _room_left(sharing, held, queue, ask, grant, now, mine) -> tuple[int, int]:
    """The free memory of the reservation's GPUs once ``grant`` is taken (after the waiters ahead took
    theirs), and what must stay free: the room its members leave unused, as far as it was free before."""
    line = sharing.line(queue, now=now, gpus=held.gpus, everyone=held.leases, use={})
    ahead = ahead_of(line.waiters, mine)
    before = reserve_for_waiters(list(held.gpus), ahead, BINPACK)
    need = unused(sharing.active(now)[0], held.gpus, held.leases)
    kept = max(need.memory - sum(w.slice.memory for w in ahead if "class" in w.groups), 0)
    after = [u.plus(ask.profile.slice) if u.gpu in grant.gpus else u for u in before]
    return free_on(after, need.eligible), min(kept, free_on(before, need.eligible))


def test_the_room_check_can_fail():
    """Without the reservation in the decision, a non-member takes the reserved room, and the check sees it."""
    pool = gpus(80, 80)
    bob = Lease(id="l", owner="bob", kernel_id="kb", profile="p", isolation="soft", memory=40 * GiB, sm_percent=None,
                whole=False, gpu_count=1, state=ACTIVE, gpus=("GPU-0",), last_gpus=(), groups=("others",), label="",
                created=0.0, updated=0.0, state_since=0.0)
    held = Holdings.of(pool, [bob])
    ask = Ask(owner="carl", kernel_id="k", profile=parse_profile("p", "80GiB"), groups=("others",))
    sharing = reservation(80)
    blind = allocate(held, ask, NO_QUOTA, now=MAKING)
    assert isinstance(blind, Grant)
    free_after, required = _room_left(sharing, held, [], ask, blind, MAKING, None)
    assert free_after < required
    assert not isinstance(allocate(held, ask, NO_QUOTA, now=MAKING, sharing=sharing), Grant)


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.integers(1, 5), min_size=2, max_size=3), aging=st.sampled_from([60.0, 600.0, 1800.0]),
       arrivals=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 120)), min_size=1, max_size=40),
       use=st.lists(st.floats(0, 1e6), min_size=3, max_size=3))
def test_no_one_waits_forever_in_a_fair_queue(weights, aging, arrivals, use):
    """Served one a minute, whatever the groups' use: a waiter is served before anyone who came more than
    aging x (the largest ratio) after it, so every waiter's wait is bounded."""
    fair = FairShare(weights={f"g{i}": float(w) for i, w in enumerate(weights)}, aging=aging)
    sharing = Sharing(order=FAIR, fair=fair)
    groups = [f"g{i}" for i in range(len(weights))]
    now, queue, served = 0.0, [], []
    for n, (group, gap) in enumerate(arrivals):
        now += gap
        queue.append(Waiter(id=f"w{n}", owner=f"u{n}", kernel_id=f"k{n}", lease_id=None, profile="p",
                            slice=SliceSpec(memory=GiB), label="", enqueued=now, heartbeat=now,
                            groups=(groups[group % len(groups)],)))
        queue = _serve(sharing, queue, now, dict(zip(groups, use)), served)
    while queue:
        now += 60
        queue = _serve(sharing, queue, now, dict(zip(groups, use)), served)
    longest = aging * fair.bound
    for i, (w, _at) in enumerate(served):
        for later, _ in served[:i]:
            assert later.enqueued <= w.enqueued + longest + 1e-6, "a waiter was passed by one who came much later"


def _serve(sharing, queue, now, use, served):
    line = sharing.line(queue, now=now, gpus=None, everyone=[], use=use)
    head = line.waiters[0]
    served.append((head, now))
    return [w for w in queue if w.id != head.id]


def _old_waiter_served_at(aging: float, minutes: int = 200) -> float | None:
    """A waiter of a group far over its share, and a newcomer of the other group every minute, one served a
    minute: when the old one is served (None: not within ``minutes``)."""
    sharing = Sharing(order=FAIR, fair=FairShare(weights={"a": 1.0, "b": 1.0}, aging=aging))
    queue = [Waiter(id="old", owner="old", kernel_id="k", lease_id=None, profile="p", slice=SliceSpec(memory=GiB),
                    label="", enqueued=0.0, heartbeat=0.0, groups=("a",))]
    served: list = []
    for minute in range(1, minutes):
        now = minute * 60.0
        queue.append(Waiter(id=f"n{minute}", owner="new", kernel_id=f"k{minute}", lease_id=None, profile="p",
                            slice=SliceSpec(memory=GiB), label="", enqueued=now, heartbeat=now, groups=("b",)))
        queue = _serve(sharing, queue, now, {"a": 100.0, "b": 0.0}, served)
        if served[-1][0].id == "old":
            return now
    return None


def test_waiting_is_what_keeps_a_group_over_its_share_from_starving():
    """The property above can fail: without aging (infinite), a waiter of a group over its share is
    passed by every newcomer and never served; with it, it is served within aging x the largest ratio."""
    assert _old_waiter_served_at(float("inf")) is None
    at = _old_waiter_served_at(600.0)
    assert at is not None and at <= 600.0 * FairShare(weights={"a": 1.0, "b": 1.0}).bound + 60
