"""A hibernation on a shared box: the user's own server checkpoints its kernel, the service records it,
and on a real GPU gives the slice back only once NVML shows that none of the user's processes holds
memory there beyond their other kernels (a client cannot just say "hibernated", nor name a decoy
process as its kernel and keep the GPU busy with the real one).  NVML may lag a moment behind a
checkpoint: the service asks again for up to ``gpu_settle`` seconds before it refuses.

Without a GPU here, NVML's answer is the one part given to the service (its ``gpu_processes`` seam);
the processes, their users, the ledger and the service's requests are real.  The GPU test at the end
runs the same rule on NVML itself."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest
from service_helpers import identity

from jupyter_gpu_pool.config import GPUPool
from jupyter_gpu_pool.devices.nvml import Discovery, discover
from jupyter_gpu_pool.local.pool import Inventory, LocalPool
from jupyter_gpu_pool.pool import GPU
from jupyter_gpu_pool.service.identity import Identities, Peer
from jupyter_gpu_pool.service.server import PoolService

GiB = 2**30
REAL = GPU("GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H100", 80 * GiB)  # detected, not declared


class Box:
    """A service on a pool whose GPU is a real (detected) one, NVML's readings as the test sets them."""

    def __init__(self, tmp_path, gpus: list[GPU], readings=None, settle: float = 1.0):
        from traitlets.config import Config

        settings = GPUPool(config=Config({"GPUPool": {
            "ledger_path": str(tmp_path / "ledger.sqlite"), "gpu_discovery": "declared",
            "profiles": {"small": {"slice": "10GiB", "isolation": "soft"}}, "default_user_quota": {"kernels": 4}}}))
        self.pool = LocalPool(settings.check(), Inventory(gpus, Discovery(gpus=gpus), "test GPUs"))
        self.readings = readings  # NVML's answer: a dict, or a function of nothing that gives one
        self.asked = 0
        self.service = PoolService(self.pool, Identities(user_prefix="jupyter-"), gpu_settle=settle,
                                   gpu_processes=self.nvml if readings is not None else None)
        self.children: list[subprocess.Popen] = []

    def nvml(self, uuids):
        self.asked += 1
        return self.readings() if callable(self.readings) else self.readings

    def dump(self) -> list[str]:
        with sqlite3.connect(f"file:{self.pool.ledger.path}?mode=ro", uri=True) as db:
            return list(db.iterdump())

    def process(self, name: str | None) -> subprocess.Popen:
        """A real process of the user (root where ``name`` is None) that lives until the test ends."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 **(identity(name) if name else {}))
        self.children.append(child)
        return child

    def ask(self, peer_process: subprocess.Popen, op: str, **args) -> dict:
        """One request, as the service gets it from ``peer_process`` (its uid, as SO_PEERCRED tells)."""
        peer = Peer(pid=peer_process.pid, uid=psutil.Process(peer_process.pid).uids().real, gid=0)
        caller = self.service.identities.caller(peer)
        line = json.dumps({"id": 1, "op": op, "args": args}).encode() + b"\n"
        return asyncio.run(self.service.handle(caller, peer, line))

    def close(self) -> None:
        for child in self.children:
            child.kill()
            child.wait()
        self.pool.ledger.close()


@pytest.fixture
def box(tmp_path, unix_users):
    made = []

    def make(gpus=(REAL,), readings=None, settle: float = 1.0) -> Box:
        made.append(Box(tmp_path, list(gpus), readings, settle))
        return made[-1]

    yield make
    for b in made:
        b.close()


def _kernel(box: Box, server: subprocess.Popen, kernel: subprocess.Popen, kernel_id: str) -> str:
    """A lease taken by ``server`` (its user's server), held by ``kernel``."""
    lease = box.ask(server, "allocate", kernel_id=kernel_id, profile="small")
    assert lease["ok"], lease
    held = box.ask(server, "set_holder", lease_id=lease["result"].id, pid=kernel.pid)
    assert held["ok"], held
    return lease["result"].id


def test_a_kernel_that_still_holds_gpu_memory_keeps_its_slice(box):
    b = box(readings={})
    server, kernel = b.process("alice"), b.process("alice")
    lease_id = _kernel(b, server, kernel, "k-alice-1")
    b.readings = {REAL.uuid: {kernel.pid: 3 * GiB}}
    before = b.dump()
    started = time.monotonic()
    refused = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=3 * GiB)
    waited = time.monotonic() - started
    assert refused["error"]["reason"] == "gpu_memory_held" and refused["error"]["status"] == 409
    message = refused["error"]["message"]
    assert "still shows the kernel's user holding 3072 MiB" in message and f"{kernel.pid} (3072 MiB)" in message
    assert 1.0 <= waited < 5 and b.asked > 2  # NVML asked again for the settle time (1 s here), then refused
    assert b.dump() == before  # nothing changed in the ledger
    assert b.pool.ledger.get(lease_id).state == "active" and b.pool.ledger.get(lease_id).gpus == (REAL.uuid,)
    b.readings = {REAL.uuid: {}}  # checkpointed: NVML lists nothing of it
    granted = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=3 * GiB)
    assert granted["ok"] and granted["result"].state == "hibernated" and granted["result"].gpus == ()


