"""The hibernation state machine and the resume queue, on real kernels, a real ledger and the
stand-in for the driver calls (hibernation_standin.py: this machine has no GPU).

What these tests prove: the order of driver calls, what the ledger and the UI say at each step, that
every refusal and failure leaves things exactly as documented, the queue, the host-RAM cap.  What
they cannot prove (real memory moved, real timing, a real lock racing real GPU work) is the gpu
tests' job (tests/gpu/test_hibernation_gpu.py).
"""

from __future__ import annotations

import asyncio

import pytest
from hibernation_standin import STANDIN_GPUS
from kernel_helpers import run_code, wait_until
from rig_helpers import CHECKPOINTED, LOCKED, RUNNING, GiB, MiB

from jupyter_gpu_pool.hibernation import (
    EVICTING,
    FAILED,
    HibernationFailed,
    HibernationRefused,
    Hibernator,
    Kernels,
)
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, RELEASED

# -- the round trip ------------------------------------------------------------------------------


async def test_hibernate_frees_the_slice_and_resume_brings_the_kernel_back_where_it_was(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=500 * MiB)
    await run_code(r.manager.get_kernel(kid), "x = 41")
    lease = r.lease(kid)
    gpu = lease.gpus[0]
    assert r.held_on(gpu) == 10 * GiB

    out = await r.hibernator.hibernate(kid, "idle")

    assert (out.action, out.bytes, out.pids) == ("hibernated", 500 * MiB, (pid,))
    assert r.standin.procs[pid].state == CHECKPOINTED and r.standin.memory_of([pid]) == {}  # NVML: nothing held
    hib = r.lease(kid)
    assert (hib.state, hib.phase, hib.host_bytes, hib.last_gpus) == (HIBERNATED, "", 500 * MiB, (gpu,))
    assert r.held_on(gpu) == 0  # the slice is back in the pool
    assert r.hibernator.shown(kid) == "hibernated" and r.hibernator.asleep(kid)
    assert [c for c, p in r.standin.calls if p == pid][-2:] == ["cuCheckpointProcessLock",
                                                                "cuCheckpointProcessCheckpoint"]
    assert out.duration >= 0 and "500 MiB" in out.message
    assert (out.lease.owner, out.lease.profile, out.lease.state) == (lease.owner, "small", HIBERNATED)

    back = await r.hibernator.resume(kid)

    assert back.action == "resumed" and back.gpus == (gpu,) and back.bytes == 500 * MiB
    assert r.standin.procs[pid].state == RUNNING and r.standin.procs[pid].restored_on == (gpu,)
    now = r.lease(kid)
    assert (now.state, now.phase, now.host_bytes, now.gpus) == (ACTIVE, "", 0, (gpu,))
    assert r.held_on(gpu) == 10 * GiB
    assert "500 MiB back on the GPU" in back.message and back.lease.state == ACTIVE
    assert "41" in await run_code(r.manager.get_kernel(kid), "print(x + 0)")  # the kernel lived throughout
    kinds = [e.kind for e in r.pool.ledger.journal(kinds=("hibernated", "resumed"))]
    assert kinds == ["resumed", "hibernated"]


async def test_the_freed_slice_can_be_taken_by_another_kernel_at_once(rig):
    r = rig()
    kid, _ = await r.gpu_kernel("big", gpu_bytes=700 * MiB)  # the whole of one stand-in GPU
    other, _ = await r.gpu_kernel("big", gpu_bytes=700 * MiB)  # the other one
    await r.hibernator.hibernate(kid)
    third, _ = await r.gpu_kernel("big", gpu_bytes=0)  # would have been refused before
    assert r.lease(third).gpus == r.lease(kid).last_gpus


async def test_the_silent_cache_release_runs_in_the_kernel_and_leaves_no_trace(rig):
    r = rig()
    kid, _ = await r.gpu_kernel()
    km = r.manager.get_kernel(kid)
    before = int(await run_code(km, "print(get_ipython().execution_count)"))
    assert await r.hibernator.kernels.release_cache(kid, 30) == "released"
    after = await run_code(km, "print('_jupyter_gpu_pool_release_cache' in globals(), get_ipython().execution_count)")
    assert after.split() == ["False", str(before + 1)]  # no name left behind; silent: the count did not move


