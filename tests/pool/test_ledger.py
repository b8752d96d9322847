import pytest

from ledger_helpers import GiB, NO_QUOTA, gpus, request
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import (
    ACTIVE,
    HIBERNATED,
    RELEASED,
    Holder,
    LeaseNotFound,
    PoolExhausted,
    QuotaExceeded,
    build_quota_book,
)


def held_memory(ledger):
    return {u.gpu.uuid: u.memory for u in ledger.snapshot().gpus}


def test_a_lease_holds_its_slice_until_released(ledger):
    lease = ledger.allocate(request(slice_text="10GiB"), NO_QUOTA)
    assert lease.state == ACTIVE and len(lease.gpus) == 1
    assert sum(held_memory(ledger).values()) == 10 * GiB
    released = ledger.release(lease.id, "shutdown")
    assert released.state == RELEASED and released.reason == "shutdown" and released.gpus == ()
    assert sum(held_memory(ledger).values()) == 0
    assert ledger.release(lease.id) is None  # idempotent
    assert [e.kind for e in ledger.journal()][:2] == ["released", "allocated"]


def test_a_held_lease_is_named_anew_after_a_rename_and_a_released_one_is_not(ledger):
    lease = ledger.allocate(request(label="Untitled5.ipynb"), NO_QUOTA)
    ledger.relabel(lease.id, "experiments/train.ipynb")
    assert ledger.get(lease.id).label == "experiments/train.ipynb"
    assert ledger.snapshot().lease_of_kernel(lease.kernel_id).label == "experiments/train.ipynb"  # every view
    ledger.hibernate(lease.id, 0, "idle")
    ledger.relabel(lease.id, "train.ipynb")  # a hibernated kernel's notebook renamed too
    assert ledger.get(lease.id).label == "train.ipynb"
    ledger.release(lease.id, "shutdown")
    with pytest.raises(LeaseNotFound):
        ledger.relabel(lease.id, "other.ipynb")
    assert ledger.get(lease.id).label == "train.ipynb"  # a released lease keeps the name it ended with


def test_binpack_fills_the_fullest_gpu_that_fits(ledger):
    first = ledger.allocate(request(slice_text="10GiB"), NO_QUOTA, placement="binpack")
    second = ledger.allocate(request(slice_text="10GiB"), NO_QUOTA, placement="binpack")
    assert first.gpus == second.gpus


def test_spread_takes_the_emptiest_gpu(ledger):
    first = ledger.allocate(request(slice_text="10GiB"), NO_QUOTA, placement="spread")
    second = ledger.allocate(request(slice_text="10GiB"), NO_QUOTA, placement="spread")
    assert first.gpus != second.gpus


def test_a_whole_gpu_is_exclusive(ledger):
    whole = ledger.allocate(request(slice_text="whole"), NO_QUOTA)
    small = ledger.allocate(request(slice_text="10GiB"), NO_QUOTA)
    assert small.gpus != whole.gpus  # nothing else goes on the whole GPU
    with pytest.raises(PoolExhausted):
        ledger.allocate(request(slice_text="whole"), NO_QUOTA)  # the other GPU has a slice on it
    assert held_memory(ledger)[whole.gpus[0]] == 40 * GiB


def test_several_whole_gpus_in_one_lease(ledger):
    lease = ledger.allocate(request(slice_text="2 x whole"), NO_QUOTA)
    assert sorted(lease.gpus) == ["GPU-0", "GPU-1"] and lease.total_memory == 80 * GiB
    with pytest.raises(PoolExhausted):
        ledger.allocate(request(slice_text="1GiB"), NO_QUOTA)


def test_sm_shares_add_up_to_at_most_100_percent_per_gpu(ledger):
    for _ in range(4):
        ledger.allocate(request(slice_text="1GiB,50%"), NO_QUOTA)
    with pytest.raises(PoolExhausted):
        ledger.allocate(request(slice_text="1GiB,1%"), NO_QUOTA)
    assert ledger.overcommitted() == []


def test_pool_refusal_says_what_is_free_and_what_the_user_holds(ledger):
    mine = ledger.allocate(request(owner="alice", slice_text="30GiB", label="big.ipynb"), NO_QUOTA)
    ledger.allocate(request(owner="bob", slice_text="35GiB", label="secret-bob.ipynb"), NO_QUOTA)
    with pytest.raises(PoolExhausted) as err:
        ledger.allocate(request(owner="alice", slice_text="20GiB"), NO_QUOTA)
    text = str(err.value)
    assert text.startswith("The GPU pool is full for 'Python 3 · GPU 20 GiB' (20 GiB): the most free on one GPU "
                           "is 10 GiB on GPU 0")
    assert "every GPU slice is taken" not in text  # 10 GiB is free: the pool is full for this slice only
    assert "big.ipynb" in text and "secret-bob" not in text  # only the user's own kernels by name
    assert [lease.id for lease in ledger.leases()] == [mine.id, ledger.leases()[1].id]
    assert len(ledger.leases()) == 2  # the refusal took nothing
    refused = ledger.journal(kinds=("refused",))
    assert refused and refused[0].reason == "pool_exhausted" and refused[0].owner == "alice"


