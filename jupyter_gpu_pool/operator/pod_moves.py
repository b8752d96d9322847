"""The node agent's part of hibernation: a kernel pod's CUDA processes moved to host RAM and back.

The operator admits a move by setting a GPUKernel's ``status.phase`` (Running → Hibernating,
Hibernated → Resuming); the agent of the kernel's node carries it out and settles the phase
(Hibernating → Hibernated, Resuming → Running) with a status write that carries the
``resourceVersion`` it read: compare-and-set.  Where each outcome of a move (done, undone, stuck)
leaves the kernel is the lifecycle's model's (``pool.residency``, through ``cluster.kernels.settled_phase``),
the same as on one machine.  A conflict is re-read; where the phase is still the
one the move started from, the write is made on the new version, and a phase someone else moved is
never overwritten (the processes are then brought to what that phase says: a kernel counted running
runs, one counted hibernated holds no GPU memory).

Which processes: only the kernel's own pod's, found from the pod, never from anything written in a
resource.  The pod ``status.pod`` names must be on this node, labelled a kernel pod of this GPUKernel
and owned by it (an ownerReference with the kernel's uid); its processes are those whose cgroup names
that pod's uid (:func:`.agent.pids_of_pod`).  A kernel whose status names any other pod is refused
(``HibernationRefused``) with nothing touched, so a user's server (which writes the spec, never the
status) cannot make this privileged agent checkpoint or stop anything else.

Each move starts from the processes' real CUDA states (``driver.state``), so one interrupted by an
agent restart is finished by the next agent, or undone where it cannot be finished:

- Hibernating: lock every running process (all or none: one whose GPU work outlasts the lock timeout
  leaves the kernel running, untouched), checkpoint every locked one; a checkpoint that fails puts
  every process back running.  Settles Hibernated with the bytes NVML saw before and the seconds.
- Resuming: restore every checkpointed process on the GPU it came from (the pod stays on its node and
  GPU: no remap), then unlock each; a restore that fails puts every process back checkpointed.
  Settles Running.
- A move that can be neither finished nor undone marks the kernel Failed (the operator then deletes
  its pod and frees its slice), after the precaution for processes this agent restored
  (``devices.checkpoint.prepare_kill``: killing a just-restored process hung a host on one driver).

A pod gone (deleted while hibernated or resuming) leaves nothing to do here: nothing is written, and
the operator frees the slice.

Before the operator deletes a pod this agent resumed, it asks for the same precaution
(``status.killPrecaution``: :meth:`PodMover.answer_kill`): the pod named there must pass
:func:`kernel_pod`, and the answer is a compare-and-set write as the moves' are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from ..cluster.kernels import RESIDENCY_OF_PHASE, meta, settled_phase, status
from ..cluster.resources import (GROUP, HIBERNATED, HIBERNATING, HIBERNATION_FAILED, HIBERNATION_REFUSED,
                                 KERNEL_COMPONENT, KERNEL_KIND, KERNELS, LABEL_COMPONENT, LABEL_KERNEL, RESUMING,
                                 RUNNING, VERSION)
from ..devices import checkpoint as cp
from ..devices import moves
from ..pool import format_size
from ..pool import residency as M

log = logging.getLogger("jupyter_gpu_pool.agent")

MERGE = "application/merge-patch+json"
SETTLE_ATTEMPTS = 10  # conflicts in a row (other writers' heartbeats, usage reports) before a move gives up
# A move's outcomes, as the model's events: its checkpoint (Hibernating) or its restore (Resuming) done, undone
# (everything put back as it was), or stuck (neither).
_OUTCOMES = {"done": (M.CHECKPOINT_DONE, M.RESTORE_DONE), "undone": (M.CHECKPOINT_UNDONE, M.RESTORE_UNDONE),
             "stuck": (M.CHECKPOINT_STUCK, M.RESTORE_STUCK)}
# The phases whose move this agent carries out: those a checkpoint's or a restore's outcome settles.
MOVES = tuple(phase for phase, state in RESIDENCY_OF_PHASE.items() if M.allowed(state, M.CHECKPOINT_DONE)
              or M.allowed(state, M.RESTORE_DONE))


def report(phase: str, outcome: str) -> str:
    """The model's event for the ``outcome`` (done, undone, stuck) of the move a kernel in ``phase`` is in."""
    return next(e for e in _OUTCOMES[outcome] if M.allowed(RESIDENCY_OF_PHASE[phase], e))