async def test_a_kernel_that_never_used_cuda_hibernates_without_a_driver_call(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=0)
    out = await r.hibernator.hibernate(kid)
    assert out.bytes == 0 and out.pids == ()
    assert [c for c in r.standin.calls if c[0] != "cuCheckpointProcessGetState"] == []
    assert r.lease(kid).state == HIBERNATED
    assert (await r.hibernator.resume(kid)).action == "resumed"
    assert r.lease(kid).state == ACTIVE


# -- refusals: nothing changes -------------------------------------------------------------------


async def test_a_lock_that_times_out_leaves_the_kernel_running_untouched(rig):
    r = rig(lock_timeout=0.5)
    kid, pid = await r.gpu_kernel()
    r.standin.busy_for(pid, 30)  # a long GPU computation in flight
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "gpu_busy" and "left running, untouched" in err.value.message
    assert err.value.keep_running  # for now: the culler leaves it running
    assert ("cuCheckpointProcessLock", pid) in r.standin.calls  # the lock itself timed out
    assert r.standin.procs[pid].state == RUNNING and r.standin.procs[pid].checkpoints == 0
    lease = r.lease(kid)
    assert (lease.state, lease.phase, lease.host_bytes) == (ACTIVE, "", 0)
    assert r.held_on(lease.gpus[0]) == 10 * GiB and r.hibernator.shown(kid) == "active"
    assert "hibernated" not in r.journaled(kid)


async def test_a_cache_release_stuck_behind_gpu_work_counts_against_the_lock_timeout(rig, monkeypatch):
    # the kernel's grace to answer, beyond the lock timeout, waited out here: one second, not five
    monkeypatch.setattr("jupyter_gpu_pool.pool.hibernation.ANSWER_GRACE", 1.0)
    r = rig(lock_timeout=0.5)
    kid, pid = await r.gpu_kernel()
    km = r.manager.get_kernel(kid)
    # A stand-in for PyTorch inside the kernel, whose empty_cache waits as cudaFree waits for the GPU work
    # in flight (part of the stand-in machine: this machine has no GPU and no CUDA PyTorch).
    await run_code(km, "\n".join([
        "import sys, types, time",
        "sys.modules['torch'] = types.SimpleNamespace(cuda=types.SimpleNamespace(",
        "    is_initialized=lambda: True, empty_cache=lambda: time.sleep(60)))"]))
    started = asyncio.get_running_loop().time()
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "gpu_busy" and err.value.keep_running
    waited = asyncio.get_running_loop().time() - started
    assert 1.5 <= waited < 20  # the lock timeout and the grace, not the GPU work
    assert r.standin.procs[pid].state == RUNNING and r.standin.procs[pid].checkpoints == 0
    assert ("cuCheckpointProcessLock", pid) not in r.standin.calls
    lease = r.lease(kid)
    assert (lease.state, lease.phase, lease.host_bytes) == (ACTIVE, "", 0)


async def test_gpu_work_that_ends_within_the_timeout_is_waited_for(rig):
    r = rig(lock_timeout=5.0)
    kid, pid = await r.gpu_kernel()
    r.standin.busy_for(pid, 0.5)
    assert (await r.hibernator.hibernate(kid)).action == "hibernated"


@pytest.mark.parametrize("profile,reason,words", [
    ("half", "mps", "cannot checkpoint an MPS kernel"),
])
async def test_an_mps_kernel_cannot_hibernate_and_says_why_before_touching_it(rig, profile, reason, words):
    r = rig()
    pool = r.pool
    lease = pool.ledger.allocate(pool.request("mps-kernel", pool.settings.profiles[profile]), pool.settings.quotas)
    ok, why = r.hibernator.can_hibernate(lease)
    assert not ok and words in why and "MPS" in why
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate("mps-kernel")
    assert err.value.reason == reason and r.standin.calls == [] and err.value.keep_running is False
    assert pool.ledger.get(lease.id).state == ACTIVE


