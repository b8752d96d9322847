"""The rig of the hibernator tests: a hibernator over real kernels on the stand-in machine
(hibernation_standin.py), with what a test needs to look at the ledger and the stand-in."""

from __future__ import annotations

from kernel_helpers import start_answering

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.hibernation import HibernationSettings, Hibernator, Kernels
from jupyter_gpu_pool.pools import pool_for
from jupyter_gpu_pool.pool import LeaseRequest

GiB = 2**30
MiB = 2**20  # what stand-in processes "hold": small, so the real free-RAM check passes on any CI box
RUNNING, LOCKED, CHECKPOINTED = cp.ProcessState.RUNNING, cp.ProcessState.LOCKED, cp.ProcessState.CHECKPOINTED


class Rig:
    """One test's hibernator over real kernels (it reports nothing itself: its moves return outcomes)."""

    def __init__(self, manager, standin, memory, **settings):
        self.manager, self.standin, self.memory = manager, standin, memory
        self.pool = pool_for()
        self.settings = HibernationSettings(**{"lock_timeout": 5.0, "queue_poll": 0.2, **settings})
        self.hibernator = Hibernator(self.pool, Kernels(manager), self.settings, driver=standin, memory=memory)

    async def gpu_kernel(self, profile: str = "small", gpu_bytes: int = 400 * MiB) -> tuple[str, int]:
        """A real kernel on the pool whose process holds ``gpu_bytes`` on its GPU (stand-in)."""
        kid, pid = await start_answering(self.manager, f"gpu-pool-{profile}")
        lease = self.lease(kid)
        if gpu_bytes:
            self.standin.add(pid, gpu_bytes, gpus=lease.gpus)
        return kid, pid

    def lease(self, kid: str):
        return self.pool.ledger.by_kernel(kid)

    def held_on(self, uuid: str) -> int:
        return next(u.memory for u in self.pool.ledger.snapshot().gpus if u.gpu.uuid == uuid)

    def block(self, uuid: str, memory: str, kernel_id: str) -> str:
        """Another user takes ``memory`` of the GPU ``uuid`` (a lease with no kernel); returns its id."""
        from jupyter_gpu_pool.pool import Profile, SliceSpec

        profile = Profile("blk", SliceSpec.parse(memory), "soft", "blk")
        elsewhere = []
        while True:  # placement picks the GPU: take leases until one lands where we want it
            lease = self.pool.ledger.allocate(LeaseRequest(owner="bob", kernel_id=kernel_id, profile=profile),
                                              self.pool.settings.quotas)
            if lease.gpus == (uuid,):
                break
            elsewhere.append(lease)
        for other in elsewhere:
            self.pool.ledger.release(other.id)
        return lease.id

    def journaled(self, kid: str) -> list[str]:
        return [e.kind for e in self.pool.ledger.journal() if e.kernel_id == kid]
