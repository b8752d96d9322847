"""The queue's reservation (what is left for a waiter after every earlier waiter that fits took its
slice) is the plain fold of ``choose`` over the waiters, however it saves work: a slice that fits
nowhere is not tried again (taking room never makes room), and the head of a long queue is found
without reading the rest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from ledger_helpers import gpus

from jupyter_gpu_pool.pool.placement import BINPACK, PLACEMENTS, GPUUsage, choose
from jupyter_gpu_pool.pool.queue import Waiter, ahead_of, reserve_for_waiters
from jupyter_gpu_pool.pool.slices import SliceSpec

SLICES = ["10GiB", "30GiB", "45GiB", "whole", "2 x whole", "20GiB,50%", "10GiB,30%"]


def waiter(i: int, text: str) -> Waiter:
    spec = SliceSpec.parse(text)
    return Waiter(id=f"w{i}", owner="u", kernel_id=f"k{i}", lease_id=None, profile="p", slice=spec, label="",
                  enqueued=0.0, heartbeat=0.0)


def plain_fold(usage: list[GPUUsage], waiters: list[Waiter], placement: str) -> list[GPUUsage]:
    sim = {u.gpu.uuid: u for u in usage}
    for w in waiters:
        for g in choose(list(sim.values()), w.slice, placement) or []:
            sim[g.uuid] = sim[g.uuid].plus(w.slice)
    return [sim[u.gpu.uuid] for u in usage]


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.sampled_from([40, 80]), min_size=1, max_size=4),
       held=st.lists(st.sampled_from(SLICES), max_size=4),
       queued=st.lists(st.sampled_from(SLICES), max_size=30), placement=st.sampled_from(PLACEMENTS))
def test_the_reservation_is_the_plain_fold_over_the_queue(sizes, held, queued, placement):
    usage = [GPUUsage(g) for g in gpus(*sizes)]
    usage = plain_fold(usage, [waiter(100 + i, t) for i, t in enumerate(held)], placement)  # some held already
    waiters = [waiter(i, t) for i, t in enumerate(queued)]
    assert reserve_for_waiters(usage, waiters, placement) == plain_fold(usage, waiters, placement)


def test_the_waiters_ahead_of_one_are_those_before_it_and_all_for_none_or_a_stranger():
    waiters = [waiter(i, "10GiB") for i in range(5)]
    assert ahead_of(waiters, "w0") == []
    assert ahead_of(waiters, "w3") == waiters[:3]
    assert ahead_of(waiters, None) == waiters == ahead_of(waiters, "w-gone")
    assert reserve_for_waiters([GPUUsage(g) for g in gpus(80)], waiters, BINPACK)[0].memory == 50 * 2**30
