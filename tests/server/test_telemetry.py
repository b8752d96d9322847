"""Per-kernel GPU telemetry: a kernel's process tree summed per GPU, bounded history, never invented readings."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from jupyter_gpu_pool.devices.telemetry import NVMLSource, ProcessReading, Sampler
from jupyter_gpu_pool.devices.processes import process_tree

GiB = 2**30


class TableSource:
    """Per-process readings from a table (NVML's answers on a machine that has none)."""

    def __init__(self, table: dict[str, dict[int, ProcessReading]]):
        self.table = table

    def available(self):
        return True, ""

    def read(self, gpu_uuids):
        return {u: dict(self.table[u]) for u in gpu_uuids if u in self.table}

    def device_utilization(self, gpu_uuids):
        return {u: 99.0 for u in gpu_uuids if u in self.table}


@pytest.fixture
def tree():
    """A real kernel-like process with a child (a dataloader worker, say)."""
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while len(process_tree(parent.pid)) < 2:
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    yield parent.pid, sorted(set(process_tree(parent.pid)) - {parent.pid})[0]
    for pid in process_tree(parent.pid):
        subprocess.run(["kill", "-9", str(pid)])
    parent.wait()


def test_a_kernels_reading_sums_its_process_tree(tree):
    kernel, child = tree
    stranger = 1  # another user's process on the same GPU does not count
    source = TableSource({
        "GPU-a": {kernel: ProcessReading(1 * GiB, 30.0), child: ProcessReading(2 * GiB, 50.0),
                  stranger: ProcessReading(5 * GiB, 90.0)},
        "GPU-b": {child: ProcessReading(GiB, 95.0)},
    })
    sampler = Sampler(source, thresholds=(5.0,))
    sampler.track({"k": (kernel, frozenset({"GPU-a"}))})
    sampler.sample_once()
    r = sampler.reading("k")
    assert (r.memory_used, r.utilization) == (3 * GiB, 80.0)
    sampler.track({"k": (kernel, frozenset({"GPU-a", "GPU-b"}))})  # two GPUs: memory adds, the busiest counts
    sampler.sample_once()
    r = sampler.reading("k")
    assert (r.memory_used, r.utilization) == (4 * GiB, 95.0)
    assert sampler.device_utilization("GPU-a") == 99.0
    source.table["GPU-a"][child] = ProcessReading(2 * GiB, 90.0)
    sampler.sample_once()
    assert sampler.reading("k").utilization == 100.0  # capped


def test_declared_gpus_and_unknown_memory_give_no_invented_reading(tree):
    kernel, child = tree
    sampler = Sampler(TableSource({"GPU-a": {kernel: ProcessReading(None, 10.0)}}))
    sampler.track({"declared": (kernel, frozenset({"DECLARED-local-0"})), "real": (kernel, frozenset({"GPU-a"}))})
    sampler.sample_once()
    assert sampler.reading("declared") is None and sampler.samples("declared") == []
    r = sampler.reading("real")
    assert r.memory_used is None and r.utilization == 10.0  # NVML would not say the memory: null, not 0


def test_history_is_bounded_and_gpu_idle_since_follows_the_threshold(tree):
    kernel, _ = tree
    clock = iter(range(1000, 2000)).__next__
    table = {"GPU-a": {kernel: ProcessReading(GiB, 60.0)}}
    sampler = Sampler(TableSource(table), thresholds=(5.0, 50.0), history=4, clock=lambda: float(clock()))
    sampler.track({"k": (kernel, frozenset({"GPU-a"}))})
    for _ in range(6):
        sampler.sample_once()
    assert [t for t, _ in sampler.samples("k")] == [1002.0, 1003.0, 1004.0, 1005.0]
    assert sampler.gpu_idle_since("k", 5.0) is None  # busy
    table["GPU-a"][kernel] = ProcessReading(GiB, 20.0)
    sampler.sample_once()  # t=1006
    assert sampler.gpu_idle_since("k", 50.0) == 1005.0  # under 50% since its last reading above
    assert sampler.gpu_idle_since("k", 5.0) is None
    assert sampler.last_gpu_activity("k", 5.0) == 1006.0
    table["GPU-a"][kernel] = ProcessReading(0, 0.0)
    sampler.sample_once()  # holds no memory: not "GPU idle", it holds nothing
    assert sampler.gpu_idle_since("k", 5.0) is None
    table["GPU-a"][kernel] = ProcessReading(GiB, 0.0)
    sampler.sample_once()  # t=1008, holds memory again, from now
    assert sampler.gpu_idle_since("k", 5.0) == 1008.0
    sampler.track({})
    assert sampler.reading("k") is None


def test_history_keeps_memory_and_each_gpus_utilization_for_the_dashboard(tree):
    kernel, _ = tree
    clock = iter(range(1000, 2000)).__next__
    table = {"GPU-a": {kernel: ProcessReading(GiB, 60.0)}}
    sampler = Sampler(TableSource(table), history=3, clock=lambda: float(clock()))
    sampler.track({"k": (kernel, frozenset({"GPU-a"}))})
    for memory in (1, 2, 3, 4):
        table["GPU-a"][kernel] = ProcessReading(memory * GiB, 10.0 * memory)
        sampler.sample_once()
    assert [(r.at, r.memory_used, r.utilization) for r in sampler.history("k")] == [
        (1001.0, 2 * GiB, 20.0), (1002.0, 3 * GiB, 30.0), (1003.0, 4 * GiB, 40.0)]
    assert sampler.samples("k") == [(1001.0, 20.0), (1002.0, 30.0), (1003.0, 40.0)]  # the sparkline's view
    assert sampler.device_history("GPU-a") == [(1001.0, 99.0), (1002.0, 99.0), (1003.0, 99.0)]  # bounded too
    assert sampler.device_history("GPU-unknown") == []


def test_readings_outlive_a_hibernation_and_the_kernels_end_for_the_dashboard(tree):
    kernel, _ = tree
    clock = iter(range(1000, 2000)).__next__
    table = {"GPU-a": {kernel: ProcessReading(GiB, 60.0)}}
    sampler = Sampler(TableSource(table), history=10, clock=lambda: float(clock()))
    sampler.track({"k": (kernel, frozenset({"GPU-a"}))})
    sampler.sample_once()
    sampler.sample_once()
    before = [(r.at, r.memory_used) for r in sampler.history("k")]
    assert before == [(1000.0, GiB), (1001.0, GiB)]
    sampler.track({"k": (kernel, frozenset())})  # hibernated: it holds no GPU, its readings stay
    sampler.sample_once()
    assert [(r.at, r.memory_used) for r in sampler.history("k")] == before and sampler.reading("k") is None
    sampler.track({})  # shut down: the plots still draw what it used
    assert [(r.at, r.memory_used) for r in sampler.history("k")] == before
    assert sampler.reading("k") is None and sampler.samples("k") == [(1000.0, 60.0), (1001.0, 60.0)]


def test_without_nvml_readings_are_none():
    source = NVMLSource()
    ok, why = source.available()
    if ok:
        pytest.skip("NVML works here; the gpu tests cover it")
    assert "NVML unavailable" in why
    assert source.read({"GPU-anything"}) == {}
    sampler = Sampler(source)
    sampler.track({"k": (1, frozenset({"GPU-anything"}))})
    sampler.sample_once()
    assert sampler.reading("k") is None


# -- on a real GPU ------------------------------------------------------------------------------

LOOP = """
import time, torch
x = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
end = time.time() + {seconds}
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
"""


@pytest.mark.gpu
async def test_nvml_reads_a_real_kernel_busy_then_idle():
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_gpu_pool.devices.nvml import discover

    gpus = discover().gpus
    assert gpus, "the gpu marker promised a GPU"
    source = NVMLSource()
    assert source.available()[0]
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        sampler = Sampler(source, thresholds=(5.0,))
        sampler.track({"k": (km.provisioner.pid, frozenset(g.uuid for g in gpus))})
        reply = await kc.execute_interactive("import torch; print(torch.cuda.is_available())", timeout=120)
        assert reply["content"]["status"] == "ok"
        kc.execute(LOOP.format(seconds=12))  # the cell runs while we sample
        busy = []
        for _ in range(40):
            await asyncio.sleep(0.5)
            await asyncio.to_thread(sampler.sample_once)
            r = sampler.reading("k")
            if r is not None:
                busy.append(r.utilization)
            if len(busy) >= 6 and max(busy[-4:]) >= 90:
                break
        r = sampler.reading("k")
        print("busy readings:", busy, "memory:", r.memory_used)
        assert r.memory_used is not None and r.memory_used >= 256 * 2**20  # the 256 MiB matrix and more
        assert max(busy) >= 90, busy  # near 100%
        await asyncio.sleep(13)  # the loop ends (it started at least 3 s ago); the tensor stays
        idle = []
        for _ in range(12):
            await asyncio.sleep(0.5)
            await asyncio.to_thread(sampler.sample_once)
            idle.append(sampler.reading("k").utilization)
        print("idle readings:", idle)
        assert max(idle[-6:]) <= 5, idle  # near 0%
        assert sampler.reading("k").memory_used >= 256 * 2**20
        assert sampler.gpu_idle_since("k", 5.0) is not None
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