def test_user_memory_quota_refuses_and_lists_the_users_kernels(ledger):
    quotas = build_quota_book({"alice": {"memory": "25GiB"}}, {}, {}, {})
    ledger.allocate(request(owner="alice", slice_text="10GiB", label="a.ipynb"), quotas)
    ledger.allocate(request(owner="alice", slice_text="10GiB", label="b.ipynb"), quotas)
    with pytest.raises(QuotaExceeded) as err:
        ledger.allocate(request(owner="alice", slice_text="10GiB"), quotas)
    text = str(err.value)
    assert text.startswith("GPU quota exceeded: 'Python 3 · GPU 10 GiB' needs 10 GiB of GPU memory, and you hold "
                           "20 GiB of your 25 GiB.")
    assert "a.ipynb" in text and "b.ipynb" in text
    assert err.value.scope == "user" and len(ledger.leases()) == 2
    # bob has no quota of his own and no default: not limited
    ledger.allocate(request(owner="bob", slice_text="30GiB"), quotas)


def test_kernel_count_quota_counts_hibernated_kernels(ledger):
    quotas = build_quota_book({}, {}, {"kernels": 1}, {})
    lease = ledger.allocate(request(owner="alice"), quotas)
    ledger.hibernate(lease.id, host_bytes=GiB)
    with pytest.raises(QuotaExceeded, match="you hold 1 GPU kernel, as many as your quota allows"):
        ledger.allocate(request(owner="alice"), quotas)


def test_group_quota_is_shared_by_its_members(ledger):
    quotas = build_quota_book({}, {"students": {"memory": "30GiB"}}, {}, {"students": ["ann", "ben"]})
    ledger.allocate(request(owner="ann", slice_text="20GiB", groups=["students"]), quotas)
    with pytest.raises(QuotaExceeded) as err:
        ledger.allocate(request(owner="ben", slice_text="20GiB", groups=["students"]), quotas)
    assert err.value.scope == "students" and "group 'students' holds" in str(err.value)
    ledger.allocate(request(owner="ben", slice_text="10GiB", groups=["students"]), quotas)


def test_quota_refusal_comes_before_pool_refusal(ledger):
    quotas = build_quota_book({}, {}, {"memory": "5GiB"}, {})
    with pytest.raises(QuotaExceeded):
        ledger.allocate(request(slice_text="50GiB"), quotas)  # fits nowhere and passes the quota


def test_sm_quota(ledger):
    quotas = build_quota_book({}, {}, {"sm_percent": 60}, {})
    ledger.allocate(request(slice_text="1GiB,50%"), quotas)
    with pytest.raises(QuotaExceeded, match="needs a 20% SM share \\(of a GPU's compute\\), and you hold 50% of your 60%"):
        ledger.allocate(request(slice_text="1GiB,20%"), quotas)


# -- reconcile: holders judged by the liveness callable the edge passes in -----------------


def test_a_dead_kernel_keeps_its_lease_through_the_grace_then_is_reclaimed(ledger, clock):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, Holder(2, 2.0))
    alive = {1}  # the server lives, the kernel (pid 2) died
    is_alive = lambda pid, start: pid in alive  # noqa: E731
    assert ledger.reconcile(is_alive) == []  # within the grace: a restarter may reuse it
    clock.advance(31)
    reclaimed = ledger.reconcile(is_alive)
    assert [r.id for r in reclaimed] == [lease.id]
    assert ledger.get(lease.id).state == RELEASED
    assert "did not restart" in ledger.get(lease.id).reason


def test_a_lease_whose_server_and_kernel_died_is_reclaimed_at_once(ledger):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, Holder(2, 2.0))
    assert [r.id for r in ledger.reconcile(lambda pid, start: False)] == [lease.id]


def test_an_orphan_kernel_that_still_runs_keeps_its_slice(ledger):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, Holder(2, 2.0))
    assert ledger.reconcile(lambda pid, start: pid == 2) == []  # its memory is really still held


def test_a_lease_whose_kernel_never_started_is_reclaimed_after_the_launch_grace(ledger, clock):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    assert ledger.reconcile(lambda pid, start: True) == []
    clock.advance(121)
    assert [r.id for r in ledger.reconcile(lambda pid, start: True)] == [lease.id]


