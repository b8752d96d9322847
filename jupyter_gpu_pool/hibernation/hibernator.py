"""The hibernator: moves an idle kernel's GPU memory to host RAM and back, keeping the kernel alive.

Hibernate: refuse early and plainly (capability, busy kernel, host-RAM cap, free RAM), claim the
lease by moving its phase to ``hibernating`` (compare-and-set in the ledger: no other mover can
start), release the framework's cached memory, *lock* every CUDA process of the kernel's process
tree (the driver waits up to ``lock_timeout`` for submitted GPU work; a kernel still busy is left
running, untouched), *checkpoint* them, then mark the lease ``hibernated`` (its slice goes back to
the pool).

Resume: take a slice again (its last GPU, else another of the same model where the driver can
restore there), *restore*, *unlock*.  No slice free, or its GPU short of the free memory the
checkpoint needs (as NVML counts it: soft slices are not enforced, and a restore that runs out of
memory can leave the process checkpointed for good): the resume waits in the pool's queue (the
lease's phase says ``queued``, the queue says where, the hibernator why); nothing hangs silently.

A resume on a *hint* (the user opened the kernel's notebook: a cell is likely soon) takes a slice
only if one is free now and nobody waits in the queue: it never queues and never takes the room a
waiter needs; declined, it changes nothing.  Until a cell arrives (:meth:`Hibernator.used`) the
kernel stays marked as woken on a hint (:meth:`Hibernator.hinted`), so that its caller can put it
back to sleep if none does.

On declared GPUs (the pool's inventory, not real GPUs) a kernel holds no GPU memory: both moves
run exactly as above (phase claims, host-RAM accounting of 0 bytes, the ledger, the queue) with
no driver call, since there is nothing to checkpoint; their outcomes say ``declared``.

Every failure either puts everything back as it was (the kernel runs on, the lease stays as it
was) or, past the point of no return, marks the lease ``failed`` and says where each process was
left.  The ledger's phase is the one record of a move under way; the hibernator keeps only its own
locks and tasks, and a cache of what it last read or wrote there (for the websocket's hot path).
It reports nothing itself: each move returns an :class:`Outcome` (or raises a refusal or failure
carrying its message), and :meth:`Hibernator.tick` returns its :class:`Notice` s, for the caller to
put on record.  Blocking calls (driver, ledger, NVML) run in threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..devices import checkpoint as cp
from ..devices import moves
from ..devices import nvml
from ..local.waiting import Place, wait_for_slice
from ..pool import (
    ACTIVE,
    HIBERNATED,
    RELEASED,
    Lease,
    LeaseNotFound,
    PoolError,
    PoolExhausted,
    QuotaExceeded,
    format_size,
)
from ..pool.leases import FIRST_CELL as FIRST_CELL_REASON
from ..pool.budgets import BudgetExceeded
from ..pool.units import format_age
from ..pool.phases import (
    EVICTING,
    FAILED,
    HIBERNATING,
    IN_FLIGHT,
    NO_GPU_YET,
    QUEUED,
    RESUMING,
    STOPPING,
    PhaseConflict,
    display_state,
)
from .errors import GPUMemoryShort, HibernationFailed, HibernationRefused
from .kernels import Kernels, available_ram, machine_ram
from ..pool.hibernation import EVICT_OLDEST, KEEP_RUNNING, SHUTDOWN, HibernationSettings

log = logging.getLogger(__name__)

RAM_MARGIN = 2 * 2**30  # keep this much RAM free beyond a checkpoint, for everything else on the machine
ANSWER_GRACE = 5.0  # seconds, beyond the lock timeout, for a kernel to answer the silent cache release
# Seconds for a kernel to run its first cell's environment code (silent, no GPU work: nothing to wait for but
# the kernel itself, which may still be starting on a loaded machine; its cell waits meanwhile either way).
ENVIRONMENT_TIMEOUT = 60.0
ASLEEP = (HIBERNATING, HIBERNATED, RESUMING, QUEUED, NO_GPU_YET)  # a cell sent now waits for a resume (or a first slice)
USABLE = 0.97  # of a GPU's memory a process can ever find free (the driver keeps the rest)


@dataclass(frozen=True)
class Outcome:
    """A completed move: ``action`` is hibernated or resumed; ``message`` says it for its user."""

    kernel_id: str
    action: str
    duration: float = 0.0
    bytes: int = 0
    pids: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()
    waited: float = 0.0  # seconds a resume spent in the queue
    message: str = ""
    lease: Lease | None = None  # the lease after the move
    declared: bool = False  # on declared GPUs: no GPU memory to move, no driver call made

    def to_dict(self) -> dict:
        return {"kernel_id": self.kernel_id, "action": self.action, "duration": self.duration, "bytes": self.bytes,
                "pids": list(self.pids), "gpus": list(self.gpus), "waited": self.waited, "message": self.message,
                "declared": self.declared}


@dataclass(frozen=True)
class Notice:
    """Something the upkeep did or announces about a kernel (an eviction warned, or carried out)."""

    kind: str  # warned, culled
    lease: Lease
    reason: str
    message: str
    deadline: float | None = None


@dataclass
class _Kernel:
    """This server's own handles on one kernel: its move lock and resume task, and a cache of its
    ledger state (what the UI shows) for the websocket, which must not read SQLite per message."""

    guard: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    seen: str = ACTIVE  # display_state of the lease as last read or written by this server
    position: int | None = None  # its place in the queue while queued
    wait_reason: str | None = None  # why it waits there, where the pool is not simply full
    resume_task: asyncio.Task | None = None
    placed: asyncio.Event = field(default_factory=asyncio.Event)  # the resume under way has a slice or a queue place
    resume_wanted: bool = False  # a cell arrived while hibernating: give up the hibernation if not too late
    warned_eviction: float | None = None  # the eviction deadline its owner was told of
    taking_first: bool = False  # the move under way takes the kernel's first slice (nothing to restore)
    hint_only: bool = False  # resumed (or resuming) on a hint, and no cell has come for it yet


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
        self.ram_total, self.ram_available = ram_total, ram_available
        self.clock = clock
        self._kernels: dict[str, _Kernel] = {}
        self._unsupported: dict[str, str] = {}  # kernel → the driver's own refusal (801 on a kernel we let try)

    # -- small helpers -------------------------------------------------------------------------

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

    def _k(self, kernel_id: str) -> _Kernel:
        k = self._kernels.get(kernel_id)
        if k is None:
            k = self._kernels[kernel_id] = _Kernel()
        return k

    async def _lease(self, kernel_id: str) -> Lease | None:
        return await asyncio.to_thread(self.ledger.by_kernel, kernel_id)

    async def _move(self, lease: Lease, to: str, *, expect: str, deadline: float | None = None) -> Lease | None:
        """Move the lease's phase from ``expect`` to ``to`` in the ledger (compare-and-set) and show
        the result.  A lease that ended meanwhile is shown released (None is returned); one being
        shut down is its provisioner's until released (returned as it is, unmoved)."""
        def move() -> Lease | None:
            try:
                return self.ledger.set_phase(lease.id, to, expect=expect, deadline=deadline)
            except LeaseNotFound:
                return None
            except PhaseConflict as e:
                if e.found == STOPPING:
                    return self.ledger.get(lease.id)
                raise

        updated = await asyncio.to_thread(move)
        await self._show(lease.kernel_id, display_state(updated) if updated else RELEASED)
        return updated

    async def _show(self, kernel_id: str, seen: str, position: int | None = None, reason: str | None = None) -> None:
        k = self._k(kernel_id)
        if (k.seen, k.position, k.wait_reason) == (seen, position, reason):
            return
        k.seen, k.position, k.wait_reason = seen, position, reason
        async with k.changed:
            k.changed.notify_all()

    def _gpus_of(self, lease: Lease):
        uuids = lease.gpus or lease.last_gpus
        return [g for g in (self.pool.gpu(u) for u in uuids) if g is not None]

    def _driver_version(self) -> str | None:
        return self.pool.inventory.discovery.driver_version

    def _cap(self) -> int | None:
        return self.settings.cap_bytes(self.ram_total())

    @property
    def declared(self) -> bool:
        """The pool's GPUs are declared, not real: no move has GPU memory to carry."""
        return self.pool.inventory.declared

    async def _cuda_states(self, cap: cp.Capability, tree: list[int]) -> dict[int, cp.ProcessState]:
        """The CUDA state of each process of ``tree`` that has one; on declared GPUs none (the driver
        is not asked: there is no GPU memory to move)."""
        if cap.declared or not tree:
            return {}
        return await asyncio.to_thread(cp.cuda_processes, self.driver, tree)

    # -- capability ----------------------------------------------------------------------------

    def capability(self, lease: Lease) -> cp.Capability:
        """Whether this lease's kernel can hibernate at all, and why not (no driver call is made
        for MPS or MIG, refused on what the pool already knows, nor for declared GPUs, which have
        nothing to move)."""
        gpus = self._gpus_of(lease)
        pre = cp.capability(lease.isolation, gpus, cp.DriverInfo(True, remap=True), self._driver_version())
        if not pre.available or pre.declared:
            return pre
        if lease.kernel_id in self._unsupported:
            return cp.Capability(False, "not_supported", self._unsupported[lease.kernel_id])
        return cp.capability(lease.isolation, gpus, self.driver.info(), self._driver_version())

    def can_hibernate(self, lease: Lease) -> tuple[bool, str | None]:
        cap = self.capability(lease)
        return cap.available, None if cap.available else cap.message

    # -- what the UI shows ---------------------------------------------------------------------

    def shown(self, kernel_id: str) -> str:
        """The kernel's state as this server last read or wrote it in the ledger (no I/O: cheap
        enough for every websocket message)."""
        k = self._kernels.get(kernel_id)
        return k.seen if k else ACTIVE

    def asleep(self, kernel_id: str) -> bool:
        """Whether a cell sent now must wait for a resume."""
        return self.shown(kernel_id) in ASLEEP

    def queue_position(self, kernel_id: str) -> int | None:
        k = self._kernels.get(kernel_id)
        return k.position if k and k.seen == QUEUED else None

    def first_slice(self, kernel_id: str) -> bool:
        """Whether the kernel holds no slice yet, or is taking its first one (no I/O)."""
        k = self._kernels.get(kernel_id)
        return k is not None and (k.seen == NO_GPU_YET or k.taking_first)

    def queue_reason(self, kernel_id: str) -> str | None:
        """Why a queued resume waits, where it is not for a free slice ("waiting for 5 GiB of GPU
        memory to be free on GPU 0: 2 GiB is free"); None otherwise."""
        k = self._kernels.get(kernel_id)
        return k.wait_reason if k and k.seen == QUEUED else None

    async def refresh(self, kernel_id: str) -> str:
        """Re-read the kernel's state from the ledger (a restarted server, another server's move)."""
        lease = await self._lease(kernel_id)
        k = self._k(kernel_id)
        if not k.guard.locked():
            await self._show(kernel_id, display_state(lease) if lease else ACTIVE, k.position)
        return k.seen

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        """Wait up to ``timeout`` for the kernel's shown state or queue position to change."""
        k = self._k(kernel_id)
        async with k.changed:
            try:
                await asyncio.wait_for(k.changed.wait(), timeout)
            except TimeoutError:
                pass
        return k.seen

    # -- hibernate -----------------------------------------------------------------------------

    async def hibernate(self, kernel_id: str, reason: str = "idle", *, force: bool = False) -> Outcome:
        """Hibernate the kernel, or raise :class:`HibernationRefused` (nothing changed) or
        :class:`HibernationFailed`.  ``force`` skips the check of the kernel's execution state (the
        lock's timeout still guards its GPU work)."""
        k = self._k(kernel_id)
        if k.guard.locked():
            raise HibernationRefused("in_progress", f"This kernel is already {k.seen}; try again when that is done.")
        async with k.guard:
            k.resume_wanted = False
            k.hint_only = False
            return await self._hibernate(kernel_id, reason, force)

    async def _hibernate(self, kernel_id: str, reason: str, force: bool) -> Outcome:
        lease = await self._lease(kernel_id)
        if lease is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU lease, so there is nothing to hibernate.",
                                     status=404)
        if lease.awaits_first_cell:
            raise HibernationRefused("no_slice", "This kernel holds no GPU slice yet: it takes one when a cell runs.")
        if lease.state == HIBERNATED:
            raise HibernationRefused("hibernated", "This kernel is hibernated already.")
        if lease.phase:
            raise HibernationRefused("in_progress", f"This kernel is {lease.phase}; try again when that is done.")
        cap = self.capability(lease)
        if not cap.available:
            raise HibernationRefused(cap.reason or "unavailable", cap.message or "Hibernation is unavailable.",
                                     keep_running=False)
        if not force and self.kernels.execution_state(kernel_id) == "busy":
            raise HibernationRefused("busy", "This kernel is running a cell; it can hibernate once the cell is done.")
        tree = self.kernels.pids(kernel_id, lease.holder_pid)
        if not tree:
            raise HibernationRefused("no_process", "This kernel's process is not running.")
        states = await self._cuda_states(cap, tree)
        stuck = {pid: s.word for pid, s in states.items() if s != cp.ProcessState.RUNNING}
        if stuck:
            raise HibernationRefused("not_running", f"This kernel's CUDA processes are not all running ({stuck}); "
                                     "it was left mid-move. Resume it, or restart it.")
        pids = sorted(states)
        started = time.monotonic()
        try:
            claimed = await self._move(lease, HIBERNATING, expect="")
        except PhaseConflict as e:
            raise HibernationRefused("in_progress", f"This kernel is {e.found}; try again when that is done.") from None
        if claimed is None or claimed.phase != HIBERNATING:
            raise HibernationRefused("stopping", "This kernel is being shut down.", keep_running=False)
        try:
            if pids and self.settings.release_cache:
                # Bounded like the lock: freeing GPU memory waits for the GPU work in flight.
                timeout = self.settings.lock_timeout + ANSWER_GRACE
                if await self.kernels.release_cache(kernel_id, timeout) == "timeout":
                    raise self._gpu_busy(timeout)
            moved = await self._bytes_held(pids, lease)
            await self._claim_host_ram(lease, moved)
            if pids:
                await self._lock_all(kernel_id, pids, force)
                await self._checkpoint_all(lease, pids)
        except BaseException:
            await self._settle_undone(lease)
            raise
        duration = time.monotonic() - started
        try:
            lease = await asyncio.to_thread(self.ledger.hibernate, lease.id, moved, reason)
        except Exception as e:  # the ledger (a pool service that still sees GPU memory held) refused to record it
            raise await self._undo_checkpoint(lease, pids, e) from None
        await self._show(kernel_id, display_state(lease))
        log.info("kernel %s hibernated (%s): %s in %.1fs, pids %s%s", kernel_id, reason, format_size(moved), duration,
                 pids, f" ({cp.DECLARED_NOTE})" if cap.declared else "")
        message = (f"Nothing moved to host RAM ({cp.DECLARED_NOTE})." if cap.declared
                   else f"{format_size(moved)} of GPU memory moved to host RAM in {duration:.1f} s.")
        return Outcome(kernel_id, "hibernated", duration, moved, tuple(pids), lease.last_gpus, lease=lease,
                       message=message, declared=cap.declared)

    async def _undo_checkpoint(self, lease: Lease, pids: list[int], why: Exception) -> HibernationFailed:
        """The kernel was checkpointed but the hibernation cannot be recorded: put it back on its GPU
        (it still holds its slice), so that it is never left checkpointed with its slice counted held."""
        states = await asyncio.to_thread(self._put_back_running, pids)
        if all(s == cp.ProcessState.RUNNING.word for s in states.values()):
            await self._settle_undone(lease)
            return HibernationFailed(
                "not_recorded", f"The pool did not record this kernel's hibernation ({why}); it was put back on its "
                "GPU and runs as before.", recovered=True, states=states)
        return await self._fail(lease, states, "not_recorded",
                                f"The pool did not record this kernel's hibernation ({why}) and the checkpoint "
                                "could not be undone")

    async def _settle_undone(self, lease: Lease) -> None:
        """A hibernation that did not happen: release its host-RAM claim and clear its phase."""
        current = await self._lease(lease.kernel_id)
        if current is None or current.state != ACTIVE or current.phase == FAILED:
            return  # shut down meanwhile (the over-cap policy may), or failed: its claim stands for what it may hold
        if current.host_bytes:
            await asyncio.to_thread(self.ledger.reserve_host_bytes, current.id, 0, None, current.host)
        if current.phase == HIBERNATING:
            await self._move(current, "", expect=HIBERNATING)
        else:
            await self._show(lease.kernel_id, display_state(current))

    async def _bytes_held(self, pids: list[int], lease: Lease) -> int:
        """What the checkpoint will move: NVML's figure for the processes, else the slice's size."""
        if not pids:
            return 0
        held = await asyncio.to_thread(self.memory.of_processes, pids)
        if held and any(pid in held for pid in pids):
            return sum(held.values())
        return lease.total_memory

    async def _claim_host_ram(self, lease: Lease, needed: int) -> None:
        """Claim host RAM for the checkpoint under the cap, or apply the over-cap policy."""
        if not needed:  # nothing to hold (declared GPUs, a kernel that never used CUDA): always fits
            await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, 0, None, lease.host)
            return
        available = await asyncio.to_thread(self.ram_available)
        if needed + RAM_MARGIN > available:
            raise HibernationRefused(
                "host_ram", f"This machine has {format_size(available)} of RAM free, too little to hold this "
                f"kernel's {format_size(needed)} of GPU memory safely; it keeps running on its GPU.")
        cap = self._cap()
        granted, others = await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, needed, cap, lease.host)
        if granted:
            return
        assert cap is not None
        over = others + needed - cap
        cap_text = self.settings.describe_cap(self.ram_total())
        policy = self.settings.over_cap
        base = (f"Hibernated kernels on this machine hold {format_size(others)} of host RAM; this kernel's "
                f"{format_size(needed)} would pass the cap of {cap_text}.")
        if policy == KEEP_RUNNING or needed > cap:
            raise HibernationRefused("host_memory", base + " It keeps running on its GPU.")
        if policy == SHUTDOWN:  # the caller (the culler) shuts it down, as for any kernel that cannot hibernate
            raise HibernationRefused("host_memory", base + " The pool's setting says to shut it down instead.",
                                     keep_running=False)
        assert policy == EVICT_OLDEST
        deadline = self.clock() + self.settings.eviction_warning
        victims = await asyncio.to_thread(self._mark_victims, lease.host, over, deadline)
        if not victims:
            raise HibernationRefused("host_memory", base + " Kernels already being shut down to make room will free "
                                     "it soon; it keeps running on its GPU until then.",
                                     retry_after=self.settings.eviction_warning)
        raise HibernationRefused(
            "host_memory", base + f" The {len(victims)} kernel(s) hibernated longest will be shut down in "
            f"{format_age(self.settings.eviction_warning)} to make room (their owners are warned); this kernel "
            "keeps running on its GPU until then.", retry_after=self.settings.eviction_warning)

    def _mark_victims(self, host: str, over: int, deadline: float) -> list[Lease]:
        """Mark the longest-hibernated leases on ``host`` for eviction until ``over`` bytes are covered
        (those already marked count).  Runs in a thread."""
        hibernated = sorted((lease for lease in self.ledger.leases(states=(HIBERNATED,))
                             if lease.host == host), key=lambda lease: lease.state_since)
        covered = sum(lease.host_bytes for lease in hibernated if lease.phase == EVICTING)
        marked = []
        for lease in hibernated:
            if covered >= over:
                break
            if lease.phase or lease.awaits_first_cell:
                continue  # evicting already, or resuming; or it never held anything (no host RAM to free)
            try:
                self.ledger.set_phase(lease.id, EVICTING, expect="", deadline=deadline)
            except (LeaseNotFound, PhaseConflict):
                continue  # ended, or its own server started moving it
            covered += lease.host_bytes
            marked.append(lease)
        return marked

    async def _lock_all(self, kernel_id: str, pids: list[int], force: bool) -> None:
        locked: list[int] = []
        timeout = self.settings.lock_timeout
        try:
            for pid in pids:
                await asyncio.to_thread(self.driver.lock, pid, timeout)
                locked.append(pid)
        except cp.LockTimeout:
            await self._unlock(locked)
            raise self._gpu_busy() from None
        except cp.NotSupported as e:
            await self._unlock(locked)
            message = (f"The CUDA driver cannot checkpoint this kernel ({e.error_name}): it may use MPS, MIG, "
                       "CUDA IPC or multi-process NCCL. It was left running, untouched, and can only be shut down "
                       "to free its slice.")
            self._unsupported[kernel_id] = message
            raise HibernationRefused("not_supported", message, keep_running=False) from None
        except cp.CheckpointError as e:
            await self._unlock(locked)
            raise HibernationRefused("lock_failed", f"Could not pause this kernel's GPU work ({e}); it was left "
                                     "running, untouched.") from None
        busy = not force and self.kernels.execution_state(kernel_id) == "busy"
        if busy or self._k(kernel_id).resume_wanted:
            await self._unlock(locked)
            raise HibernationRefused("in_use", "A cell was started on this kernel while it was being hibernated; "
                                     "it was left running.")

    def _gpu_busy(self, waited: float | None = None) -> HibernationRefused:
        return HibernationRefused(
            "gpu_busy", f"This kernel's GPU work did not finish within {waited or self.settings.lock_timeout:g} s, "
            "so it was left running, untouched; it can hibernate once its GPU is quiet.")

    async def _unlock(self, pids: list[int]) -> None:
        for pid in pids:
            try:
                await asyncio.to_thread(self.driver.unlock, pid)
            except cp.CheckpointError:
                log.exception("could not unlock pid %s", pid)

    async def _checkpoint_all(self, lease: Lease, pids: list[int]) -> None:
        done: list[int] = []
        try:
            for pid in pids:
                await asyncio.to_thread(self.driver.checkpoint, pid)
                done.append(pid)
        except cp.CheckpointError as e:
            states = await asyncio.to_thread(self._put_back_running, pids)
            if all(s == cp.ProcessState.RUNNING.word for s in states.values()):
                raise HibernationFailed(
                    "checkpoint_failed", f"The checkpoint of this kernel failed ({e}); everything was put back as it "
                    "was and the kernel runs on its GPU.", recovered=True, states=states) from None
            raise await self._fail(lease, states, "checkpoint_failed",
                                   f"The checkpoint of this kernel failed ({e}) and could not be undone") from None

    def _put_back_running(self, pids: list[int]) -> dict[int, str]:
        """Bring each process back to RUNNING on the GPU it still holds; return where each ended."""
        return moves.put_back_running(self.driver, pids)

    def _put_back_checkpointed(self, pids: list[int]) -> dict[int, str]:
        """Bring each process back to CHECKPOINTED (its memory in host RAM); return where each ended."""
        return moves.put_back_checkpointed(self.driver, pids, self.settings.lock_timeout)

    async def _fail(self, lease: Lease, states: dict[int, str], reason: str, what: str) -> HibernationFailed:
        """Past the point of no return: mark the lease failed; return the failure, which says exactly
        where things are (its caller puts it on record)."""
        where = "; ".join(f"pid {pid}: CUDA {state}" for pid, state in sorted(states.items()))
        current = await self._lease(lease.kernel_id)
        holds = ("still holds its GPU slice" if current is not None and current.state == ACTIVE
                 else "holds no GPU slice")
        message = (f"{what}: {where}. The kernel {holds}; its GPU state cannot be trusted. Save what you can "
                   "(CPU-only code still runs) and restart the kernel.")
        if current is not None and current.phase != FAILED:
            await self._move(current, FAILED, expect=current.phase)
        log.error("kernel %s: %s", lease.kernel_id, message)
        return HibernationFailed(reason, message, recovered=False, states=states)

    # -- resume --------------------------------------------------------------------------------

    def start_resume(self, kernel_id: str, reason: str = "user", *, hint: bool = False) -> asyncio.Task:
        """Start resuming (or join the resume under way) and return its task at once.

        ``hint``: only if a slice is free now and nobody waits (declined with a :class:`HibernationRefused`
        otherwise, nothing changed); a hint joins a resume under way without changing it.  A resume
        that is not a hint (a cell, the user's Resume) makes a hinted one under way its own: it then
        waits in the queue where the hint would have given up."""
        k = self._k(kernel_id)
        running = k.resume_task is not None and not k.resume_task.done()
        if hint and running:
            return k.resume_task  # type: ignore[return-value]
        if not hint:
            k.hint_only = False
        if k.seen == HIBERNATING and not hint:
            k.resume_wanted = True  # if still before the checkpoint, the hibernation gives up
        if not running:
            k.hint_only = hint
            k.placed.clear()
            k.resume_task = asyncio.ensure_future(self._resume_guarded(kernel_id, reason))
            k.resume_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        return k.resume_task

    def hinted(self, kernel_id: str) -> bool:
        """Whether the kernel was resumed (or is resuming) on a hint and no cell has come since (no I/O)."""
        k = self._kernels.get(kernel_id)
        return bool(k and k.hint_only)

    def used(self, kernel_id: str) -> None:
        """A cell came for the kernel: a hint that woke it was right (it is no longer :meth:`hinted`)."""
        k = self._kernels.get(kernel_id)
        if k is not None:
            k.hint_only = False

    async def resume(self, kernel_id: str, reason: str = "user") -> Outcome:
        """Resume the kernel and return once it runs on a GPU again (queue wait included)."""
        return await asyncio.shield(self.start_resume(kernel_id, reason))

    async def placed(self, kernel_id: str, timeout: float) -> None:
        """Wait up to ``timeout`` for the resume under way to take a slice or a place in the queue, or
        to end (refused, say, for quota or budget): what a caller can then tell its user at once."""
        k = self._k(kernel_id)
        if k.resume_task is None or k.resume_task.done():
            return
        waiter = asyncio.ensure_future(k.placed.wait())
        try:
            await asyncio.wait([k.resume_task, waiter], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _resume_guarded(self, kernel_id: str, reason: str) -> Outcome:
        k = self._k(kernel_id)
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
        lease = await self._lease(kernel_id)
        if lease is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU lease (it was shut down).", status=404)
        if lease.state == ACTIVE and not lease.phase:
            await self._show(kernel_id, ACTIVE)
            return Outcome(kernel_id, "resumed", gpus=lease.gpus, lease=lease)  # awake already
        if lease.phase == STOPPING:
            raise HibernationRefused("stopping", "This kernel is shutting down; there is nothing to resume.")
        if lease.state != HIBERNATED or lease.phase == FAILED:
            raise HibernationRefused("not_hibernated", f"This kernel is {display_state(lease)}"
                                     f"{' (' + lease.phase + ')' if lease.phase else ''}; there is nothing to resume.")
        if lease.awaits_first_cell:
            return await self._first_slice(kernel_id, lease, started)
        cap = self.capability(lease)
        tree = self.kernels.pids(kernel_id, lease.holder_pid)
        states = await self._cuda_states(cap, tree)
        pids = sorted(pid for pid, s in states.items() if s == cp.ProcessState.CHECKPOINTED)
        try:
            claimed = await self._move(lease, RESUMING, expect=lease.phase)
        except PhaseConflict as e:
            raise HibernationRefused("in_progress", f"This kernel is {e.found}; try again when that is done.") from None
        if claimed is None or claimed.phase != RESUMING:
            raise HibernationRefused("stopping", "This kernel is shutting down; there is nothing to resume.")
        moved = lease.host_bytes
        new: Lease | None = None
        pairs = None
        restored: list[int] = []
        try:
            # Another GPU only where the driver can restore there, or nothing is to be restored on a declared one.
            same_gpu = not (cap.declared or (cap.remap and pids))
            new, waited = await self._take_slice(lease, same_gpu, moved if pids else 0)
            if cap.declared:  # a modelled restore time, where a benchmark set one (none by default)
                await asyncio.sleep(self.settings.declared_restore_seconds(lease.total_memory))
            pairs = list(zip(lease.last_gpus, new.gpus)) if pids and new.gpus != lease.last_gpus else None
            try:
                await self._restore_all(pids, pairs, restored)
            except cp.CheckpointError as e:
                if pairs is None or restored or not await self._still_checkpointed(pids):
                    raise
                # The driver would not restore onto the other GPU: give that slice back, wait for the old one.
                log.warning("kernel %s: restore onto %s refused (%s); waiting for its own GPU", kernel_id,
                            new.gpus, e)
                await asyncio.to_thread(self.ledger.hibernate, new.id, moved, "restore elsewhere refused",
                                        lease.last_gpus, RESUMING)
                new, more = await self._take_slice(lease, True, moved)
                waited += more
                pairs = None
                await self._restore_all(pids, None, restored)
            await self._unlock(pids)
        except HibernationRefused:
            await self._settle(kernel_id, HIBERNATED)
            raise
        except cp.CheckpointError as e:
            home = new.gpus if new is not None and pairs and restored else lease.last_gpus  # where the memory is
            raise await self._undo_resume(lease, pids, e, home) from None
        except asyncio.CancelledError:
            await self._settle(kernel_id, HIBERNATED)
            raise
        settled = await self._settle(kernel_id, ACTIVE) or new
        duration = time.monotonic() - started
        where = "" if new.gpus == lease.last_gpus else " on another GPU of the same model"
        queued = f" after {waited:.0f} s in the queue" if waited >= 1 else ""
        log.info("kernel %s resumed (%s) on %s in %.1fs%s%s", kernel_id, reason, new.gpus, duration, queued,
                 f" ({cp.DECLARED_NOTE})" if cap.declared else "")
        moved_text = (f"{cp.DECLARED_NOTE}" if cap.declared
                      else f"{format_size(moved)} back on the GPU in {duration:.1f} s")
        return Outcome(kernel_id, "resumed", duration, moved, tuple(pids), new.gpus, waited, lease=settled,
                       message=f"Resumed{where}{queued}: {moved_text}; every variable is as it was.",
                       declared=cap.declared)

    async def _first_slice(self, kernel_id: str, lease: Lease, started: float) -> Outcome:
        """A kernel that started without a slice takes one (its first cell, its rule's ``slice_at``): the same
        claim, allocation decision and queue as a resume, with nothing to restore; then, before the cell
        runs, the slice's environment goes into the running kernel (CUDA reads it when the process first
        initialises it).  Where that fails, the slice goes back and the kernel holds nothing, as before."""
        try:
            claimed = await self._move(lease, RESUMING, expect=lease.phase)
        except PhaseConflict as e:
            raise HibernationRefused("in_progress", f"This kernel is {e.found}; try again when that is done.") from None
        if claimed is None or claimed.phase != RESUMING:
            raise HibernationRefused("stopping", "This kernel is shutting down; it takes no GPU slice.")
        self._k(kernel_id).taking_first = True
        try:
            return await self._take_first_slice(kernel_id, lease, started)
        finally:
            self._k(kernel_id).taking_first = False

    async def _take_first_slice(self, kernel_id: str, lease: Lease, started: float) -> Outcome:
        try:
            new, waited = await self._take_slice(lease, False, 0, refusal="")
            code = await self.kernels.environment_code(kernel_id, new)
            ran = await self.kernels.run_silently(kernel_id, code, ENVIRONMENT_TIMEOUT) if code else "ran"
        except BaseException:  # refused, cancelled (the kernel shut down), or the pool unreachable
            await self._give_first_slice_back(kernel_id)
            raise
        if ran != "ran":
            await self._give_first_slice_back(kernel_id)
            raise HibernationRefused("environment_failed", f"This kernel took its GPU slice but could not be given "
                                     f"the slice's environment ({ran}), so the slice was given back. Run the cell "
                                     "again, or restart the kernel.")
        settled = await self._settle(kernel_id, ACTIVE) or new
        gpus = ", ".join(g.label for g in self._gpus_of(new)) or "the pool"
        queued = f" after {waited:.0f} s in the queue" if waited >= 1 else ""
        log.info("kernel %s took its GPU slice at its first cell on %s%s", kernel_id, new.gpus, queued)
        return Outcome(kernel_id, "took_slice", time.monotonic() - started, gpus=new.gpus, waited=waited,
                       lease=settled, message=f"This kernel took its GPU slice ({new.slice}) on {gpus}{queued}.",
                       declared=self.declared)

    async def _give_first_slice_back(self, kernel_id: str) -> None:
        """A first slice given up (refused, cancelled, its environment not set): the kernel holds nothing."""
        current = await self._lease(kernel_id)
        if current is not None and current.state == ACTIVE:
            await asyncio.to_thread(self.ledger.hibernate, current.id, 0, FIRST_CELL_REASON, (), current.phase)
        await self._settle(kernel_id, HIBERNATED)

    async def _settle(self, kernel_id: str, state: str) -> Lease | None:
        """A resume ended: a lease in ``state`` with a resume's phase is settled (phase cleared)."""
        current = await self._lease(kernel_id)
        if current is not None and current.state == state and current.phase in IN_FLIGHT:
            return await self._move(current, "", expect=current.phase)
        await self._show(kernel_id, display_state(current) if current else RELEASED)
        return current

    async def _take_slice(self, lease: Lease, same_gpu: bool, need: int,
                          refusal: str = "Cannot resume this kernel: ") -> tuple[Lease, float]:
        """Take a slice for the lease, waiting in the queue (phase ``queued``) while the pool is full or,
        for ``need`` bytes to restore, while its GPU lacks that much free memory plus the margin.  A quota's
        or budget's refusal is raised with the pool's words after ``refusal``."""
        place = Place(lease.owner, lease.kernel_id, lease.profile, lease.slice, lease_id=lease.id, label=lease.label,
                      groups=lease.groups)
        wait: dict = {"position": None, "reason": None, "only_last": same_gpu}

        def attempt(waiter_id: str | None) -> Lease:
            only_last = wait["only_last"]
            if need:  # safe wake: checked before the ledger is asked, so a wait keeps its place in the queue
                self._check_room(self._candidates(lease, only_last), need, len(lease.last_gpus))
            new = self.pool.resume(lease, only_last, waiter_id, record_refusal=False)
            if need and not only_last:
                try:  # the ledger picks among the GPUs of the model, not necessarily one that had room
                    self._check_room(list(new.gpus), need, len(new.gpus))
                except GPUMemoryShort:  # give it back, and wait for the kernel's own GPU from now on
                    self.ledger.hibernate(new.id, lease.host_bytes, "GPU memory taken meanwhile", lease.last_gpus,
                                          new.phase)
                    wait["only_last"] = True
                    raise
            return new

        async def queued(position: int) -> None:
            wait["position"] = position
            current = await self._lease(lease.kernel_id)
            if current is not None and current.phase == RESUMING:
                await self._move(current, QUEUED, expect=RESUMING)
            await self._show(lease.kernel_id, QUEUED, position, wait["reason"])
            self._k(lease.kernel_id).placed.set()  # once the ledger and what is shown say queued

        async def refused(refusal) -> None:
            wait["reason"] = str(refusal) if isinstance(refusal, GPUMemoryShort) else None
            if wait["position"] is not None:
                await self._show(lease.kernel_id, QUEUED, wait["position"], wait["reason"])

        k = self._k(lease.kernel_id)
        if k.hint_only:
            taken = await asyncio.to_thread(self._take_slice_now, lease, attempt)
            if isinstance(taken, Lease):
                k.placed.set()
                return taken, 0.0
            if k.hint_only:  # no cell came meanwhile: decline, nothing taken, nothing queued
                raise taken
            # else a cell came while the hint tried: it waits in the queue like any resume
        try:
            new, waited = await wait_for_slice(self.ledger, attempt, place, poll=self.settings.queue_poll,
                                               on_position=queued, on_refusal=refused)
        except (QuotaExceeded, BudgetExceeded) as e:
            raise HibernationRefused(e.reason, f"{refusal}{e}", status=403) from None
        except LeaseNotFound:
            raise HibernationRefused("no_lease", "This kernel's GPU lease ended while it waited to resume.",
                                     status=404) from None
        self._k(lease.kernel_id).placed.set()
        if new.phase == QUEUED:
            new = await self._move(new, RESUMING, expect=QUEUED) or new
        return new, waited

    def _take_slice_now(self, lease: Lease, attempt: Callable[[str | None], Lease]) -> Lease | HibernationRefused:
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

    def _candidates(self, lease: Lease, same_gpu: bool) -> list[str]:
        """The GPUs a resume may land on: its last ones, or any of the same model."""
        if same_gpu:
            return list(lease.last_gpus)
        models = {g.name for g in self._gpus_of(lease)}
        return [g.uuid for g in self.pool.inventory.gpus if g.name in models] or list(lease.last_gpus)

    def _check_room(self, uuids: list[str], need: int, count: int) -> None:
        """Raise :class:`GPUMemoryShort` unless ``count`` of ``uuids`` each have their share of ``need``
        free plus the margin, as the driver counts it (a GPU it cannot read is not held against the
        resume).  Runs in a thread (NVML)."""
        gpus = [g for g in (self.pool.gpu(u) for u in uuids) if g is not None]
        per_gpu = need // max(count, 1) + self.settings.resume_margin
        if gpus:  # a checkpoint sized from the slice (NVML could not see the process) never needs more than exists
            per_gpu = min(per_gpu, int(min(g.memory for g in gpus) * USABLE))
        free = {uuid: self.memory.free(uuid) for uuid in uuids}
        if sum(1 for f in free.values() if f is None or f >= per_gpu) >= count:
            return
        best = max((f for f in free.values() if f is not None), default=0)
        where = " or ".join(f"GPU {g.index}" for g in gpus) or "its GPU"
        raise GPUMemoryShort(
            f"waiting for {format_size(per_gpu)} of GPU memory to be free on {where} ({format_size(best)} is free "
            "now; other processes hold the rest)", tuple(uuids), per_gpu)

    async def _restore_all(self, pids: list[int], pairs: list[tuple[str, str]] | None, restored: list[int]) -> None:
        """Restore each checkpointed process, appending each done to ``restored``."""
        for pid in pids:
            if await asyncio.to_thread(self.driver.state, pid) == cp.ProcessState.CHECKPOINTED:
                await asyncio.to_thread(self.driver.restore, pid, pairs)
                restored.append(pid)

    async def _still_checkpointed(self, pids: list[int]) -> bool:
        try:
            states = [await asyncio.to_thread(self.driver.state, pid) for pid in pids]
        except cp.CheckpointError:
            return False
        return all(s == cp.ProcessState.CHECKPOINTED for s in states)

    async def _undo_resume(self, lease: Lease, pids: list[int], error: cp.CheckpointError,
                           home: tuple[str, ...]) -> HibernationFailed:
        """A restore failed with a slice taken: checkpoint what was restored and give the slice back.
        Returns the error to raise."""
        states = await asyncio.to_thread(self._put_back_checkpointed, pids)
        if all(s == cp.ProcessState.CHECKPOINTED.word for s in states.values()):
            current = await self._lease(lease.kernel_id)
            if current is not None and current.state == ACTIVE:
                current = await asyncio.to_thread(self.ledger.hibernate, current.id, lease.host_bytes,
                                                  "resume failed", home)
            await self._settle(lease.kernel_id, HIBERNATED)
            return HibernationFailed("restore_failed", f"Restoring this kernel's GPU memory failed ({error}); it is "
                                     "hibernated as before and its slice was given back. Try again, or restart it.",
                                     recovered=True, states=states)
        return await self._fail(lease, states, "restore_failed",
                                f"Restoring this kernel's GPU memory failed ({error}) and could not be undone")

    # -- upkeep --------------------------------------------------------------------------------

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone (shut down): stop any resume of it and drop what we keep."""
        k = self._kernels.pop(kernel_id, None)
        self._unsupported.pop(kernel_id, None)
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
            k = self._k(lease.kernel_id)
            if k.guard.locked():
                continue
            if lease.phase == EVICTING:
                notices += await self._evict(lease, k, now)
            elif lease.phase in IN_FLIGHT:
                notices += await self._recover(lease)
            else:
                await self._show(lease.kernel_id, display_state(lease), k.position)
        for kernel_id in [kid for kid in self._kernels if not self.kernels.has(kid)]:
            self.forget(kernel_id)
        return notices

    async def _evict(self, lease: Lease, k: _Kernel, now: float) -> list[Notice]:
        deadline = lease.phase_deadline or now
        if lease.state != HIBERNATED:  # resumed by its user before the deadline: spared
            await self._move(lease, "", expect=EVICTING)
            return []
        notices = []
        if k.warned_eviction != deadline:
            k.warned_eviction = deadline
            notices.append(Notice(
                "warned", lease, "host_memory",
                f"Hibernated kernels on this machine use up the host RAM set aside for them: this kernel, hibernated "
                f"for {format_age(now - lease.state_since)}, will be shut down in {format_age(max(deadline - now, 0))} "
                "to make room, unless you resume it (run a cell) or save your work first.", deadline))
        if now >= deadline:
            notices.append(Notice("culled", lease, "host_memory",
                                  "Shut down to make room in the host RAM set aside for hibernated kernels: it had "
                                  f"been hibernated for {format_age(now - lease.state_since)}."))
            await self.kernels.shutdown(lease.kernel_id, now=True, reason="host_memory")
            self.forget(lease.kernel_id)
        return notices

    async def _recover(self, lease: Lease) -> list[Notice]:
        """A lease left in a transient phase with no move under way here: settle it by the processes'
        real CUDA states."""
        if lease.state == HIBERNATED:
            await self._move(lease, "", expect=lease.phase)  # the queue wait or resume ended with its server
            return []
        tree = self.kernels.pids(lease.kernel_id, lease.holder_pid)
        states = await self._cuda_states(self.capability(lease), tree)
        if any(s in (cp.ProcessState.CHECKPOINTED, cp.ProcessState.LOCKED) for s in states.values()):
            result = await asyncio.to_thread(self._put_back_running, sorted(states))
            if not all(s == cp.ProcessState.RUNNING.word for s in result.values()):
                failed = await self._fail(lease, result, "recovery_failed",
                                          "A move of this kernel was interrupted and could not be undone")
                return [Notice("hibernation_failed", lease, failed.reason, failed.message)]
        await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, 0, None, lease.host)
        await self._move(lease, "", expect=lease.phase)
        return []
