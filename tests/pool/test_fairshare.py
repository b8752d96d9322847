"""Fair share in the pure core: the queue's order by group weights, recent use (decayed by its half-life)
and waiting time, the words a waiter reads, and fifo left exactly as it was."""

from __future__ import annotations

import math

import pytest
from ledger_helpers import GiB, NO_QUOTA, gpus

from jupyter_gpu_pool.pool import PoolExhausted, parse_profile
from jupyter_gpu_pool.pool.allocation import Ask, Grant, Holdings, allocate
from jupyter_gpu_pool.pool.fairshare import FAIR, OTHERS, Decaying, FairShare, decayed, parse_weights, ratios
from jupyter_gpu_pool.pool.queue import Waiter
from jupyter_gpu_pool.pool.sharing import Sharing
from jupyter_gpu_pool.pool.slices import SliceSpec

HOUR = 3600.0
FAIR_SHARE = FairShare(weights={"ml101": 1.0, "research": 1.0}, half_life=HOUR, aging=1800.0)


def waiter(n: int, owner: str, group: str, enqueued: float, gib: int = 40) -> Waiter:
    return Waiter(id=f"w{n}", owner=owner, kernel_id=f"k{n}", lease_id=None, profile="p",
                  slice=SliceSpec.parse(f"{gib}GiB"), label="", enqueued=enqueued, heartbeat=enqueued, position=n,
                  groups=(group,) if group else ())


def order(waiters, use, fair=FAIR_SHARE, now=1000.0):
    line = Sharing(order=FAIR, fair=fair).line(waiters, now=now, gpus=None, everyone=[], use=use)
    return [w.owner for w in line.waiters]


@pytest.mark.parametrize("use, weights, expected", [
    ({}, {"ml101": 1, "research": 1}, ["rita", "ann", "rob", "amy"]),  # nobody used anything: arrival order
    ({"research": 100.0}, {"ml101": 1, "research": 1}, ["ann", "amy", "rita", "rob"]),  # research used it all
    ({"ml101": 100.0}, {"ml101": 1, "research": 1}, ["rita", "rob", "ann", "amy"]),
    # both used as much, but research's weight is twice ml101's: ml101 used more than its share
    ({"ml101": 50.0, "research": 50.0}, {"ml101": 1, "research": 2}, ["rita", "rob", "ann", "amy"]),
    ({"ml101": 50.0, "research": 50.0}, {"ml101": 1, "research": 1}, ["rita", "ann", "rob", "amy"]),
])
def test_the_group_under_its_weighted_share_goes_first_and_arrival_order_holds_within_a_group(use, weights, expected):
    queue = [waiter(1, "rita", "research", 990.0), waiter(2, "ann", "ml101", 991.0),
             waiter(3, "rob", "research", 992.0), waiter(4, "amy", "ml101", 993.0)]
    fair = FairShare(weights=weights, half_life=HOUR, aging=1800.0)
    assert order(queue, use, fair) == expected


def test_waiting_raises_a_waiter_so_that_no_one_waits_forever():
    use = {"research": 100.0}  # research's ratio is 2 (all the use, half the weight), ml101's 0
    # ann came 999 s after rita: 2 - 1000/1800 > 0 - 1/1800, ann goes first
    assert order([waiter(1, "rita", "research", 0.0), waiter(2, "ann", "ml101", 999.0)], use, now=1000.0) == [
        "ann", "rita"]
    # ann came more than aging x 2 (the ratios' difference) after rita: rita goes first
    assert order([waiter(1, "rita", "research", 0.0), waiter(2, "ann", "ml101", 3650.0)], use, now=3700.0) == [
        "rita", "ann"]
    assert FAIR_SHARE.bound == 3.0  # the largest ratio: (1 + 1 + 1 for the others) / 1


def test_users_in_no_weighted_group_share_one_group_and_its_weight():
    fair = FairShare(weights={"ml101": 3.0}, others_weight=1.0)
    assert fair.group_of(("staff", "ml101")) == "ml101" and fair.group_of(("staff",)) == OTHERS
    assert FairShare(weights={"a": 1.0, "b": 1.0}).group_of(("b", "a")) == "a"  # the weights' order decides
    r = ratios({"ml101": 30.0, OTHERS: 10.0}, ["ml101", OTHERS], fair)
    assert r == pytest.approx({"ml101": 1.0, OTHERS: 1.0})  # 75% of the use on 75% of the weight


