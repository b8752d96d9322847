"""The hibernator: moves an idle kernel's GPU memory to host RAM and back, keeping the kernel alive.

Hibernate: refuse early and plainly (capability, busy kernel, host-RAM cap, free RAM), release the
framework's cached memory, *lock* every CUDA process of the kernel's process tree (the driver waits
up to ``lock_timeout`` for submitted GPU work; a kernel still busy is left running, untouched),
*checkpoint* them, then mark the lease ``hibernated`` (its slice goes back to the pool).

Resume: take a slice again (its last GPU, else another of the same model where the driver can
restore there), *restore*, *unlock*.  No slice free: the resume waits in the pool's queue and its
position is reported; nothing hangs silently.

Every failure either puts everything back as it was (the kernel runs on, the lease stays as it
was) or, past the point of no return, marks the lease ``failed`` and says where each process was
left.  Blocking calls (driver, ledger, NVML) run in threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..devices import checkpoint as cp
from ..pool import ACTIVE, HIBERNATED, Lease, LeaseNotFound, PoolExhausted, QuotaExceeded, format_size
from ..pool.errors import format_age
from ..pool.leases import STOPPING
from . import metrics
from .errors import HibernationFailed, HibernationRefused
from .kernels import Kernels, available_ram, machine_ram
from .phases import EVICTING, FAILED, HIBERNATING, IN_FLIGHT, QUEUED, RESUMING, check_move, display_state
from .settings import EVICT_OLDEST, KEEP_RUNNING, SHUTDOWN, HibernationSettings

log = logging.getLogger(__name__)

RAM_MARGIN = 2 * 2**30  # keep this much RAM free beyond a checkpoint, for everything else on the machine
ANSWER_GRACE = 5.0  # seconds, beyond the lock timeout, for a kernel to answer the silent cache release

Emit = Callable[[dict], None]


@dataclass(frozen=True)
class Outcome:
    """A completed move: ``action`` hibernated, resumed or shutdown."""

    kernel_id: str
    action: str
    duration: float = 0.0
    bytes: int = 0
    pids: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()
    waited: float = 0.0  # seconds a resume spent in the queue

    def to_dict(self) -> dict:
        return {"kernel_id": self.kernel_id, "action": self.action, "duration": self.duration, "bytes": self.bytes,
                "pids": list(self.pids), "gpus": list(self.gpus), "waited": self.waited}


@dataclass
class _Kernel:
    """What this server keeps in memory about one kernel between ledger reads."""

    guard: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    shown: str = ACTIVE  # the state the UI shows
    resume_task: asyncio.Task | None = None
    resume_wanted: bool = False  # a cell arrived while hibernating: give up the hibernation if not too late
    position: int | None = None
    message: str | None = None  # the last refusal or failure, for the UI
    warned_eviction: float | None = None  # the deadline the owner was warned of
    last: dict = field(default_factory=dict)  # "hibernated" / "resumed" → outcome dict


class Hibernator:
    """Hibernation of this server's kernels on the local pool (the server extension's hook)."""

    def __init__(self, pool, kernels: Kernels, settings: HibernationSettings | None = None, *,
                 driver: cp.Driver | None = None, memory_of=None, emit: Emit | None = None,
                 ram_total: Callable[[], int] = machine_ram, ram_available: Callable[[], int] = available_ram,
                 clock: Callable[[], float] = time.time):
        self.pool = pool
        self.kernels = kernels
        self.settings = settings or getattr(pool.settings, "hibernation", None) or HibernationSettings()
        self._driver = driver
        self._memory_of = memory_of
        self.emit = emit or (lambda event: None)
        self.ram_total, self.ram_available = ram_total, ram_available
        self.clock = clock
        self._kernels: dict[str, _Kernel] = {}
        self._unsupported: dict[str, str] = {}  # kernel → the driver's own refusal (801 on a kernel we let try)

    # -- small helpers -------------------------------------------------------------------------

    @property
    def driver(self) -> cp.Driver:
        """The checkpoint driver: the one given, else ``devices.checkpoint.driver()`` (looked up on use)."""
        return self._driver if self._driver is not None else cp.driver()

    def memory_of(self, pids: list[int]) -> dict[int, int] | None:
        return (self._memory_of or cp.gpu_memory_of)(pids)

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

    async def _set_phase(self, lease: Lease, phase: str, deadline: float | None = None) -> None:
        """Move the lease to ``phase`` if the state machine (phases.MOVES) allows it from where the
        lease is now; a lease that ended meanwhile is shown as released."""
        def move() -> Lease | None:
            current = self.ledger.get(lease.id)
            if current is None or current.state not in (ACTIVE, HIBERNATED):
                return None
            if current.phase == STOPPING:
                return current  # being shut down: the provisioner owns the lease until it releases it
            check_move(current.state, current.phase, phase)
            return self.ledger.set_phase(lease.id, phase, deadline)

        try:
            updated = await asyncio.to_thread(move)
        except LeaseNotFound:
            updated = None
        await self._show(lease.kernel_id, display_state(updated) if updated else "released")

    async def _show(self, kernel_id: str, shown: str, position: int | None = None) -> None:
        k = self._k(kernel_id)
        if (k.shown, k.position) == (shown, position):
            return
        k.shown, k.position = shown, position
        async with k.changed:
            k.changed.notify_all()

    def _event(self, action: str, lease: Lease, reason: str, message: str, **extra) -> None:
        event = {"action": action, "kernel_id": lease.kernel_id, "user": lease.owner, "profile": lease.profile,
                 "reason": reason, "message": message, **{k: v for k, v in extra.items() if v is not None}}
        try:
            self.emit(event)
        except Exception:  # an event sink must never break a hibernation
            log.exception("could not emit the %s event of kernel %s", action, lease.kernel_id)

    def _gpus_of(self, lease: Lease):
        uuids = lease.gpus or lease.last_gpus
        return [g for g in (self.pool.gpu(u) for u in uuids) if g is not None]

    def _driver_version(self) -> str | None:
        inventory = getattr(self.pool, "inventory", None)
        return getattr(getattr(inventory, "discovery", None), "driver_version", None)

    def _cap(self) -> int | None:
        return self.settings.cap_bytes(self.ram_total())

    # -- capability ----------------------------------------------------------------------------

    def capability(self, lease: Lease) -> cp.Capability:
        """Whether this lease's kernel can hibernate at all, and why not (no driver call is made
        for MPS, MIG or declared GPUs: those are refused on what the pool already knows)."""
        gpus = self._gpus_of(lease)
        pre = cp.capability(lease.isolation, gpus, cp.DriverInfo(True, remap=True), self._driver_version())
        if not pre.available:
            return pre
        if lease.kernel_id in self._unsupported:
            return cp.Capability(False, "not_supported", self._unsupported[lease.kernel_id])
        return cp.capability(lease.isolation, gpus, self.driver.info(), self._driver_version())

    def can_hibernate(self, kernel_id: str, lease: Lease | None = None) -> tuple[bool, str | None]:
        """The hook's question.  Pass the lease where the caller has one; otherwise the ledger is read
        (a short SQLite read)."""
        lease = lease or self.ledger.by_kernel(kernel_id)
        if lease is None:
            return False, "This kernel holds no GPU lease."
        cap = self.capability(lease)
        return cap.available, cap.message

    # -- what the UI shows ---------------------------------------------------------------------

    def shown(self, kernel_id: str) -> str:
        """The state the UI shows, from memory (cheap enough for every websocket message)."""
        k = self._kernels.get(kernel_id)
        return k.shown if k else ACTIVE

    def asleep(self, kernel_id: str) -> bool:
        """Whether a cell sent now must wait for a resume."""
        return self.shown(kernel_id) in (HIBERNATING, HIBERNATED, RESUMING, QUEUED)

    async def refresh(self, kernel_id: str) -> str:
        """Re-read the kernel's state from the ledger (a restarted server, another server's move)."""
        lease = await self._lease(kernel_id)
        k = self._k(kernel_id)
        if not k.guard.locked():
            await self._show(kernel_id, display_state(lease) if lease else ACTIVE, k.position)
        return k.shown

    def state(self, kernel_id: str, lease: Lease | None = None) -> dict:
        """The kernel's hibernation facts for ``GET me``: state, queue position, capability, last moves."""
        k = self._kernels.get(kernel_id) or _Kernel()
        moving = k.guard.locked() or (k.resume_task is not None and not k.resume_task.done())
        shown = k.shown if moving or lease is None else display_state(lease)
        out = {"state": shown, "queue_position": k.position if shown == QUEUED else None, "message": k.message,
               "last": dict(k.last)}
        if lease is not None:
            cap = self.capability(lease)
            out.update(can_hibernate=cap.available, hibernate_unavailable=cap.message, host_bytes=lease.host_bytes,
                       hibernated_since=lease.state_since if lease.state == HIBERNATED else None,
                       phase=lease.phase or None, phase_deadline=lease.phase_deadline)
        return out

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        """Wait up to ``timeout`` for the kernel's shown state or queue position to change."""
        k = self._k(kernel_id)
        async with k.changed:
            try:
                await asyncio.wait_for(k.changed.wait(), timeout)
            except TimeoutError:
                pass
        return k.shown

    def queue_position(self, kernel_id: str) -> int | None:
        k = self._kernels.get(kernel_id)
        return k.position if k and k.shown == QUEUED else None

    # -- hibernate -----------------------------------------------------------------------------

    async def hibernate(self, kernel_id: str, reason: str = "idle", *, force: bool = False) -> Outcome:
        """Hibernate the kernel, or raise :class:`HibernationRefused` (nothing changed) or
        :class:`HibernationFailed`.  ``force`` skips the check of the kernel's execution state (the
        lock's timeout still guards its GPU work)."""
        k = self._k(kernel_id)
        if k.guard.locked():
            raise HibernationRefused("in_progress", f"This kernel is already {k.shown}; try again when that is done.")
        async with k.guard:
            k.resume_wanted = False
            return await self._recorded(k, metrics.HIBERNATIONS, "hibernated",
                                        self._hibernate(kernel_id, reason, force))

    @staticmethod
    async def _recorded(k: _Kernel, counter, done: str, move) -> Outcome:
        """Await one move (a hibernation or a resume): keep its refusal or failure message for
        GET me and count its result."""
        try:
            outcome = await move
        except (HibernationRefused, HibernationFailed) as e:
            k.message = e.message
            counter.labels("refused" if isinstance(e, HibernationRefused) else "failed").inc()
            raise
        k.message = None
        counter.labels(done).inc()
        return outcome

    async def _hibernate(self, kernel_id: str, reason: str, force: bool) -> Outcome:
        lease = await self._lease(kernel_id)
        if lease is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU lease, so there is nothing to hibernate.",
                                     status=404)
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
        states = await asyncio.to_thread(cp.cuda_processes, self.driver, tree)
        stuck = {pid: s.word for pid, s in states.items() if s != cp.ProcessState.RUNNING}
        if stuck:
            raise HibernationRefused("not_running", f"This kernel's CUDA processes are not all running ({stuck}); "
                                     "it was left mid-move. Resume it, or restart it.")
        pids = sorted(states)
        started = time.monotonic()
        await self._set_phase(lease, HIBERNATING)
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
        lease = await asyncio.to_thread(self.ledger.hibernate, lease.id, moved, reason)
        await self._set_phase(lease, "")
        outcome = Outcome(kernel_id, "hibernated", duration, moved, tuple(pids), lease.last_gpus)
        self._k(kernel_id).last["hibernated"] = {**outcome.to_dict(), "at": self.clock(), "reason": reason}
        metrics.HIBERNATE_SECONDS.observe(duration)
        metrics.MOVED_BYTES.labels("to_host").inc(moved)
        await self._update_gauges()
        self._event("hibernated", lease, reason,
                    f"Hibernated: {format_size(moved)} of GPU memory moved to host RAM in {duration:.1f} s; "
                    "its variables are kept and the GPU slice is free. Run a cell to resume.",
                    duration=round(duration, 3), bytes=moved)
        log.info("kernel %s hibernated (%s): %s in %.1fs, pids %s", kernel_id, reason, format_size(moved), duration,
                 pids)
        return outcome

    async def _settle_undone(self, lease: Lease) -> None:
        """A hibernation that did not happen: release its host-RAM claim and clear its phase."""
        current = await self._lease(lease.kernel_id)
        if current is None or current.state != ACTIVE or current.phase == FAILED:
            return  # shut down meanwhile (the over-cap policy may), or failed: its claim stands for what it may hold
        if current.host_bytes:
            await asyncio.to_thread(self.ledger.reserve_host_bytes, current.id, 0, None, current.host)
        if current.phase == HIBERNATING:
            await self._set_phase(current, "")

    async def _bytes_held(self, pids: list[int], lease: Lease) -> int:
        """What the checkpoint will move: NVML's figure for the processes, else the slice's size."""
        if not pids:
            return 0
        held = await asyncio.to_thread(self.memory_of, pids)
        if held and any(pid in held for pid in pids):
            return sum(held.values())
        return lease.total_memory

    async def _claim_host_ram(self, lease: Lease, needed: int) -> None:
        """Claim host RAM for the checkpoint under the cap, or apply the over-cap policy."""
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
            self._event("refused", lease, "host_memory", base + " It keeps running on its GPU.")
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
        message = (base + f" The {len(victims)} kernel(s) hibernated longest will be shut down in "
                   f"{format_age(self.settings.eviction_warning)} to make room (their owners are warned); "
                   "this kernel keeps running on its GPU until then.")
        self._event("refused", lease, "host_memory", message)
        raise HibernationRefused("host_memory", message, retry_after=self.settings.eviction_warning)

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
            if lease.phase:
                continue  # evicting already, or resuming
            try:
                self.ledger.set_phase(lease.id, EVICTING, deadline)
            except LeaseNotFound:
                continue
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
            await self._fail(lease, states, f"The checkpoint of this kernel failed ({e}) and could not be undone")
            raise HibernationFailed("checkpoint_failed", self._k(lease.kernel_id).message or "", recovered=False,
                                    states=states) from None

    def _put_back_running(self, pids: list[int]) -> dict[int, str]:
        """Bring each process back to RUNNING on the GPU it still holds; return where each ended."""
        states: dict[int, str] = {}
        for pid in pids:
            try:
                state = self.driver.state(pid)
                if state == cp.ProcessState.CHECKPOINTED:
                    self.driver.restore(pid)
                    state = cp.ProcessState.LOCKED
                if state == cp.ProcessState.LOCKED:
                    self.driver.unlock(pid)
                    state = cp.ProcessState.RUNNING
                states[pid] = state.word
            except cp.CheckpointError as e:
                states[pid] = f"unknown ({e})"
        return states

    async def _fail(self, lease: Lease, states: dict[int, str], what: str) -> None:
        """Past the point of no return: mark the lease failed and say exactly where things are."""
        where = "; ".join(f"pid {pid}: CUDA {state}" for pid, state in sorted(states.items()))
        current = await self._lease(lease.kernel_id)
        holds = ("still holds its GPU slice" if current is not None and current.state == ACTIVE
                 else "holds no GPU slice")
        message = (f"{what}: {where}. The kernel {holds}; its GPU state cannot be trusted. Save what you can "
                   "(CPU-only code still runs) and restart the kernel.")
        self._k(lease.kernel_id).message = message
        if current is not None:
            await self._set_phase(current, FAILED)
        await asyncio.to_thread(self.ledger.record, "hibernation_failed", lease_id=lease.id,
                                kernel_id=lease.kernel_id, owner=lease.owner, reason="failed",
                                detail={"states": {str(p): s for p, s in states.items()}, "message": message})
        self._event("refused", lease, "hibernation_failed", message)
        log.error("kernel %s: %s", lease.kernel_id, message)

    # -- resume --------------------------------------------------------------------------------

    def start_resume(self, kernel_id: str, reason: str = "user") -> asyncio.Task:
        """Start resuming (or join the resume under way) and return its task at once."""
        k = self._k(kernel_id)
        if k.shown == HIBERNATING:
            k.resume_wanted = True  # if still before the checkpoint, the hibernation gives up
        if k.resume_task is None or k.resume_task.done():
            k.resume_task = asyncio.ensure_future(self._resume_guarded(kernel_id, reason))
            k.resume_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        return k.resume_task

    async def resume(self, kernel_id: str, reason: str = "user") -> Outcome:
        """Resume the kernel and return once it runs on a GPU again (queue wait included)."""
        return await asyncio.shield(self.start_resume(kernel_id, reason))

    async def _resume_guarded(self, kernel_id: str, reason: str) -> Outcome:
        k = self._k(kernel_id)
        async with k.guard:
            try:
                return await self._recorded(k, metrics.RESUMES, "resumed", self._resume(kernel_id, reason))
            finally:
                k.resume_wanted = False

    async def _resume(self, kernel_id: str, reason: str) -> Outcome:
        started = time.monotonic()
        lease = await self._lease(kernel_id)
        if lease is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU lease (it was shut down).", status=404)
        if lease.state == ACTIVE and not lease.phase:
            await self._show(kernel_id, ACTIVE)
            return Outcome(kernel_id, "resumed", gpus=lease.gpus)  # awake already
        if lease.phase == STOPPING:
            raise HibernationRefused("stopping", "This kernel is shutting down; there is nothing to resume.")
        if lease.state != HIBERNATED or lease.phase == FAILED:
            raise HibernationRefused("not_hibernated", f"This kernel is {display_state(lease)}"
                                     f"{' (' + lease.phase + ')' if lease.phase else ''}; there is nothing to resume.")
        tree = self.kernels.pids(kernel_id, lease.holder_pid)
        states = await asyncio.to_thread(cp.cuda_processes, self.driver, tree) if tree else {}
        pids = sorted(pid for pid, s in states.items() if s == cp.ProcessState.CHECKPOINTED)
        cap = self.capability(lease)
        await self._set_phase(lease, RESUMING)
        moved = lease.host_bytes
        try:
            same_gpu = not (cap.remap and pids)
            new, waited = await self._take_slice(lease, same_gpu)
            pairs = list(zip(lease.last_gpus, new.gpus)) if pids and new.gpus != lease.last_gpus else None
            restored: list[int] = []
            try:
                await self._restore_all(pids, pairs, restored)
            except cp.CheckpointError as e:
                if pairs is None or restored or not await self._still_checkpointed(pids):
                    raise
                # The driver would not restore onto the other GPU: give that slice back, wait for the old one.
                log.warning("kernel %s: restore onto %s refused (%s); waiting for its own GPU", kernel_id,
                            new.gpus, e)
                await asyncio.to_thread(self.ledger.hibernate, new.id, moved, "restore elsewhere refused",
                                        lease.last_gpus)
                new, more = await self._take_slice(lease, True)
                waited += more
                pairs = None
                await self._restore_all(pids, None, restored)
            await self._unlock(pids)
        except HibernationRefused:
            current = await self._lease(kernel_id)
            if current is not None and current.state == HIBERNATED:
                await self._set_phase(current, "")
            raise
        except cp.CheckpointError as e:
            home = new.gpus if pairs and restored else lease.last_gpus  # where the memory is now based
            raise await self._undo_resume(lease, pids, e, home) from None
        except asyncio.CancelledError:
            current = await self._lease(kernel_id)
            if current is not None and current.phase in IN_FLIGHT and current.state == HIBERNATED:
                await self._set_phase(current, "")
            raise
        current = await self._lease(kernel_id)
        if current is not None:
            await self._set_phase(current, "")
        duration = time.monotonic() - started
        outcome = Outcome(kernel_id, "resumed", duration, moved, tuple(pids), new.gpus, waited)
        self._k(kernel_id).last["resumed"] = {**outcome.to_dict(), "at": self.clock(), "reason": reason}
        metrics.RESUME_SECONDS.observe(duration)
        metrics.MOVED_BYTES.labels("to_gpu").inc(moved)
        await self._update_gauges()
        where = "" if new.gpus == lease.last_gpus else " on another GPU of the same model"
        queued = f" after {waited:.0f} s in the queue" if waited >= 1 else ""
        self._event("resumed", lease, reason, f"Resumed{where}{queued}: {format_size(moved)} back on the GPU in "
                    f"{duration:.1f} s; every variable is as it was.", duration=round(duration, 3), bytes=moved)
        log.info("kernel %s resumed (%s) on %s in %.1fs%s", kernel_id, reason, new.gpus, duration, queued)
        return outcome

    async def _take_slice(self, lease: Lease, same_gpu: bool) -> tuple[Lease, float]:
        """Take a slice for the lease, waiting in the queue while the pool is full."""
        settings = self.pool.settings
        waiter = None
        queued_at: float | None = None
        try:
            while True:
                try:
                    new = await asyncio.to_thread(
                        self.ledger.resume, lease.id, settings.quotas, placement=settings.placement,
                        same_model=True, same_gpu=same_gpu, waiter_id=waiter.id if waiter else None,
                        profile=settings.profiles.get(lease.profile))
                    waiter = None  # the ledger took us off the queue
                    return new, (time.monotonic() - queued_at) if queued_at is not None else 0.0
                except QuotaExceeded as e:
                    self._event("refused", lease, e.reason, f"Cannot resume: {e}")
                    raise HibernationRefused(e.reason, f"Cannot resume this kernel: {e}", status=403) from None
                except PoolExhausted as e:
                    if waiter is None:
                        waiter = await asyncio.to_thread(
                            self.ledger.enqueue, lease.owner, lease.kernel_id, lease.profile,
                            _spec(lease), lease_id=lease.id, label=lease.label)
                        queued_at = time.monotonic()
                        await self._set_phase(lease, QUEUED)
                        await self._show(lease.kernel_id, QUEUED, waiter.position)
                        await self._update_gauges()
                        self._event("queued", lease, e.reason,
                                    f"No GPU slice is free to resume this kernel: it waits in the queue at position "
                                    f"{waiter.position} and resumes by itself when a slice frees up.")
                    await asyncio.sleep(self.settings.queue_poll)
                    current = await asyncio.to_thread(self.ledger.heartbeat, waiter.id)
                    if current is None:  # pruned (a stall longer than the waiter TTL): back in line
                        waiter = await asyncio.to_thread(
                            self.ledger.enqueue, lease.owner, lease.kernel_id, lease.profile, _spec(lease),
                            lease_id=lease.id, label=lease.label)
                        current = waiter
                    if current.position != self._k(lease.kernel_id).position:
                        await self._show(lease.kernel_id, QUEUED, current.position)
                except LeaseNotFound:
                    raise HibernationRefused("no_lease", "This kernel's GPU lease ended while it waited to resume.",
                                             status=404) from None
        finally:
            if waiter is not None:
                await asyncio.to_thread(self.ledger.dequeue, waiter.id)
            await self._update_gauges()
            current = await self._lease(lease.kernel_id)
            if current is not None and current.phase == QUEUED:
                await self._set_phase(current, RESUMING)

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
            if current is not None:
                await self._set_phase(current, "")
            return HibernationFailed("restore_failed", f"Restoring this kernel's GPU memory failed ({error}); it is "
                                     "hibernated as before and its slice was given back. Try again, or restart it.",
                                     recovered=True, states=states)
        await self._fail(lease, states, f"Restoring this kernel's GPU memory failed ({error}) and could not be undone")
        return HibernationFailed("restore_failed", self._k(lease.kernel_id).message or "", recovered=False,
                                 states=states)

    def _put_back_checkpointed(self, pids: list[int]) -> dict[int, str]:
        states: dict[int, str] = {}
        for pid in pids:
            try:
                state = self.driver.state(pid)
                if state == cp.ProcessState.RUNNING:
                    self.driver.lock(pid, self.settings.lock_timeout)
                    state = cp.ProcessState.LOCKED
                if state == cp.ProcessState.LOCKED:
                    self.driver.checkpoint(pid)
                    state = cp.ProcessState.CHECKPOINTED
                states[pid] = state.word
            except cp.CheckpointError as e:
                states[pid] = f"unknown ({e})"
        return states

    # -- upkeep --------------------------------------------------------------------------------

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone (shut down): stop any resume of it and drop what we keep."""
        k = self._kernels.pop(kernel_id, None)
        self._unsupported.pop(kernel_id, None)
        if k and k.resume_task and not k.resume_task.done():
            k.resume_task.cancel()

    async def tick(self) -> None:
        """Periodic upkeep: warn and shut down this server's kernels marked for eviction, and put
        right the kernels a previous server left mid-move."""
        leases = await asyncio.to_thread(self.ledger.leases)
        now = self.clock()
        for lease in leases:
            if not self.kernels.has(lease.kernel_id):
                continue  # another server's kernel: its own hibernator looks after it
            k = self._k(lease.kernel_id)
            if k.guard.locked():
                continue
            if lease.phase == EVICTING:
                await self._evict(lease, k, now)
            elif lease.phase in IN_FLIGHT:
                await self._recover(lease)
            else:
                await self._show(lease.kernel_id, display_state(lease), k.position)
        for kernel_id in [kid for kid in self._kernels if not self.kernels.has(kid)]:
            self.forget(kernel_id)
        await self._update_gauges(leases)

    async def _evict(self, lease: Lease, k: _Kernel, now: float) -> None:
        deadline = lease.phase_deadline or now
        if lease.state != HIBERNATED:
            await self._set_phase(lease, "")
            return
        if k.warned_eviction != deadline:
            k.warned_eviction = deadline
            self._event("warned", lease, "host_memory",
                        f"Hibernated kernels on this machine use up the host RAM set aside for them: this kernel, "
                        f"hibernated for {format_age(now - lease.state_since)}, will be shut down in "
                        f"{format_age(max(deadline - now, 0))} to make room, unless you resume it (run a cell) or "
                        "save your work first.", deadline=deadline)
        if now >= deadline:
            message = (f"Shut down to make room in the host RAM set aside for hibernated kernels: it had been "
                       f"hibernated for {format_age(now - lease.state_since)}.")
            self._event("culled", lease, "host_memory", message)
            await self._set_reason(lease.kernel_id, "host_memory")
            await self.kernels.shutdown(lease.kernel_id, now=True)
            self.forget(lease.kernel_id)

    async def _set_reason(self, kernel_id: str, reason: str) -> None:
        try:
            provisioner = self.kernels.manager.get_kernel(kernel_id).provisioner
        except KeyError:
            return
        if hasattr(provisioner, "release_reason"):
            provisioner.release_reason = reason

    async def _recover(self, lease: Lease) -> None:
        """A lease left in a transient phase with no move under way here: settle it by the processes'
        real CUDA states."""
        tree = self.kernels.pids(lease.kernel_id, lease.holder_pid)
        states = await asyncio.to_thread(cp.cuda_processes, self.driver, tree) if tree else {}
        if lease.state == HIBERNATED:
            await self._set_phase(lease, "")  # the queue wait or resume ended with the server that ran it
            return
        if any(s == cp.ProcessState.CHECKPOINTED for s in states.values()) or any(
                s == cp.ProcessState.LOCKED for s in states.values()):
            result = await asyncio.to_thread(self._put_back_running, sorted(states))
            if not all(s == cp.ProcessState.RUNNING.word for s in result.values()):
                await self._fail(lease, result, "A move of this kernel was interrupted and could not be undone")
                return
        await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, 0, None, lease.host)
        await self._set_phase(lease, "")

    async def _update_gauges(self, leases: list[Lease] | None = None) -> None:
        if leases is None:
            leases = await asyncio.to_thread(self.ledger.leases)
        mine = [lease for lease in leases if self.kernels.has(lease.kernel_id)]
        metrics.HIBERNATED_KERNELS.set(sum(1 for lease in mine if lease.state == HIBERNATED))
        metrics.RESUME_QUEUE.set(sum(1 for k in self._kernels.values() if k.shown == QUEUED))
        host = getattr(self.pool, "host", "")
        metrics.HIBERNATED_HOST_BYTES.set(sum(lease.host_bytes for lease in leases if lease.host == host))


def _spec(lease: Lease):
    from ..pool import SliceSpec

    if lease.whole:
        return SliceSpec(whole=True, gpu_count=lease.gpu_count)
    return SliceSpec(memory=lease.memory, sm_percent=lease.sm_percent)