class NotItsPod(Exception):
    """The pod a GPUKernel's status names is not that kernel's own pod on this node: nothing is touched."""


def kernel_pod(kernel: dict, pods: Iterable[dict], node: str, name: str | None = None,
               terminating: bool = False) -> dict | None:
    """The kernel's own pod on ``node``, as ``status.pod`` (or ``name``) names it, from ``pods`` (this
    node's kernel pods, as the agent watches them); None where no pod of that name is here, or it is being
    deleted (gone, or going: nothing to move) unless ``terminating``.  Raises :class:`NotItsPod` where
    the pod so named belongs to something else."""
    name, namespace = name if name is not None else status(kernel).get("pod"), meta(kernel).get("namespace")
    if not name:
        raise NotItsPod("its status names no pod, so there are no processes to move; nothing was touched.")
    pod = next((p for p in pods if meta(p).get("namespace") == namespace and meta(p).get("name") == name), None)
    if pod is None or (meta(pod).get("deletionTimestamp") and not terminating):
        return None
    wrong = []
    labels = meta(pod).get("labels") or {}
    if labels.get(LABEL_COMPONENT) != KERNEL_COMPONENT:
        wrong.append("it is not a kernel pod")
    if labels.get(LABEL_KERNEL) != meta(kernel).get("name"):
        wrong.append("it is labelled for another kernel")
    if not any(ref.get("kind") == KERNEL_KIND and ref.get("controller") and ref.get("uid") == meta(kernel).get("uid")
               for ref in meta(pod).get("ownerReferences") or []):
        wrong.append("this kernel does not own it")
    if (pod.get("spec") or {}).get("nodeName") != node:
        wrong.append(f"it does not run on node {node}")
    if wrong:
        raise NotItsPod(f"its status names pod {name}, which is not this kernel's own pod ({'; '.join(wrong)}); "
                        "nothing was touched.")
    return pod


def _census(states: dict[int, str]) -> str:
    """Where a group of processes was left, in words: "1 checkpointed, 1 running"."""
    counts: dict[str, int] = {}
    for word in states.values():
        word = word if word in {s.word for s in cp.ProcessState} else "unknown"
        counts[word] = counts.get(word, 0) + 1
    return ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))


