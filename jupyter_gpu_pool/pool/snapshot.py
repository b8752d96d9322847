"""One consistent read of the whole pool: each GPU's usage, the held leases, the queue."""

from __future__ import annotations

from dataclasses import dataclass

from .leases import Lease
from .placement import GPUUsage
from .queue import Waiter


@dataclass(frozen=True)
class Snapshot:
    at: float
    gpus: list[GPUUsage]
    leases: list[Lease]
    waiters: list[Waiter]

    def leases_of(self, owner: str) -> list[Lease]:
        return [lease for lease in self.leases if lease.owner == owner]

    def leases_on(self, gpu_uuid: str) -> list[Lease]:
        return [lease for lease in self.leases if gpu_uuid in lease.gpus]

    def lease_of_kernel(self, kernel_id: str) -> Lease | None:
        return next((lease for lease in self.leases if lease.kernel_id == kernel_id), None)

    def waiter_of_kernel(self, kernel_id: str) -> Waiter | None:
        return next((w for w in self.waiters if w.kernel_id == kernel_id), None)
