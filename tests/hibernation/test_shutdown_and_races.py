"""Shutting down hibernated and just-resumed kernels, and moves that race each other.

Killing a just-restored process hung a host on one driver (595, open module), and its reporter's
workaround was to lock and checkpoint it again before the kill: the provisioner does that for every
process a resume restored (``hibernation_checkpoint_before_kill``), bounded by
``hibernation_shutdown_timeout`` so that a shutdown never hangs on the driver.  Real kernels through
the gpu-pool provisioner, a real ledger; the driver is the stand-in machine's (hibernation_standin.py).
What a real driver and real memory do after the kill (NVML, the host's RAM): tests/gpu.
"""

from __future__ import annotations

import asyncio
import time

import psutil
from hibernation_standin import STANDIN_GPUS
from kernel_helpers import run_code, wait_until
from rig_helpers import CHECKPOINTED, RUNNING, MiB

from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, RELEASED

LOCK, CHECKPOINT = "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint"


def calls_after(standin, pid: int, start: int) -> list[str]:
    return [call for call, p in standin.calls[start:] if p == pid]


def configure(machine, **settings) -> None:
    machine.configure(gpu_discovery="nvml", inventory=[], profiles=machine.settings["profiles"], **settings)


async def test_killing_a_resumed_kernel_checkpoints_it_again_first(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    lease_id = r.lease(kid).id
    await r.hibernator.hibernate(kid)
    await r.hibernator.resume(kid)
    start = len(r.standin.calls)

    await asyncio.wait_for(r.manager.shutdown_kernel(kid, now=True), 60)

    assert calls_after(r.standin, pid, start) == ["cuCheckpointProcessGetState", LOCK, CHECKPOINT]
    assert r.standin.procs[pid].state == CHECKPOINTED  # as the workaround leaves it, then killed
    assert not psutil.pid_exists(pid) and r.pool.ledger.get(lease_id).state == RELEASED


async def test_a_hibernated_kernel_is_killed_without_a_driver_call_and_its_host_ram_is_released(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    lease_id = r.lease(kid).id
    await r.hibernator.hibernate(kid)
    assert r.pool.ledger.host_bytes_on(r.pool.host) == 600 * MiB
    start = len(r.standin.calls)

    await asyncio.wait_for(r.manager.shutdown_kernel(kid, now=True), 60)

    assert calls_after(r.standin, pid, start) == []  # nothing was restored: nothing to prepare
    assert not psutil.pid_exists(pid) and r.pool.ledger.get(lease_id).state == RELEASED
    assert r.pool.ledger.host_bytes_on(r.pool.host) == 0


async def test_a_graceful_shutdown_of_a_hibernated_kernel_ends_and_releases_everything(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    lease_id = r.lease(kid).id
    await r.hibernator.hibernate(kid)
    await asyncio.wait_for(r.manager.shutdown_kernel(kid, now=False), 60)
    assert not psutil.pid_exists(pid) and r.pool.ledger.get(lease_id).state == RELEASED
    assert r.pool.ledger.host_bytes_on(r.pool.host) == 0


async def test_a_kill_waits_no_longer_than_the_shutdown_timeout_for_the_driver(rig, standin_machine):
    configure(standin_machine, hibernation_shutdown_timeout=1.0)
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    await r.hibernator.hibernate(kid)
    await r.hibernator.resume(kid)
    gate = r.standin.gate_locks()  # the driver hangs in the lock for longer than the bound

    started = time.monotonic()
    await asyncio.wait_for(r.manager.shutdown_kernel(kid, now=True), 60)
    took = time.monotonic() - started
    gate.set()  # the driver's call returns at last (its thread would hold up the test's teardown)

    assert took < 5.5  # the bound, plus jupyter_client's kill
    assert not psutil.pid_exists(pid) and r.lease(kid) is None


async def test_without_the_workaround_a_resumed_kernel_is_killed_directly(rig, standin_machine):
    configure(standin_machine, hibernation_checkpoint_before_kill=False)
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    await r.hibernator.hibernate(kid)
    await r.hibernator.resume(kid)
    start = len(r.standin.calls)
    await asyncio.wait_for(r.manager.shutdown_kernel(kid, now=True), 60)
    assert calls_after(r.standin, pid, start) == [] and not psutil.pid_exists(pid)


async def test_a_restart_of_a_resumed_kernel_checkpoints_the_old_process_and_keeps_the_slice(rig):
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    lease = r.lease(kid)
    await r.hibernator.hibernate(kid)
    await r.hibernator.resume(kid)
    await asyncio.wait_for(r.manager.restart_kernel(kid, now=True), 120)
    assert [c for c, p in r.standin.calls if p == pid][-2:] == [LOCK, CHECKPOINT]
    now = r.lease(kid)
    assert now.id == lease.id and now.state == ACTIVE and r.manager.get_kernel(kid).provisioner.pid != pid


# -- races ---------------------------------------------------------------------------------------------


async def test_two_kernels_hibernate_and_resume_at_the_same_time_and_end_consistent(rig):
    r = rig()
    (a, pa), (b, pb) = await r.gpu_kernel(gpu_bytes=500 * MiB), await r.gpu_kernel(gpu_bytes=700 * MiB)
    await run_code(r.manager.get_kernel(a), "x = 'a'")
    await run_code(r.manager.get_kernel(b), "x = 'b'")

    outs = await asyncio.gather(r.hibernator.hibernate(a), r.hibernator.hibernate(b))

    assert [o.bytes for o in outs] == [500 * MiB, 700 * MiB]
    assert {r.lease(a).state, r.lease(b).state} == {HIBERNATED}
    assert r.pool.ledger.host_bytes_on(r.pool.host) == 1200 * MiB
    assert all(u.memory == 0 for u in r.pool.ledger.snapshot().gpus)
    assert (r.standin.procs[pa].state, r.standin.procs[pb].state) == (CHECKPOINTED, CHECKPOINTED)

    await asyncio.gather(r.hibernator.resume(a), r.hibernator.resume(b))

    assert {r.lease(a).state, r.lease(b).state} == {ACTIVE} and r.pool.ledger.host_bytes_on(r.pool.host) == 0
    assert (r.standin.procs[pa].state, r.standin.procs[pb].state) == (RUNNING, RUNNING)
    assert r.pool.ledger.overcommitted() == []
    assert "a" in await run_code(r.manager.get_kernel(a), "print(x)")
    assert "b" in await run_code(r.manager.get_kernel(b), "print(x)")


async def test_a_resume_racing_a_new_kernel_for_the_same_gpu_ends_consistent(rig):
    r = rig()
    kid, pid = await r.gpu_kernel("big", gpu_bytes=600 * MiB)  # a whole stand-in GPU
    await run_code(r.manager.get_kernel(kid), "x = 42")
    gpu = r.lease(kid).gpus[0]
    await r.hibernator.hibernate(kid)
    other = next(g.uuid for g in STANDIN_GPUS if g.uuid != gpu)
    r.block(other, "80GiB", "blocker")  # one GPU left: the resume and the new kernel race for it

    resume = r.hibernator.start_resume(kid)
    start = asyncio.ensure_future(r.manager.start_kernel(kernel_name="gpu-pool-big"))
    await asyncio.wait([resume, start], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    await wait_until(lambda: start.done() and (resume.done() or r.hibernator.shown(kid) == "queued"),
                     what="the race decided")

    assert r.pool.ledger.overcommitted() == []
    if resume.done():  # the resume won: the start was refused with the pool's message
        assert start.exception() is not None and "full" in str(start.exception())
        assert r.lease(kid).gpus == (gpu,) and r.standin.procs[pid].state == RUNNING
    else:  # the start won: the resume waits its turn, its memory still in host RAM
        newcomer = start.result()
        assert r.lease(newcomer).gpus == (gpu,) and r.standin.procs[pid].state == CHECKPOINTED
        assert r.hibernator.queue_position(kid) == 1
        await r.manager.shutdown_kernel(newcomer, now=True)
        await asyncio.wait_for(resume, 60)
    assert r.lease(kid).state == ACTIVE and r.standin.procs[pid].state == RUNNING
    assert "42" in await run_code(r.manager.get_kernel(kid), "print(x)")


async def test_a_shutdown_that_begins_during_a_checkpoint_keeps_the_kernel_stopping_once_it_is_done(rig):
    """The shutdown wins over the move under way, but the move's end still counts: the slice goes back once
    the memory is in host RAM, and the lease stays ``stopping`` (its provisioner's until released), never
    settled hibernated for the culler or a resume to pick up."""
    r = rig()
    kid, pid = await r.gpu_kernel(gpu_bytes=600 * MiB)
    lease = r.lease(kid)
    gate = r.standin.gate_locks()
    move = asyncio.ensure_future(r.hibernator.hibernate(kid))
    await wait_until(lambda: ("cuCheckpointProcessLock", pid) in r.standin.calls, 30, what="the hibernation under way")
    r.pool.ledger.stop(lease.id)  # what the provisioner does when a shutdown begins
    gate.set()
    outcome = await asyncio.wait_for(move, 60)
    after = r.lease(kid)
    assert (after.state, after.phase, after.host_bytes, after.gpus) == (HIBERNATED, "stopping", 600 * MiB, ())
    assert outcome.lease is not None and outcome.lease.phase == "stopping"
    assert r.standin.procs[pid].state == CHECKPOINTED
