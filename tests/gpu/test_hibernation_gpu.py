"""Hibernation on a real GPU, with real kernels (a GPU machine: docs/gpu-testing.md; all of them at once:
``scripts/gpu-check``):

    python3 -m pytest -m gpu -v tests/gpu/test_hibernation_gpu.py

Each test configures a pool of the DETECTED GPUs, starts real kernels through the gpu-pool
provisioner and uses PyTorch inside them.  The hibernator runs with the real CUDA driver
(``devices.checkpoint.CudaCheckpoint``) and real NVML; nothing is stood in.  Figures each test
measures are recorded as junit properties (``record_property``), which ``scripts/gpu-check`` puts in
its report.  Sizes are kept to a few GiB so that the tests fit their step of scripts/gpu-check on one H100;
the benchmark (benchmarks/hibernation.py) goes to 32 GiB.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from dataclasses import replace

import psutil
import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from kernel_helpers import run_code, start_answering, wait_until

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.devices.nvml import NVMLMemory, discover

pytestmark = pytest.mark.gpu

GiB = 2**30
NVML = NVMLMemory()
HIBERNATE_ON_RELEASE = [{"name": "hibernate-on-release", "idle_timeout": None, "gpu_idle_timeout": None,
                         "max_hibernated": None, "action": "hibernate"}]


def gpu():
    return discover().gpus[0]


def held(pid: int) -> int:
    """NVML's figure for the process (0 when it lists none)."""
    return (NVML.of_processes([pid]) or {}).get(pid, 0)


@pytest.fixture
def gpu_pool(pool_home):
    """A pool of the detected GPUs: a 'big' soft slice of 3/4 of a GPU, a small soft one, a whole GPU,
    an MPS one."""
    big = int(gpu().memory * 0.75) // GiB
    pool_home.configure(
        gpu_discovery="nvml", inventory=[], unix_groups=False, policy=HIBERNATE_ON_RELEASE,
        hibernation_host_memory="none", hibernation_lock_timeout=3.0,
        profiles={"big": {"slice": f"{big}GiB", "isolation": "soft"},
                  "soft10g": {"slice": "10GiB", "isolation": "soft"},
                  "whole": {"slice": "whole"},
                  "mps8": {"slice": "8GiB,25%", "isolation": "mps"}},
    )
    pool_home.install_kernelspecs()
    yield pool_home
    pool_home.pool().stop_mps()  # the pool's own daemons: leave the card as we found it


@pytest.fixture
async def kernels(gpu_pool, tmp_path):
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path))
    yield manager
    await manager.shutdown_all(now=True)


def make_hibernator(kernels, **settings):
    from jupyter_gpu_pool.hibernation import Hibernator, Kernels
    from jupyter_gpu_pool.pools import pool_for

    pool = pool_for()
    return Hibernator(pool, Kernels(kernels), replace(pool.settings.hibernation, queue_poll=0.5, **settings))


@pytest.fixture
def hibernator(kernels):
    return make_hibernator(kernels)


async def start(kernels, profile: str) -> tuple[str, int]:
    return await start_answering(kernels, f"gpu-pool-{profile}")


def tensors(gib: int) -> str:
    return f"import torch\ntorch.manual_seed(0)\nx = torch.randn({gib} * 2**30 // 4, device='cuda')\ntorch.cuda.synchronize()"


CHECKSUM = "print(repr(sum(float(c.sum()) for c in x.split(2**27))))"


async def holding(kernels, profile: str, gib: int) -> tuple[str, int, str]:
    """A kernel on ``profile`` whose ``x`` holds ``gib`` GiB on the GPU; with its checksum."""
    kid, pid = await start(kernels, profile)
    km = kernels.get_kernel(kid)
    await run_code(km, tensors(gib), timeout=300)
    return kid, pid, await run_code(km, CHECKSUM, timeout=300)


def host_available() -> int:
    return psutil.virtual_memory().available


# -- the round trip --------------------------------------------------------------------------------


