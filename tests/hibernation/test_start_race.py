"""A kernel whose first process dies at start (it lost the race for a port jupyter_client picked: another
process bound it first) is started again by jupyter_client's restarter on new ports, with a new pid.
CI saw it: a hibernation test read the pid at launch, the stand-in held the dead process's memory, and
the hibernation waited for a cache release that the live kernel never got.  The first launch here
really dies (its command exits before ipykernel starts), the way a lost port race ends."""

from __future__ import annotations

import psutil
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from kernel_helpers import kernelspec_wrapping, run_code, start_answering
from rig_helpers import CHECKPOINTED, MiB, Rig
from traitlets.config import Config

# jupyter_client's restarter looks every 0.5 s, not every 3 s: the first launch's death is seen sooner
RESTARTER = Config({"KernelRestarter": {"time_to_dead": 0.5}})


def dies_once_kernelspec(tmp_path) -> str:
    """gpu-pool-small's kernelspec, whose first launch exits at once."""
    mark = tmp_path / "launched-once"
    return kernelspec_wrapping("gpu-pool-small", "gpu-pool-dies-once",
                               f'if [ ! -e "{mark}" ]; then touch "{mark}"; exit 1; fi')


async def test_a_kernel_restarted_at_start_is_known_by_the_process_that_answers(standin_machine, tmp_path):
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path), config=RESTARTER)
    try:
        kid, pid = await start_answering(manager, dies_once_kernelspec(tmp_path))
        assert (tmp_path / "launched-once").exists()  # the first launch ran, and died
        assert psutil.pid_exists(pid) and manager.get_kernel(kid).provisioner.pid == pid
        assert await run_code(manager.get_kernel(kid), "import os; print(os.getpid())") == f"{pid}\n"
    finally:
        await manager.shutdown_all(now=True)


async def test_a_kernel_restarted_at_start_keeps_one_slice_and_hibernates(standin_machine, standin, standin_memory,
                                                                         tmp_path):
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path), config=RESTARTER)
    try:
        rig = Rig(manager, standin, standin_memory)
        kid, pid = await start_answering(manager, dies_once_kernelspec(tmp_path))
        leases = [lease for lease in rig.pool.ledger.snapshot().leases if lease.kernel_id == kid]
        assert len(leases) == 1  # the restart kept the kernel's slice; it did not take a second
        standin.add(pid, 400 * MiB, gpus=leases[0].gpus)
        await rig.hibernator.hibernate(kid)
        assert standin.procs[pid].state == CHECKPOINTED
    finally:
        await manager.shutdown_all(now=True)
