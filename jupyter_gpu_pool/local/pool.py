"""The GPU pool on this machine: settings + inventory + ledger + MPS daemon.

One object that the provisioner, the server extension and the CLI share, so all three see the same
GPUs (detected or declared) and the same ledger, and take and give back slices the same way (with
this machine's process table judging who is alive).  Its blocking calls have async twins
(``a``-prefixed) that run in a thread.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..config import GPUPool, check_profiles_fit
from ..devices.mps import MPSDaemon
from ..devices.nvml import Discovery, discover
from ..pool import GPU, Holder, Lease, LeaseRequest, Profile
from ..pool.reclaim import Candidate, reserved_for
from . import processes
from .ledger import Ledger
from .store import LeaseStore


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


class Pool(ABC):
    """What the provisioner, the server extension and the CLI use of "the pool on this machine", alike
    whether this process keeps the ledger itself (:class:`LocalPool`) or asks the pool service
    (``service.client.ServicePool``): ``settings``, ``inventory``, ``ledger``, ``host``."""

    settings: GPUPool
    inventory: Inventory
    ledger: LeaseStore
    host: str
    # Whether the caller administers the pool, where the pool decides (the service knows its callers);
    # None: the pool has no say (one user's own ledger), the server's own settings decide.
    admin: bool | None = None

    @property
    def gpus(self) -> list[GPU]:
        return self.inventory.gpus

    def gpu(self, uuid: str) -> GPU | None:
        return next((g for g in self.inventory.gpus if g.uuid == uuid), None)

    def groups_of(self, user: str) -> tuple[str, ...]:
        """``user``'s groups, as quotas, budgets and the policy count them."""
        return self.settings.groups_of(user)

    def request(self, kernel_id: str, profile: Profile, label: str = "", manager: Holder | None = None) -> LeaseRequest:
        owner = self.settings.owner
        return LeaseRequest(owner=owner, kernel_id=kernel_id, profile=profile, groups=self.groups_of(owner),
                            label=label, manager=manager or processes.identify())

    @abstractmethod
    def allocate(self, request: LeaseRequest, waiter_id: str | None = None, record_refusal: bool = True) -> Lease:
        """Take a slice for a kernel, or raise the pool's refusal (``waiter_id``: its place in the queue)."""

    @abstractmethod
    def start_without_slice(self, request: LeaseRequest) -> Lease:
        """Record a kernel that holds no slice until its first cell (a lease in state hibernated, reason
        ``first_cell``), or raise the refusal of a quota's kernel count."""

    @abstractmethod
    def resume(self, lease: Lease, same_gpu: bool = False, waiter_id: str | None = None,
               record_refusal: bool = True) -> Lease:
        """Take a slice again for a hibernated lease (its last GPU, else one of the same model;
        ``same_gpu``: its last GPU only)."""

    @abstractmethod
    def reconcile(self) -> list[Lease]:
        """Release the leases whose holders are gone; return them."""

    @abstractmethod
    def mps_env(self, lease: Lease) -> dict[str, str]:
        """The MPS environment of a kernel on ``lease`` (its GPU's control daemon started if it is real)."""

    @abstractmethod
    def reserved(self, candidates: list[Candidate], freeing: tuple[str, ...] = (),
                 warned: tuple[str, ...] = ()) -> dict[str, str]:
        """Of the caller's ``candidates`` (its idle kernels), those to give back room the admin's reservations
        keep now, each with why in words (``pool.reclaim.reserved_for``, on the whole pool: members' use,
        the queue); ``freeing``: its kernels on their way out, ``warned``: those it warned for a reservation."""

    async def aallocate(self, request: LeaseRequest, waiter_id: str | None = None) -> Lease:
        return await asyncio.to_thread(self.allocate, request, waiter_id)

    async def arelease(self, lease_id: str, reason: str) -> Lease | None:
        return await asyncio.to_thread(self.ledger.release, lease_id, reason)

    async def areconcile(self) -> list[Lease]:
        return await asyncio.to_thread(self.reconcile)


class LocalPool(Pool):
    """The pool kept by this process: the ledger file, this machine's processes, its MPS daemons."""

    def __init__(self, settings: GPUPool, inventory: Inventory | None = None, *, ledger_mode: int | None = None):
        self.settings = settings
        self.inventory = inventory or build_inventory(settings)
        check_profiles_fit(settings, self.inventory.gpus)
        self.ledger = Ledger(settings.ledger_path, holder_grace=settings.holder_grace, mode=ledger_mode,
                             sharing=settings.sharing)
        self.ledger.sync_gpus(self.inventory.gpus)
        self.host = processes.hostname()

    def allocate(self, request: LeaseRequest, waiter_id: str | None = None, record_refusal: bool = True) -> Lease:
        return self.ledger.allocate(request, self.settings.quotas, placement=self.settings.placement,
                                    is_alive=processes.is_alive, host=self.host, waiter_id=waiter_id,
                                    record_refusal=record_refusal, budgets=self.settings.budget_book)

    def start_without_slice(self, request: LeaseRequest) -> Lease:
        return self.ledger.start_without_slice(request, self.settings.quotas, host=self.host)

    def resume(self, lease: Lease, same_gpu: bool = False, waiter_id: str | None = None,
               record_refusal: bool = True) -> Lease:
        return self.ledger.resume(lease.id, self.settings.quotas, placement=self.settings.placement, same_model=True,
                                  same_gpu=same_gpu, waiter_id=waiter_id, profile=self.settings.profiles.get(lease.profile),
                                  is_alive=processes.is_alive, host=self.host, record_refusal=record_refusal,
                                  budgets=self.settings.budget_book)

    def reconcile(self) -> list[Lease]:
        return self.ledger.reconcile(processes.is_alive, host=self.host)

    def reserved(self, candidates: list[Candidate], freeing: tuple[str, ...] = (),
                 warned: tuple[str, ...] = ()) -> dict[str, str]:
        sharing = self.settings.sharing
        if not candidates or not sharing.needs_everyone(self.ledger.clock()):
            return {}
        snap = self.ledger.snapshot()
        return reserved_for(sharing, snap.gpus, snap.leases, snap.waiters, candidates, snap.at, freeing=freeing,
                            warned=warned, placement=self.settings.placement)

    def mps_daemon(self, gpu_uuid: str) -> MPSDaemon:
        """The MPS control daemon of one GPU (one per GPU: an MPS server serves one user at a time)."""
        s = self.settings
        return MPSDaemon.of_gpu(gpu_uuid, os.path.join(s.mps_log_directory, gpu_uuid), s.mps_pipe_directory)

    def mps_env(self, lease: Lease) -> dict[str, str]:
        [uuid] = lease.gpus[:1] or lease.last_gpus[:1]
        daemon = self.mps_daemon(uuid)
        gpu = self.gpu(uuid)
        if gpu is not None and not gpu.declared:
            daemon.start()
        return daemon.env()

    def stop_mps(self) -> list[str]:
        """Stop every GPU's MPS daemon that runs; return the GPUs whose daemon was stopped."""
        return [g.uuid for g in self.gpus if self.mps_daemon(g.uuid).stop()]
