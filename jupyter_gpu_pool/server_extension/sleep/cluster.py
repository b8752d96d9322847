"""Hibernation of cluster kernels, the Jupyter server's side: the hook (``HibernationHook``) of a server
whose kernels run in pods (``GPUPoolExtension.pool_backend = "kubernetes"``).

The server asks and the cluster moves (docs/kubernetes.md, "Hibernation"): to hibernate, it releases the
framework's cached GPU memory over the kernel's own channel (as on one machine), then writes
``spec.desiredState = Hibernated`` on the kernel's GPUKernel with the object's resourceVersion
(compare-and-set), and waits for the operator's admission and the node agent's checkpoint in the
status.  To resume (a cell on a hibernated kernel, or ``POST …/resume``), it writes ``Running`` and
holds the cell until the phase is Running, showing the queue position the operator writes.  A hint
(``POST …/hint``: the user opened the notebook or started typing) writes ``Running`` with
``spec.resumeHint``: the operator admits it only where the node has room now and nobody waits, else
declines it (status.reason ``ResumeDeclined``) and the server withdraws the ask; a cell that comes
meanwhile makes it a real resume, and a kernel a hint woke that runs no cell goes back to sleep
(``SleepTimers.after_hint``).  Nothing here touches a process: the kernel's pod is out of the server's
reach.  What a request may do, and where a move's end leaves the kernel, is the lifecycle's model
(``pool.residency``, on the kernel's object through ``cluster.kernels.residency_of_kernel``), as on one
machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from ...cluster import resources as R
from ...cluster.hibernation import HOST_MEMORY, LASTING, NODE_CAP, never_hands_back
from ...cluster.kernels import (as_lease, desired, hibernation, hint_declined, meta, residency_of_kernel,
                                resume_hint, status)
from ...hibernation import HibernationFailed, HibernationRefused, Kernels, Outcome
from ...pool import ACTIVE, Lease, format_size
from ...pool import residency as M
from ...pool.phases import display_state
from ...pool.words import cannot_hibernate_sentence, why_clause
from .hook import HibernationHook
from .timers import SleepTimers

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"
ADMISSION_TIMEOUT = 30.0  # seconds for the operator to answer a hibernation request (it may be down)
MOVE_TIMEOUT = 300.0  # seconds for the node agent to checkpoint (32 GiB took 18 s on an H100)
REFUSAL_WORDS = {HOST_MEMORY: "host_memory", NODE_CAP: "node_cap"}
SLEEP_EVENTS = {"after_cell": M.AFTER_CELL, "hint_unused": M.HINT_UNUSED, "user": M.RELEASE, "admin": M.RELEASE}


def asked_to_sleep(obj: dict, event: str, hinted: bool) -> M.Step:
    """The model's answer to a request to hibernate the kernel, refused in its user's words (a kernel
    admitted whose pod does not run yet is refused too: there is nothing to checkpoint yet)."""
    phase = status(obj).get("phase") or "starting"
    try:
        asked = M.step(residency_of_kernel(obj, hint=hinted), event)
    except M.Refused as e:
        if e.reason == "hibernated" or phase == R.HIBERNATED:
            raise HibernationRefused("hibernated", "This kernel is hibernated already.") from None
        if e.reason == "used":
            raise HibernationRefused("used", "A cell ran on this kernel since it was woken in advance, so it stays "
                                             "awake.") from None
        asked = None
    if asked is None or phase != R.RUNNING:
        raise HibernationRefused("in_progress", f"This kernel is {phase}; try again when that is done.")
    return asked


def wakes_on_hint(obj: dict) -> bool:
    """Simply asleep, nothing asked: where the model has a hint take a slice (one try)."""
    state = residency_of_kernel(obj)
    return desired(obj) == R.DESIRED_HIBERNATED and M.allowed(state, M.HINT) and \
        M.TAKE_SLICE_NOW in M.step(state, M.HINT).effects


class ClusterHibernation(HibernationHook):
    """The hibernation hook of a Jupyter server on a cluster: requests through the kernels' GPUKernels."""

    enabled = True
    resumes = True
    pool_backend = "kubernetes"

    def __init__(self, parent):
        super().__init__(parent)
        self.backend = parent.backend
        self.recorder = parent.recorder
        self.kernels = Kernels(parent.serverapp.kernel_manager)
        self.settings = self.backend.settings.hibernation
        self._listening = None  # the session the listener is on
        self._resumes: dict[str, asyncio.Task] = {}
        self._hints: set[asyncio.Task] = set()  # the resumes of ``_resumes`` that a hint started
        self._hinted: set[str] = set()  # kernels a hint is waking or woke, and no cell has come for since
        self.hint_sleep_after = parent.hint_sleep_after
        self._changed: dict[str, asyncio.Event] = {}
        self._seen: dict[str, tuple] = {}
        self._recording: set[asyncio.Future] = set()
        self.timers = SleepTimers(self, parent)  # a rule's hibernate_after_cell: asleep between cells

    # -- the kernel's object ----------------------------------------------------------------------

    def _session(self):
        session = self.backend.session
        if session is not None and self._listening is not session:
            session.listeners.append(self._heard)
            self._listening = session
        return session

    def _obj(self, kernel_id: str) -> dict | None:
        session = self._session()
        return session.kernels.get(R.kernel_name(kernel_id)) if session is not None else None

    def _heard(self, event_type: str, obj: dict) -> None:
        """A kernel's object changed: wake whoever waits for what the UI shows of it (not for heartbeats)."""
        kernel_id = (obj.get("spec") or {}).get("kernelId", "")
        shown = (None if event_type == "DELETED" else self._shown_of(obj), hibernation(obj).get("queuePosition"),
                 status(obj).get("message"))
        if self._seen.get(kernel_id) != shown:
            self._seen[kernel_id] = shown
            if event_type == "DELETED":
                del self._seen[kernel_id]
            event = self._changed.pop(kernel_id, None)
            if event is not None:
                event.set()

    @staticmethod
    def _shown_of(obj: dict | None) -> str:
        return display_state(as_lease(obj)) if obj is not None else "released"

    async def _ask(self, kernel_id: str, state: str, reason: str, *, hint: bool = False,
                   only_if=None) -> dict | None:
        """Write spec.desiredState (and, for a hibernation, why; for a resume, whether it is a hint's) by
        compare-and-set on the object's resourceVersion; on a conflict (its heartbeat, the operator), wait
        for the watch to bring the newer version and try again.  ``only_if(obj)``: write only while it
        holds of the object as read (None, and nothing written, once it does not)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        session, name = self._session(), R.kernel_name(kernel_id)
        for _ in range(20):
            obj = session.kernels.get(name) if session is not None else None
            if obj is None:
                raise HibernationRefused("no_lease", "This kernel holds no GPU slice in the cluster, so there is "
                                                     "nothing to move.", status=404)
            if only_if is not None and not only_if(obj):
                return None
            version = meta(obj).get("resourceVersion")
            asked = {"desiredState": state, "resumeHint": True if hint else None}
            if state == R.DESIRED_HIBERNATED:
                asked["hibernateReason"] = reason
            try:
                written = await session.custom.patch_namespaced_custom_object(
                    R.GROUP, R.VERSION, session.namespace, R.KERNELS, name,
                    {"metadata": {"resourceVersion": version}, "spec": asked}, _content_type=MERGE)
            except ApiException as e:
                if e.status == 404:
                    raise HibernationRefused("no_lease", "This kernel is gone.", status=404) from None
                if e.status != 409:
                    raise
                try:
                    await session.wait_for(name, lambda o, v=version: o is None or meta(o).get("resourceVersion") != v,
                                           2.0)
                except TimeoutError:
                    pass
                continue
            await session.remember(written)
            return written
        raise HibernationRefused("in_progress", "This kernel's object kept changing; try again in a moment.")

    async def _wait(self, kernel_id: str, done, timeout: float | None) -> dict | None:
        session = self._session()
        return await session.wait_for(R.kernel_name(kernel_id), lambda o: o is None or done(o), timeout)

    # -- what the culler, the handlers and the websockets ask (no I/O) ----------------------------------

    def can_hibernate(self, lease: Lease) -> tuple[bool, str | None]:
        obj = self._obj(lease.kernel_id)
        if obj is None:
            return False, "its GPUKernel is not known to this server yet"
        st = status(obj)
        never = never_hands_back((st.get("gpu") or {}).get("sharing", ""))
        if never is not None:
            return False, never.why
        if st.get("reason") == R.HIBERNATION_REFUSED and hibernation(obj).get("reason") in LASTING:
            return False, why_clause(st.get("message") or "the operator refused its hibernation")
        return True, None

    def shown(self, kernel_id: str) -> str:
        obj = self._obj(kernel_id)
        return self._shown_of(obj) if obj is not None else ACTIVE

    def asleep(self, kernel_id: str) -> bool:
        """Moving or moved, or asked to (the operator may admit the request at any moment): a cell then
        waits for the resume, which withdraws a request not yet admitted (``_resume``)."""
        obj = self._obj(kernel_id)
        return obj is not None and (residency_of_kernel(obj).asleep or desired(obj) == R.DESIRED_HIBERNATED)

    def queue_position(self, kernel_id: str) -> int | None:
        obj = self._obj(kernel_id)
        if obj is None or status(obj).get("phase") != R.HIBERNATED or desired(obj) != R.DESIRED_RUNNING:
            return None
        return hibernation(obj).get("queuePosition")

    def queue_reason(self, kernel_id: str) -> str | None:
        obj = self._obj(kernel_id)
        if obj is None or status(obj).get("reason") not in (R.WAITING_FOR_ROOM, R.QUOTA_EXCEEDED):
            return None
        return hibernation(obj).get("message") or None

    def resume_notice(self, kernel_id: str) -> str:
        obj = self._obj(kernel_id)
        st = status(obj) if obj is not None else {}
        position, why = self.queue_position(kernel_id), self.queue_reason(kernel_id)
        if position is not None:
            why = why or "waiting for room on its GPU"
            shared = hibernation(obj).get("why")  # where the admin's sharing orders the queue: why it is there
            return (f"Waiting to resume this kernel: position {position} in its node's queue"
                    f"{f', {shared}' if shared else ''} ({why}). The cell runs as soon as the kernel has resumed.")
        if st.get("reason") in (R.QUOTA_EXCEEDED, R.WAITING_FOR_ROOM) and why:  # its quota, or reserved room
            return f"This kernel's resume is {why}. The cell runs as soon as the kernel has resumed."
        return ("Resuming this kernel: its GPU memory is coming back from host memory on its node. The cell runs "
                "next.")

    async def wait_change(self, kernel_id: str, timeout: float) -> str:
        event = self._changed.setdefault(kernel_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        return self.shown(kernel_id)

    async def settle(self, kernel_id: str, timeout: float) -> None:
        def placed(o: dict) -> bool:
            return status(o).get("phase") in (R.RESUMING, R.RUNNING) or hibernation(o).get("queuePosition") is not None \
                or hint_declined(o)

        deadline = time.monotonic() + timeout
        try:
            await self._wait(kernel_id, placed, timeout)
            task = self._resumes.get(kernel_id)
            if task in self._hints:  # a hint declined ends once its ask is withdrawn: its answer is that
                await asyncio.wait([task], timeout=max(deadline - time.monotonic(), 0))
        except TimeoutError:
            pass

    def hinted(self, kernel_id: str) -> bool:
        return kernel_id in self._hinted

    def used(self, kernel_id: str) -> None:
        self._hinted.discard(kernel_id)

    async def others_waiting(self, kernel_id: str) -> bool:
        """Another kernel's resume waits for room on this kernel's node (room is the node's)."""
        session, me = self._session(), self._obj(kernel_id)
        if session is None or me is None:
            return False
        node = status(me).get("node")
        return any(status(o).get("node") == node and hibernation(o).get("queuePosition") is not None
                   and meta(o).get("uid") != meta(me).get("uid") for o in list(session.kernels.values()))

    # -- hibernate ---------------------------------------------------------------------------------

    def cell_started(self, kernel_id: str) -> None:
        self.timers.cell_started(kernel_id)

    def cell_ended(self, kernel_id: str) -> None:
        self.timers.cell_ended(kernel_id)

    async def hibernate(self, kernel_id: str, reason: str) -> Outcome:
        self.timers.cancel(kernel_id)  # it sleeps by another path: no timer left to put it to sleep again
        hinted = kernel_id in self._hinted
        self._hinted.discard(kernel_id)
        obj = self._obj(kernel_id)
        if obj is None:
            raise HibernationRefused("no_lease", "This kernel holds no GPU slice in the cluster, so there is nothing "
                                                 "to hibernate.", status=404)
        asked_to_sleep(obj, SLEEP_EVENTS.get(reason, M.IDLE), hinted)
        can, why = self.can_hibernate(as_lease(obj))
        if not can:
            raise HibernationRefused("unavailable", cannot_hibernate_sentence(why or "for a reason not known"), keep_running=False)
        if self.kernels.execution_state(kernel_id) == "busy":
            raise HibernationRefused("busy", "This kernel is running a cell; it can hibernate once the cell is done.")
        started = time.monotonic()
        if self.settings.release_cache:
            # What moves is what the process has reserved: the framework's cache goes first, over the
            # kernel's own channel, bounded like the lock (freeing GPU memory waits for the GPU work in flight).
            timeout = self.settings.cache_release_timeout
            if await self.kernels.release_cache(kernel_id, timeout) == "timeout":
                raise HibernationRefused("busy", f"This kernel's GPU stayed busy for {timeout:.0f} s; it can "
                                                 "hibernate once its GPU work is done.", retry_after=timeout)
        try:
            written = await self._ask(kernel_id, R.DESIRED_HIBERNATED, reason)
            generation = int(meta(written).get("generation") or 0)

            def answered(o: dict) -> bool:
                st = status(o)
                if desired(o) == R.DESIRED_RUNNING and st.get("phase") == R.RUNNING:
                    return True  # withdrawn before its admission (a cell came: its resume asked Running)
                if int(st.get("observedGeneration") or 0) < generation:
                    return st.get("phase") in (R.FAILED, R.STOPPED)
                return st.get("phase") != R.RUNNING or st.get("reason") in (R.HIBERNATION_REFUSED,
                                                                            R.HIBERNATION_FAILED)

            obj = await self._wait(kernel_id, answered, ADMISSION_TIMEOUT)
        except TimeoutError:
            await self._ask(kernel_id, R.DESIRED_RUNNING, reason)
            raise HibernationRefused("operator_unavailable", "The cluster's GPU pool operator did not answer the "
                                     f"hibernation request within {ADMISSION_TIMEOUT:.0f} s; the kernel keeps "
                                     "running.") from None
        except asyncio.CancelledError:
            # Called off before the operator admitted it (a cell cancelled its timer): a request left standing
            # would hibernate the kernel under that cell, with nobody to record it.  Withdrawn where nothing moves.
            await asyncio.shield(self._withdraw(kernel_id, reason))
            raise
        if obj is not None and status(obj).get("phase") == R.HIBERNATING:
            try:
                obj = await self._wait(kernel_id, lambda o: status(o).get("phase") != R.HIBERNATING, MOVE_TIMEOUT)
            except TimeoutError:
                raise HibernationFailed("timeout", f"The node agent did not finish this kernel's checkpoint within "
                                        f"{MOVE_TIMEOUT:.0f} s.", recovered=False) from None
        return await self._hibernated(kernel_id, obj, started, reason)

    async def _hibernated(self, kernel_id: str, obj: dict | None, started: float, reason: str) -> Outcome:
        st = status(obj) if obj is not None else {}
        phase = st.get("phase")
        if phase == R.HIBERNATED:
            h = hibernation(obj)
            moved, took = int(h.get("bytes") or 0), time.monotonic() - started
            checkpoint = h.get("checkpointSeconds")
            log.info("kernel %s hibernated in the cluster (%s): %s in %.1fs", kernel_id, reason, format_size(moved),
                     took)
            detail = f" (the checkpoint itself {checkpoint:.1f} s)" if checkpoint is not None else ""
            return Outcome(kernel_id, "hibernated", took, moved, gpus=tuple(h.get("devices") or ()),
                           lease=as_lease(obj), message=f"{format_size(moved)} of GPU memory moved to host memory "
                                                        f"on its node in {took:.1f} s{detail}.",
                           effects=M.step(M.Residency(M.HIBERNATING), M.CHECKPOINT_DONE).effects)
        if phase == R.RUNNING and desired(obj) == R.DESIRED_RUNNING and st.get("reason") not in (
                R.HIBERNATION_REFUSED, R.HIBERNATION_FAILED):
            raise HibernationRefused("busy", "A cell started before this kernel's hibernation was admitted, so it "
                                             "keeps running.")
        if phase == R.RUNNING:
            await self._ask(kernel_id, R.DESIRED_RUNNING, reason)  # the request is answered: it stands no more
            if st.get("reason") == R.HIBERNATION_REFUSED:
                kind = hibernation(obj).get("reason")
                raise HibernationRefused(REFUSAL_WORDS.get(kind, "unavailable"), st.get("message") or "Refused.",
                                         keep_running=kind not in LASTING)
            raise HibernationFailed("checkpoint_failed", st.get("message") or "The node agent's checkpoint failed.",
                                    recovered=True)
        raise HibernationFailed("lost", st.get("message") or "The kernel ended while it hibernated.", recovered=False)

    async def _withdraw(self, kernel_id: str, reason: str) -> None:
        """Ask Running again where the kernel still runs (its hibernation not admitted); a move under way is
        left to finish (the next cell resumes it)."""
        obj = self._obj(kernel_id)
        if obj is None or status(obj).get("phase") != R.RUNNING:
            return
        try:
            await self._ask(kernel_id, R.DESIRED_RUNNING, reason)
        except Exception:  # the operator's watch re-reads it; the next cell's resume asks again
            log.warning("kernel %s: could not withdraw its hibernation request", kernel_id, exc_info=True)

    # -- resume ------------------------------------------------------------------------------------

    def start_resume(self, kernel_id: str, reason: str = "user", *, hint: bool = False) -> asyncio.Task:
        """Start (or join) the kernel's resume; its outcome is put on record when it ends.  ``hint``: a resume
        the operator admits only where the node has room now and nobody waits (else declined, never queued);
        a cell or the user's Resume while it is under way makes it a real one."""
        task = self._resumes.get(kernel_id)
        if hint:
            if task is not None and not task.done():
                return task
            self._hinted.add(kernel_id)
            task = self._resumes[kernel_id] = asyncio.ensure_future(self._resume_on_hint(kernel_id))
            self._hints.add(task)
            task.add_done_callback(self._hints.discard)
        else:
            self.timers.cancel(kernel_id)  # its user wants it awake
            self._hinted.discard(kernel_id)
            if task is not None and not task.done() and task not in self._hints:
                self._asking(kernel_id, task)
                return task
            hinted = task if task is not None and not task.done() else None
            task = self._resumes[kernel_id] = asyncio.ensure_future(
                self._resume(kernel_id, reason) if hinted is None else self._for_real(kernel_id, hinted, reason))
            self._asking(kernel_id, task)
        future = asyncio.ensure_future(self._recorded(task, kernel_id, reason))
        self._recording.add(future)
        future.add_done_callback(self._recording.discard)
        return task

    async def _resume_on_hint(self, kernel_id: str) -> Outcome:
        """Ask a resume as a hint; wait for the operator's answer (within ``ADMISSION_TIMEOUT``) and, once
        admitted, for the node agent's restore.  Declined (no room now, others waiting, the owner's quota):
        the ask is withdrawn and the refusal says why, in the local pool's words."""

        def still_a_hint(o: dict) -> bool:
            return status(o).get("phase") == R.HIBERNATED and resume_hint(o)

        started = time.monotonic()
        if await self._ask(kernel_id, R.DESIRED_RUNNING, "hint", hint=True, only_if=wakes_on_hint) is None:
            raise HibernationRefused("in_progress", "This kernel is not simply sleeping (a move is under way): "
                                                    "there is nothing to wake in advance.")

        def answered(o: dict) -> bool:
            return status(o).get("phase") in (R.RESUMING, R.RUNNING, R.FAILED, R.STOPPED) or (
                status(o).get("phase") == R.HIBERNATED and hint_declined(o))

        while True:
            try:
                obj = await self._wait(kernel_id, answered, ADMISSION_TIMEOUT if kernel_id in self._hinted else None)
            except TimeoutError:  # the operator did not answer a guess: withdrawn (unless a cell made it real)
                if await self._ask(kernel_id, R.DESIRED_HIBERNATED, "hint", only_if=still_a_hint) is None:
                    continue
                self._hinted.discard(kernel_id)
                raise HibernationRefused("not_now", "The cluster's GPU pool operator did not answer, so this kernel "
                                         "was not woken in advance: it resumes when a cell runs.") from None
            st = status(obj) if obj is not None else {}
            if obj is None or st.get("phase") != R.HIBERNATED:
                break
            # declined: withdrawn, unless a cell's real ask came first (then its answer is awaited here too)
            if await self._ask(kernel_id, R.DESIRED_HIBERNATED, "hint", only_if=still_a_hint) is None:
                continue
            self._hinted.discard(kernel_id)
            raise HibernationRefused(hibernation(obj).get("declined") or "not_now", st.get("message") or
                                     "This kernel was not woken in advance: it resumes when a cell runs.")
        if obj is not None and status(obj).get("phase") == R.RESUMING:
            obj = await self._wait(kernel_id, lambda o: status(o).get("phase") != R.RESUMING, None)
        if obj is None or status(obj).get("phase") != R.RUNNING:
            self._hinted.discard(kernel_id)
        return await self._resumed(kernel_id, obj, started, "hint")

    async def _for_real(self, kernel_id: str, hinted: asyncio.Task, reason: str) -> Outcome:
        """A cell (or the user's Resume) came while a hint's resume was under way: ask it as a real resume
        (it queues if it must), and wait for that one resume.  Its record is the hint task's."""
        await self._ask(kernel_id, R.DESIRED_RUNNING, reason, only_if=resume_hint)
        try:
            outcome = await asyncio.shield(hinted)
        except HibernationRefused:  # declined and withdrawn before this ask landed: a resume of its own
            return await self._resume(kernel_id, reason)
        return dataclasses.replace(outcome, lease=None)  # on record once, by the hint's task

    async def _resume(self, kernel_id: str, reason: str) -> Outcome:
        obj = self._obj(kernel_id)
        state = residency_of_kernel(obj)
        if not M.allowed(state, M.CELL if reason == "cell" else M.RESUME):  # gone, failed: nothing to wake
            raise HibernationRefused("no_lease", "This kernel is gone, so there is nothing to resume.", status=404)
        if state.stage == M.ACTIVE and desired(obj) == R.DESIRED_RUNNING:  # awake, and no hibernation asked
            raise HibernationRefused("not_hibernated", "This kernel is running, not hibernated: there is nothing to "
                                                       "resume.")
        started = time.monotonic()
        written = await self._ask(kernel_id, R.DESIRED_RUNNING, reason)
        if status(written).get("phase") == R.RUNNING:
            # A hibernation asked but not admitted, withdrawn by this compare-and-set write (the operator's
            # admission is one too, so it cannot come after): nothing moved, nothing to put on record.
            return Outcome(kernel_id, "withdrawn", time.monotonic() - started, 0, lease=None,
                           message="Its hibernation was called off before it began.")
        generation = int(meta(written).get("generation") or 0)

        def ended(o: dict) -> bool:
            st = status(o)
            restore_failed = st.get("phase") == R.HIBERNATED and st.get("reason") == R.HIBERNATION_FAILED and \
                int(st.get("observedGeneration") or 0) >= generation  # the agent put it back, checkpointed
            return st.get("phase") in (R.RUNNING, R.FAILED, R.STOPPED) or restore_failed

        return await self._resumed(kernel_id, await self._wait(kernel_id, ended, None), started, reason)

    async def _resumed(self, kernel_id: str, obj: dict | None, started: float, reason: str) -> Outcome:
        """A resume's end, from the kernel's object once its phase settled: Running; back to Hibernated (the
        restore failed on its node: the agent put it back, checkpointed); or gone."""
        st = status(obj) if obj is not None else {}
        if st.get("phase") == R.HIBERNATED:  # not asked again at once: the restore failed on this node
            await self._ask(kernel_id, R.DESIRED_HIBERNATED, reason)
            raise HibernationFailed("restore_failed", st.get("message") or "The node agent's restore failed; the "
                                    "kernel stays hibernated.", recovered=True)
        if st.get("phase") != R.RUNNING:
            raise HibernationFailed("lost", st.get("message") or "The kernel ended before it could resume.",
                                    recovered=False)
        h = hibernation(obj)
        moved, took = int(h.get("bytes") or 0), time.monotonic() - started
        restored = M.Residency(M.RESTORING, hint=reason == "hint" and kernel_id in self._hinted)
        return Outcome(kernel_id, "resumed", took, moved, gpus=tuple(h.get("devices") or ()), lease=as_lease(obj),
                       message=f"{format_size(moved)} of GPU memory came back from host memory in {took:.1f} s.",
                       effects=M.step(restored, M.RESTORE_DONE).effects)

    async def _record_resume(self, task: asyncio.Task, kernel_id: str, reason: str) -> None:
        try:
            outcome = await asyncio.shield(task)
        except asyncio.CancelledError:
            return
        except HibernationFailed as e:
            obj = self._obj(kernel_id)
            if obj is not None:
                await self.recorder.record("hibernation_failed", as_lease(obj), reason=e.reason, message=e.message,
                                           action="resume", extra={"recovered": e.recovered})
            return
        except Exception:
            return  # a refusal (a hint declined among them): said to whoever asked
        hinted = reason == "hint" and kernel_id in self._hinted
        if reason == "hint" and not hinted:
            reason = "cell"  # a cell came while the hint's resume was under way: it was for the cell
        self.user_resumed(kernel_id, outcome.effects)
        if outcome.lease is not None:
            await self.recorder.record("resumed", outcome.lease, reason=reason, message=outcome.message,
                                       action="resume", rule="hibernation", duration=round(outcome.duration, 3),
                                       bytes=outcome.bytes,
                                       extra={"hold": self.hint_sleep_after} if hinted else None)
        if hinted and M.HOLD_FOR_CELL in outcome.effects:
            self.timers.after_hint(kernel_id, self.hint_sleep_after)

    async def stop(self) -> None:
        await self.timers.stop()
        for task in self._resumes.values():
            task.cancel()
        await asyncio.gather(*self._resumes.values(), *self._recording, return_exceptions=True)

