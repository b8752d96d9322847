"""Hibernation on a real GPU, with real kernels (a GPU machine: docs/gpu-testing.md):

    python3 -m pytest -m gpu -v tests/gpu/test_hibernation_gpu.py

Each test configures a pool of the DETECTED GPUs, starts real kernels through the gpu-pool
provisioner and uses PyTorch inside them.  The hibernator runs with the real CUDA driver
(``devices.checkpoint.CudaCheckpoint``) and real NVML; nothing is stood in.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from kernel_helpers import run_code

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.devices.nvml import discover

pytestmark = pytest.mark.gpu

GiB = 2**30
HIBERNATE_ON_RELEASE = [{"name": "hibernate-on-release", "idle_timeout": None, "gpu_idle_timeout": None,
                         "max_hibernated": None, "action": "hibernate"}]


def gpu_memory() -> int:
    return discover().gpus[0].memory


@pytest.fixture
def gpu_pool(pool_home):
    """A pool of the detected GPUs: a 'big' soft slice of 3/4 of a GPU, a small soft one, an MPS one."""
    big = int(gpu_memory() * 0.75) // GiB
    pool_home.configure(
        gpu_discovery="nvml", inventory=[], unix_groups=False, policy=HIBERNATE_ON_RELEASE,
        hibernation_host_memory="none", hibernation_lock_timeout=3.0,
        profiles={"big": {"slice": f"{big}GiB", "isolation": "soft"},
                  "soft10g": {"slice": "10GiB", "isolation": "soft"},
                  "mps8": {"slice": "8GiB,25%", "isolation": "mps"}},
    )
    pool_home.install_kernelspecs()
    yield pool_home
    pool_home.pool().stop_mps()  # the pool's own daemon: leave the card as we found it


@pytest.fixture
async def kernels(gpu_pool):
    manager = AsyncMultiKernelManager()
    yield manager
    await manager.shutdown_all(now=True)


@pytest.fixture
def hibernator(kernels):
    from jupyter_gpu_pool.hibernation import Hibernator, Kernels
    from jupyter_gpu_pool.local.pool import pool_for

    return Hibernator(pool_for(), Kernels(kernels))


async def start(kernels, profile: str) -> tuple[str, int]:
    kid = await kernels.start_kernel(kernel_name=f"gpu-pool-{profile}")
    return kid, kernels.get_kernel(kid).provisioner.pid


CHECKSUM = "print(repr(sum(float(c.sum()) for c in x.split(2**27))))"


async def test_a_kernel_holding_gibs_hibernates_frees_its_gpu_memory_for_another_and_resumes_intact(
        kernels, hibernator):
    total = gpu_memory()
    hold = int(total * 0.45) // GiB  # 36 GiB on an 80 GiB H100
    kid, pid = await start(kernels, "big")
    km = kernels.get_kernel(kid)
    await run_code(km, f"import torch\ntorch.manual_seed(0)\nx = torch.randn({hold} * 2**30 // 4, device='cuda')",
                   timeout=300)
    before = await run_code(km, CHECKSUM, timeout=300)
    assert cp.gpu_memory_of([pid])[pid] >= hold * GiB

    out = await hibernator.hibernate(kid, "idle")

    print(f"hibernated {out.bytes / GiB:.1f} GiB in {out.duration:.1f}s")
    assert pid in out.pids and out.bytes >= hold * GiB
    assert cp.driver().state(pid) == cp.ProcessState.CHECKPOINTED
    assert cp.gpu_memory_of([pid]).get(pid, 0) == 0  # NVML shows none of its memory on the GPU
    assert "True" in await run_code(km, "print('x' in dir())")  # CPU-only code still runs

    other, _ = await start(kernels, "big")  # the slice it gave back
    more = int(total * 0.6) // GiB  # hold + more > the GPU: only possible with the first kernel's memory out
    got = await run_code(kernels.get_kernel(other), "\n".join([
        "import torch", f"y = torch.empty({more} * 2**30, dtype=torch.uint8, device='cuda')",
        "print('allocated', y.numel() // 2**30)"]), timeout=300)
    assert f"allocated {more}" in got
    await kernels.shutdown_kernel(other, now=True)

    back = await hibernator.resume(kid)

    print(f"resumed {back.bytes / GiB:.1f} GiB in {back.duration:.1f}s")
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING
    assert await run_code(km, CHECKSUM, timeout=300) == before  # every value intact
    assert cp.gpu_memory_of([pid])[pid] >= hold * GiB


async def test_cached_allocator_memory_is_released_before_the_checkpoint(kernels, hibernator):
    kid, pid = await start(kernels, "big")
    km = kernels.get_kernel(kid)
    await run_code(km, "import torch\nx = torch.ones(2**28, device='cuda')\n"
                       "junk = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda')\ndel junk")
    assert cp.gpu_memory_of([pid])[pid] >= 8 * GiB  # freed by the user, still reserved by PyTorch
    out = await hibernator.hibernate(kid)
    assert out.bytes < 4 * GiB, f"{out.bytes / GiB:.1f} GiB moved: the cache was not emptied"
    await hibernator.resume(kid)
    assert "268435456.0" in await run_code(km, "print(float(x.sum()))")


async def test_a_kernel_busy_in_a_long_gpu_loop_is_not_checkpointed_mid_work(gpu_pool, jp_fetch, ext_hook):
    """Busy per jupyter_server (a cell runs a GPU loop): refused before any driver call."""
    kid = await rest_kernel(jp_fetch, "soft10g")
    km = ext_hook.extension.serverapp.kernel_manager
    pid = km.get_kernel(kid).provisioner.pid
    client = km.get_kernel(kid).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        msg_id = client.execute("import torch, time\nx = torch.randn(4096, 4096, device='cuda')\nt = time.time()\n"
                                "n = 0\nwhile time.time() - t < 20:\n    y = x @ x\n    n += 1\n"
                                "torch.cuda.synchronize()\nprint('loops', n)")
        await until(lambda: km.get_kernel(kid).execution_state == "busy", 60)
        await asyncio.sleep(3)  # well inside the loop
        from jupyter_gpu_pool.hibernation import HibernationRefused

        with pytest.raises(HibernationRefused) as err:
            await ext_hook.hibernate(kid, "idle")
        assert err.value.reason == "busy" and err.value.keep_running
        assert cp.driver().state(pid) == cp.ProcessState.RUNNING
        reply = await client.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != msg_id:  # kernel_info replies of wait_for_ready
            reply = await client.get_shell_msg(timeout=120)
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()


async def test_gpu_work_in_flight_past_the_lock_timeout_leaves_the_kernel_running_untouched(kernels, hibernator):
    """Idle per Jupyter, but a background thread's GPU kernel runs 25 s: the lock gives up after 3 s."""
    kid, pid = await start(kernels, "soft10g")
    km = kernels.get_kernel(kid)
    await run_code(km, "\n".join([
        "import torch, threading, time",
        "torch.cuda._sleep(1); torch.cuda.synchronize()",
        "t = time.time(); torch.cuda._sleep(int(2e8)); torch.cuda.synchronize(); per_s = 2e8 / (time.time() - t)",
        "done = []",
        "def work():",
        "    torch.cuda._sleep(int(25 * per_s)); torch.cuda.synchronize(); done.append(time.time())",
        "worker = threading.Thread(target=work); worker.start()",
    ]), timeout=120)
    from jupyter_gpu_pool.hibernation import HibernationRefused

    started = time.monotonic()
    with pytest.raises(HibernationRefused) as err:
        await hibernator.hibernate(kid)
    assert err.value.reason == "gpu_busy" and err.value.keep_running
    assert time.monotonic() - started < 20  # it gave up, it did not wait for the work
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING
    assert hibernator.ledger.by_kernel(kid).state == "active"
    assert "True" in await run_code(km, "worker.join(); print(len(done) == 1)", timeout=120)
    assert (await hibernator.hibernate(kid)).action == "hibernated"  # quiet now
    await hibernator.resume(kid)


