"""A group of CUDA processes moved together through the checkpoint API (:mod:`.checkpoint`).

A kernel is several processes (ipykernel and the CUDA workers it started; on a cluster, a pod's
containers).  Every one is locked before any is checkpointed, so none runs on while another's memory
is gone; a step that fails is undone for all of them; and a group left mid-move (a mover that died)
is driven from each process's real CUDA state, never from a record of what was done.  The hibernator
(one machine) and the node agent (a kernel pod) both move kernels with these.

Every function blocks (driver calls; a checkpoint of 32 GiB takes ~18 s): async callers use
``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .checkpoint import CheckpointError, Driver, ProcessState

log = logging.getLogger(__name__)

Step = tuple[ProcessState, Callable[[int], None], ProcessState]  # (from state, driver call, resulting state)


def drive(drv: Driver, pids: Iterable[int], steps: Iterable[Step]) -> dict[int, str]:
    """Take each process through ``steps`` in order from wherever it is; return the state word each
    ended in (or why it is unknown)."""
    steps = list(steps)
    states: dict[int, str] = {}
    for pid in pids:
        try:
            state = drv.state(pid)
            for before, call, after in steps:
                if state == before:
                    call(pid)
                    state = after
            states[pid] = state.word
        except CheckpointError as e:
            states[pid] = f"unknown ({e})"
    return states


def put_back_running(drv: Driver, pids: Iterable[int]) -> dict[int, str]:
    """Bring each process back to RUNNING on the GPU it was checkpointed from; return where each ended."""
    return drive(drv, pids, ((ProcessState.CHECKPOINTED, drv.restore, ProcessState.LOCKED),
                             (ProcessState.LOCKED, drv.unlock, ProcessState.RUNNING)))


def put_back_checkpointed(drv: Driver, pids: Iterable[int], lock_timeout: float) -> dict[int, str]:
    """Bring each process back to CHECKPOINTED (its memory in host RAM); return where each ended."""
    def lock(pid: int) -> None:
        drv.lock(pid, lock_timeout)

    return drive(drv, pids, ((ProcessState.RUNNING, lock, ProcessState.LOCKED),
                             (ProcessState.LOCKED, drv.checkpoint, ProcessState.CHECKPOINTED)))


def all_in(states: dict[int, str], state: ProcessState) -> bool:
    """Whether every process of a :func:`drive` result ended in ``state``."""
    return all(word == state.word for word in states.values())


def unlock_each(drv: Driver, pids: Iterable[int]) -> None:
    """Unlock each process, logging (not raising) a refusal: an undo must reach every process."""
    for pid in pids:
        try:
            drv.unlock(pid)
        except CheckpointError:
            log.exception("could not unlock pid %s", pid)


def lock_all(drv: Driver, pids: Iterable[int], timeout: float) -> None:
    """Lock every process, or none: when one lock fails (its GPU work outlasted ``timeout``:
    :class:`~.checkpoint.LockTimeout`; the driver cannot checkpoint it: ``NotSupported``), those
    locked before it are unlocked and the error is raised, every process left running."""
    locked: list[int] = []
    try:
        for pid in pids:
            drv.lock(pid, timeout)
            locked.append(pid)
    except CheckpointError:
        unlock_each(drv, locked)
        raise


def checkpoint_all(drv: Driver, pids: Iterable[int]) -> None:
    """Checkpoint every (locked) process; raises the first failure (undo with :func:`put_back_running`)."""
    for pid in pids:
        drv.checkpoint(pid)


def restore_all(drv: Driver, pids: Iterable[int], pairs: list[tuple[str, str]] | None = None) -> list[int]:
    """Restore each process that is checkpointed (``pairs``: onto other GPUs, where the driver can);
    return those restored.  Raises the first failure (undo with :func:`put_back_checkpointed`)."""
    restored = []
    for pid in pids:
        if drv.state(pid) == ProcessState.CHECKPOINTED:
            drv.restore(pid, pairs)
            restored.append(pid)
    return restored
