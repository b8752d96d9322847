"""Hibernation plugged into the server extension: ``GPUPoolExtension.hibernator_class``.

:class:`HibernationHook` declares what the culler, the handlers and the kernel websockets ask of
hibernation, with defaults for a server without it (nothing can hibernate; the policy shuts such
kernels down and says why).  :class:`PoolHibernation` is the one that moves GPU memory: built by
the extension as ``PoolHibernation(parent=extension)``, it runs the hibernator's upkeep (evictions
past the host-RAM cap, kernels a previous server left mid-move) and puts what the hibernator did on
record through the extension's recorder (its cluster counterpart, for kernels in pods, is
``cluster_hibernation.ClusterHibernation``).  Each ``resumes``, so the extension (``app``) serves the
``POST kernels/{id}/resume`` handler and installs transparent resume on the kernel websockets (a cell
run on a hibernated kernel resumes it and then runs); the hook itself knows nothing of HTTP.

A resume on a hint (``POST kernels/{id}/hint``: the user opened the notebook, a cell is likely soon)
takes a slice only where one is free and nobody waits; a kernel it woke that runs no cell within
``GPUPoolExtension.hint_sleep_after`` (or sooner, once someone waits for a slice) goes back to sleep
without a warning, recorded with reason ``hint_unused``: nothing was used.  A kernel whose rule says
``hibernate_after_cell`` goes to sleep that long after each cell ends (reason ``after_cell``).  Both
timers are one owner's, one per kernel (``sleep_timers.SleepTimers``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from abc import ABC
from collections.abc import Callable

from ...devices.checkpoint import DECLARED_NOTE
from ...hibernation import HibernationFailed, HibernationRefused, Hibernator, Kernels, Outcome
from ...periodic import every
from ...pool import ACTIVE, Lease
from ...pool import residency as M
from .timers import SleepTimers

log = logging.getLogger(__name__)

# Why a kernel was resumed, by the resume's reason: a cell the user ran, their Resume button.
RESUMED_FOR = {"cell": "for the cell you ran", "user": "at your request"}


class HibernationHook(ABC):
    """No hibernation on this server: the base every hook builds on, and what runs without one.

    Every seam the culler, the handlers and the websockets use is declared here with its no-op
    default, so that a caller never asks whether a hook has it."""

    enabled = False
    #: Whether the hook resumes kernels itself: the extension then serves ``POST kernels/{id}/resume``
    #: and holds cells sent to a sleeping kernel until it has resumed (transparent resume).
    resumes = False
    #: The pool it works on (``GPUPoolExtension.pool_backend``: local or kubernetes); None: either.
    pool_backend: str | None = None

    def __init__(self, parent=None, **kwargs):
        self.extension = parent
        self._on_user_resume: list[Callable[[str], None]] = []
        self._asked: dict[str, asyncio.Future] = {}  # kernel -> the resume its user asked for, until it ends

    def when_user_resumes(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(kernel_id)`` whenever a resume the kernel's user asked for has put it back on a
        slice (the culler, whose memory keeps each kernel's idle clock, restarts it then)."""
        self._on_user_resume.append(listener)

    def user_resumed(self, kernel_id: str, effects: tuple[str, ...]) -> None:
        """Carry out the residency model's ``restart_idle_clock`` among a move's ``effects``: its user asked
        for the kernel awake (their Resume, a cell, a hint's resume a cell came for), so the listeners are
        told and the kernel is judged idle from now, not from its last cell before it slept.  A hint's resume
        no cell has come for has no such effect: it goes back to sleep unwarned if none comes.  Each hook
        calls this where a resume ends and where a hint's cell comes (``used``)."""
        if M.RESTART_IDLE_CLOCK in effects:
            for listener in self._on_user_resume:
                listener(kernel_id)

    def resume_asked(self, kernel_id: str) -> bool:
        """Whether a resume (or a first slice) the kernel's user asked for is under way and has not yet ended
        with :meth:`user_resumed` (no I/O).  The culler leaves such a kernel alone: from the moment its slice is
        taken until the clock restarts it would be judged idle for all the time before the ask, and a
        first cell was once warned 60 ms after it took its slice."""
        return kernel_id in self._asked

    def _asking(self, kernel_id: str, task: asyncio.Future) -> None:
        """``task`` carries a resume the kernel's user asked for (their cell, their Resume)."""
        self._asked[kernel_id] = task

    def _answered(self, kernel_id: str, task: asyncio.Future) -> None:
        """``task`` ended and is on record; a later resume of the kernel keeps its own mark."""
        if self._asked.get(kernel_id) is task:
            del self._asked[kernel_id]

    async def _recorded(self, task: asyncio.Future, kernel_id: str, reason: str) -> None:
        """Put the resume's outcome on record, then drop its user's ask (whatever the outcome)."""
        try:
            await self._record_resume(task, kernel_id, reason)
        finally:
            self._answered(kernel_id, task)

    async def _record_resume(self, task: asyncio.Future, kernel_id: str, reason: str) -> None:
        """Await the resume ``task`` and put its outcome on record (the journal, the event, the clock
        restarted where its user asked for it)."""

    def can_hibernate(self, lease: Lease) -> tuple[bool, str | None]:
        """Whether the lease's kernel can hibernate now, and why not (no I/O: the culler asks on every pass)."""
        return False, "no hibernator is installed on this server"

    async def hibernate(self, kernel_id: str, reason: str) -> Outcome:
        raise HibernationRefused("no_hibernation", "Hibernation is not enabled on this server.", keep_running=False)

    def start_resume(self, kernel_id: str, reason: str = "user", *, hint: bool = False) -> asyncio.Task:
        """Start (or join) the kernel's resume.  ``hint``: only if a slice is free now and nobody waits."""
        raise HibernationRefused("no_hibernation", "Hibernation is not enabled on this server, so there is nothing "
                                                   "to resume.")

    def hinted(self, kernel_id: str) -> bool:
        """Whether a hint woke the kernel and no cell has come since (no I/O: asked per message and per pass;
        the culler leaves such a kernel alone, the hook puts it back to sleep if no cell comes)."""
        return False

    def used(self, kernel_id: str) -> None:
        """A cell came for the kernel (it is no longer :meth:`hinted`)."""

    async def others_waiting(self, kernel_id: str) -> bool:
        """Whether a kernel other than this one waits for GPU room that this one (woken on a hint, no cell
        since) holds: it then goes back to sleep before its time."""
        return False

    def cell_started(self, kernel_id: str) -> None:
        """A kernel websocket sent the kernel a cell (an execute request, not a silent one; no I/O): the
        kernel's timer to sleep again unwarned, if any, is cancelled."""

    def cell_ended(self, kernel_id: str) -> None:
        """The kernel answered a cell of a kernel websocket (no I/O): where its rule says
        ``hibernate_after_cell``, it sleeps that long from now unless another cell starts first."""

    def asleep(self, kernel_id: str) -> bool:
        """Whether a cell sent to the kernel now must wait for a resume (no I/O: asked per message)."""
        return False

    def queue_reason(self, kernel_id: str) -> str | None:
        """Why the kernel's queued resume waits, where not for a free slice (no I/O)."""
        return None

    def queue_why(self, kernel_id: str) -> str | None:
        """Why the kernel's queued resume is where it is in the queue, where sharing orders it (no I/O)."""
        return None

    def queue_position(self, kernel_id: str) -> int | None:
        """The kernel's place in the queue while its resume waits there (no I/O)."""
        return None

    @property
    def declared(self) -> bool:
        """The GPUs are declared, not real: a move has no GPU memory to carry."""
        return False

    def shown(self, kernel_id: str) -> str:
        """The kernel's state as the UI shows it (active, hibernating, hibernated, resuming, queued; no I/O)."""
        return ACTIVE

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        """Wait up to ``timeout`` for the kernel's shown state or queue position to change; the state then."""
        await asyncio.sleep(timeout)
        return self.shown(kernel_id)

    def resume_notice(self, kernel_id: str) -> str:
        """What a cell held for the kernel's resume shows meanwhile (no I/O)."""
        position, reason = self.queue_position(kernel_id), self.queue_reason(kernel_id)
        why = self.queue_why(kernel_id) if position is not None else None
        why = f"{why[0].upper()}{why[1:]}" if why else None  # "2nd in the queue: …", a sentence of its own
        if self.first_slice(kernel_id):
            if why:
                return (f"Waiting for a GPU slice for this kernel's first cell. {why}. The cell "
                        "runs as soon as the kernel has its GPU.")
            if position is not None:
                return (f"Waiting for a GPU slice for this kernel's first cell: position {position} in the queue. "
                        "The cell runs as soon as the kernel has its GPU.")
            return "This kernel takes its GPU slice now (it holds none until a cell runs). The cell runs next."
        if position is not None and reason:
            return (f"This kernel's resume is {reason}. Position {position} in the queue; the cell runs as soon "
                    "as the kernel has resumed.")
        if why:  # where the admin's sharing orders the queue: why it is where it is
            return (f"Waiting for a GPU slice to resume this kernel. {why}. The cell runs as "
                    "soon as the kernel has resumed.")
        if position is not None:
            return (f"Waiting for a GPU slice to resume this kernel: position {position} in the queue. "
                    "The cell runs as soon as the kernel has resumed.")
        if self.declared:
            return f"Resuming this kernel ({DECLARED_NOTE}): it takes a GPU slice again. The cell runs next."
        return "Resuming this kernel: its GPU memory is coming back from host RAM. The cell runs next."

    def first_slice(self, kernel_id: str) -> bool:
        """Whether the kernel's next slice is its first (it started without one: the words differ; no I/O)."""
        return False

    async def refresh(self, kernel_id: str) -> None:
        """Read the kernel's state from the pool again (a websocket opens on it: a kernel that just started
        without a slice must hold its first cell)."""

    async def settle(self, kernel_id: str, timeout: float) -> None:
        """Wait up to ``timeout`` for a resume just started to take a slice or a place in the queue."""

    def start(self) -> None:
        """Start the upkeep (once the server's event loop runs)."""

    async def stop(self) -> None:
        """Stop the upkeep."""