async def test_an_mps_kernel_reports_that_it_cannot_hibernate_and_why(kernels, hibernator):
    kid, pid = await start(kernels, "mps8")
    await run_code(kernels.get_kernel(kid), "import torch\nx = torch.ones(2**28, device='cuda')")
    ok, why = hibernator.can_hibernate(hibernator.ledger.by_kernel(kid))
    assert not ok and "MPS" in why and "801" in why
    from jupyter_gpu_pool.hibernation import HibernationRefused

    with pytest.raises(HibernationRefused) as err:
        await hibernator.hibernate(kid)
    assert err.value.reason == "mps" and not err.value.keep_running
    with pytest.raises(cp.NotSupported) as refused:  # and the driver itself says so (docs/architecture.md)
        cp.driver().lock(pid, 3.0)
    assert refused.value.code == cp.CUDA_ERROR_NOT_SUPPORTED
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING


def test_the_binding_round_trips_a_cuda_process():
    info = cp.driver().info()
    assert info.available, info.reason
    assert info.cuda_version >= 12080
    child = subprocess.Popen(
        [sys.executable, "-c", "import torch, sys\nx = torch.ones(2**28, device='cuda')\ntorch.cuda.synchronize()\n"
                               "print('ready', flush=True)\nsys.stdin.readline()\nprint(float(x.sum()), flush=True)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        drv = cp.driver()
        assert drv.state(child.pid) == cp.ProcessState.RUNNING
        assert drv.restore_thread_id(child.pid) > 0
        drv.lock(child.pid, 5.0)
        assert drv.state(child.pid) == cp.ProcessState.LOCKED
        drv.checkpoint(child.pid)
        assert drv.state(child.pid) == cp.ProcessState.CHECKPOINTED
        assert cp.gpu_memory_of([child.pid]).get(child.pid, 0) == 0
        with pytest.raises(cp.IllegalState):
            drv.checkpoint(child.pid)  # not LOCKED: refused with 401, named
        drv.restore(child.pid)
        drv.unlock(child.pid)
        assert drv.state(child.pid) == cp.ProcessState.RUNNING
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "268435456.0"
    finally:
        child.kill()
        child.wait()


# -- through a real jupyter_server: transparent resume -----------------------------------------------


@pytest.fixture
def jp_server_config(gpu_pool):
    from traitlets.config import Config

    from jupyter_gpu_pool.server_extension.hibernation_hook import PoolHibernation

    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}},
                   "GPUPoolExtension": {"cull_interval": 0.5, "hibernator_class": PoolHibernation}})