def test_use_decays_by_its_half_life_and_the_running_sum_agrees_with_the_intervals():
    ten = 10 * GiB
    assert decayed([(ten, 0.0, HOUR)], HOUR, HOUR) == pytest.approx(10 * HOUR / math.log(2) * 0.5)
    # an hour later the same hour of use counts half
    assert decayed([(ten, 0.0, HOUR)], 2 * HOUR, HOUR) == pytest.approx(decayed([(ten, 0.0, HOUR)], HOUR, HOUR) / 2)
    intervals = [(ten, 100.0, 1900.0), (4 * GiB, 1000.0, None), (2 * GiB, 2500.0, 4000.0)]
    events = sorted([(s, m) for m, s, _e in intervals] + [(e, -m) for m, _s, e in intervals if e is not None])
    running = Decaying(HOUR)
    for t, m in events:
        running.change(t, m)
    assert running.at_time(5000.0) == pytest.approx(decayed(intervals, 5000.0, HOUR))


def test_a_waiter_reads_why_it_is_where_it_is():
    queue = [waiter(1, "rita", "research", 900.0), waiter(2, "rob", "research", 950.0),
             waiter(3, "ann", "ml101", 990.0), waiter(4, "amy", "ml101", 995.0), waiter(5, "zed", "", 999.0)]
    line = Sharing(order=FAIR, fair=FAIR_SHARE).line(queue, now=1000.0, gpus=None, everyone=[],
                                                     use={"research": 100.0, "ml101": 10.0})
    told = {w.owner: (w.position, w.why) for w in line.told()}
    assert told["zed"] == (1, "1st in the queue: users in no group with a share have used less than their share "
                              "lately")
    assert told["rita"] == (4, "4th in the queue: group 'research' has used more than its share lately (2.7x); "
                               "3 ahead are from groups under their share")
    assert told["rob"] == (5, "5th in the queue: group 'research' has used more than its share lately (2.7x); "
                              "4 ahead: 3 from groups under their share, 1 from your group, who came earlier")
    assert told["amy"] == (3, "3rd in the queue: group 'ml101' has used less than its share lately; 2 ahead: "
                              "1 from groups under their share, 1 from your group, who came earlier")


def test_fair_order_decides_who_is_served_first_by_allocate():
    pool = gpus(80)
    queue = [waiter(1, "rita", "research", 10.0), waiter(2, "ann", "ml101", 20.0)]
    held = Holdings.of(pool, [], waiters=queue)
    held = Holdings(leases=held.leases, gpus=held.gpus, waiters=held.waiters, group_use={"research": 500.0})
    sharing = Sharing(order=FAIR, fair=FAIR_SHARE)

    def asks(owner, n, group):
        return Ask(owner=owner, kernel_id=f"k{n}", profile=parse_profile("p", "60GiB"), groups=(group,))
    # 80 GiB, two waiters of 40 each ahead of anyone new: under fifo rita is first; under fair share ann is
    assert isinstance(allocate(held, asks("rita", 1, "research"), NO_QUOTA, now=30.0, waiter_id="w1"), Grant)
    assert isinstance(allocate(held, asks("rita", 1, "research"), NO_QUOTA, now=30.0, waiter_id="w1",
                               sharing=sharing), PoolExhausted)
    assert isinstance(allocate(held, asks("ann", 2, "ml101"), NO_QUOTA, now=30.0, waiter_id="w2",
                               sharing=sharing), Grant)


def test_quotas_still_bound_the_group_that_goes_first():
    from jupyter_gpu_pool.pool import build_quota_book
    quotas = build_quota_book({}, {"ml101": {"memory": "20GiB"}}, {}, {})
    queue = [waiter(1, "ann", "ml101", 10.0)]
    held = Holdings(gpus=Holdings.of(gpus(80), []).gpus, waiters=tuple(queue), group_use={"research": 500.0})
    result = allocate(held, Ask(owner="ann", kernel_id="k1", profile=parse_profile("p", "40GiB"), groups=("ml101",)),
                      quotas, now=30.0, waiter_id="w1", sharing=Sharing(order=FAIR, fair=FAIR_SHARE))
    assert result.reason == "quota_exceeded"


@pytest.mark.parametrize("value, message", [
    ({"ml101": 0}, "['ml101'] must be a weight above 0"),
    ({"ml101": "two"}, "['ml101'] must be a weight above 0"),
    (["ml101"], "must be a dict of group name to weight"),
])
def test_bad_weights_are_refused_naming_the_group(value, message):
    with pytest.raises(ValueError) as e:
        parse_weights(value)
    assert message in str(e.value)