class PoolHibernation(HibernationHook):
    """The hibernation hook of one Jupyter server on the local pool."""

    enabled = True
    resumes = True
    pool_backend = "local"

    def __init__(self, parent, upkeep_interval: float = 5.0):
        super().__init__(parent)
        backend = parent.backend
        self.recorder = parent.recorder
        self.hibernator = Hibernator(backend.pool, Kernels(parent.serverapp.kernel_manager))
        self.upkeep_interval = min(upkeep_interval, parent.cull_interval)
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._recording: set[asyncio.Future] = set()
        self._watched: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()
        self.hint_sleep_after = parent.hint_sleep_after
        self.timers = SleepTimers(self, parent)  # when each kernel sleeps again unwarned: after a cell, after a hint

    # -- what the culler, the handlers and the websockets ask ----------------------------------------

    def can_hibernate(self, lease: Lease) -> tuple[bool, str | None]:
        return self.hibernator.can_hibernate(lease)

    async def hibernate(self, kernel_id: str, reason: str) -> Outcome:
        self.timers.cancel(kernel_id)  # it sleeps by another path: no timer left to put it to sleep again
        return await self.hibernator.hibernate(kernel_id, reason)

    def start_resume(self, kernel_id: str, reason: str = "user", *, hint: bool = False) -> asyncio.Task:
        """Start (or join) the kernel's resume; its outcome is put on record when it ends."""
        if not hint:
            self.timers.cancel(kernel_id)  # its user wants it awake
        task = self.hibernator.start_resume(kernel_id, reason, hint=hint)
        if not hint:
            self._asking(kernel_id, task)
        if task not in self._watched:  # one record per resume, however many callers join it
            self._watched.add(task)
            future = asyncio.ensure_future(self._recorded(task, kernel_id, reason))
            self._recording.add(future)
            future.add_done_callback(self._recording.discard)
        return task

    def asleep(self, kernel_id: str) -> bool:
        return self.hibernator.asleep(kernel_id)

    def hinted(self, kernel_id: str) -> bool:
        return self.hibernator.hinted(kernel_id)

    def used(self, kernel_id: str) -> None:
        self.user_resumed(kernel_id, self.hibernator.used(kernel_id))

    def cell_started(self, kernel_id: str) -> None:
        self.timers.cell_started(kernel_id)

    def cell_ended(self, kernel_id: str) -> None:
        self.timers.cell_ended(kernel_id)

    def queue_reason(self, kernel_id: str) -> str | None:
        return self.hibernator.queue_reason(kernel_id)

    def queue_why(self, kernel_id: str) -> str | None:
        return self.hibernator.queue_why(kernel_id)

    def queue_position(self, kernel_id: str) -> int | None:
        return self.hibernator.queue_position(kernel_id)

    @property
    def declared(self) -> bool:
        return self.hibernator.declared

    def shown(self, kernel_id: str) -> str:
        return self.hibernator.shown(kernel_id)

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        return await self.hibernator.wait_change(kernel_id, timeout)

    def first_slice(self, kernel_id: str) -> bool:
        return self.hibernator.first_slice(kernel_id)

    async def refresh(self, kernel_id: str) -> None:
        await self.hibernator.refresh(kernel_id)

    async def settle(self, kernel_id: str, timeout: float) -> None:
        await self.hibernator.placed(kernel_id, timeout)
        await asyncio.sleep(0)  # let a queue position land

    # -- the record -------------------------------------------------------------------------------

    async def _record_resume(self, task: asyncio.Task, kernel_id: str, reason: str) -> None:
        try:
            outcome = await asyncio.shield(task)
        except asyncio.CancelledError:
            return  # the kernel was shut down while it waited
        except HibernationRefused as e:  # (a hint declined has reasons of its own: nothing to record)
            if e.reason in ("quota_exceeded", "budget_exceeded", "pool_exhausted"):
                lease = await asyncio.to_thread(self.hibernator.ledger.by_kernel, kernel_id)
                if lease is not None:  # a first cell's slice refused: the kernel's ask for one, not a resume
                    await self.recorder.record("refused", lease, reason=e.reason, message=e.message,
                                               action="first_cell" if lease.awaits_first_cell else "resume")
            return
        except HibernationFailed as e:
            lease = await asyncio.to_thread(self.hibernator.ledger.by_kernel, kernel_id)
            if lease is not None:
                await self.recorder.record("hibernation_failed", lease, reason=e.reason, message=e.message,
                                           action="resume", extra={"states": {str(p): s for p, s in e.states.items()},
                                                                   "recovered": e.recovered})
            return
        except Exception:
            log.exception("resume failed")
            return
        hinted = self.hibernator.hinted(kernel_id)
        if reason == "hint" and not hinted:
            reason = "cell"  # a cell came while the hinted resume was under way: it was for the cell
        self.user_resumed(kernel_id, outcome.effects)
        if outcome.lease is not None and outcome.duration and outcome.action == "resumed":  # a first slice: journaled
            why = RESUMED_FOR.get(reason)  # the user's own doing, not the pool's policy
            message = outcome.message.replace("Resumed", f"Resumed {why}", 1) if why else outcome.message
            await self.recorder.record("resumed", outcome.lease, reason=reason, message=message,
                                       action="resume", rule=None, duration=round(outcome.duration, 3),
                                       bytes=outcome.bytes, declared=outcome.declared,
                                       extra={"hold": self.hint_sleep_after} if reason == "hint" else None)
        if hinted and M.HOLD_FOR_CELL in outcome.effects:  # woken on a hint: back to sleep unless a cell comes
            self.timers.after_hint(kernel_id, self.hint_sleep_after)

    async def others_waiting(self, kernel_id: str) -> bool:
        return any(w.kernel_id != kernel_id for w in await asyncio.to_thread(self.hibernator.ledger.waiters))

    # -- upkeep -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.ensure_future(self._upkeep())

    async def _upkeep(self) -> None:
        # Load libcuda and cuInit once, in a thread, before the culler's first can_hibernate asks for it.
        await asyncio.to_thread(self.hibernator.driver.info)
        await every(self.upkeep_interval, self._upkeep_pass, self._stop, what="hibernation upkeep")

    async def _upkeep_pass(self) -> None:
        for notice in await self.hibernator.tick():
            await self.recorder.record(notice.kind, notice.lease, reason=notice.reason, message=notice.message,
                                       rule="hibernation", deadline=notice.deadline,
                                       action="shutdown" if notice.kind in ("warned", "culled") else None)

    async def stop(self) -> None:
        if self._task is not None:
            self._stop.set()  # a pass under way finishes (its blocking parts run in threads)
            _done, pending = await asyncio.wait([self._task], timeout=10)
            for task in pending:
                task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.timers.stop()  # a server that stops puts nothing back to sleep
        await asyncio.gather(*self._recording, return_exceptions=True)
