"""The gpu-pool provisioner with real ipykernel processes, through jupyter_client's
AsyncKernelManager: the lease exists while the kernel runs and is gone after, on
every exit path."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from kernel_helpers import kernel_env, run_code, wait_until, write_kernelspec


from jupyter_gpu_pool.local import processes
from jupyter_gpu_pool.kernel_provisioner import GPUPoolProvisioner, KernelStartRefused
from jupyter_gpu_pool.pool import ACTIVE, RELEASED

GiB = 2**30


def held(pool_home):
    return pool_home.ledger().leases()


async def test_a_kernel_holds_a_lease_while_it_runs_and_gives_it_back(pool_home, managers):
    km = managers("gpu-pool-small")
    await km.start_kernel()
    assert isinstance(km.provisioner, GPUPoolProvisioner)
    [lease] = held(pool_home)
    assert lease.state == ACTIVE and lease.profile == "small" and lease.memory == 10 * GiB
    assert lease.holder_pid == km.provisioner.pid and lease.manager_pid == os.getpid()
    env = await kernel_env(km)
    assert env["JUPYTER_GPU_POOL_LEASE"] == lease.id
    assert env["CUDA_VISIBLE_DEVICES"] == lease.gpus[0] == env["JUPYTER_GPU_POOL_GPUS"]
    assert env["JUPYTER_GPU_POOL_MEMORY_BYTES"] == str(10 * GiB)
    assert env["JUPYTER_GPU_POOL_GPU_SOURCE"] == "declared"
    await km.shutdown_kernel()
    assert held(pool_home) == []
    assert pool_home.ledger().get(lease.id).reason == "shutdown"


async def test_a_restart_keeps_the_same_lease_with_the_new_process_as_holder(pool_home, managers):
    km = managers("gpu-pool-small")
    await km.start_kernel()
    [before] = held(pool_home)
    old_pid = km.provisioner.pid
    await run_code(km, "x = 1")
    await km.restart_kernel()
    [after] = held(pool_home)
    assert after.id == before.id and after.holder_pid == km.provisioner.pid != old_pid
    assert (await kernel_env(km))["JUPYTER_GPU_POOL_LEASE"] == before.id
    await km.shutdown_kernel()
    assert held(pool_home) == []


async def test_a_kernel_killed_with_sigkill_loses_its_lease_after_the_grace(pool_home, managers):
    km = managers("gpu-pool-small")
    await km.start_kernel()
    [lease] = held(pool_home)
    os.kill(km.provisioner.pid, signal.SIGKILL)
    await wait_until(lambda: km.provisioner.process.poll() is not None)
    pool = pool_home.pool()
    assert pool.reconcile() == []  # within holder_grace (2 s here) the server's restarter may reuse it
    await asyncio.sleep(pool_home.settings["holder_grace"] + 0.5)
    assert [r.id for r in pool.reconcile()] == [lease.id]
    assert held(pool_home) == []
    await km.shutdown_kernel(now=True)  # the manager's own cleanup finds nothing left to release


async def test_a_killed_kernel_under_a_restarter_comes_back_on_the_same_lease(pool_home, managers):
    from jupyter_client.ioloop import AsyncIOLoopKernelManager
    from traitlets.config import Config

    # its restarter looks every 0.5 s, not jupyter_client's 3 s (as jupyter_server's can be told to)
    km = AsyncIOLoopKernelManager(kernel_name="gpu-pool-small", autorestart=True,
                                  config=Config({"KernelRestarter": {"time_to_dead": 0.5}}))
    await km.start_kernel()
    try:
        [lease] = held(pool_home)
        first_pid = km.provisioner.pid
        os.kill(first_pid, signal.SIGKILL)
        await wait_until(lambda: km.provisioner.pid != first_pid and held(pool_home)[0].holder_pid == km.provisioner.pid,
                       timeout=60)
        [again] = held(pool_home)
        assert again.id == lease.id
        assert pool_home.pool().reconcile() == []
        assert (await run_code(km, "print('back')")).strip() == "back"  # the restart has finished
    finally:
        km.stop_restarter()
        await km.shutdown_kernel(now=True)
    assert held(pool_home) == []


async def test_a_failed_launch_leaves_nothing_held(pool_home, managers, jp_data_dir):
    write_kernelspec(jp_data_dir, "broken", argv=["/nonexistent/python", "-f", "{connection_file}"],
                     provisioner_config={"profile": "small"})
    km = managers("broken")
    with pytest.raises(FileNotFoundError):
        await km.start_kernel()
    assert held(pool_home) == []
    assert pool_home.ledger().journal(kinds=("released",))[0].reason == "launch failed"


async def test_an_exhausted_quota_is_refused_within_a_second_and_takes_nothing(pool_home, managers):
    pool_home.configure(default_user_quota={"memory": "15GiB"})
    first = managers("gpu-pool-small", )
    await first.start_kernel(env={**os.environ, "JPY_SESSION_NAME": "analysis/first.ipynb"})
    second = managers("gpu-pool-small")
    started = time.monotonic()
    with pytest.raises(KernelStartRefused) as err:
        await second.start_kernel()
    assert time.monotonic() - started < 1.0
    assert err.value.status_code == 403
    message = str(err.value)
    assert message.startswith("GPU quota exceeded: 'Python 3 · GPU 10 GiB' needs 10 GiB of GPU memory, and you hold "
                              "10 GiB of your 15 GiB.")
    assert "analysis/first.ipynb" in message  # which of their own kernels holds it
    assert len(held(pool_home)) == 1
    assert second.provisioner.lease_id is None


async def test_a_full_pool_is_refused_with_a_message_a_user_understands(pool_home, managers):
    for _ in range(2):
        await managers("gpu-pool-whole").start_kernel()
    km = managers("gpu-pool-small")
    started = time.monotonic()
    with pytest.raises(KernelStartRefused) as err:
        await km.start_kernel()
    assert time.monotonic() - started < 1.0
    assert err.value.status_code == 503
    # named as the launcher shows it; every slice is taken, so nothing smaller would start either
    assert str(err.value).startswith("The GPU pool is full: every GPU slice is taken, so 'Python 3 · GPU 10 GiB' "
                                     "(10 GiB) cannot start now.")
    assert "would start now" not in str(err.value)
    assert len(held(pool_home)) == 2


async def test_a_start_waits_in_the_queue_when_the_admin_allows_it(pool_home, managers):
    pool_home.configure(start_queue_timeout=30.0)
    blockers = [managers("gpu-pool-whole"), managers("gpu-pool-whole")]
    for km in blockers:
        await km.start_kernel()
    waiting = managers("gpu-pool-small")
    start = asyncio.create_task(waiting.start_kernel())
    queue = await wait_until(lambda: pool_home.ledger().waiters())
    assert queue[0].position == 1 and queue[0].profile == "small"
    await blockers[0].shutdown_kernel()
    await asyncio.wait_for(start, 30)
    assert waiting.provisioner.lease_id in {lease.id for lease in held(pool_home)}
    assert pool_home.ledger().waiters() == []


async def test_a_queued_start_gives_up_with_a_clear_message(pool_home, managers):
    pool_home.configure(start_queue_timeout=1.0)
    for _ in range(2):
        await managers("gpu-pool-whole").start_kernel()
    km = managers("gpu-pool-small")
    with pytest.raises(KernelStartRefused, match=r"Waited 1s in the GPU queue"):
        await km.start_kernel()
    assert pool_home.ledger().waiters() == [] and len(held(pool_home)) == 2


async def test_a_kernelspec_naming_an_unknown_profile_is_refused(pool_home, managers, jp_data_dir):
    write_kernelspec(jp_data_dir, "typo", provisioner_config={"profile": "smal"})
    with pytest.raises(KernelStartRefused) as err:
        await managers("typo").start_kernel()
    assert err.value.status_code == 400
    assert "no GPU profile named 'smal'" in str(err.value) and "half, small, whole" in str(err.value)
    assert held(pool_home) == []


async def test_a_kernelspec_with_an_unknown_config_key_is_refused(pool_home, managers, jp_data_dir):
    write_kernelspec(jp_data_dir, "badkey", provisioner_config={"profle": "small"})
    with pytest.raises(KernelStartRefused, match=r"unknown keys \['profle'\]"):
        await managers("badkey").start_kernel()
    assert held(pool_home) == []


async def test_a_kernelspec_without_a_profile_gets_the_default(pool_home, managers, jp_data_dir):
    pool_home.configure(default_profile="half")
    write_kernelspec(jp_data_dir, "plain")
    km = managers("plain")
    await km.start_kernel()
    assert held(pool_home)[0].profile == "half"


async def test_an_mps_slice_puts_its_caps_in_the_environment(pool_home, managers):
    km = managers("gpu-pool-half")
    await km.start_kernel()
    env = await kernel_env(km)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    [lease] = held(pool_home)  # one MPS daemon per GPU (an MPS server serves one user at a time): the lease's GPU's
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pool_home.pool().mps_daemon(lease.gpus[0]).pipe_directory
    assert "JUPYTER_GPU_POOL_MEMORY_FRACTION" not in env  # no soft caps under MPS


async def test_a_soft_slice_caps_frameworks_only_through_env_and_a_lazy_hook(pool_home, managers):
    km = managers("gpu-pool-small")
    await km.start_kernel()
    env = await kernel_env(km)
    assert env["JUPYTER_GPU_POOL_MEMORY_FRACTION"] == "0.250000"  # 10 of 40 GiB
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(10 * GiB)
    hook = await run_code(km, "import sys; print([type(f).__name__ for f in sys.meta_path][0], 'torch' in sys.modules)")
    assert hook.split() == ["_TorchCapFinder", "False"]  # installed, and torch not imported for it


async def test_a_whole_gpu_kernel_sees_its_gpu_and_no_caps(pool_home, managers):
    km = managers("gpu-pool-whole")
    await km.start_kernel()
    env = await kernel_env(km)
    lease = held(pool_home)[0]
    assert lease.whole and env["CUDA_VISIBLE_DEVICES"] == lease.gpus[0]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env and "JUPYTER_GPU_POOL_MEMORY_FRACTION" not in env


async def test_a_restarted_server_adopts_its_kernels_lease(pool_home, managers):
    km = managers("gpu-pool-small")
    await km.start_kernel()
    info = await km.provisioner.get_provisioner_info()
    assert info["gpu_pool_lease_id"] == held(pool_home)[0].id
    fresh = GPUPoolProvisioner(kernel_id=km.kernel_id, kernel_spec=km.kernel_spec, parent=km)
    await fresh.load_provisioner_info(info)
    assert fresh.lease_id == info["gpu_pool_lease_id"]
    assert held(pool_home)[0].manager_pid == os.getpid()


SERVER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, time
    from jupyter_client.manager import AsyncKernelManager

    async def main():
        km = AsyncKernelManager(kernel_name="gpu-pool-small")
        await km.start_kernel()
        print(km.provisioner.lease_id, km.provisioner.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


async def test_a_server_killed_with_sigkill_leaves_no_slice_held(pool_home, tmp_path):
    """kill -9 of the managing process: its kernel exits (ipykernel watches its parent) and the
    next reconcile reclaims the slice."""
    script = tmp_path / "server.py"
    script.write_text(SERVER_SCRIPT)
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), 60)
        lease_id, kernel_pid = line.split()
        kernel = processes.identify(int(kernel_pid))
        assert held(pool_home)[0].id == lease_id
        server.send_signal(signal.SIGKILL)
        server.wait()
        await wait_until(lambda: not processes.is_alive(kernel.pid, kernel.start), timeout=30)
        reclaimed = pool_home.pool().reconcile()
        assert [r.id for r in reclaimed] == [lease_id]
        assert pool_home.ledger().get(lease_id).state == RELEASED
    finally:
        server.kill()


def test_the_provisioner_is_registered_under_its_entry_point():
    from jupyter_client.provisioning import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    assert factory._check_availability("gpu-pool")



async def test_a_shutdown_in_progress_marks_the_lease_stopping(pool_home, managers):
    km = managers("gpu-pool-small")
    await km.start_kernel()
    await km.provisioner.shutdown_requested()
    [lease] = held(pool_home)
    assert lease.phase == "stopping" and lease.holder_pid is None
    await km.shutdown_kernel()
    assert held(pool_home) == []
    assert pool_home.ledger().journal(kinds=("released",))[0].reason == "shutdown"
