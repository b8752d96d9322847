"""The journal: what happened to the pool's kernels, and why (allocations, refusals, releases,
reclaims, the policy's warnings and actions).  Stores keep it; the UI and the planner read it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class JournalEntry:
    seq: int
    at: float
    kind: str
    lease_id: str | None
    kernel_id: str | None
    owner: str | None
    reason: str
    detail: dict

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
