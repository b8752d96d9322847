"""The ledger's side of ``slice_at: first-cell``: a kernel's lease that holds nothing until its first cell,
then takes its slice through the same resume (the allocation decision, quotas, the journal)."""

import pytest
from ledger_helpers import GiB, NO_QUOTA, request

from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, QuotaExceeded, build_quota_book
from jupyter_gpu_pool.pool.phases import NO_GPU_YET, display_state


def test_a_lease_without_a_slice_holds_nothing_and_its_first_take_is_the_kernels_allocation(ledger, clock):
    lease = ledger.start_without_slice(request(slice_text="10GiB", label="lab.ipynb"), NO_QUOTA)

    assert (lease.state, lease.reason, lease.gpus, lease.last_gpus, lease.host_bytes) == (HIBERNATED, "first_cell",
                                                                                         (), (), 0)
    assert lease.awaits_first_cell and display_state(lease) == NO_GPU_YET and lease.memory == 10 * GiB
    assert all(u.memory == 0 and u.leases == 0 for u in ledger.snapshot().gpus)
    assert ledger.usage_of("alice").kernels == 1 and ledger.usage_of("alice").memory == 0

    clock.advance(30)
    taken = ledger.resume(lease.id, NO_QUOTA)

    assert (taken.state, taken.reason, len(taken.gpus), taken.awaits_first_cell) == (ACTIVE, "", 1, False)
    assert display_state(taken) == ACTIVE and ledger.usage_of("alice").memory == 10 * GiB
    [allocated, opened] = [e for e in ledger.journal() if e.lease_id == lease.id][:2]
    assert (opened.kind, opened.reason) == ("opened", "first_cell")
    assert (allocated.kind, allocated.reason, allocated.detail["waited_for_cell"]) == ("allocated", "first_cell", 30)
    assert ledger.overcommitted() == []


def test_a_whole_gpu_lease_learns_its_memory_when_its_first_cell_places_it(ledger):
    lease = ledger.start_without_slice(request(slice_text="whole"), NO_QUOTA)
    assert lease.whole and lease.memory == 0  # which GPU, so how much, is known only once placed
    taken = ledger.resume(lease.id, NO_QUOTA)
    assert taken.memory == 40 * GiB and taken.total_memory == 40 * GiB
    assert [u.memory for u in ledger.snapshot().gpus if u.gpu.uuid in taken.gpus] == [40 * GiB]


def test_a_first_take_is_judged_by_the_quota_and_a_kernel_with_nothing_still_counts_as_a_kernel(ledger):
    quotas = build_quota_book({}, {}, {"memory": "5GiB", "kernels": 2}, {})
    lease = ledger.start_without_slice(request(slice_text="10GiB"), quotas)  # holds nothing: memory is not asked
    with pytest.raises(QuotaExceeded):
        ledger.resume(lease.id, quotas)
    assert ledger.get(lease.id).awaits_first_cell  # refused: it still holds nothing, as before
    ledger.start_without_slice(request(slice_text="10GiB"), quotas)
    with pytest.raises(QuotaExceeded) as refused:
        ledger.start_without_slice(request(slice_text="10GiB"), quotas)
    assert refused.value.resource == "kernels"
    assert [e.kind for e in ledger.journal()][0] == "refused"