async def test_a_driver_refusal_801_is_remembered_and_reported(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    r.standin.procs[pid].mps = True  # a client the driver refuses (as MPS clients are on the H100)
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "not_supported" and "CUDA_ERROR_NOT_SUPPORTED" in err.value.message
    assert r.standin.procs[pid].state == RUNNING and r.lease(kid).state == ACTIVE
    ok, why = r.hibernator.can_hibernate(r.lease(kid))  # remembered: said as a clause, the refusal's own words
    assert not ok and "CUDA_ERROR_NOT_SUPPORTED" in why and why in err.value.message


async def test_a_missing_driver_is_refused_with_a_sentence(rig, standin):
    r = rig()
    kid, _ = await r.gpu_kernel()
    standin.available = False
    standin.reason = "libcuda.so.1 not found (no NVIDIA driver on this machine)"
    ok, why = r.hibernator.can_hibernate(r.lease(kid))
    assert not ok and "libcuda.so.1 not found" in why
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "driver"


async def test_a_second_hibernate_while_one_runs_is_refused(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    gate = r.standin.gate_locks()  # the driver's lock takes a while: the second request comes during it
    first = asyncio.ensure_future(r.hibernator.hibernate(kid))
    await wait_until(lambda: r.lease(kid).phase == "hibernating", timeout=10, what="the first to be under way")
    assert r.hibernator.shown(kid) == "hibernating"
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "in_progress"
    gate.set()
    assert (await first).action == "hibernated"


async def test_a_cell_sent_while_hibernating_makes_the_hibernation_give_up_before_the_checkpoint(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    gate = r.standin.gate_locks()  # the cell comes while the driver locks
    hibernation = asyncio.ensure_future(r.hibernator.hibernate(kid))
    await wait_until(lambda: ("cuCheckpointProcessLock", pid) in r.standin.calls, timeout=10,
                     what="the hibernation to be locking")
    resume = r.hibernator.start_resume(kid, "cell")  # what transparent resume does
    gate.set()
    with pytest.raises(HibernationRefused) as err:
        await hibernation
    assert err.value.reason == "in_use"
    assert (await resume).action == "resumed"
    assert r.standin.procs[pid].state == RUNNING and r.standin.procs[pid].checkpoints == 0
    assert r.lease(kid).state == ACTIVE and r.lease(kid).host_bytes == 0


# -- failures halfway ------------------------------------------------------------------------------


async def test_a_failed_checkpoint_is_undone_and_the_kernel_runs_on(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    r.standin.fail_next("cuCheckpointProcessCheckpoint", pid, 999)
    with pytest.raises(HibernationFailed) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.recovered and err.value.states == {pid: "running"}
    assert "put back as it was" in err.value.message
    assert r.standin.procs[pid].state == RUNNING
    lease = r.lease(kid)
    assert (lease.state, lease.phase, lease.host_bytes) == (ACTIVE, "", 0)


async def test_a_hibernation_the_pool_will_not_record_is_undone_and_the_kernel_runs_on(rig, monkeypatch):
    """The pool service refuses to count a slice free while NVML still sees the kernel's memory: the
    checkpointed kernel is put back on its GPU, never left checkpointed with its slice held."""
    from jupyter_gpu_pool.service.client import ServiceError

    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=300 * MiB)
    await run_code(r.manager.get_kernel(kid), "x = 7")

    def refuse(*args, **kwargs):
        raise ServiceError("gpu_memory_held", 409, "the kernel's processes still hold 300 MiB on the GPU")

    monkeypatch.setattr(r.pool.ledger, "hibernate", refuse)  # fault injected at the ledger's seam
    with pytest.raises(HibernationFailed) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.recovered and err.value.reason == "not_recorded" and err.value.states == {pid: "running"}
    assert "still hold 300 MiB" in err.value.message and "runs as before" in err.value.message
    assert r.standin.procs[pid].state == RUNNING
    lease = r.lease(kid)
    assert (lease.state, lease.phase, lease.host_bytes) == (ACTIVE, "", 0)
    assert "7" in await run_code(r.manager.get_kernel(kid), "print(x)")


async def test_a_failure_past_the_point_of_no_return_says_where_each_process_was_left(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    child = await run_code(r.manager.get_kernel(kid), "\n".join([
        "import subprocess, sys",
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])",
        "print(child.pid)"]))
    child = int(child)
    lease = r.lease(kid)
    r.standin.add(child, 100 * MiB, gpus=lease.gpus)  # the kernel's CUDA worker process
    # the child's checkpoint fails, and so does the undo of the kernel's own checkpoint
    r.standin.fail_next("cuCheckpointProcessCheckpoint", child, 999)
    r.standin.fail_next("cuCheckpointProcessRestore", pid, 999)
    with pytest.raises(HibernationFailed) as err:
        await r.hibernator.hibernate(kid)
    assert not err.value.recovered
    assert err.value.states[child] == "running"  # locked, never checkpointed: unlocked again
    assert err.value.states[pid].startswith("unknown") or err.value.states[pid] == "checkpointed"
    message = err.value.message
    assert f"pid {pid}" in message and f"pid {child}" in message and "restart the kernel" in message
    lease = r.lease(kid)
    assert lease.phase == FAILED and lease.state == ACTIVE  # its slice stays held: memory may be on the GPU
    assert err.value.reason == "checkpoint_failed"  # its caller puts it on record (the server tests check that)
    with pytest.raises(HibernationRefused):
        await r.hibernator.hibernate(kid)  # not again until someone settles it


async def test_every_cuda_process_of_the_kernel_is_checkpointed_and_a_halfway_failure_undoes_them_all(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=300 * MiB)
    child = int(await run_code(r.manager.get_kernel(kid), "\n".join([
        "import subprocess, sys",
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])",
        "print(child.pid)"])))
    r.standin.add(child, 200 * MiB, gpus=r.lease(kid).gpus)
    r.standin.fail_next("cuCheckpointProcessCheckpoint", max(pid, child), 999)  # the second one fails
    with pytest.raises(HibernationFailed) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.recovered and set(err.value.states) == {pid, child}
    assert all(r.standin.procs[p].state == RUNNING for p in (pid, child))
    out = await r.hibernator.hibernate(kid)
    assert set(out.pids) == {pid, child} and out.bytes == 500 * MiB
    assert all(r.standin.procs[p].state == CHECKPOINTED for p in (pid, child))
    await r.hibernator.resume(kid)
    assert all(r.standin.procs[p].state == RUNNING for p in (pid, child))