async def test_a_kernel_holding_gibs_hibernates_frees_its_gpu_memory_for_another_and_resumes_intact(
        kernels, hibernator, record_property):
    hold = 8
    kid, pid, before = await holding(kernels, "big", hold)
    km = kernels.get_kernel(kid)
    assert held(pid) >= hold * GiB

    out = await hibernator.hibernate(kid, "idle")

    record_property("hibernate_s", round(out.duration, 2))
    record_property("moved_gib", round(out.bytes / GiB, 2))
    assert pid in out.pids and out.bytes >= hold * GiB and not out.declared
    assert cp.driver().state(pid) == cp.ProcessState.CHECKPOINTED
    assert held(pid) == 0  # NVML shows none of its memory on the GPU
    assert "True" in await run_code(km, "print('x' in dir())")  # CPU-only code still runs

    other, _ = await start(kernels, "whole")  # the slice it gave back, and the rest of the GPU
    got = await run_code(kernels.get_kernel(other), "\n".join([
        "import torch", "free, total = torch.cuda.mem_get_info()",
        "y = torch.empty(free - 2**30, dtype=torch.uint8, device='cuda')",
        "print('allocated', y.numel() / total)"]), timeout=300)
    assert float(got.split("allocated")[1]) > 1 - hold * GiB / gpu().memory  # only with the first kernel's memory out
    await kernels.shutdown_kernel(other, now=True)

    back = await hibernator.resume(kid)  # safe wake waits, if need be, for the killed kernel's memory to go

    record_property("resume_s", round(back.duration, 2))
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING
    assert await run_code(km, CHECKSUM, timeout=300) == before  # every value intact
    assert held(pid) >= hold * GiB


@pytest.mark.parametrize("release", [True, False], ids=["cache-released", "cache-kept"])
async def test_the_cache_release_shrinks_what_moves(kernels, release, record_property):
    """1 GiB held and 4 GiB freed-but-cached by PyTorch: about 1 GiB moves with the release, 5 without."""
    hibernator = make_hibernator(kernels, release_cache=release)
    kid, pid = await start(kernels, "big")
    km = kernels.get_kernel(kid)
    await run_code(km, "import torch\nx = torch.ones(2**28, device='cuda')\n"
                       "junk = torch.empty(4 * 2**30, dtype=torch.uint8, device='cuda')\ndel junk")
    assert held(pid) >= 5 * GiB  # freed by the user, still reserved by PyTorch
    out = await hibernator.hibernate(kid)
    record_property("moved_gib", round(out.bytes / GiB, 2))
    record_property("hibernate_s", round(out.duration, 2))
    if release:
        assert out.bytes < 2 * GiB, f"{out.bytes / GiB:.1f} GiB moved: the cache was not emptied"
    else:
        assert out.bytes >= 5 * GiB, f"{out.bytes / GiB:.1f} GiB moved with the cache kept"
    await hibernator.resume(kid)
    assert "268435456.0" in await run_code(km, "print(float(x.sum()))")


# -- refusals -------------------------------------------------------------------------------------------


async def test_gpu_work_in_flight_past_the_lock_timeout_leaves_the_kernel_running_untouched(kernels, hibernator):
    """Idle per Jupyter, but a background thread's GPU kernel runs 12 s: the lock gives up after 3 s."""
    kid, pid = await start(kernels, "soft10g")
    km = kernels.get_kernel(kid)
    await run_code(km, "\n".join([
        "import torch, threading, time",
        "torch.cuda._sleep(1); torch.cuda.synchronize()",
        "t = time.time(); torch.cuda._sleep(int(2e8)); torch.cuda.synchronize(); per_s = 2e8 / (time.time() - t)",
        "done = []",
        "def work():",
        "    torch.cuda._sleep(int(12 * per_s)); torch.cuda.synchronize(); done.append(time.time())",
        "worker = threading.Thread(target=work); worker.start()",
    ]), timeout=120)
    from jupyter_gpu_pool.hibernation import HibernationRefused

    started = time.monotonic()
    with pytest.raises(HibernationRefused) as err:
        await hibernator.hibernate(kid)
    assert err.value.reason == "gpu_busy" and err.value.keep_running, err.value.message
    assert time.monotonic() - started < 10  # it gave up, it did not wait for the work
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING
    assert hibernator.ledger.by_kernel(kid).state == "active"
    assert "True" in await run_code(km, "worker.join(); print(len(done) == 1)", timeout=120)
    assert (await hibernator.hibernate(kid)).action == "hibernated"  # quiet now
    await hibernator.resume(kid)