def test_naming_a_decoy_process_as_the_kernel_does_not_free_the_slice(box):
    b = box(readings={})
    server, kernel, decoy = b.process("alice"), b.process("alice"), b.process("alice")
    lease_id = _kernel(b, server, kernel, "k-alice-1")
    assert b.ask(server, "set_holder", lease_id=lease_id, pid=decoy.pid)["ok"]  # "this idle one is my kernel"
    b.readings = {REAL.uuid: {kernel.pid: 5 * GiB}}  # while the real one keeps its memory
    refused = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=0)
    assert refused["error"]["reason"] == "gpu_memory_held" and "holding 5120 MiB" in refused["error"]["message"]
    assert b.pool.ledger.get(lease_id).state == "active"


def test_memory_that_nvml_still_shows_a_moment_after_the_checkpoint_is_waited_for(box):
    """NVML lags behind the driver: right after a checkpoint it may still list the kernel's memory.  The
    service asks again, and frees the slice once the memory is gone (the hibernation is not failed)."""
    b = box(readings={}, settle=3.0)
    server, kernel = b.process("alice"), b.process("alice")
    lease_id = _kernel(b, server, kernel, "k-alice-1")
    gone_at = time.monotonic() + 0.6
    b.readings = lambda: {REAL.uuid: {kernel.pid: 3 * GiB}} if time.monotonic() < gone_at else {REAL.uuid: {}}
    granted = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=3 * GiB)
    assert granted["ok"], granted
    assert time.monotonic() >= gone_at and b.asked >= 2  # it waited, and asked more than once
    assert granted["result"].state == "hibernated" and granted["result"].gpus == ()
    assert b.pool.ledger.get(lease_id).host_bytes == 3 * GiB


def test_memory_of_the_users_other_kernels_and_of_other_users_does_not_count(box):
    b = box(readings={})
    server, first, second = b.process("alice"), b.process("alice"), b.process("alice")
    bobs_server, bobs_kernel = b.process("bob"), b.process("bob")
    lease_id = _kernel(b, server, first, "k-alice-1")
    _kernel(b, server, second, "k-alice-2")
    _kernel(b, bobs_server, bobs_kernel, "k-bob-1")
    b.readings = {REAL.uuid: {second.pid: 8 * GiB, bobs_kernel.pid: 9 * GiB}}
    granted = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=0)
    assert granted["ok"] and granted["result"].state == "hibernated"


def test_where_nvml_cannot_say_the_slice_stays_held(box):
    b = box()  # no readings given: the service asks NVML, which this machine lacks (or says nothing of the GPU)
    server, kernel = b.process("alice"), b.process("alice")
    lease_id = _kernel(b, server, kernel, "k-alice-1")
    refused = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=0)
    assert refused["error"]["reason"] == "gpu_unreadable" and "NVML cannot say" in refused["error"]["message"]
    assert b.pool.ledger.get(lease_id).state == "active"


@pytest.mark.gpu
def test_on_a_real_gpu_the_slice_goes_back_only_once_nvml_shows_the_memory_gone(tmp_path):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU here (nvidia-smi not found)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    from jupyter_gpu_pool.devices import checkpoint as cp

    found = discover()
    assert found.gpus, found.error
    b = Box(tmp_path, found.gpus[:1], settle=3.0)  # NVML itself decides
    try:
        server = b.process(None)
        kernel = subprocess.Popen([sys.executable, "-c", "import torch, sys\nx = torch.ones(2**28, device='cuda')\n"
                                   "torch.cuda.synchronize()\nprint('ready', flush=True)\nsys.stdin.readline()"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "CUDA_VISIBLE_DEVICES": found.gpus[0].uuid})
        b.children.append(kernel)
        assert kernel.stdout.readline().strip() == "ready"
        lease_id = _kernel(b, server, kernel, "k-root-1")
        refused = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=GiB)
        assert refused["error"]["reason"] == "gpu_memory_held" and "still shows" in refused["error"]["message"]
        drv = cp.driver()
        drv.lock(kernel.pid, 10.0)
        drv.checkpoint(kernel.pid)
        granted = b.ask(server, "hibernate", lease_id=lease_id, host_bytes=GiB)
        assert granted["ok"] and granted["result"].state == "hibernated", granted
        drv.restore(kernel.pid)
        drv.unlock(kernel.pid)
    finally:
        b.close()
