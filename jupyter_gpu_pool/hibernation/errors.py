"""What a hibernation or a resume says when it does not happen.  ``str(e)`` is for the user."""

from __future__ import annotations

from ..pool import PoolError, PoolExhausted


class HibernationError(Exception):
    """Base: ``reason`` is a machine word, ``status`` the HTTP status a handler answers with."""

    status = 409

    def __init__(self, reason: str, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.reason, self.message = reason, message
        self.retry_after = retry_after
        if status is not None:
            self.status = status

    def to_dict(self) -> dict:
        out = {"reason": self.reason, "message": self.message}
        if self.retry_after is not None:
            out["retry_after"] = self.retry_after
        return out


class HibernationRefused(HibernationError):
    """Nothing was changed: the kernel runs (or sleeps) on exactly as before.

    ``keep_running``: the refusal is for now (busy, the lock timed out, host RAM is being made)
    and the kernel should be left running; False where it can never hibernate here (MPS, MIG, no
    driver…) or the admin's setting says to shut it down instead."""

    def __init__(self, reason: str, message: str, *, status: int | None = None, retry_after: float | None = None,
                 keep_running: bool = True):
        super().__init__(reason, message, status=status, retry_after=retry_after)
        self.keep_running = keep_running

    def to_dict(self) -> dict:
        return {**super().to_dict(), "keep_running": self.keep_running}


class HibernationFailed(HibernationError):
    """A step failed.  ``recovered``: everything was put back as it was; otherwise ``states`` says
    where each process was left (pid → CUDA state word) and the message says what to do."""

    status = 500

    def __init__(self, reason: str, message: str, *, recovered: bool, states: dict[int, str] | None = None):
        super().__init__(reason, message)
        self.recovered = recovered
        self.states = states or {}

    def to_dict(self) -> dict:
        return {**super().to_dict(), "recovered": self.recovered, "states": {str(k): v for k, v in self.states.items()}}


class GPUMemoryShort(PoolExhausted):
    """A resume's GPU lacks the free memory (as the driver counts it) its checkpoint needs: the resume
    waits in the queue like one for which no slice is free, and the message says for what."""

    reason = "gpu_memory"

    def __init__(self, message: str, gpus: tuple[str, ...], needed: int):
        PoolError.__init__(self, message)  # not the pool's "full" sentence: the slice is free, the memory is not
        self.gpus, self.needed = gpus, needed

    def to_dict(self) -> dict:
        return {"reason": self.reason, "message": str(self), "gpus": list(self.gpus), "needed": self.needed}
