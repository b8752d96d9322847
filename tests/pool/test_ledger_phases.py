"""The ledger's phase is the one record of what is under way on a kernel, changed only by
compare-and-set: a mover that finds another phase than it expected is refused and changes nothing,
and of several movers racing from separate processes exactly one wins."""

import multiprocessing as mp

import pytest
from ledger_helpers import NO_QUOTA, gpus, request

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED
from jupyter_gpu_pool.pool.phases import HIBERNATING, QUEUED, RESUMING, STOPPING, PhaseConflict, PhaseError


def test_a_mover_that_expects_another_phase_is_refused_and_changes_nothing(ledger):
    lease = ledger.allocate(request(), NO_QUOTA)
    ledger.set_phase(lease.id, HIBERNATING, expect="")
    with pytest.raises(PhaseConflict) as refused:
        ledger.set_phase(lease.id, HIBERNATING, expect="")
    assert (refused.value.expected, refused.value.found, refused.value.state) == ("", HIBERNATING, ACTIVE)
    assert "in phase 'hibernating', not 'settled' as expected" in str(refused.value)
    after = ledger.get(lease.id)
    assert (after.state, after.phase, after.gpus) == (ACTIVE, HIBERNATING, lease.gpus)


def test_a_move_the_state_machine_does_not_allow_is_refused_even_from_the_expected_phase(ledger):
    lease = ledger.allocate(request(), NO_QUOTA)
    with pytest.raises(PhaseError, match="cannot move to 'resuming'"):
        ledger.set_phase(lease.id, RESUMING, expect="")  # an active kernel has nothing to resume
    assert ledger.get(lease.id).phase == ""


def test_a_cull_does_not_cut_into_a_hibernation_under_way_but_a_shutdown_wins(ledger):
    lease = ledger.allocate(request(), NO_QUOTA)
    ledger.set_phase(lease.id, HIBERNATING, expect="")
    with pytest.raises(PhaseConflict):
        ledger.stop(lease.id, expect="")  # the culler saw it settled: it must not start
    assert ledger.get(lease.id).phase == HIBERNATING
    stopped = ledger.stop(lease.id, expect=None)  # its user shuts it down: that wins over any move
    assert (stopped.phase, stopped.holder_pid) == (STOPPING, None)


def test_a_resume_and_its_queue_move_only_from_where_they_were(ledger):
    lease = ledger.allocate(request(), NO_QUOTA)
    ledger.set_phase(lease.id, HIBERNATING, expect="")
    ledger.hibernate(lease.id, host_bytes=2**30)
    assert ledger.get(lease.id).state == HIBERNATED
    ledger.set_phase(lease.id, RESUMING, expect="")  # a resume claims the kernel, then waits in the queue
    ledger.set_phase(lease.id, QUEUED, expect=RESUMING)
    with pytest.raises(PhaseConflict):
        ledger.set_phase(lease.id, RESUMING, expect="")  # a second resume thought it was still settled
    assert ledger.set_phase(lease.id, RESUMING, expect=QUEUED).phase == RESUMING


def _race(path: str, lease_id: str, start, out) -> None:
    ledger = Ledger(path, busy_timeout=60)
    start.wait()
    try:
        ledger.set_phase(lease_id, HIBERNATING, expect="")
        out.put("won")
    except PhaseConflict:
        out.put("lost")
    finally:
        ledger.close()


def test_of_many_processes_racing_to_move_one_kernel_exactly_one_wins(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    ledger = Ledger(path)
    ledger.sync_gpus(gpus(40))
    lease = ledger.allocate(request(), NO_QUOTA)
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    racers = [ctx.Process(target=_race, args=(path, lease.id, start, out)) for _ in range(12)]
    for r in racers:
        r.start()
    start.set()
    results = sorted(out.get(timeout=60) for _ in racers)
    for r in racers:
        r.join(timeout=30)
        assert r.exitcode == 0
    assert results == ["lost"] * 11 + ["won"]
    assert ledger.get(lease.id).phase == HIBERNATING
    ledger.close()


async def test_the_servers_claim_to_shut_a_kernel_down_fails_while_another_move_holds_it(pool_home):
    from jupyter_gpu_pool.server_extension.backends.local import LocalBackend

    pool = pool_home.pool()
    backend = LocalBackend(pool)
    seen = pool.ledger.allocate(request(), NO_QUOTA)  # what the culler saw: settled
    pool.ledger.set_phase(seen.id, HIBERNATING, expect="")  # a hibernation started since
    assert await backend.claim_stop(seen) is False
    assert pool.ledger.get(seen.id).phase == HIBERNATING
    undone = pool.ledger.set_phase(seen.id, "", expect=HIBERNATING)
    assert await backend.claim_stop(undone) is True
    assert pool.ledger.get(seen.id).phase == STOPPING
    pool.ledger.release(seen.id)
    assert await backend.claim_stop(undone) is False  # gone: nothing to shut down
