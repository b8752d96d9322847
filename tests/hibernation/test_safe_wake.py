"""Safe wake: a resume restores only where its GPU really has room.  A restore that runs out of GPU
memory can leave the process stuck in the checkpointed state for good (docs/gpu-testing.md), and
soft slices are not enforced, so the ledger's word that a slice is free is not enough: NVML's free
memory must cover the checkpoint plus ``hibernation_resume_margin``.  Until it does, the resume waits
in the queue with its position and the reason.

Real kernels, a real ledger, the real queue; the checkpoint driver and NVML's memory readings are the
stand-in machine's (hibernation_standin.py), where ``held_elsewhere`` is memory another process holds.
The same check against a GPU filled from another process: tests/gpu/test_hibernation_gpu.py.
"""

from __future__ import annotations

import asyncio

import pytest
from hibernation_standin import STANDIN_GPUS
from kernel_helpers import wait_until
from rig_helpers import CHECKPOINTED, RUNNING, GiB, MiB

from jupyter_gpu_pool.pool import HIBERNATED

RESTORE = "cuCheckpointProcessRestore"


def fill(memory, gpus, leave: int) -> None:
    """Another process takes all but ``leave`` bytes of each of ``gpus`` (outside any slice)."""
    for gpu in gpus:
        memory.held_elsewhere[gpu.uuid] = gpu.memory - leave


async def test_a_resume_waits_in_the_queue_while_its_gpu_lacks_the_memory_and_restores_once_it_has_it(
        rig, standin_memory):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    gpu = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    fill(standin_memory, STANDIN_GPUS, leave=GiB)  # 1 GiB free: less than 600 MiB + the 1 GiB margin

    task = r.hibernator.start_resume(kid)
    await wait_until(lambda: r.hibernator.queue_reason(kid) is not None, what="a reason to wait")

    reason = r.hibernator.queue_reason(kid)
    assert reason.startswith("waiting for 1.6 GiB of GPU memory to be free on GPU 0 or GPU 1 (1 GiB is free now")
    assert r.hibernator.queue_position(kid) == 1 and r.hibernator.shown(kid) == "queued"
    lease = r.lease(kid)
    assert (lease.state, lease.phase) == (HIBERNATED, "queued")
    assert [w.kernel_id for w in r.pool.ledger.waiters()] == [kid]
    assert r.held_on(gpu) == 0  # no slice is taken while it waits
    await asyncio.sleep(1.0)  # several tries of the queue: each reads NVML again
    assert not task.done() and standin_memory.reads.count(gpu) >= 3
    assert r.standin.procs[pid].state == CHECKPOINTED and (RESTORE, pid) not in r.standin.calls

    fill(standin_memory, [STANDIN_GPUS[0]], leave=2 * GiB)  # its own GPU has room now
    out = await asyncio.wait_for(task, 60)

    assert out.gpus == (gpu,) and r.standin.procs[pid].state == RUNNING
    assert r.hibernator.queue_reason(kid) is None and r.pool.ledger.waiters() == []


async def test_the_margin_is_the_admins_setting(rig, standin_memory):
    r = rig(resume_margin=0)
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    await r.hibernator.hibernate(kid)
    fill(standin_memory, STANDIN_GPUS, leave=700 * MiB)  # enough for 600 MiB with no margin
    out = await asyncio.wait_for(r.hibernator.resume(kid), 30)
    assert out.waited == 0 and r.standin.procs[pid].state == RUNNING


async def test_a_resume_goes_to_another_gpu_of_the_model_where_that_one_has_room(rig, standin_memory):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    old = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    r.block(old, "80GiB", "blocker")  # its GPU's slice is taken in the ledger...
    fill(standin_memory, [g for g in STANDIN_GPUS if g.uuid == old], leave=0)  # ...and its memory too
    out = await asyncio.wait_for(r.hibernator.resume(kid), 30)
    assert out.gpus != (old,) and r.standin.procs[pid].restored_on == out.gpus


async def test_a_slice_granted_on_a_gpu_without_room_is_given_back_once_and_the_resume_waits_for_its_own(
        rig, standin_memory):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)
    old = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    own = next(g for g in STANDIN_GPUS if g.uuid == old)
    fill(standin_memory, [own], leave=0)  # its GPU: a free slice in the ledger, but no memory; the other has both

    task = r.hibernator.start_resume(kid)
    await wait_until(lambda: r.hibernator.queue_reason(kid) is not None, what="a reason to wait")
    await asyncio.sleep(1.0)

    assert f"to be free on GPU {own.index} (0 B is free now" in r.hibernator.queue_reason(kid)
    assert r.journaled(kid).count("resumed") == 1  # the ledger's pick, given back once: no churn
    assert (RESTORE, pid) not in r.standin.calls and r.lease(kid).state == HIBERNATED
    standin_memory.held_elsewhere.clear()
    out = await asyncio.wait_for(task, 60)
    assert out.gpus == (old,) and r.standin.procs[pid].restored_on == (old,)


async def test_a_gpu_nvml_cannot_read_does_not_hold_a_resume_back(rig, standin_memory, monkeypatch):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    await r.hibernator.hibernate(kid)
    monkeypatch.setattr(standin_memory, "free", lambda uuid: None)
    out = await asyncio.wait_for(r.hibernator.resume(kid), 30)
    assert out.waited == 0 and r.standin.procs[pid].state == RUNNING


async def test_a_kernel_with_nothing_to_restore_never_waits_for_memory(rig, standin_memory):
    r = rig()
    kid, _ = await r.gpu_kernel(gpu_bytes=0)  # never touched CUDA
    await r.hibernator.hibernate(kid)
    fill(standin_memory, STANDIN_GPUS, leave=0)
    out = await asyncio.wait_for(r.hibernator.resume(kid), 30)
    assert out.waited == 0 and standin_memory.reads == []


@pytest.mark.parametrize("margin", ["lots", "-1GiB", "5"])
def test_a_bad_margin_is_refused_with_the_setting_named(margin):
    from jupyter_gpu_pool.config import GPUPool

    with pytest.raises(Exception) as err:
        GPUPool(hibernation_resume_margin=margin)
    assert "hibernation_resume_margin" in str(err.value)
