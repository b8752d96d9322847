"""What a move of a kernel's memory returns to its caller, who puts it on record (the hibernator reports
nothing itself)."""

from __future__ import annotations

from dataclasses import dataclass

from ..pool import Lease


@dataclass(frozen=True)
class Outcome:
    """A completed move: ``action`` is hibernated, resumed or took_slice; ``message`` says it for its user.
    ``effects``: what the residency model (``pool.residency``) left for the caller to carry out, such as
    ``restart_idle_clock`` (its user asked for it awake) or ``hold_for_cell`` (woken on a hint)."""

    kernel_id: str
    action: str
    duration: float = 0.0
    bytes: int = 0
    pids: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()
    waited: float = 0.0  # seconds a resume spent in the queue
    message: str = ""
    lease: Lease | None = None  # the lease after the move
    declared: bool = False  # on declared GPUs: no GPU memory to move, no driver call made
    effects: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"kernel_id": self.kernel_id, "action": self.action, "duration": self.duration, "bytes": self.bytes,
                "pids": list(self.pids), "gpus": list(self.gpus), "waited": self.waited, "message": self.message,
                "declared": self.declared}


@dataclass(frozen=True)
class Notice:
    """Something the upkeep did or announces about a kernel (an eviction warned, or carried out)."""

    kind: str  # warned, culled
    lease: Lease
    reason: str
    message: str
    deadline: float | None = None
