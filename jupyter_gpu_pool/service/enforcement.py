"""What the pool service enforces on its own authority, beyond answering requests: the GPU-hour budget
(a kernel still active ``budget_grace`` seconds after its owner's budget ran out is ended, its process
proven first: ``kernels.py``), and a hibernation's freed GPU memory (NVML must show it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psutil

from ..devices.processes import process_tree
from ..local.pool import LocalPool
from ..pool import ACTIVE, Lease
from . import kernels
from .identity import Identities
from .turns import Turns

log = logging.getLogger(__name__)

# Per GPU uuid, per pid, the device memory NVML shows the process holding (None: it would not say);
# None where NVML cannot be read at all.
GPUProcesses = Callable[[set[str]], "dict[str, dict[int, int | None]] | None"]


class GPUMemoryHeld(RuntimeError):
    """A hibernation the service will not record: NVML still shows the kernel's user holding GPU memory."""

    reason, status = "gpu_memory_held", 409


class GPUUnreadable(RuntimeError):
    """A hibernation the service cannot check: NVML does not say what the kernel holds."""

    reason, status = "gpu_unreadable", 503


class Enforcement:
    """The budget's and the GPU memory's checks of one service."""

    def __init__(self, pool: LocalPool, identities: Identities, turns: Turns, *, budget_grace: float = 300.0,
                 gpu_processes: GPUProcesses | None = None, gpu_settle: float = 3.0):
        self.pool, self.ledger, self.identities, self.turns = pool, pool.ledger, identities, turns
        self.budget_grace = budget_grace
        self._gpu_processes = gpu_processes or _nvml_processes
        self.gpu_settle = gpu_settle  # seconds NVML may lag behind a checkpoint before a hibernation is refused
        self._spent_since: dict[str, float] = {}  # lease id -> when its owner's budget was first seen spent

    async def budgets(self) -> list[Lease]:
        """End the kernels still active ``budget_grace`` seconds after their owner's GPU-hour budget ran
        out: their server should have acted (the policy warns at 90% and acts at 100%), and did not."""
        book = self.pool.settings.budget_book
        if not book.budgets:
            return []
        now = time.monotonic()
        active = [lease for lease in await asyncio.to_thread(self.ledger.leases, None, (ACTIVE,)) if not lease.phase]
        spent: dict[str, bool] = {}
        ended = []
        for lease in active:
            if lease.owner not in spent:
                standing = await asyncio.to_thread(self.ledger.budget_standing, lease.owner, lease.groups, book)
                spent[lease.owner] = standing is not None and standing.exhausted
            if not spent[lease.owner]:
                self._spent_since.pop(lease.id, None)
                continue
            since = self._spent_since.setdefault(lease.id, now)
            if now - since < self.budget_grace:
                continue
            log.warning("GPU pool service: %s's GPU time is used up and kernel %s still runs %.0fs later; "
                        "ending it", lease.owner, lease.kernel_id, now - since)
            owner = await asyncio.to_thread(self.identities.by_name, lease.owner)
            await asyncio.to_thread(kernels.end_kernel, lease.holder_pid, lease.holder_start,
                                    owner.uid if owner is not None else None)
            released = await self.turns.write(None, self.ledger.release, lease.id,
                                         "budget: GPU time used up (ended by the pool service)")
            if released is not None:
                ended.append(released)
        self._spent_since = {k: v for k, v in self._spent_since.items() if k in {x.id for x in active}}
        return ended

    async def gpu_freed(self, lease: Lease, gpus: set[str], caller_uid: int) -> None:
        """Return once NVML shows no process of the lease's owner holding memory on ``gpus`` but for the
        process trees of the owner's other active kernels; NVML may lag a moment behind a checkpoint, so
        it is asked again for up to ``gpu_settle`` seconds before the hibernation is refused."""
        deadline = time.monotonic() + self.gpu_settle
        while True:
            held = await asyncio.to_thread(self._gpu_held, lease, gpus, caller_uid)
            if held is not None and not held:
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if held is None:
            raise GPUUnreadable("NVML cannot say what the kernel holds on the GPU, so its slice stays held "
                                "(the admin may check the driver: nvidia-smi)")
        total = sum(held.values())
        pids = ", ".join(f"{pid} ({used // 2**20} MiB)" if used else f"{pid}" for pid, used in sorted(held.items()))
        amount = f"{max(total, 2**20) // 2**20} MiB" if total else "memory"  # (NVML need not say how much)
        raise GPUMemoryHeld(f"NVML still shows the kernel's user holding {amount} on the GPU "
                            f"{self.gpu_settle:g} s after its checkpoint (processes {pids}): a hibernated kernel holds "
                            "none, so its slice stays held")

    def _gpu_held(self, lease: Lease, gpus: set[str], caller_uid: int) -> dict[int, int] | None:
        """Per pid, the memory NVML shows the owner's processes holding on ``gpus`` (0 where NVML does not
        say how much), leaving out the owner's other active kernels; None where NVML cannot be read."""
        found = self._gpu_processes(gpus)
        if found is None:
            return None
        uid = next((u for u in (_uid_of(lease.holder_pid), _uid_of(lease.manager_pid)) if u is not None), caller_uid)
        others = {pid for other in self.ledger.leases(lease.owner, states=(ACTIVE,)) if other.id != lease.id
                  for pid in process_tree(other.holder_pid)}
        kernel = set(process_tree(lease.holder_pid))
        held: dict[int, int] = {}
        for per_pid in found.values():
            for pid, used in per_pid.items():
                if pid in others or (pid not in kernel and _uid_of(pid) != uid):
                    continue
                held[pid] = held.get(pid, 0) + (used or 0)
        return held


def _uid_of(pid: int | None) -> int | None:
    if not pid:
        return None
    try:
        return psutil.Process(pid).uids().real
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _nvml_processes(gpus: set[str]) -> dict[str, dict[int, int | None]] | None:
    """Per GPU, per pid, the memory NVML shows; None where NVML cannot be read."""
    from ..devices.telemetry import NVMLSource

    source = NVMLSource()
    if not source.available()[0]:
        return None
    readings = source.read(gpus)
    if set(readings) != set(gpus):
        return None  # a GPU NVML does not know (gone since discovery): it cannot say
    return {uuid: {pid: r.memory for pid, r in procs.items()} for uuid, procs in readings.items()}