class PodMover:
    """Carries out the moves the operator admitted for the kernels of one node.

    ``pids_of(pod_uid)`` lists the processes whose cgroup names a pod; ``source`` is the agent's NVML
    reading per process (what a checkpoint moves, and where); ``driver`` the checkpoint calls."""

    def __init__(self, node: str, custom, driver: Callable[[], cp.Driver], source, gpus: Iterable[str],
                 pids_of: Callable[[str], list[int]], lock_timeout: float = 10.0,
                 checkpoint_before_kill: bool = True, clock: Callable[[], float] = time.time):
        self.node = node
        self.custom = custom
        self._driver = driver
        self.source = source
        self.gpus = set(gpus)
        self.pids_of = pids_of
        self.lock_timeout = lock_timeout
        self.checkpoint_before_kill = checkpoint_before_kill
        self.clock = clock
        self.restored: dict[str, list[int]] = {}  # pod uid -> processes this agent restored (prepare_kill)
        self.measured: dict[str, tuple[int, list[str]]] = {}  # pod uid -> NVML's bytes and GPUs before its checkpoint

    @property
    def driver(self) -> cp.Driver:
        return self._driver()

    # -- the move -----------------------------------------------------------------------------

    async def move(self, kernel: dict, pods: Iterable[dict]) -> None:
        """Carry out the move ``kernel``'s phase asks for (Hibernating or Resuming) on its own pod's
        processes, and settle the phase; nothing where its pod is not on this node any more."""
        phase = status(kernel).get("phase")
        if phase not in MOVES:
            return
        try:
            pod = kernel_pod(kernel, pods, self.node)
        except NotItsPod as e:
            log.warning("kernel %s/%s: %s", meta(kernel).get("namespace"), meta(kernel).get("name"), e)
            await self._settle(kernel, None, phase, report(phase, "undone"), HIBERNATION_REFUSED,
                               f"The node agent refused to {'hibernate' if phase == HIBERNATING else 'resume'} "
                               f"this kernel: {e}")
            return
        if pod is None:
            log.info("kernel %s/%s is %s but its pod %s is not on node %s (deleted): nothing to move",
                     meta(kernel).get("namespace"), meta(kernel).get("name"), phase, status(kernel).get("pod"),
                     self.node)
            return
        pids = await asyncio.to_thread(self.pids_of, meta(pod)["uid"])
        try:
            states = await asyncio.to_thread(cp.cuda_processes, self.driver, pids)
        except cp.CheckpointUnavailable as e:
            await self._settle(kernel, pod, phase, report(phase, "undone"), HIBERNATION_REFUSED if phase == HIBERNATING
                               else HIBERNATION_FAILED,
                               f"The CUDA checkpoint API is unavailable on node {self.node} ({e.reason}); "
                               + ("the kernel runs on its GPU, untouched." if phase == HIBERNATING
                                  else "the kernel stays hibernated."))
            return
        if any(s == cp.ProcessState.FAILED for s in states.values()):
            await self._fail(kernel, pod, {pid: s.word for pid, s in states.items()},
                             "A process of this kernel is in the CUDA driver's failed state")
            return
        if phase == HIBERNATING:
            await self._hibernate(kernel, pod, states)
        else:
            await self._resume(kernel, pod, states)

    async def _hibernate(self, kernel: dict, pod: dict, states: dict[int, cp.ProcessState]) -> None:
        pids = sorted(states)
        running = [pid for pid in pids if states[pid] == cp.ProcessState.RUNNING]
        interrupted = len(running) != len(pids)  # a previous agent began this move: finish it
        held, devices = await self._held(pids)
        uid = meta(pod)["uid"]
        if interrupted:  # NVML no longer sees what was checkpointed: what this agent measured, or last reported
            usage = status(kernel).get("usage") or {}
            measured, on = self.measured.get(uid, (0, []))
            held = max(held, measured, int(usage.get("memoryUsed") or 0))
            devices = sorted(set(devices) | set(on) | set(usage.get("devices") or []))
        self.measured[uid] = (held, devices)
        started = time.monotonic()
        try:
            await asyncio.to_thread(moves.lock_all, self.driver, running, self.lock_timeout)
        except cp.CheckpointError as e:
            if interrupted:
                await self._undo_hibernation(kernel, pod, pids, e)
                return
            if isinstance(e, cp.LockTimeout):
                why = (f"its GPU work did not finish within {self.lock_timeout:g} s, so it was left running, "
                       "untouched; it can hibernate once its GPU is quiet.")
            elif isinstance(e, cp.NotSupported):
                why = (f"the CUDA driver cannot checkpoint it ({e.error_name}: an MPS client, MIG, CUDA IPC or "
                       "multi-process NCCL); it was left running, untouched.")
            else:
                why = f"its GPU work could not be paused ({e}); it was left running, untouched."
            await self._settle(kernel, pod, HIBERNATING, M.CHECKPOINT_UNDONE, HIBERNATION_REFUSED,
                               f"This kernel did not hibernate: {why}")
            return
        try:
            to_checkpoint = [pid for pid in pids if states[pid] != cp.ProcessState.CHECKPOINTED]  # all locked now
            await asyncio.to_thread(moves.checkpoint_all, self.driver, to_checkpoint)
        except cp.CheckpointError as e:
            await self._undo_hibernation(kernel, pod, pids, e)
            return
        if interrupted:  # some were checkpointed already; the rest are now: check all are
            states_now = await asyncio.to_thread(cp.cuda_processes, self.driver, pids)
            if any(s != cp.ProcessState.CHECKPOINTED for s in states_now.values()):
                await self._undo_hibernation(kernel, pod, pids, RuntimeError("not every process was checkpointed"))
                return
        seconds = round(time.monotonic() - started, 3)
        sentence = (f"{format_size(held)} of GPU memory moved to host RAM in {seconds:.1f} s" if pids
                    else "this kernel holds no GPU memory, so nothing had to move")
        if await self._settle(kernel, pod, HIBERNATING, M.CHECKPOINT_DONE, "", f"Hibernated: {sentence}; every "
                              "variable is kept.", hibernatedAt=self.clock(), bytes=held, checkpointSeconds=seconds,
                              devices=devices) is not None:
            self.measured.pop(uid, None)

    async def _undo_hibernation(self, kernel: dict, pod: dict, pids: list[int], error: Exception) -> None:
        back = await asyncio.to_thread(moves.put_back_running, self.driver, pids)
        if moves.all_in(back, cp.ProcessState.RUNNING):
            await self._settle(kernel, pod, HIBERNATING, M.CHECKPOINT_UNDONE, HIBERNATION_FAILED,
                               f"The checkpoint of this kernel failed ({error}); everything was put back as it was "
                               "and the kernel runs on its GPU.")
            return
        await self._fail(kernel, pod, back, f"The checkpoint of this kernel failed ({error}) and could not be undone")

    async def _resume(self, kernel: dict, pod: dict, states: dict[int, cp.ProcessState]) -> None:
        pids = sorted(states)
        started = time.monotonic()
        try:
            restored = await asyncio.to_thread(moves.restore_all, self.driver, pids)  # no GPU pairs: the same GPU
        except cp.CheckpointError as e:
            await self._undo_resume(kernel, pod, pids, e)
            return
        if restored:
            self.restored.setdefault(meta(pod)["uid"], []).extend(restored)
        unlocked = await asyncio.to_thread(moves.drive, self.driver, pids,
                                           ((cp.ProcessState.LOCKED, self.driver.unlock, cp.ProcessState.RUNNING),))
        if not moves.all_in(unlocked, cp.ProcessState.RUNNING):
            await self._undo_resume(kernel, pod, pids, RuntimeError(f"unlocking left {_census(unlocked)}"))
            return
        seconds = round(time.monotonic() - started, 3)
        _, devices = await self._held(pids)
        was = status(kernel).get("hibernation") or {}
        moved = int(was.get("bytes") or 0)
        sentence = (f"{format_size(moved)} back on the GPU in {seconds:.1f} s" if restored
                    else "nothing had to move back")
        await self._settle(kernel, pod, RESUMING, M.RESTORE_DONE, "", f"Resumed: {sentence}; every variable is as it "
                           "was.", resumedAt=self.clock(), pod=meta(pod)["name"], restoreSeconds=seconds,
                           devices=devices or was.get("devices") or [])

    async def _undo_resume(self, kernel: dict, pod: dict, pids: list[int], error: Exception) -> None:
        back = await asyncio.to_thread(moves.put_back_checkpointed, self.driver, pids, self.lock_timeout)
        if moves.all_in(back, cp.ProcessState.CHECKPOINTED):
            await self._settle(kernel, pod, RESUMING, M.RESTORE_UNDONE, HIBERNATION_FAILED,
                               f"Restoring this kernel's GPU memory failed ({error}); it is hibernated as before. "
                               "Try again, or restart it.")
            return
        await self._fail(kernel, pod, back, f"Restoring this kernel's GPU memory failed ({error}) and could not be "
                         "undone")

    async def _fail(self, kernel: dict, pod: dict, states: dict[int, str], what: str) -> None:
        """Neither done nor undone: the kernel's GPU state cannot be trusted.  Marked Failed (the operator
        deletes its pod and frees its slice), once the processes this agent restored are made safe to kill."""
        pids = await asyncio.to_thread(self.pids_of, meta(pod)["uid"])
        try:  # where each process really is now (a drive's result says only where its last step left it)
            real = await asyncio.to_thread(cp.cuda_processes, self.driver, [p for p in pids if p in states])
            states = {**states, **{pid: s.word for pid, s in real.items()}}
        except cp.CheckpointError:
            pass
        await self.before_kill(meta(pod)["uid"], pids)
        log.error("kernel %s/%s: %s; CUDA states %s", meta(kernel).get("namespace"), meta(kernel).get("name"), what,
                  states)
        phase = status(kernel).get("phase")
        await self._settle(kernel, pod, phase, report(phase, "stuck"), HIBERNATION_FAILED,
                           f"{what}: its processes were left {_census(states)}. Its GPU state cannot be trusted, so "
                           "the kernel is stopped and its GPU slice freed; start it again (unsaved variables are "
                           "lost).")

    async def before_kill(self, pod_uid: str, pids: list[int]) -> dict[int, str]:
        """The precaution before a pod's processes are killed: each this agent restored that runs on its
        GPU is locked and checkpointed again (``prepare_kill``); returns what was done to each."""
        restored = set(self.restored.pop(pod_uid, []))
        if not self.checkpoint_before_kill or not restored:
            return {}
        done = await asyncio.to_thread(cp.prepare_kill, self.driver, [p for p in pids if p in restored],
                                       self.lock_timeout)
        for pid, what in done.items():
            log.info("pod %s: pid %s %s before its kill", pod_uid, pid, what)
        return done

    async def answer_kill(self, kernel: dict, pods: Iterable[dict]) -> None:
        """The operator asks, before it deletes a pod this agent may have resumed (status.killPrecaution),
        for :meth:`before_kill` on that pod's processes; do it, and answer.  The pod must be the kernel's
        own (:func:`kernel_pod`: labelled for it, owned by it, on this node), its processes are found from
        its cgroup, and only those this agent restored are touched: a request naming any other pod is
        answered with the refusal, and nothing is touched."""
        asked = status(kernel).get("killPrecaution") or {}
        namespace, name = meta(kernel).get("namespace"), meta(kernel).get("name")
        try:
            pod = kernel_pod(kernel, pods, self.node, name=asked.get("pod") or "", terminating=True)
        except NotItsPod as e:
            log.warning("kernel %s/%s: the checkpoint before a kill was refused: %s", namespace, name, e)
            await self._answer(kernel, f"Refused: {e}")
            return
        if pod is None:
            await self._answer(kernel, f"Pod {asked.get('pod')} is not on node {self.node}: nothing to do.")
            return
        uid = meta(pod)["uid"]
        done = await self.before_kill(uid, await asyncio.to_thread(self.pids_of, uid))
        words = "; ".join(f"pid {pid} {what}" for pid, what in sorted(done.items()))
        if not self.checkpoint_before_kill:
            words = "the precaution is off on this node (AgentApp.checkpoint_before_kill)"
        elif not done:
            words = "no process of this pod was restored by this agent and still runs on its GPU"
        await self._answer(kernel, f"Safe to kill: {words}.")

    async def _answer(self, kernel: dict, message: str) -> None:
        """Answer the kill precaution's request the kernel carries, by compare-and-set: on a conflict the
        kernel is read again and the answer written only where the same request still waits for one."""
        from kubernetes_asyncio.client.exceptions import ApiException

        namespace, name = meta(kernel)["namespace"], meta(kernel)["name"]
        asked = status(kernel).get("killPrecaution") or {}
        current = kernel
        for _ in range(SETTLE_ATTEMPTS):
            now = status(current).get("killPrecaution") or {}
            if (now.get("pod"), now.get("requestedAt")) != (asked.get("pod"), asked.get("requestedAt")) or \
                    now.get("answeredAt") is not None:
                return  # asked again, or answered: the next request is its own
            body = {"metadata": {"resourceVersion": meta(current)["resourceVersion"]},
                    "status": {"killPrecaution": {"answeredAt": self.clock(), "message": message}}}
            try:
                await self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, KERNELS, name, body, _content_type=MERGE)
                log.info("kernel %s/%s: kill precaution for pod %s answered: %s", namespace, name, asked.get("pod"),
                         message)
                return
            except ApiException as e:
                if e.status == 404:
                    return
                if e.status != 409:
                    raise
            current = await self._read(namespace, name)
            if current is None:
                return
        raise RuntimeError(f"kernel {namespace}/{name}: {SETTLE_ATTEMPTS} conflicting writes in a row; the kill "
                           "precaution's answer waits for the next pass")

    async def _held(self, pids: list[int]) -> tuple[int, list[str]]:
        """NVML's reading of what ``pids`` hold on this node's GPUs: bytes, and on which GPUs."""
        if not pids:
            return 0, []
        per_gpu = await asyncio.to_thread(self.source.read, self.gpus)
        wanted = set(pids)
        held, devices = 0, set()
        for gpu, procs in per_gpu.items():
            for pid, reading in procs.items():
                if pid in wanted:
                    devices.add(gpu)
                    held += reading.memory or 0
        return held, sorted(devices)

    # -- the status write: compare-and-set ----------------------------------------------------

    async def _settle(self, kernel: dict, pod: dict | None, expect: str, event: str, reason: str,
                      message: str, /, **hibernation) -> dict | None:
        """Move the kernel's phase from ``expect`` (its move) to where the move's outcome ``event`` leaves it
        (:func:`~jupyter_gpu_pool.cluster.kernels.settled_phase`) with a write that carries the
        resourceVersion read (the kernel's, then each re-read's); returns the kernel as written, or None
        where the kernel is gone or someone else moved its phase (then the processes are brought to what
        that phase says, and nothing is overwritten)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        namespace, name = meta(kernel)["namespace"], meta(kernel)["name"]
        phase = settled_phase(expect, event)
        update = {"phase": phase, "reason": reason, "message": message,
                  "hibernation": {**hibernation, "reason": reason, "message": message}}
        if event == M.RESTORE_DONE:  # restored anew: an earlier answer before a kill holds no more
            update["killPrecaution"] = None
        current = kernel
        for _ in range(SETTLE_ATTEMPTS):
            if status(current).get("phase") != expect:
                log.info("kernel %s/%s: its phase moved to %s meanwhile (not %s): left as it is", namespace, name,
                         status(current).get("phase"), expect)
                await self.conform(current, pod)
                return None
            body = {"metadata": {"resourceVersion": meta(current)["resourceVersion"]}, "status": update}
            try:
                written = await self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, KERNELS, name, body, _content_type=MERGE)
                log.info("kernel %s/%s: %s -> %s %s", namespace, name, expect, phase, message)
                return written
            except ApiException as e:
                if e.status == 404:
                    return None
                if e.status != 409:
                    raise
            current = await self._read(namespace, name)
            if current is None:
                return None
        raise RuntimeError(f"kernel {namespace}/{name}: {SETTLE_ATTEMPTS} conflicting writes in a row; its phase "
                           f"stays {expect}, and the next pass tries again")

    async def _read(self, namespace: str, name: str) -> dict | None:
        """The kernel as the API server has it now, through an empty status patch (no write, no watch
        event: the agent's right to patch status is all it needs); None when it is gone."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, KERNELS, name,
                                                                           {}, _content_type=MERGE)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def conform(self, kernel: dict, pod: dict | None) -> None:
        """Bring the processes of a kernel whose phase someone else settled to what that phase says (its
        slice is counted so): Running runs on its GPU, Hibernated holds no GPU memory.  A phase that is a
        move is left to that move; a kernel without its pod here, to the operator."""
        phase = status(kernel).get("phase")
        if phase not in (RUNNING, HIBERNATED):
            return
        if pod is None or status(kernel).get("pod") != meta(pod).get("name"):
            return
        pids = await asyncio.to_thread(self.pids_of, meta(pod)["uid"])
        if phase == RUNNING:
            ended = await asyncio.to_thread(moves.put_back_running, self.driver, pids)
        else:
            ended = await asyncio.to_thread(moves.put_back_checkpointed, self.driver, pids, self.lock_timeout)
        log.info("kernel %s/%s is %s: its processes brought to match (%s)", meta(kernel).get("namespace"),
                 meta(kernel).get("name"), phase, _census(ended) or "no CUDA process")
