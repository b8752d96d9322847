"""The ledger's pieces that hibernation adds: phases, the host-RAM budget, resume on the same GPU only."""

from __future__ import annotations

import sqlite3

import pytest

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import (
    ACTIVE,
    GPU,
    HIBERNATED,
    LeaseNotFound,
    LeaseRequest,
    PoolExhausted,
    SliceSpec,
    build_quota_book,
)
from jupyter_gpu_pool.pool.profiles import Profile

GiB = 2**30
NO_QUOTA = build_quota_book({}, {}, {}, {})


def gpus(*sizes_gib):
    return [GPU(uuid=f"GPU-{i}", name="Test GPU", memory=s * GiB, index=i) for i, s in enumerate(sizes_gib)]


def request(owner="alice", slice_text="10GiB", kernel="k"):
    spec = SliceSpec.parse(slice_text)
    return LeaseRequest(owner=owner, kernel_id=kernel, profile=Profile("p", spec, "soft", "p"))


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.sync_gpus(gpus(40, 40))
    yield led
    led.close()


def test_a_phase_is_recorded_seen_by_another_reader_and_cleared_on_release(ledger, tmp_path):
    lease = ledger.allocate(request(), NO_QUOTA, host="h")
    marked = ledger.set_phase(lease.id, "hibernating", deadline=123.0)
    assert (marked.phase, marked.phase_deadline, marked.state) == ("hibernating", 123.0, ACTIVE)
    other = Ledger(tmp_path / "ledger.sqlite")  # another server's view of the same file
    assert other.get(lease.id).phase == "hibernating"
    assert other.get(lease.id).to_dict()["phase"] == "hibernating"
    assert ledger.set_phase(lease.id, "").phase == ""
    ledger.set_phase(lease.id, "hibernating")
    released = ledger.release(lease.id)
    assert released.phase == "" and released.phase_deadline is None
    with pytest.raises(LeaseNotFound):
        ledger.set_phase(lease.id, "hibernating")  # a released lease takes no phase
    other.close()


def test_a_version_1_ledger_file_is_migrated_keeping_its_leases(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    from jupyter_gpu_pool.local.database import SCHEMA

    db.executescript(SCHEMA[0] + "PRAGMA user_version=1;")
    db.execute("""INSERT INTO leases(id, owner, kernel_id, profile, isolation, memory, whole, gpu_count, state,
                  created, updated, state_since) VALUES('L1','alice','k','p','soft',1,0,1,'hibernated',1,1,1)""")
    db.commit()
    db.close()
    led = Ledger(path)
    lease = led.get("L1")
    assert lease.state == HIBERNATED and lease.phase == "" and lease.phase_deadline is None
    led.close()


def test_the_host_ram_budget_is_granted_up_to_the_cap_and_counts_every_server_on_the_host(ledger):
    a = ledger.allocate(request(kernel="a"), NO_QUOTA, host="h")
    b = ledger.allocate(request(kernel="b"), NO_QUOTA, host="h")
    c = ledger.allocate(request(kernel="c"), NO_QUOTA, host="elsewhere")
    assert ledger.reserve_host_bytes(a.id, 6 * GiB, cap=10 * GiB, host="h") == (True, 0)
    ledger.hibernate(a.id, host_bytes=6 * GiB)
    assert ledger.reserve_host_bytes(c.id, 9 * GiB, cap=10 * GiB, host="elsewhere") == (True, 0)
    granted, others = ledger.reserve_host_bytes(b.id, 5 * GiB, cap=10 * GiB, host="h")
    assert (granted, others) == (False, 6 * GiB)
    assert ledger.get(b.id).host_bytes == 0  # a refusal claims nothing
    assert ledger.reserve_host_bytes(b.id, 4 * GiB, cap=10 * GiB, host="h") == (True, 6 * GiB)
    assert ledger.host_bytes_on("h") == 10 * GiB
    assert ledger.reserve_host_bytes(b.id, 40 * GiB, cap=None, host="h")[0]  # no cap: no limit


def test_the_budget_is_only_claimed_for_an_active_lease(ledger):
    a = ledger.allocate(request(kernel="a"), NO_QUOTA, host="h")
    ledger.hibernate(a.id, host_bytes=GiB)
    with pytest.raises(LeaseNotFound):
        ledger.reserve_host_bytes(a.id, GiB, cap=None, host="h")


def test_resume_on_the_same_gpu_only_waits_rather_than_move(ledger):
    lease = ledger.allocate(request(slice_text="30GiB"), NO_QUOTA)
    ledger.hibernate(lease.id, host_bytes=GiB)
    ledger.allocate(request(slice_text="20GiB", kernel="blocker"), NO_QUOTA)  # binpack: onto the GPU it left
    with pytest.raises(PoolExhausted):
        ledger.resume(lease.id, NO_QUOTA, same_gpu=True)
    assert ledger.get(lease.id).state == HIBERNATED
    assert ledger.resume(lease.id, NO_QUOTA).gpus != lease.gpus  # without same_gpu it moves


def test_a_resume_given_up_can_hand_back_its_slice_and_keep_where_the_memory_was(ledger):
    lease = ledger.allocate(request(slice_text="30GiB"), NO_QUOTA)
    home = lease.gpus
    ledger.hibernate(lease.id, host_bytes=GiB)
    ledger.allocate(request(slice_text="20GiB", kernel="blocker"), NO_QUOTA)  # onto its GPU
    moved = ledger.resume(lease.id, NO_QUOTA)
    assert moved.gpus != home
    back = ledger.hibernate(lease.id, host_bytes=GiB, reason="restore elsewhere refused", last_gpus=home)
    assert back.state == HIBERNATED and back.last_gpus == home and back.host_bytes == GiB
