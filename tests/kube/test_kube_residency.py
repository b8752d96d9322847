"""A GPUKernel's GPU residency, the cluster's reading of the lifecycle's one model (``pool.residency``): what
each phase of its object is, where the node agent's report of a move settles it, and which phases the agent
moves.  Pure: objects as the watch has them, no API server."""

from __future__ import annotations

import pytest

from jupyter_gpu_pool.cluster.kernels import residency_of_kernel, settled_phase
from jupyter_gpu_pool.cluster.resources import (DESIRED_HIBERNATED, DESIRED_RUNNING, FAILED, HIBERNATED,
                                                HIBERNATING, PENDING, RESUME_DECLINED, RESUMING, RUNNING,
                                                WAITING_FOR_ROOM)
from jupyter_gpu_pool.operator.pod_moves import MOVES, report
from jupyter_gpu_pool.pool import residency as M
from jupyter_gpu_pool.pool.residency import Residency


def kernel(phase: str, desired: str = DESIRED_RUNNING, *, reason: str = "", queue: int | None = None,
           hint: bool = False, generation: int = 1, observed: int = 1) -> dict:
    return {"metadata": {"name": "k-1", "namespace": "ns", "uid": "u1", "generation": generation},
            "spec": {"kernelId": "1", "owner": "ann", "desiredState": desired, "resumeHint": hint or None},
            "status": {"phase": phase, "admitted": {"memory": 2**30, "at": 1.0}, "reason": reason,
                       "observedGeneration": observed, "hibernation": {"queuePosition": queue}}}


@pytest.mark.parametrize("obj, residency", [
    (kernel(RUNNING), Residency(M.ACTIVE)),
    (kernel(RUNNING, DESIRED_HIBERNATED), Residency(M.ACTIVE)),  # asked, not admitted yet: nothing moved
    (kernel(HIBERNATING, DESIRED_HIBERNATED), Residency(M.HIBERNATING)),
    (kernel(HIBERNATED, DESIRED_HIBERNATED), Residency(M.HIBERNATED)),
    (kernel(HIBERNATED), Residency(M.RESUMING)),  # asked back: the operator admits it, or queues it
    (kernel(HIBERNATED, reason=WAITING_FOR_ROOM, queue=2), Residency(M.QUEUED)),
    (kernel(HIBERNATED, hint=True, reason=RESUME_DECLINED), Residency(M.HIBERNATED)),  # declined: sleeps on
    (kernel(RESUMING), Residency(M.RESTORING)),  # admitted into room on its GPU: the agent restores
    (kernel(FAILED), Residency(M.GONE)),  # its pod deleted, its slice freed
    (None, Residency(M.GONE)),
])
def test_each_phase_of_a_kernels_object_is_a_residency(obj, residency):
    assert residency_of_kernel(obj) == residency


def test_a_kernel_woken_on_a_hint_is_read_so_where_its_server_says():
    assert residency_of_kernel(kernel(RUNNING), hint=True) == Residency(M.ACTIVE, hint=True)
    assert residency_of_kernel(kernel(RESUMING), hint=True) == Residency(M.RESTORING, hint=True)
    assert residency_of_kernel(kernel(HIBERNATED, DESIRED_HIBERNATED), hint=True) == Residency(M.HIBERNATED)


@pytest.mark.parametrize("phase, outcome, settled", [
    (HIBERNATING, "done", HIBERNATED), (HIBERNATING, "undone", RUNNING), (HIBERNATING, "stuck", FAILED),
    (RESUMING, "done", RUNNING), (RESUMING, "undone", HIBERNATED), (RESUMING, "stuck", FAILED),
])
def test_where_the_agents_report_of_a_move_settles_the_kernel(phase, outcome, settled):
    assert settled_phase(phase, report(phase, outcome)) == settled


def test_the_agent_moves_kernels_in_the_phases_whose_move_it_carries_out_and_no_other():
    assert set(MOVES) == {HIBERNATING, RESUMING}
    with pytest.raises(M.Refused):
        settled_phase(HIBERNATING, M.RESTORE_DONE)  # a restore is no report of a checkpoint
    with pytest.raises(KeyError):
        settled_phase(PENDING, M.CHECKPOINT_DONE)  # a starting kernel is no move of its memory
