"""Moves a previous server left under way (it stopped, or died, mid-move): the lease still shows the move's
phase and nobody moves it.  The model's ``INTERRUPTED`` says where each ends; what the processes really are
(the driver's states, never a record of what was done) says whether it can get there: a kernel that held
no slice sleeps on; one caught mid-checkpoint or mid-restore is put back running on the slice it holds,
and where that fails too it is marked failed, saying where each process was left."""

from __future__ import annotations


from ..devices import checkpoint as cp
from ..devices import moves
from ..pool import Lease
from ..pool import residency as M
from .kernels import Kernels
from .outcomes import Notice
from .processes import Processes
from .steps import Steps


class Recovery:
    """Settles this server's kernels left mid-move (``capability(lease)``: whether the driver is asked)."""

    def __init__(self, kernels: Kernels, steps: Steps, processes: Processes, capability):
        self.kernels, self.steps, self.processes, self.capability = kernels, steps, processes, capability

    async def recover(self, lease: Lease) -> list[Notice]:
        """Settle a lease left in a move's phase with no move under way here."""
        state = M.residency_of(lease)
        settled = M.step(state, M.INTERRUPTED)
        if M.PUT_BACK_RUNNING in settled.effects:
            tree = self.kernels.pids(lease.kernel_id, lease.holder_pid)
            states = await self.processes.states(self.capability(lease), tree)
            if any(s in (cp.ProcessState.CHECKPOINTED, cp.ProcessState.LOCKED) for s in states.values()):
                result = await self.processes.put_back_running(sorted(states))
                if not moves.all_in(result, cp.ProcessState.RUNNING):
                    stuck = M.CHECKPOINT_STUCK if state.stage == M.HIBERNATING else M.RESTORE_STUCK
                    failed = await self.steps.fail(lease.kernel_id, stuck, state.stage, result, "recovery_failed",
                                                   "A move of this kernel was interrupted and could not be undone")
                    return [Notice("hibernation_failed", lease, failed.reason, failed.message)]
        await self.steps.report(lease.kernel_id, M.INTERRUPTED, was=state.stage)
        return []