def test_the_real_lock_timeout_returns_a_code_the_binding_calls_a_timeout(record_property):
    """cuCheckpointProcessLock on a process whose GPU kernel outlasts the timeout (cuda.h: the lock
    waits for submitted work): the binding must see LockTimeout, and leave the process running."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import torch, sys\ntorch.cuda._sleep(1); torch.cuda.synchronize()\n"
                               "print('ready', flush=True)\ntorch.cuda._sleep(int(2e10))\n"
                               "torch.cuda.synchronize()\nprint('done', flush=True)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        drv = cp.driver()
        started = time.monotonic()
        try:
            drv.lock(child.pid, 1.0)
        except cp.CheckpointError as e:
            record_property("lock_timeout_code", e.code)
            assert isinstance(e, cp.LockTimeout), f"the real driver answered {e}"
        else:
            drv.unlock(child.pid)
            pytest.fail("the lock did not wait for the GPU work in flight")
        record_property("lock_gave_up_after_s", round(time.monotonic() - started, 2))
        assert drv.state(child.pid) == cp.ProcessState.RUNNING
    finally:
        child.kill()
        child.wait()


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
        assert held(child.pid) == 0
        with pytest.raises(cp.IllegalState):
            drv.checkpoint(child.pid)  # not LOCKED: refused with 401, named
        drv.restore(child.pid)
        drv.unlock(child.pid)
        assert drv.state(child.pid) == cp.ProcessState.RUNNING and drv.restored(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "268435456.0"
    finally:
        child.kill()
        child.wait()


# -- safe wake ------------------------------------------------------------------------------------------

FILLER = """
import sys, torch
free, total = torch.cuda.mem_get_info()
y = torch.empty(free - int(sys.argv[1]), dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
print('filled', flush=True)
sys.stdin.readline()
"""


async def test_a_resume_waits_while_another_process_fills_the_gpu_and_restores_once_it_has_gone(
        kernels, hibernator, record_property):
    hold = 2
    kid, pid, before = await holding(kernels, "soft10g", hold)
    await hibernator.hibernate(kid)
    # Another process (no slice: soft slices are not enforced) takes all but 2 GiB: less than 2 GiB + 1 GiB.
    filler = subprocess.Popen([sys.executable, "-c", FILLER, str(2 * GiB)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert filler.stdout.readline().strip() == "filled"
        uuid_ = hibernator.ledger.by_kernel(kid).last_gpus[0]
        assert NVML.free(uuid_) < (hold + 1) * GiB

        task = hibernator.start_resume(kid)
        reason = await wait_until(lambda: hibernator.queue_reason(kid), timeout=60, what="a reason to wait")
        assert reason.startswith("waiting for ") and "of GPU memory to be free on GPU" in reason
        await asyncio.sleep(3)  # several tries of the queue
        assert not task.done() and cp.driver().state(pid) == cp.ProcessState.CHECKPOINTED
        assert hibernator.ledger.by_kernel(kid).phase == "queued"
    finally:
        filler.kill()
        filler.wait()
    out = await asyncio.wait_for(task, 120)
    record_property("waited_s", round(out.waited, 2))
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING
    assert await run_code(kernels.get_kernel(kid), CHECKSUM, timeout=300) == before


# -- shutting down hibernated and just-resumed kernels ------------------------------------------------


@pytest.mark.parametrize("now", [False, True], ids=["shutdown", "kill"])
@pytest.mark.parametrize("resumed", [False, True], ids=["hibernated", "just-resumed"])
async def test_shutting_down_a_hibernated_or_just_resumed_kernel_frees_gpu_and_host_memory(
        kernels, hibernator, resumed, now, record_property):
    hold = 2
    kid, pid, _ = await holding(kernels, "soft10g", hold)
    uuid_ = hibernator.ledger.by_kernel(kid).gpus[0]
    ram_before = host_available()
    await hibernator.hibernate(kid)
    if resumed:
        await hibernator.resume(kid)
    else:
        assert host_available() < ram_before - (hold - 1) * GiB  # the checkpoint is in host RAM

    started = time.monotonic()
    await asyncio.wait_for(kernels.shutdown_kernel(kid, now=now), 120)  # never hangs
    record_property("shutdown_s", round(time.monotonic() - started, 2))

    assert not psutil.pid_exists(pid) and held(pid) == 0
    await wait_until(lambda: host_available() > ram_before - GiB, timeout=30, what="the host RAM back")
    await wait_until(lambda: NVML.free(uuid_) > gpu().memory - 2 * GiB, timeout=30, what="the GPU memory back")
    assert hibernator.ledger.by_kernel(kid) is None  # the lease was released


# -- concurrency ---------------------------------------------------------------------------------------


async def test_two_kernels_hibernated_at_once_end_consistent(kernels, hibernator):
    (a, pa, ca), (b, pb, cb) = await asyncio.gather(holding(kernels, "soft10g", 3), holding(kernels, "soft10g", 4))

    outs = await asyncio.gather(hibernator.hibernate(a), hibernator.hibernate(b))

    assert outs[0].bytes >= 3 * GiB and outs[1].bytes >= 4 * GiB
    assert (held(pa), held(pb)) == (0, 0)
    assert {hibernator.ledger.by_kernel(k).state for k in (a, b)} == {"hibernated"}
    await asyncio.gather(hibernator.resume(a), hibernator.resume(b))
    assert held(pa) >= 3 * GiB and held(pb) >= 4 * GiB
    assert hibernator.ledger.overcommitted() == []
    assert await run_code(kernels.get_kernel(a), CHECKSUM, timeout=300) == ca
    assert await run_code(kernels.get_kernel(b), CHECKSUM, timeout=300) == cb


async def test_a_resume_racing_a_new_kernel_for_the_same_gpu_ends_consistent(kernels, hibernator):
    kid, pid, before = await holding(kernels, "whole", 4)
    await hibernator.hibernate(kid)

    resume = hibernator.start_resume(kid)
    newcomer = asyncio.ensure_future(kernels.start_kernel(kernel_name="gpu-pool-whole"))
    await wait_until(lambda: newcomer.done() and (resume.done() or hibernator.shown(kid) == "queued"),
                     timeout=120, what="the race decided")

    assert hibernator.ledger.overcommitted() == []
    if not resume.done():  # the newcomer won the GPU: the resume waits, its memory still in host RAM
        other = newcomer.result()
        assert cp.driver().state(pid) == cp.ProcessState.CHECKPOINTED
        await kernels.shutdown_kernel(other, now=True)
    else:
        assert newcomer.exception() is not None  # the GPU was the resumed kernel's again
    await asyncio.wait_for(resume, 120)
    assert cp.driver().state(pid) == cp.ProcessState.RUNNING and held(pid) >= 4 * GiB
    assert await run_code(kernels.get_kernel(kid), CHECKSUM, timeout=300) == before


# -- through a real jupyter_server ------------------------------------------------------------------------


@pytest.fixture
def jp_server_config(gpu_pool):
    from traitlets.config import Config

    from jupyter_gpu_pool.server_extension.sleep.hook import PoolHibernation

    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}},
                   "GPUPoolExtension": {"cull_interval": 0.5, "hibernator_class": PoolHibernation}})


@pytest.fixture
def ext_hook(jp_serverapp):
    return jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app.hibernator


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
                                "n = 0\nwhile time.time() - t < 8:\n    y = x @ x\n    n += 1\n"
                                "torch.cuda.synchronize()\nprint('loops', n)")
        await wait_until(lambda: km.get_kernel(kid).execution_state == "busy", 60, what="busy")
        # Inside the loop: the kernel holds GPU memory.  (Before it has used CUDA, importing torch, the
        # driver answers CUDA_ERROR_NOT_INITIALIZED for its state: what the first H100 run met 3 s in.)
        await wait_until(lambda: held(pid) > 0, 60, what="the GPU loop running")
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


async def test_a_cell_run_during_hibernation_completes_after_an_automatic_resume(jp_fetch, jp_ws_fetch, ext_hook):
    kid = await rest_kernel(jp_fetch, "soft10g")
    pid = ext_hook.extension.serverapp.kernel_manager.get_kernel(kid).provisioner.pid
    ws = await jp_ws_fetch("api", "kernels", kid, "channels")
    try:
        await ws_run(ws, "import torch\nx = torch.full((2**28,), 3.0, device='cuda')\ntorch.cuda.synchronize()")
        r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "release", method="POST", body="{}")
        assert json.loads(r.body)["action"] == "hibernate"
        ledger = ext_hook.hibernator.ledger
        await wait_until(lambda: ledger.by_kernel(kid).state == "hibernated", 120, what="hibernated")
        assert held(pid) == 0

        got = await ws_run(ws, "print(float(x.sum()))")

        outputs = [c.get("text") or c.get("data", {}).get("text/plain", "") for k, c in got
                   if k in ("stream", "display_data")]
        assert any("Resuming this kernel" in o for o in outputs)
        assert "805306368.0\n" in outputs
        assert next(c for k, c in got if k == "execute_reply")["status"] == "ok"
        assert ledger.by_kernel(kid).state == "active" and cp.driver().state(pid) == cp.ProcessState.RUNNING
    finally:
        ws.close()