def test_a_restarting_kernel_keeps_its_lease(ledger, clock):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, Holder(2, 2.0))
    ledger.set_holder(lease.id, None)  # cleanup(restart=True)
    clock.advance(60)
    ledger.set_holder(lease.id, Holder(3, 3.0))  # the new kernel process
    assert ledger.reconcile(lambda pid, start: pid in (1, 3)) == []
    assert ledger.get(lease.id).holder_pid == 3


def test_reconcile_leaves_other_hosts_alone(ledger):
    lease = ledger.allocate(request(manager=Holder(1, 1.0, "elsewhere")), NO_QUOTA)
    assert ledger.reconcile(lambda pid, start: False, host="here") == []
    assert ledger.get(lease.id).state == ACTIVE


def test_allocation_reclaims_dead_leases_first(ledger):
    dead = ledger.allocate(request(slice_text="40GiB", manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.allocate(request(slice_text="40GiB", manager=Holder(5, 5.0)), NO_QUOTA)
    alive = lambda pid, start: pid == 5  # noqa: E731
    fresh = ledger.allocate(request(slice_text="40GiB", manager=Holder(5, 5.0)), NO_QUOTA, is_alive=alive)
    assert ledger.get(dead.id).state == RELEASED and fresh.gpus == dead.gpus


def test_a_refusal_reconciles_at_most_once_a_second_and_not_while_there_is_room(ledger, monkeypatch):
    """Liveness costs a process-table read per held lease: a start that gets its slice judges nobody,
    and refusals in a burst judge the pool once."""
    judged = []

    def alive(pid, start):
        judged.append(pid)
        return True

    ledger.allocate(request(slice_text="10GiB"), NO_QUOTA, is_alive=alive)
    assert judged == []  # room: no reconcile on the way
    ledger.allocate(request(slice_text="40GiB"), NO_QUOTA, is_alive=alive)
    ledger.allocate(request(slice_text="30GiB"), NO_QUOTA, is_alive=alive)
    for _ in range(3):
        with pytest.raises(PoolExhausted):
            ledger.allocate(request(slice_text="40GiB"), NO_QUOTA, is_alive=alive)
    assert len(judged) == 3  # the three held leases' managers, judged once for the burst
    assert [e.kind for e in ledger.journal(kinds=("refused",))] == ["refused"] * 3


def test_a_lease_that_changed_after_it_was_judged_is_not_reclaimed(ledger, clock):
    """Liveness is judged outside the write lock: a lease whose kernel restarted in between (a new
    holder recorded) is left for the next reconcile to judge anew."""
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, Holder(2, 2.0))
    clock.advance(60)

    def alive(pid, start):
        if pid == 2:  # while this kernel is judged dead, its server restarts it: a new holder
            ledger.set_holder(lease.id, Holder(3, 3.0))
        return pid in (1, 3)

    assert ledger.reconcile(alive) == []
    assert ledger.get(lease.id).state == ACTIVE and ledger.get(lease.id).holder_pid == 3
    assert ledger.reconcile(alive) == []  # judged anew: the new kernel lives


def test_holder_updates_on_a_released_lease_say_so(ledger):
    lease = ledger.allocate(request(), NO_QUOTA)
    ledger.release(lease.id)
    with pytest.raises(LeaseNotFound, match="No GPU lease"):
        ledger.set_holder(lease.id, Holder(1, 1.0))


def test_adopt_moves_a_lease_to_a_new_server(ledger):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    adopted = ledger.adopt(lease.id, Holder(7, 7.0, "here"))
    assert (adopted.manager_pid, adopted.manager_start) == (7, 7.0)


# -- hibernation bookkeeping ---------------------------------------------------------------


def test_hibernating_frees_the_slice_and_resume_prefers_the_same_gpu(ledger):
    lease = ledger.allocate(request(slice_text="30GiB"), NO_QUOTA, placement="spread")
    hib = ledger.hibernate(lease.id, host_bytes=5 * GiB)
    assert hib.state == HIBERNATED and hib.gpus == () and hib.last_gpus == lease.gpus and hib.host_bytes == 5 * GiB
    assert sum(held_memory(ledger).values()) == 0
    back = ledger.resume(lease.id, NO_QUOTA, placement="spread")
    assert back.state == ACTIVE and back.gpus == lease.gpus and back.host_bytes == 0


def test_resume_goes_to_another_gpu_of_the_same_model_when_its_own_is_taken(ledger):
    lease = ledger.allocate(request(slice_text="30GiB"), NO_QUOTA)
    ledger.hibernate(lease.id, host_bytes=GiB)
    blocker = ledger.allocate(request(slice_text="20GiB"), NO_QUOTA)
    assert blocker.gpus == lease.gpus  # binpack takes the GPU our kernel left
    back = ledger.resume(lease.id, NO_QUOTA)
    assert back.gpus != lease.gpus


def test_resume_with_no_room_refuses_and_keeps_the_lease_hibernated(ledger):
    lease = ledger.allocate(request(slice_text="30GiB"), NO_QUOTA)
    ledger.hibernate(lease.id, host_bytes=GiB)
    ledger.allocate(request(slice_text="40GiB"), NO_QUOTA)
    ledger.allocate(request(slice_text="40GiB"), NO_QUOTA)
    with pytest.raises(PoolExhausted):
        ledger.resume(lease.id, NO_QUOTA)
    assert ledger.get(lease.id).state == HIBERNATED


def test_resume_only_onto_the_same_model(tmp_path, clock):
    led = Ledger(tmp_path / "mixed.sqlite", clock=clock)
    led.sync_gpus(gpus(40) + [g for g in gpus(0, 80, name="Other GPU") if g.memory])
    lease = led.allocate(request(slice_text="30GiB"), NO_QUOTA)
    assert lease.gpus == ("GPU-0",)
    led.hibernate(lease.id, host_bytes=GiB)
    led.allocate(request(slice_text="20GiB"), NO_QUOTA, placement="binpack")  # takes GPU-0
    with pytest.raises(PoolExhausted):
        led.resume(lease.id, NO_QUOTA)  # the 80 GiB GPU is another model
    assert led.resume(lease.id, NO_QUOTA, same_model=False).gpus == ("GPU-1",)
    led.close()


# -- the queue -------------------------------------------------------------------------------


def test_an_earlier_waiter_that_fits_goes_first(ledger):
    ledger.allocate(request(slice_text="30GiB"), NO_QUOTA)
    big = ledger.allocate(request(slice_text="40GiB"), NO_QUOTA)
    spec = request(slice_text="20GiB").profile.slice
    first = ledger.enqueue("ann", "k-ann", "p-20gib", spec)
    second = ledger.enqueue("ben", "k-ben", "p-20gib", spec)
    assert (first.position, second.position) == (1, 2)
    ledger.release(big.id)  # room for exactly... two 20 GiB slices on GPU 1
    with pytest.raises(PoolExhausted, match="2 other request"):
        ledger.allocate(request(slice_text="40GiB"), NO_QUOTA)  # a newcomer cannot jump the queue
    got = ledger.allocate(request(owner="ben", slice_text="20GiB", kernel="k-ben"), NO_QUOTA, waiter_id=second.id)
    assert got.state == ACTIVE  # ann's 20 GiB is still reserved beside it
    assert [w.owner for w in ledger.waiters()] == ["ann"] and ledger.waiters()[0].position == 1


def test_a_waiter_that_stops_calling_drops_out(ledger, clock):
    spec = request(slice_text="20GiB").profile.slice
    waiter = ledger.enqueue("ann", "k", "p", spec)
    clock.advance(10)
    assert ledger.heartbeat(waiter.id).position == 1
    clock.advance(16)
    assert ledger.waiters() == []


def test_gpus_that_disappear_take_no_new_slices(ledger):
    ledger.sync_gpus(gpus(40))  # GPU-1 is gone
    assert ledger.allocate(request(slice_text="40GiB"), NO_QUOTA).gpus == ("GPU-0",)
    with pytest.raises(PoolExhausted):
        ledger.allocate(request(slice_text="40GiB"), NO_QUOTA)
    assert [g.uuid for g in ledger.gpus()] == ["GPU-0"]


def test_schema_is_created_once_and_reopened(tmp_path, clock):
    path = tmp_path / "reopen.sqlite"
    first = Ledger(path, clock=clock)
    first.sync_gpus(gpus(40))
    lease = first.allocate(request(), NO_QUOTA)
    first.close()
    again = Ledger(path, clock=clock)
    assert again.get(lease.id).state == ACTIVE
    again.close()


def test_a_kernel_being_shut_down_is_not_taken_for_a_crash(ledger, clock):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, Holder(2, 2.0), phase="")
    ledger.set_holder(lease.id, None, phase="stopping")  # the provisioner: a shutdown began
    server_alive = lambda pid, start: pid == 1  # noqa: E731  the kernel process is gone by now
    clock.advance(5)
    assert ledger.reconcile(server_alive) == []  # its server is about to release it
    clock.advance(30)
    [reclaimed] = ledger.reconcile(server_alive)
    assert reclaimed.reason == "kernel was shut down but its server did not release the slice"


def test_a_relaunch_clears_the_stopping_phase(ledger):
    lease = ledger.allocate(request(manager=Holder(1, 1.0)), NO_QUOTA)
    ledger.set_holder(lease.id, None, phase="stopping")
    ledger.set_holder(lease.id, Holder(3, 3.0), phase="")
    assert ledger.get(lease.id).phase == ""
