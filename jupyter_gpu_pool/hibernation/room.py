"""Room for a kernel that asks for a slice (a resume, or its first slice): the pool's allocation decision,
the queue while there is none, and safe wake: a resume that has GPU memory to restore waits until its GPU
really has that much free (as NVML counts it: soft slices are not enforced, and a restore that runs out of
memory can leave the process checkpointed for good), holding its place in the queue meanwhile.

A hint's resume (the user opened the notebook) makes one try: a slice only where one is free now and
nobody waits; declined, nothing was taken or queued.  Blocking calls (ledger, NVML) run in threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..devices import nvml
from ..local.waiting import Place, wait_for_slice
from ..pool import Lease, LeaseNotFound, PoolError, PoolExhausted, QuotaExceeded, format_size
from ..pool import residency as M
from ..pool.budgets import BudgetExceeded
from ..pool.hibernation import HibernationSettings
from ..pool.phases import QUEUED, RESUMING
from .errors import GPUMemoryShort, HibernationRefused
from .handles import Handles
from .steps import Steps

USABLE = 0.97  # of a GPU's memory a process can ever find free (the driver keeps the rest)


def gpus_of(pool, lease: Lease) -> list:
    """The pool's GPUs the lease holds, or held last."""
    return [g for g in (pool.gpu(u) for u in lease.gpus or lease.last_gpus) if g is not None]


