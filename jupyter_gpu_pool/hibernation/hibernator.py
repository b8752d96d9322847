"""The hibernator: moves an idle kernel's GPU memory to host RAM and back, keeping the kernel alive.

It is the local driver of the moves of a kernel's lifecycle, written once as a pure model
(``pool.residency``): each move asks the model what the request leads to (or why it is refused), claims
the kernel by moving its lease's phase (compare-and-set in the ledger: no other mover can start), carries
out the step's effects, and writes each report of the move as the model steps it (``steps.py``).

Hibernate: refuse early and plainly (capability, busy kernel, host-RAM cap, free RAM), claim the lease
(``hibernating``), release the framework's cached memory, claim host RAM (``host_memory.py``), *lock*
every CUDA process of the kernel's process tree (the driver waits up to ``lock_timeout`` for submitted GPU
work; a kernel still busy is left running, untouched), *checkpoint* them, then mark the lease
``hibernated`` (its slice goes back to the pool).

Resume: take a slice again (``room.py``: its last GPU, else another of the same model where the driver
can restore there; the queue while there is no room, or while its GPU lacks the free memory the
checkpoint needs), *restore*, *unlock*.  A resume on a *hint* takes a slice only if one is free now and
nobody waits; until a cell arrives (:meth:`Hibernator.used`) the kernel stays :meth:`Hibernator.hinted`,
so that its caller can put it back to sleep if none does.  A kernel that started without a slice takes
its first one the same way (``first_slice.py``).

On declared GPUs (the pool's inventory, not real GPUs) a kernel holds no GPU memory: both moves run
exactly as above with no driver call, since there is nothing to checkpoint; their outcomes say
``declared``.

Every failure either puts everything back as it was or, past the point of no return, marks the lease
``failed`` and says where each process was left.  It reports nothing itself: each move returns an
:class:`Outcome` (or raises a refusal or failure carrying its message), and :meth:`Hibernator.tick`
(evictions past the host-RAM cap, moves a previous server left under way: ``recovery.py``) returns its
:class:`Notice` s, for the caller to put on record.  Blocking calls (driver, ledger, NVML) run in threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..devices import checkpoint as cp
from ..devices import nvml
from ..pool import ACTIVE, Lease, LeaseNotFound, format_size
from ..pool import residency as M
from ..pool.hibernation import HibernationSettings
from ..pool.phases import EVICTING, HIBERNATING, IN_FLIGHT, PhaseError, display_state
from .errors import HibernationFailed, HibernationRefused
from .first_slice import FirstSlice
from .handles import ASLEEP, Handles
from .host_memory import RAM_MARGIN, HostMemory
from .kernels import Kernels, available_ram, machine_ram
from .outcomes import Notice, Outcome
from .processes import Processes, Stuck
from .recovery import Recovery
from .room import Room, gpus_of
from .steps import Steps

log = logging.getLogger(__name__)

__all__ = ["ASLEEP", "Hibernator", "Notice", "Outcome", "RAM_MARGIN"]

SLEEP_EVENTS = {"after_cell": M.AFTER_CELL, "hint_unused": M.HINT_UNUSED, "user": M.RELEASE, "admin": M.RELEASE}


class Hibernator:
    """Hibernation of this server's kernels on the local pool (the server extension's hook)."""

    def __init__(self, pool, kernels: Kernels, settings: HibernationSettings | None = None, *,
                 driver: cp.Driver | None = None, memory: nvml.GPUMemory | None = None,
                 ram_total: Callable[[], int] = machine_ram, ram_available: Callable[[], int] = available_ram,
                 clock: Callable[[], float] = time.time):
        self.pool = pool
        self.kernels = kernels
        self.settings = settings or pool.settings.hibernation
        self._driver = driver
        self._memory = memory
        self.clock = clock
        self.handles = Handles()
        self.steps = Steps(pool, self.handles)
        self.processes = Processes(lambda: self.driver, self.settings)
        self.room = Room(pool, self.settings, lambda: self.memory, self.handles, self.steps)
        self.host_memory = HostMemory(pool, self.settings, ram_total, ram_available, clock)
        self.first = FirstSlice(pool, kernels, self.handles, self.steps, self.room)
        self.recovery = Recovery(kernels, self.steps, self.processes, self.capability)

    @property
    def driver(self) -> cp.Driver:
        """The checkpoint driver: the one given, else ``devices.checkpoint.driver()`` (looked up on use)."""
        return self._driver if self._driver is not None else cp.driver()

    @property
    def memory(self) -> nvml.GPUMemory:
        """GPU memory as the driver counts it: the one given, else NVML's (``devices.nvml.memory()``)."""
        return self._memory if self._memory is not None else nvml.memory()

    @property
    def ledger(self):
        return self.pool.ledger

    @property
    def declared(self) -> bool:
        """The pool's GPUs are declared, not real: no move has GPU memory to carry."""
        return self.pool.inventory.declared

    def capability(self, lease: Lease) -> cp.Capability:
        """Whether this lease's kernel can hibernate at all, and why not."""
        return self.processes.capability(lease, gpus_of(self.pool, lease),
                                         self.pool.inventory.discovery.driver_version)

    def can_hibernate(self, lease: Lease) -> tuple[bool, str | None]:
        """Whether the lease's kernel can hibernate, and why not as a clause (``Capability.why``)."""
        cap = self.capability(lease)
        return cap.available, None if cap.available else cap.why

    # -- what the UI shows (no I/O: cheap enough for every websocket message) --------------------------

    def shown(self, kernel_id: str) -> str:
        """The kernel's state as this server last read or wrote it in the ledger."""
        return self.handles.shown(kernel_id)

    def asleep(self, kernel_id: str) -> bool:
        """Whether a cell sent now must wait for a resume (or a first slice)."""
        return self.shown(kernel_id) in ASLEEP

    def queue_position(self, kernel_id: str) -> int | None:
        return self.handles.queue_position(kernel_id)

    def first_slice(self, kernel_id: str) -> bool:
        """Whether the kernel holds no slice yet, or is taking its first one."""
        return self.handles.first_slice(kernel_id)

    def queue_reason(self, kernel_id: str) -> str | None:
        """Why a queued resume waits, where it is not for a free slice ("waiting for 5 GiB of GPU
        memory to be free on GPU 0: 2 GiB is free"); None otherwise."""
        return self.handles.queue_reason(kernel_id)

    def queue_why(self, kernel_id: str) -> str | None:
        """Why a queued resume is where it is in the queue, where the admin's sharing orders it ("2nd in the
        queue: going first into the room reserved for ML 101 lab"); None otherwise."""
        return self.handles.queue_why(kernel_id)

    def hinted(self, kernel_id: str) -> bool:
        """Whether the kernel was resumed (or is resuming) on a hint and no cell has come since."""
        return self.handles.hinted(kernel_id)

    async def refresh(self, kernel_id: str) -> str:
        """Re-read the kernel's state from the ledger (a restarted server, another server's move)."""
        lease = await self.steps.lease(kernel_id)
        k = self.handles[kernel_id]
        if not k.guard.locked():
            await self.handles.show(kernel_id, display_state(lease) if lease else ACTIVE, k.position)
        return k.seen

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        """Wait up to ``timeout`` for the kernel's shown state or queue position to change."""
        return await self.handles.wait_change(kernel_id, timeout)

    # -- hibernate -----------------------------------------------------------------------------

    async def hibernate(self, kernel_id: str, reason: str = "idle", *, force: bool = False) -> Outcome:
        """Hibernate the kernel, or raise :class:`HibernationRefused` (nothing changed) or
        :class:`HibernationFailed`.  ``force`` skips the check of the kernel's execution state (the
        lock's timeout still guards its GPU work)."""
        k = self.handles[kernel_id]
        if k.guard.locked():
            raise HibernationRefused("in_progress", f"This kernel is already {k.seen}; try again when that is done.")
        async with k.guard:
            hinted, k.hint_only, k.resume_wanted = k.hint_only, False, False
            lease = await self.steps.lease(kernel_id)
            asked = self._asked_to_sleep(lease, SLEEP_EVENTS.get(reason, M.IDLE), hinted)
            return await self._hibernate(lease, asked, reason, force)

    @staticmethod
    def _asked_to_sleep(lease: Lease | None, event: str, hinted: bool) -> M.Step:
        """The model's answer to a request to hibernate the kernel, refused in its user's words."""
        if lease is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU lease, so there is nothing to hibernate.",
                                     status=404)
        try:
            return M.step(M.residency_of(lease, hint=hinted), event)
        except PhaseError as e:  # (a Refused, or a lease no residency shows as)
            words = {"no_slice": "This kernel holds no GPU slice yet: it takes one when a cell runs.",
                     "hibernated": "This kernel is hibernated already.",
                     "used": "A cell ran on this kernel since it was woken in advance, so it stays awake."}
            reason = getattr(e, "reason", "") if getattr(e, "reason", "") in words else "in_progress"
            raise HibernationRefused(reason, words.get(reason) or f"This kernel is {lease.phase}; try again when "
                                     "that is done.") from None

    async def _hibernate(self, lease: Lease, asked: M.Step, reason: str, force: bool) -> Outcome:
        kernel_id = lease.kernel_id
        cap, pids = await self._checkpointable(lease, force)
        started = time.monotonic()
        await self.steps.claim(lease, asked, HibernationRefused("stopping", "This kernel is being shut down.",
                                                                keep_running=False))
        try:
            moved = await self._release_and_claim(lease, pids)
            if pids:  # (the model's CHECKPOINT: lock all or none, checkpoint all)
                await self.processes.lock_all(kernel_id, pids)
                await self._still_wanted(kernel_id, pids, force)
                await self.processes.checkpoint_all(pids)
        except Stuck as e:
            raise await self.steps.fail(kernel_id, M.CHECKPOINT_STUCK, HIBERNATING, e.states, e.reason,
                                        e.what) from None
        except BaseException:
            await self.steps.report(kernel_id, M.CHECKPOINT_UNDONE, was=HIBERNATING)
            raise
        duration = time.monotonic() - started
        try:
            lease, done = await self.steps.report(kernel_id, M.CHECKPOINT_DONE, was=HIBERNATING, host_bytes=moved,
                                                  reason=reason)
            if done is None:
                raise LeaseNotFound(kernel_id)  # it ended meanwhile: not recorded, so not left checkpointed either
        except Exception as e:  # the ledger (a pool service that still sees GPU memory held) refused to record it
            raise await self._undo_checkpoint(kernel_id, pids, e) from None
        log.info("kernel %s hibernated (%s): %s in %.1fs, pids %s%s", kernel_id, reason, format_size(moved), duration,
                 pids, f" ({cp.DECLARED_NOTE})" if cap.declared else "")
        message = (f"Nothing moved to host RAM ({cp.DECLARED_NOTE})." if cap.declared
                   else f"{format_size(moved)} of GPU memory moved to host RAM in {duration:.1f} s.")
        return Outcome(kernel_id, "hibernated", duration, moved, tuple(pids), lease.last_gpus if lease else (),
                       lease=lease, message=message, declared=cap.declared, effects=done.effects)

    async def _checkpointable(self, lease: Lease, force: bool) -> tuple[cp.Capability, list[int]]:
        """What a checkpoint of the kernel would move (its CUDA processes), refused where it cannot be."""
        kernel_id = lease.kernel_id
        cap = self.capability(lease)
        if not cap.available:
            raise HibernationRefused(cap.reason or "unavailable", cap.message or "Hibernation is unavailable.",
                                     keep_running=False)
        if not force and self.kernels.execution_state(kernel_id) == "busy":
            raise HibernationRefused("busy", "This kernel is running a cell; it can hibernate once the cell is done.")
        tree = self.kernels.pids(kernel_id, lease.holder_pid)
        if not tree:
            raise HibernationRefused("no_process", "This kernel's process is not running.")
        states = await self.processes.states(cap, tree)
        stuck = {pid: s.word for pid, s in states.items() if s != cp.ProcessState.RUNNING}
        if stuck:
            raise HibernationRefused("not_running", f"This kernel's CUDA processes are not all running ({stuck}); "
                                     "it was left mid-move. Resume it, or restart it.")
        return cap, sorted(states)

    async def _release_and_claim(self, lease: Lease, pids: list[int]) -> int:
        """The model's CLAIM_HOST_RAM: release the framework's cache (what moves is what is reserved), then
        claim host RAM for what NVML sees the processes hold (else the slice's size).  Returns the bytes."""
        if pids and self.settings.release_cache:
            timeout = self.settings.cache_release_timeout
            if await self.kernels.release_cache(lease.kernel_id, timeout) == "timeout":
                raise self.processes.gpu_busy(timeout)
        moved = 0
        if pids:
            held = await asyncio.to_thread(self.memory.of_processes, pids)
            moved = sum(held.values()) if held and any(pid in held for pid in pids) else lease.total_memory
        await self.host_memory.claim(lease, moved)
        return moved

    async def _still_wanted(self, kernel_id: str, pids: list[int], force: bool) -> None:
        """Locked: a cell that started meanwhile (``CALL_OFF``) gives the hibernation up, before the checkpoint."""
        busy = not force and self.kernels.execution_state(kernel_id) == "busy"
        if busy or self.handles[kernel_id].resume_wanted:
            await self.processes.unlock(pids)
            raise HibernationRefused("in_use", "A cell was started on this kernel while it was being hibernated; "
                                     "it was left running.")

    async def _undo_checkpoint(self, kernel_id: str, pids: list[int], why: Exception) -> HibernationFailed:
        """The kernel was checkpointed but the hibernation cannot be recorded: put it back on its GPU
        (it still holds its slice), so that it is never left checkpointed with its slice counted held."""
        states = await self.processes.put_back_running(pids)
        if all(s == cp.ProcessState.RUNNING.word for s in states.values()):
            await self.steps.report(kernel_id, M.CHECKPOINT_UNDONE, was=HIBERNATING)
            return HibernationFailed(
                "not_recorded", f"The pool did not record this kernel's hibernation ({why}); it was put back on its "
                "GPU and runs as before.", recovered=True, states=states)
        return await self.steps.fail(kernel_id, M.CHECKPOINT_STUCK, HIBERNATING, states, "not_recorded",
                                     f"The pool did not record this kernel's hibernation ({why}) and the checkpoint "
                                     "could not be undone")

    # -- resume --------------------------------------------------------------------------------

    def start_resume(self, kernel_id: str, reason: str = "user", *, hint: bool = False) -> asyncio.Task:
        """Start resuming (or join the resume under way) and return its task at once.

        ``hint``: only if a slice is free now and nobody waits (declined with a :class:`HibernationRefused`
        otherwise, nothing changed); a hint joins a resume under way without changing it.  A resume
        that is not a hint (a cell, the user's Resume) makes a hinted one under way its own: it then
        waits in the queue where the hint would have given up."""
        k = self.handles[kernel_id]
        running = k.resume_task is not None and not k.resume_task.done()
        if hint and running:
            return k.resume_task  # type: ignore[return-value]
        if not hint:
            k.hint_only = False
            if k.seen == HIBERNATING:  # if still before the checkpoint, the hibernation gives up
                k.resume_wanted = M.CALL_OFF in M.step(M.Residency(HIBERNATING), M.RESUME).effects
        if not running:
            k.hint_only = hint
            k.placed.clear()
            k.resume_task = asyncio.ensure_future(self._resume_guarded(kernel_id, reason))
            k.resume_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        return k.resume_task

    def used(self, kernel_id: str) -> tuple[str, ...]:
        """A cell came for the kernel: a hint that woke it was right (it is no longer :meth:`hinted`).
        Returns the model's effects (``restart_idle_clock`` where it was woken on a hint)."""
        k = self.handles.find(kernel_id)
        if k is None or not k.hint_only:
            return ()
        k.hint_only = False
        return M.step(M.Residency(ACTIVE, hint=True), M.CELL).effects if k.seen == ACTIVE else ()

    async def resume(self, kernel_id: str, reason: str = "user") -> Outcome:
        """Resume the kernel and return once it runs on a GPU again (queue wait included)."""
        return await asyncio.shield(self.start_resume(kernel_id, reason))

    async def placed(self, kernel_id: str, timeout: float) -> None:
        """Wait up to ``timeout`` for the resume under way to take a slice or a place in the queue, or
        to end (refused, say, for quota or budget): what a caller can then tell its user at once."""
        k = self.handles[kernel_id]
        if k.resume_task is None or k.resume_task.done():
            return
        waiter = asyncio.ensure_future(k.placed.wait())
        try:
            await asyncio.wait([k.resume_task, waiter], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _resume_guarded(self, kernel_id: str, reason: str) -> Outcome:
        k = self.handles[kernel_id]
        async with k.guard:
            try:
                return await self._resume(kernel_id, reason)
            except BaseException:
                k.hint_only = False  # declined or failed: the kernel sleeps on, no longer on a hint
                raise
            finally:
                k.resume_wanted = False

    async def _resume(self, kernel_id: str, reason: str) -> Outcome:
        started = time.monotonic()
        lease = await self.steps.lease(kernel_id)
        asked = self._asked_to_wake(lease, kernel_id, M.HINT if self.hinted(kernel_id) else (
            M.CELL if reason == "cell" else M.RESUME))
        if asked.state.stage == ACTIVE:  # awake already
            await self.handles.show(kernel_id, ACTIVE)
            return Outcome(kernel_id, "resumed", gpus=lease.gpus, lease=lease, effects=asked.effects)
        if asked.state.first:
            return await self.first.take(kernel_id, lease, asked, started)
        cap = self.capability(lease)
        states = await self.processes.states(cap, self.kernels.pids(kernel_id, lease.holder_pid))
        pids = sorted(pid for pid, s in states.items() if s == cp.ProcessState.CHECKPOINTED)
        await self.steps.claim(lease, asked, HibernationRefused(
            "stopping", "This kernel is shutting down; there is nothing to resume."))
        new, waited, done = await self._restore(lease, cap, pids)
        duration = time.monotonic() - started
        where = "" if new.gpus == lease.last_gpus else " on another GPU of the same model"
        queued = f" after {waited:.0f} s in the queue" if waited >= 1 else ""
        log.info("kernel %s resumed (%s) on %s in %.1fs%s%s", kernel_id, reason, new.gpus, duration, queued,
                 f" ({cp.DECLARED_NOTE})" if cap.declared else "")
        moved_text = (f"{cp.DECLARED_NOTE}" if cap.declared
                      else f"{format_size(lease.host_bytes)} back on the GPU in {duration:.1f} s")
        return Outcome(kernel_id, "resumed", duration, lease.host_bytes, tuple(pids), new.gpus, waited,
                       lease=done[0] or new, message=f"Resumed{where}{queued}: {moved_text}; every variable is as it "
                       "was.", declared=cap.declared, effects=done[1].effects if done[1] else ())

    def _asked_to_wake(self, lease: Lease | None, kernel_id: str, event: str) -> M.Step:
        """The model's answer to a request to wake the kernel (a cell, Resume, a hint), refused in its user's
        words; one that finds a move under way (it takes no slice of its own) is refused too."""
        if lease is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU lease (it was shut down).", status=404)
        try:
            state = self.steps.residency(lease, kernel_id)
            if state.stage in (M.RESUMING, M.QUEUED):  # a resume a previous server left (none runs here: guarded)
                state = M.step(state, M.INTERRUPTED).state
            asked = M.step(state, event)
        except PhaseError as e:  # (a Refused, or a lease no residency shows as)
            raise self._not_to_wake(lease, getattr(e, "reason", "not_hibernated")) from None
        if asked.state.stage != ACTIVE and not {M.TAKE_SLICE, M.TAKE_SLICE_NOW} & set(asked.effects):
            raise self._not_to_wake(lease, "in_progress")
        return asked

    @staticmethod
    def _not_to_wake(lease: Lease, why: str) -> HibernationRefused:
        if why == "stopping":
            return HibernationRefused("stopping", "This kernel is shutting down; there is nothing to resume.")
        words = {"no_gpu_yet": "This kernel has held no GPU yet: it takes one when a cell runs, not on a guess.",
                 "evicting": "This kernel is to be shut down to make room in host RAM: a cell resumes it, not a "
                             "guess.",
                 "not_hibernated": "This kernel is not sleeping: there is nothing to wake."}
        if why in words:
            return HibernationRefused(why, words[why])
        if lease.state == ACTIVE or lease.phase not in IN_FLIGHT:
            return HibernationRefused("not_hibernated", f"This kernel is {display_state(lease)}"
                                      f"{' (' + lease.phase + ')' if lease.phase else ''}; there is nothing to resume.")
        return HibernationRefused("in_progress", f"This kernel is {lease.phase}; try again when that is done.")

    async def _restore(self, lease: Lease, cap: cp.Capability, pids: list[int]):
        """Take a slice and restore onto it; every way it can end is stepped through the model (refused or
        cancelled before a slice: it sleeps on; a restore that failed: undone, or failed)."""
        kernel_id, new, pairs, restored = lease.kernel_id, None, None, []
        try:
            # Another GPU only where the driver can restore there, or nothing is to be restored on a declared one.
            same_gpu = not (cap.declared or (cap.remap and pids))
            new, waited = await self.room.take(lease, same_gpu, lease.host_bytes if pids else 0)
            if cap.declared:  # a modelled restore time, where a benchmark set one (none by default)
                await asyncio.sleep(self.settings.declared_restore_seconds(lease.total_memory))
            pairs = list(zip(lease.last_gpus, new.gpus)) if pids and new.gpus != lease.last_gpus else None
            try:
                await self.processes.restore_all(pids, pairs, restored)
            except cp.CheckpointError as e:
                if pairs is None or restored or not await self.processes.still_checkpointed(pids):
                    raise
                new, more = await self._restore_at_home(lease, new, pids, restored, e)
                waited, pairs = waited + more, None
            await self.processes.unlock(pids)
        except HibernationRefused as e:
            await self.steps.report(kernel_id, M.QUOTA_REFUSED if e.status == 403 or e.reason == "not_now"
                                    else M.NO_ROOM if self.hinted(kernel_id) else M.INTERRUPTED, was=M.RESUMING)
            raise
        except cp.CheckpointError as e:
            home = new.gpus if new is not None and pairs and restored else lease.last_gpus  # where the memory is
            raise await self._undo_restore(lease, pids, e, home) from None
        except asyncio.CancelledError:
            current = await self.steps.lease(kernel_id)
            if current is None or current.state != ACTIVE:  # (with a slice taken, recovery settles it)
                await self.steps.report(kernel_id, M.INTERRUPTED, was=M.RESUMING)
            raise
        return new, waited, await self.steps.report(kernel_id, M.RESTORE_DONE, was=M.RESTORING)

    async def _restore_at_home(self, lease: Lease, new: Lease, pids: list[int], restored: list[int],
                               error: cp.CheckpointError) -> tuple[Lease, float]:
        """The driver would not restore onto the other GPU (``ROOM_LOST``): give that slice back, wait for the
        kernel's own, and restore there."""
        log.warning("kernel %s: restore onto %s refused (%s); waiting for its own GPU", lease.kernel_id, new.gpus,
                    error)
        await self.steps.report(lease.kernel_id, M.ROOM_LOST, was=M.RESTORING, host_bytes=lease.host_bytes,
                                reason="restore elsewhere refused", last_gpus=lease.last_gpus)
        new, waited = await self.room.take(lease, True, lease.host_bytes)
        await self.processes.restore_all(pids, None, restored)
        return new, waited

    async def _undo_restore(self, lease: Lease, pids: list[int], error: cp.CheckpointError,
                            home: tuple[str, ...]) -> HibernationFailed:
        """A restore failed with a slice taken: checkpoint what was restored and give the slice back.
        Returns the error to raise."""
        states = await self.processes.put_back_checkpointed(pids)
        if all(s == cp.ProcessState.CHECKPOINTED.word for s in states.values()):
            await self.steps.report(lease.kernel_id, M.RESTORE_UNDONE, was=M.RESTORING, host_bytes=lease.host_bytes,
                                    reason="resume failed", last_gpus=home)
            return HibernationFailed("restore_failed", f"Restoring this kernel's GPU memory failed ({error}); it is "
                                     "hibernated as before and its slice was given back. Try again, or restart it.",
                                     recovered=True, states=states)
        return await self.steps.fail(lease.kernel_id, M.RESTORE_STUCK, M.RESTORING, states, "restore_failed",
                                     f"Restoring this kernel's GPU memory failed ({error}) and could not be undone")

    # -- upkeep --------------------------------------------------------------------------------

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone (shut down): stop any resume of it and drop what we keep."""
        k = self.handles.pop(kernel_id)
        self.processes.unsupported.pop(kernel_id, None)
        if k and k.resume_task and not k.resume_task.done():
            k.resume_task.cancel()

    async def tick(self) -> list[Notice]:
        """Periodic upkeep: warn and shut down this server's kernels marked for eviction, put right the
        kernels a previous server left mid-move, and refresh the cache from the ledger.  Returns what
        it warned of or did, for the caller to put on record."""
        leases = await asyncio.to_thread(self.ledger.leases)
        now = self.clock()
        notices: list[Notice] = []
        for lease in leases:
            if not self.kernels.has(lease.kernel_id):
                continue  # another server's kernel: its own hibernator looks after it
            k = self.handles[lease.kernel_id]
            if k.guard.locked():
                continue
            try:
                if lease.phase == EVICTING:
                    done = await self.host_memory.evict(lease, k, now, self.kernels)
                    notices += done
                    if any(n.kind == "culled" for n in done):
                        self.forget(lease.kernel_id)
                elif lease.phase in IN_FLIGHT:
                    notices += await self.recovery.recover(lease)
                else:
                    await self.handles.show(lease.kernel_id, display_state(lease), k.position)
            except PhaseError as e:  # a (state, phase) no mover writes: left as it is, said once per pass
                log.warning("kernel %s: %s", lease.kernel_id, e)
        for kernel_id in [kid for kid in self.handles.ids() if not self.kernels.has(kid)]:
            self.forget(kernel_id)
        return notices
