"""A local kernel's CUDA processes through the checkpoint API: whether they can hibernate, where they are,
and the group moves (lock all or none, checkpoint all, restore, put back) with the words a refusal or a
failure says to its user.  The group moves themselves are ``devices.moves``' (the node agent's too);
blocking driver calls run in threads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..devices import checkpoint as cp
from ..devices import moves
from ..pool import Lease
from ..pool.hibernation import HibernationSettings
from ..pool.words import driver_refuses
from .errors import HibernationFailed, HibernationRefused


class Stuck(Exception):
    """A step failed and could not be undone: ``states`` says where each process was left."""

    def __init__(self, reason: str, what: str, states: dict[int, str]):
        super().__init__(what)
        self.reason, self.what, self.states = reason, what, states


class Processes:
    """The driver side of this server's moves (``driver()``: the checkpoint API, looked up on use)."""

    def __init__(self, driver: Callable[[], cp.Driver], settings: HibernationSettings):
        self._driver = driver
        self.settings = settings
        self.unsupported: dict[str, cp.Capability] = {}  # kernel → the driver's own refusal (801 on a kernel we let try)

    @property
    def driver(self) -> cp.Driver:
        return self._driver()

    def capability(self, lease: Lease, gpus: list, driver_version: str | None) -> cp.Capability:
        """Whether this lease's kernel can hibernate at all, and why not (no driver call is made for MPS or
        MIG, refused on what the pool already knows, nor for declared GPUs, which have nothing to move)."""
        pre = cp.capability(lease.isolation, gpus, cp.DriverInfo(True, remap=True), driver_version)
        if not pre.available or pre.declared:
            return pre
        if lease.kernel_id in self.unsupported:
            return self.unsupported[lease.kernel_id]
        return cp.capability(lease.isolation, gpus, self.driver.info(), driver_version)

    async def states(self, cap: cp.Capability, tree: list[int]) -> dict[int, cp.ProcessState]:
        """The CUDA state of each process of ``tree`` that has one; on declared GPUs none (the driver
        is not asked: there is no GPU memory to move)."""
        if cap.declared or not tree:
            return {}
        return await asyncio.to_thread(cp.cuda_processes, self.driver, tree)

    def gpu_busy(self, waited: float | None = None) -> HibernationRefused:
        return HibernationRefused(
            "gpu_busy", f"This kernel's GPU work did not finish within {waited or self.settings.lock_timeout:g} s, "
            "so it was left running, untouched; it can hibernate once its GPU is quiet.")

    async def lock_all(self, kernel_id: str, pids: list[int]) -> None:
        """Lock every process or none, refusing (everything left running, untouched) where one cannot be."""
        try:
            await asyncio.to_thread(moves.lock_all, self.driver, pids, self.settings.lock_timeout)
        except cp.LockTimeout:
            raise self.gpu_busy() from None
        except cp.NotSupported as e:
            refused = cp.cannot("not_supported", driver_refuses(e.error_name),
                                "It was left running, untouched, and can only be shut down to free its slice.")
            self.unsupported[kernel_id] = refused
            raise HibernationRefused("not_supported", refused.message, keep_running=False) from None
        except cp.CheckpointError as e:
            raise HibernationRefused("lock_failed", f"Could not pause this kernel's GPU work ({e}); it was left "
                                     "running, untouched.") from None

    async def unlock(self, pids: list[int]) -> None:
        await asyncio.to_thread(moves.unlock_each, self.driver, pids)

    async def checkpoint_all(self, pids: list[int]) -> None:
        """Checkpoint every (locked) process; a failure puts every one back running (raised as a recovered
        :class:`HibernationFailed`), or raises :class:`Stuck` where that fails too."""
        try:
            await asyncio.to_thread(moves.checkpoint_all, self.driver, pids)
        except cp.CheckpointError as e:
            states = await self.put_back_running(pids)
            if moves.all_in(states, cp.ProcessState.RUNNING):
                raise HibernationFailed(
                    "checkpoint_failed", f"The checkpoint of this kernel failed ({e}); everything was put back as it "
                    "was and the kernel runs on its GPU.", recovered=True, states=states) from None
            raise Stuck("checkpoint_failed", f"The checkpoint of this kernel failed ({e}) and could not be undone",
                        states) from None

    async def restore_all(self, pids: list[int], pairs: list[tuple[str, str]] | None, restored: list[int]) -> None:
        """Restore each checkpointed process, appending each done to ``restored``."""
        for pid in pids:
            if await asyncio.to_thread(self.driver.state, pid) == cp.ProcessState.CHECKPOINTED:
                await asyncio.to_thread(self.driver.restore, pid, pairs)
                restored.append(pid)

    async def still_checkpointed(self, pids: list[int]) -> bool:
        try:
            states = [await asyncio.to_thread(self.driver.state, pid) for pid in pids]
        except cp.CheckpointError:
            return False
        return all(s == cp.ProcessState.CHECKPOINTED for s in states)

    async def put_back_running(self, pids: list[int]) -> dict[int, str]:
        """Bring each process back to RUNNING on the GPU it still holds; return where each ended."""
        return await asyncio.to_thread(moves.put_back_running, self.driver, pids)

    async def put_back_checkpointed(self, pids: list[int]) -> dict[int, str]:
        """Bring each process back to CHECKPOINTED (its memory in host RAM); return where each ended."""
        return await asyncio.to_thread(moves.put_back_checkpointed, self.driver, pids, self.settings.lock_timeout)