class Room:
    """Takes slices for this server's kernels (``memory()``: NVML's free memory, looked up on use)."""

    def __init__(self, pool, settings: HibernationSettings, memory: Callable[[], nvml.GPUMemory], handles: Handles,
                 steps: Steps):
        self.pool, self.settings, self._memory = pool, settings, memory
        self.handles, self.steps = handles, steps

    @property
    def ledger(self):
        return self.pool.ledger

    async def take(self, lease: Lease, same_gpu: bool, need: int,
                   refusal: str = "Cannot resume this kernel: ") -> tuple[Lease, float]:
        """Take a slice for the lease, waiting in the queue (phase ``queued``) while the pool is full or,
        for ``need`` bytes to restore, while its GPU lacks that much free memory plus the margin.  A quota's
        or budget's refusal is raised with the pool's words after ``refusal``.  A hint's resume tries once."""
        attempt, wait = self._attempt(lease, same_gpu, need)
        k = self.handles[lease.kernel_id]
        if k.hint_only:
            taken = await asyncio.to_thread(self._take_now, lease, attempt)
            if isinstance(taken, Lease):
                k.placed.set()
                return await self.steps.granted(taken, first=False), 0.0
            if k.hint_only:  # no cell came meanwhile: decline, nothing taken, nothing queued
                raise taken
            # else a cell came while the hint tried: it waits in the queue like any resume

        async def queued(position: int) -> None:  # no room: it waits (NO_ROOM), its place shown
            wait["position"] = position
            await self.steps.report(lease.kernel_id, M.NO_ROOM, was=RESUMING)
            await self.handles.show(lease.kernel_id, QUEUED, position, wait["reason"], wait["why"])
            k.placed.set()  # once the ledger and what is shown say queued

        async def refused(refusal) -> None:
            wait["reason"] = str(refusal) if isinstance(refusal, GPUMemoryShort) else None
            if wait["position"] is not None:
                await self.handles.show(lease.kernel_id, QUEUED, wait["position"], wait["reason"], wait["why"])

        async def placed_why(why: str) -> None:  # where sharing orders the queue: why it is there
            wait["why"] = why or None
            if wait["position"] is not None:
                await self.handles.show(lease.kernel_id, QUEUED, wait["position"], wait["reason"], wait["why"])

        place = Place(lease.owner, lease.kernel_id, lease.profile, lease.slice, lease_id=lease.id, label=lease.label,
                      groups=lease.groups)
        try:
            new, waited = await wait_for_slice(self.ledger, attempt, place, poll=self.settings.queue_poll,
                                               on_position=queued, on_refusal=refused, on_why=placed_why)
        except (QuotaExceeded, BudgetExceeded) as e:
            raise HibernationRefused(e.reason, f"{refusal}{e}", status=403) from None
        except LeaseNotFound:
            raise HibernationRefused("no_lease", "This kernel's GPU lease ended while it waited to resume.",
                                     status=404) from None
        k.placed.set()
        return await self.steps.granted(new, first=lease.awaits_first_cell), waited

    def _attempt(self, lease: Lease, same_gpu: bool, need: int) -> tuple[Callable[[str | None], Lease], dict]:
        """One ask of the pool (in a thread), and what the wait learns (its place, why it waits)."""
        wait: dict = {"position": None, "reason": None, "why": None, "only_last": same_gpu}

        def attempt(waiter_id: str | None) -> Lease:
            only_last = wait["only_last"]
            if need:  # safe wake: checked before the ledger is asked, so a wait keeps its place in the queue
                self.check(self.candidates(lease, only_last), need, len(lease.last_gpus))
            new = self.pool.resume(lease, only_last, waiter_id, record_refusal=False)
            if need and not only_last:
                try:  # the ledger picks among the GPUs of the model, not necessarily one that had room
                    self.check(list(new.gpus), need, len(new.gpus))
                except GPUMemoryShort:  # not room after all: given back at once, and the wait goes on (no room)
                    self.ledger.hibernate(new.id, lease.host_bytes, "GPU memory taken meanwhile", lease.last_gpus,
                                          new.phase)
                    wait["only_last"] = True  # its own GPU from now on
                    raise
            return new

        return attempt, wait

    def _take_now(self, lease: Lease, attempt: Callable[[str | None], Lease]) -> Lease | HibernationRefused:
        """A hint's one try: the slice if the pool has room now and nobody waits, else the refusal that
        declines it (returned; nothing was taken or queued).  Runs in a thread."""
        if any(w.kernel_id != lease.kernel_id for w in self.ledger.waiters()):
            return HibernationRefused("others_waiting", "Others are waiting for a GPU slice, so this kernel was "
                                      "not woken in advance: it resumes when a cell runs, in its turn.")
        try:
            return attempt(None)
        except PoolExhausted:  # (GPUMemoryShort too: its GPU lacks the free memory)
            return HibernationRefused("no_room", "No GPU slice is free now, so this kernel was not woken in "
                                      "advance: it resumes when a cell runs (in the queue if need be).")
        except LeaseNotFound:  # (before PoolError, its base)
            return HibernationRefused("no_lease", "This kernel's GPU lease ended.", status=404)
        except PoolError as e:  # its quota or budget: a cell would be refused with the same words
            return HibernationRefused("not_now", f"This kernel was not woken in advance: {e}", status=403)

    def candidates(self, lease: Lease, same_gpu: bool) -> list[str]:
        """The GPUs a resume may land on: its last ones, or any of the same model."""
        if same_gpu:
            return list(lease.last_gpus)
        models = {g.name for g in gpus_of(self.pool, lease)}
        return [g.uuid for g in self.pool.inventory.gpus if g.name in models] or list(lease.last_gpus)

    def check(self, uuids: list[str], need: int, count: int) -> None:
        """Raise :class:`GPUMemoryShort` unless ``count`` of ``uuids`` each have their share of ``need``
        free plus the margin, as the driver counts it (a GPU it cannot read is not held against the
        resume).  Runs in a thread (NVML)."""
        gpus = [g for g in (self.pool.gpu(u) for u in uuids) if g is not None]
        per_gpu = need // max(count, 1) + self.settings.resume_margin
        if gpus:  # a checkpoint sized from the slice (NVML could not see the process) never needs more than exists
            per_gpu = min(per_gpu, int(min(g.memory for g in gpus) * USABLE))
        memory = self._memory()
        free = {uuid: memory.free(uuid) for uuid in uuids}
        if sum(1 for f in free.values() if f is None or f >= per_gpu) >= count:
            return
        best = max((f for f in free.values() if f is not None), default=0)
        where = " or ".join(f"GPU {g.index}" for g in gpus) or "its GPU"
        raise GPUMemoryShort(
            f"waiting for {format_size(per_gpu)} of GPU memory to be free on {where} ({format_size(best)} is free "
            "now; other processes hold the rest)", tuple(uuids), per_gpu)