async def test_a_failed_restore_puts_the_kernel_back_to_sleep_and_gives_the_slice_back(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    await r.hibernator.hibernate(kid)
    r.standin.fail_next("cuCheckpointProcessRestore", pid, 999)
    with pytest.raises(HibernationFailed) as err:
        await r.hibernator.resume(kid)
    assert err.value.recovered and "hibernated as before" in err.value.message
    lease = r.lease(kid)
    assert (lease.state, lease.phase) == (HIBERNATED, "") and lease.host_bytes == 400 * MiB
    assert r.held_on(lease.last_gpus[0]) == 0
    assert (await r.hibernator.resume(kid)).action == "resumed"


# -- the queue -------------------------------------------------------------------------------------


async def test_resume_with_no_free_slice_waits_in_the_queue_and_shows_its_position(rig):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    gpu = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    blockers = [r.block(g.uuid, "80GiB", f"blocker-{g.index}") for g in STANDIN_GPUS]
    resume = r.hibernator.start_resume(kid)
    for _ in range(50):
        await asyncio.sleep(0.1)
        if r.hibernator.shown(kid) == "queued":
            break
    assert r.hibernator.shown(kid) == "queued" and r.hibernator.queue_position(kid) == 1
    assert r.lease(kid).phase == "queued"
    waiter = r.pool.ledger.waiters()[0]
    assert (waiter.kernel_id, waiter.lease_id, waiter.position) == (kid, r.lease(kid).id, 1)
    await asyncio.sleep(1.0)
    assert not resume.done()  # still waiting, and saying so
    r.pool.ledger.release(blockers[0])  # a slice frees up
    out = await asyncio.wait_for(resume, 30)
    assert out.waited > 0.5 and out.gpus == (gpu,)
    assert r.standin.procs[pid].state == RUNNING and r.lease(kid).state == ACTIVE
    assert r.pool.ledger.waiters() == []
    assert "in the queue" in out.message and r.journaled(kid)[0] == "resumed"


async def test_an_earlier_start_in_the_queue_goes_first(rig):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    await r.hibernator.hibernate(kid)
    blockers = [r.block(g.uuid, "80GiB", f"blocker-{g.index}") for g in STANDIN_GPUS]
    from jupyter_gpu_pool.pool import SliceSpec

    first = r.pool.ledger.enqueue("carol", "carol-kernel", "big", SliceSpec.parse("80GiB"))
    resume = r.hibernator.start_resume(kid)
    for _ in range(50):
        await asyncio.sleep(0.1)
        if r.hibernator.queue_position(kid):
            break
    assert r.hibernator.queue_position(kid) == 2
    r.pool.ledger.release(blockers[0])
    await asyncio.sleep(1.0)
    assert not resume.done()  # the slice is carol's: she was first
    r.pool.ledger.heartbeat(first.id)
    r.pool.ledger.dequeue(first.id)  # carol gives up her place
    r.pool.ledger.release(blockers[1])
    assert (await asyncio.wait_for(resume, 30)).action == "resumed"


async def test_a_resume_over_quota_is_refused_and_the_kernel_stays_hibernated(rig, standin_machine):
    standin_machine.configure(gpu_discovery="nvml", inventory=[], profiles=standin_machine.settings["profiles"],
                              default_user_quota={"memory": "15GiB"})
    r = rig()
    kid, _ = await r.gpu_kernel("small")
    await r.hibernator.hibernate(kid)
    other, _ = await r.gpu_kernel("small", gpu_bytes=0)  # the freed quota is used meanwhile
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.resume(kid)
    assert err.value.reason == "quota_exceeded" and "quota" in err.value.message
    lease = r.lease(kid)
    assert (lease.state, lease.phase) == (HIBERNATED, "") and r.pool.ledger.waiters() == []
    await r.manager.shutdown_kernel(other, now=True)
    assert (await r.hibernator.resume(kid)).action == "resumed"


async def test_resume_moves_to_another_gpu_of_the_same_model_through_gpu_pairs(rig):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    old = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    r.block(old, "80GiB", "blocker")
    out = await r.hibernator.resume(kid)
    new = out.gpus[0]
    assert new != old and r.standin.procs[pid].restored_on == (new,)
    assert ("cuCheckpointProcessRestore", pid) in r.standin.calls
    assert "another GPU" in out.message


async def test_where_the_driver_cannot_restore_elsewhere_the_resume_waits_for_its_own_gpu(rig, standin):
    standin.remap = False  # a 570-series driver: no GPU pairs
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    old = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    blocker = r.block(old, "80GiB", "blocker")
    resume = r.hibernator.start_resume(kid)
    await asyncio.sleep(1.0)
    assert r.hibernator.shown(kid) == "queued"  # the other GPU is free, but not for this kernel
    r.pool.ledger.release(blocker)
    assert (await asyncio.wait_for(resume, 30)).gpus == (old,)


async def test_a_driver_that_refuses_the_other_gpu_falls_back_to_waiting_for_its_own(rig, standin):
    standin.refuse_remap = True  # as NVIDIA/cuda-checkpoint#35 reports for some 580 setups
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    old = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    blocker = r.block(old, "80GiB", "blocker")
    resume = r.hibernator.start_resume(kid)
    for _ in range(50):
        await asyncio.sleep(0.1)
        if r.hibernator.shown(kid) == "queued":
            break
    assert r.hibernator.shown(kid) == "queued" and r.standin.procs[pid].state == CHECKPOINTED
    other = next(g.uuid for g in STANDIN_GPUS if g.uuid != old)
    assert r.held_on(other) == 0  # the slice it could not use went back
    r.pool.ledger.release(blocker)
    assert (await asyncio.wait_for(resume, 30)).gpus == (old,)
    assert r.standin.procs[pid].restored_on == (old,)


async def test_shutting_down_a_queued_kernel_ends_its_wait(rig):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    await r.hibernator.hibernate(kid)
    for g in STANDIN_GPUS:
        r.block(g.uuid, "80GiB", f"blocker-{g.index}")
    resume = r.hibernator.start_resume(kid)
    await asyncio.sleep(0.8)
    assert r.pool.ledger.waiters()
    await r.manager.shutdown_kernel(kid, now=True)
    r.hibernator.forget(kid)
    # The wait ends either way: cancelled by forget(), or, where its next poll came first, on finding the
    # lease gone with the kernel.
    with pytest.raises((asyncio.CancelledError, HibernationRefused)) as ended:
        await resume
    assert not isinstance(ended.value, HibernationRefused) or ended.value.reason == "no_lease"
    assert r.pool.ledger.waiters() == [] and r.lease(kid) is None


# -- the host-RAM cap ------------------------------------------------------------------------------


async def test_past_the_cap_the_longest_hibernated_is_warned_then_shut_down_to_make_room(rig):
    r = rig(host_memory="600MiB", eviction_warning=1.0)
    old, old_pid = await r.gpu_kernel(gpu_bytes=400 * MiB)
    await r.hibernator.hibernate(old)
    new, _ = await r.gpu_kernel(gpu_bytes=300 * MiB)
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(new)
    assert err.value.reason == "host_memory" and err.value.retry_after == 1.0
    assert "600 MiB" in err.value.message and "hibernated longest will be shut down" in err.value.message
    assert r.lease(new).state == ACTIVE and r.lease(new).host_bytes == 0  # runs on, nothing claimed
    victim = r.lease(old)
    assert victim.phase == EVICTING and victim.phase_deadline is not None

    warned = await r.hibernator.tick()  # the owner's server warns first
    assert [(n.kind, n.lease.kernel_id, n.deadline) for n in warned] == [("warned", old, victim.phase_deadline)]
    assert "will be shut down" in warned[0].message and old in r.manager
    assert await r.hibernator.tick() == []  # warned once

    await asyncio.sleep(1.1)
    culled = await r.hibernator.tick()  # past the deadline: shut down
    assert old not in r.manager
    assert r.pool.ledger.get(victim.id).state == RELEASED
    assert r.pool.ledger.get(victim.id).reason == "host_memory"
    assert [(n.kind, n.reason) for n in culled] == [("culled", "host_memory")]
    assert (await r.hibernator.hibernate(new)).action == "hibernated"  # room now


async def test_a_resumed_victim_is_spared(rig):
    r = rig(host_memory="600MiB", eviction_warning=1.0)
    old, _ = await r.gpu_kernel(gpu_bytes=400 * MiB)
    await r.hibernator.hibernate(old)
    new, _ = await r.gpu_kernel(gpu_bytes=300 * MiB)
    with pytest.raises(HibernationRefused):
        await r.hibernator.hibernate(new)
    await r.hibernator.resume(old)  # its user came back in time
    assert r.lease(old).phase == "" and r.lease(old).state == ACTIVE
    await asyncio.sleep(1.1)
    await r.hibernator.tick()
    assert old in r.manager


async def test_keep_running_past_the_cap_refuses_and_marks_nobody(rig):
    r = rig(host_memory="600MiB", over_cap="keep_running")
    old, _ = await r.gpu_kernel(gpu_bytes=400 * MiB)
    await r.hibernator.hibernate(old)
    new, _ = await r.gpu_kernel(gpu_bytes=300 * MiB)
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(new)
    assert err.value.reason == "host_memory" and "keeps running" in err.value.message
    assert r.lease(old).phase == "" and r.lease(new).state == ACTIVE


async def test_shutdown_past_the_cap_tells_the_caller_to_shut_the_kernel_down(rig):
    r = rig(host_memory="600MiB", over_cap="shutdown")
    old, _ = await r.gpu_kernel(gpu_bytes=400 * MiB)
    await r.hibernator.hibernate(old)
    new, pid = await r.gpu_kernel(gpu_bytes=300 * MiB)
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(new)
    assert err.value.reason == "host_memory" and err.value.keep_running is False
    assert "shut it down instead" in err.value.message
    assert r.standin.procs[pid].state == RUNNING and r.lease(new).host_bytes == 0 and r.lease(new).phase == ""


async def test_a_checkpoint_larger_than_the_free_ram_is_refused(rig):
    r = rig(host_memory="none")
    kid, pid = await r.gpu_kernel(gpu_bytes=2**50)  # a PiB: more than this machine's free RAM
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "host_ram" and "RAM free" in err.value.message
    assert r.standin.procs[pid].state == RUNNING and r.lease(kid).host_bytes == 0


# -- a server that died mid-move -------------------------------------------------------------------


@pytest.mark.parametrize("left", [LOCKED, CHECKPOINTED])
async def test_tick_puts_right_a_kernel_left_mid_hibernation_by_a_dead_server(rig, left):
    r = rig()
    kid, pid = await r.gpu_kernel()
    lease = r.lease(kid)
    r.pool.ledger.set_phase(lease.id, "hibernating")
    r.pool.ledger.reserve_host_bytes(lease.id, 400 * MiB, None, lease.host)
    r.standin.procs[pid].state = left
    await r.hibernator.tick()
    assert r.standin.procs[pid].state == RUNNING
    now = r.lease(kid)
    assert (now.state, now.phase, now.host_bytes) == (ACTIVE, "", 0)
    assert r.hibernator.shown(kid) == "active"


async def test_tick_learns_of_a_kernel_hibernated_by_a_previous_server(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    await r.hibernator.hibernate(kid)
    fresh = Hibernator(r.pool, Kernels(r.manager), r.settings, driver=r.standin, memory=r.memory)
    assert fresh.shown(kid) == "active"  # knows nothing yet
    await fresh.tick()
    assert fresh.shown(kid) == "hibernated" and fresh.asleep(kid)
    assert (await fresh.resume(kid)).action == "resumed"


async def test_jupyter_gpu_pool_status_shows_each_phase(rig):
    from jupyter_gpu_pool.cli import render_status

    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    short = r.lease(kid).short_id

    def row() -> str:
        return next(line for line in render_status(r.pool, r.pool.ledger.snapshot()).splitlines() if short in line)

    gate = r.standin.gate_locks()
    hibernation = asyncio.ensure_future(r.hibernator.hibernate(kid))
    await wait_until(lambda: r.lease(kid).phase == "hibernating", timeout=10, what="the hibernation to be under way")
    assert "hibernating" in row()
    gate.set()
    await hibernation
    assert "600 MiB" in row() and row().split()[-2] == "-"  # hibernated, no phase
    for g in STANDIN_GPUS:
        r.block(g.uuid, "80GiB", f"blocker-{g.index}")
    resume = r.hibernator.start_resume(kid)
    for _ in range(50):
        await asyncio.sleep(0.1)
        if "queued" in row():
            break
    assert "queued" in row()
    status = render_status(r.pool, r.pool.ledger.snapshot())
    assert "Queue:" in status and "resume" in status.split("Queue:")[1]
    r.hibernator.forget(kid)
    with pytest.raises(asyncio.CancelledError):
        await resume


async def test_a_kernel_being_shut_down_neither_hibernates_nor_resumes_and_keeps_its_phase(rig):
    r = rig()
    kid, pid = await r.gpu_kernel()
    lease = r.lease(kid)
    r.pool.ledger.set_holder(lease.id, None, "stopping")  # what the provisioner does when a shutdown begins
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.hibernate(kid)
    assert err.value.reason == "in_progress" and "stopping" in err.value.message
    r.pool.ledger.set_holder(lease.id, None, "")
    await r.hibernator.hibernate(kid)
    r.pool.ledger.set_holder(lease.id, None, "stopping")
    with pytest.raises(HibernationRefused) as err:
        await r.hibernator.resume(kid)
    assert err.value.reason == "stopping"
    assert r.lease(kid).phase == "stopping" and r.standin.procs[pid].state == CHECKPOINTED


# -- what the caller carries out: the model's effects ----------------------------------------------------


async def test_a_resume_its_user_asked_for_restarts_the_idle_clock_and_a_hints_waits_for_a_cell(rig):
    """The resume's outcome carries the residency model's effects for its caller: a cell's or a Resume's
    restarts the kernel's idle clock; a hint's only holds the kernel for a cell, and the cell that then comes
    (``used``) is what restarts it; a hibernation is put on record and restarts nothing."""
    from jupyter_gpu_pool.pool import residency as M

    r = rig()
    kid, _ = await r.gpu_kernel()
    slept = await r.hibernator.hibernate(kid)
    assert M.RECORD in slept.effects and M.RESTART_IDLE_CLOCK not in slept.effects
    asked = await r.hibernator.resume(kid, "cell")
    assert M.RESTART_IDLE_CLOCK in asked.effects and M.HOLD_FOR_CELL not in asked.effects

    await r.hibernator.hibernate(kid)
    hinted = await r.hibernator.start_resume(kid, "hint", hint=True)
    assert M.HOLD_FOR_CELL in hinted.effects and M.RESTART_IDLE_CLOCK not in hinted.effects
    assert r.hibernator.hinted(kid)
    assert r.hibernator.used(kid) == (M.RESTART_IDLE_CLOCK,)  # the hint was right: its user is here
    assert not r.hibernator.hinted(kid) and r.hibernator.used(kid) == ()  # once