@pytest.fixture
def ext_hook(jp_serverapp):
    return jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app.hibernator


async def until(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.1)


async def rest_kernel(jp_fetch, profile: str) -> str:
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": f"gpu-pool-{profile}"}))
    return json.loads(r.body)["id"]


async def ws_run(ws, code: str, timeout: float = 300) -> list[tuple[str, dict]]:
    msg_id = uuid.uuid4().hex
    await ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "u", "session": uuid.uuid4().hex,
                   "date": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    got, replied, idle = [], False, False
    deadline = time.monotonic() + timeout
    while not (replied and idle):
        msg = json.loads(await asyncio.wait_for(ws.read_message(), deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        got.append((msg["msg_type"], msg["content"]))
        replied = replied or msg["msg_type"] == "execute_reply"
        idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
    return got


async def test_a_cell_run_during_hibernation_completes_after_an_automatic_resume(jp_fetch, jp_ws_fetch, ext_hook):
    kid = await rest_kernel(jp_fetch, "soft10g")
    pid = ext_hook.extension.serverapp.kernel_manager.get_kernel(kid).provisioner.pid
    ws = await jp_ws_fetch("api", "kernels", kid, "channels")
    try:
        await ws_run(ws, "import torch\nx = torch.full((2**28,), 3.0, device='cuda')\ntorch.cuda.synchronize()")
        r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "release", method="POST", body="{}")
        assert json.loads(r.body)["action"] == "hibernate"
        ledger = ext_hook.hibernator.ledger
        await until(lambda: ledger.by_kernel(kid).state == "hibernated", 120)
        assert cp.gpu_memory_of([pid]).get(pid, 0) == 0

        got = await ws_run(ws, "print(float(x.sum()))")

        outputs = [c.get("text") or c.get("data", {}).get("text/plain", "") for k, c in got
                   if k in ("stream", "display_data")]
        assert any("Resuming this kernel" in o for o in outputs)
        assert "805306368.0\n" in outputs
        assert next(c for k, c in got if k == "execute_reply")["status"] == "ok"
        assert ledger.by_kernel(kid).state == "active" and cp.driver().state(pid) == cp.ProcessState.RUNNING
    finally:
        ws.close()
