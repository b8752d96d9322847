"""The GPU pool on this machine: settings + inventory + ledger + MPS daemon.

One object that the provisioner, the server extension and the CLI share, so all three see the same
GPUs (detected or declared) and the same ledger, and take and give back slices the same way (with
this machine's process table judging who is alive).  Its blocking calls have async twins
(``a``-prefixed) that run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import dataclass

from traitlets.config import Config

from ..config import GPUPool, check_profiles_fit, load_settings
from ..devices.mps import MPSDaemon
from ..devices.nvml import Discovery, discover
from ..pool import GPU, Holder, Lease, LeaseRequest, Profile
from . import processes
from .ledger import Ledger


@dataclass(frozen=True)
class Inventory:
    gpus: list[GPU]
    discovery: Discovery
    note: str  # one line for humans: what was detected, what was declared

    @property
    def declared(self) -> bool:
        return bool(self.gpus) and all(g.declared for g in self.gpus)


def build_inventory(settings: GPUPool, discovery: Discovery | None = None) -> Inventory:
    """The pool's GPUs under the admin's ``gpu_discovery`` choice."""
    mode = settings.gpu_discovery
    if mode == "declared":
        found = Discovery(error="discovery is set to 'declared'")
    else:
        found = discovery if discovery is not None else discover()
    if mode == "nvml" or (mode == "auto" and found.gpus):
        if not found.gpus:
            return Inventory([], found, f"{found.summary}; GPUPool.gpu_discovery is 'nvml', so the pool is empty")
        return Inventory(found.gpus, found, found.summary)
    declared = settings.declared
    if declared:
        why = found.summary if mode == "auto" else "GPUPool.gpu_discovery is 'declared'"
        return Inventory(declared, found, f"{len(declared)} declared GPU(s) from the inventory ({why})")
    return Inventory([], found, f"{found.summary} and no GPU declared in GPUPool.inventory: the pool is empty")


class LocalPool:
    def __init__(self, settings: GPUPool, inventory: Inventory | None = None):
        self.settings = settings
        self.inventory = inventory or build_inventory(settings)
        check_profiles_fit(settings, self.inventory.gpus)
        self.ledger = Ledger(settings.ledger_path, holder_grace=settings.holder_grace)
        self.ledger.sync_gpus(self.inventory.gpus)
        self.mps = MPSDaemon(settings.mps_pipe_directory, settings.mps_log_directory)
        self.host = processes.hostname()

    @property
    def gpus(self) -> list[GPU]:
        return self.inventory.gpus

    def gpu(self, uuid: str) -> GPU | None:
        return next((g for g in self.inventory.gpus if g.uuid == uuid), None)

    # -- leases (blocking; see the async twins below) ---------------------------------------

    def request(self, kernel_id: str, profile: Profile, label: str = "", manager: Holder | None = None) -> LeaseRequest:
        owner = self.settings.owner
        return LeaseRequest(owner=owner, kernel_id=kernel_id, profile=profile,
                            groups=self.settings.groups_of(owner), label=label,
                            manager=manager or processes.identify())

    def allocate(self, request: LeaseRequest, waiter_id: str | None = None, record_refusal: bool = True) -> Lease:
        return self.ledger.allocate(request, self.settings.quotas, placement=self.settings.placement,
                                    is_alive=processes.is_alive, host=self.host, waiter_id=waiter_id,
                                    record_refusal=record_refusal, budgets=self.settings.budget_book)

    def resume(self, lease: Lease, same_gpu: bool = False, waiter_id: str | None = None,
               record_refusal: bool = True) -> Lease:
        """Take a slice again for a hibernated lease (its last GPU, else one of the same model;
        ``same_gpu``: its last GPU only)."""
        return self.ledger.resume(lease.id, self.settings.quotas, placement=self.settings.placement, same_model=True,
                                  same_gpu=same_gpu, waiter_id=waiter_id, profile=self.settings.profiles.get(lease.profile),
                                  is_alive=processes.is_alive, host=self.host, record_refusal=record_refusal,
                                  budgets=self.settings.budget_book)

    def reconcile(self) -> list[Lease]:
        return self.ledger.reconcile(processes.is_alive, host=self.host)

    async def aallocate(self, request: LeaseRequest, waiter_id: str | None = None) -> Lease:
        return await asyncio.to_thread(self.allocate, request, waiter_id)

    async def arelease(self, lease_id: str, reason: str) -> Lease | None:
        return await asyncio.to_thread(self.ledger.release, lease_id, reason)

    async def areconcile(self) -> list[Lease]:
        return await asyncio.to_thread(self.reconcile)


_cache: dict[str, LocalPool] = {}
_cache_lock = threading.Lock()


def _cache_key(parent_config: Config | None) -> str:
    from ..config import config_files

    files = [(str(p), p.stat().st_mtime) for p in config_files()]
    section = parent_config.get("GPUPool", {}) if parent_config is not None else {}
    env = {k: os.environ.get(k) for k in ("JUPYTER_CONFIG_DIR", "JUPYTER_CONFIG_PATH", "JUPYTERHUB_USER",
                                          "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR")}
    return json.dumps([files, repr(section), env], sort_keys=True, default=str)


def local_pool(parent_config: Config | None = None) -> LocalPool:
    """The pool for this process's configuration, built once (NVML discovery is not free)
    and rebuilt when a config file changes."""
    key = _cache_key(parent_config)
    with _cache_lock:
        pool = _cache.get(key)
        if pool is None:
            pool = LocalPool(load_settings(parent_config))
            _cache.clear()
            _cache[key] = pool
        return pool
