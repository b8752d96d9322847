"""Refusals a notebook user reads.  Each message says what went wrong, what is
held by whom (only the user's own kernels, by name), and what to do next."""

from __future__ import annotations

from .leases import Lease
from .units import format_age, format_size


def describe_lease(lease: Lease, now: float) -> str:
    name = lease.label or f"kernel {lease.kernel_id[:8]}"
    size = f"{lease.gpu_count} whole GPU(s)" if lease.whole else format_size(lease.memory)
    if lease.sm_percent:
        size += f" · {lease.sm_percent}%"
    return f"{name} ({lease.profile}, {size}, {lease.state} for {format_age(now - lease.state_since)})"


def describe_holdings(holdings: list[Lease], now: float) -> str:
    if not holdings:
        return "You hold no GPU slice right now."
    lines = "; ".join(describe_lease(lease, now) for lease in holdings)
    return f"Your kernels holding the pool: {lines}."


class PoolError(Exception):
    """Base of every refusal; ``str(e)`` is the message for the user."""

    reason = "error"

    def to_dict(self) -> dict:
        return {"reason": self.reason, "message": str(self)}


class UnknownProfile(PoolError, ValueError):
    reason = "unknown_profile"

    def __init__(self, name: str, known: list[str]):
        self.name = name
        super().__init__(
            f"There is no GPU profile named {name!r}. The profiles are: {', '.join(sorted(known))}. "
            "Ask your admin to add it, or pick one of these."
        )


class QuotaExceeded(PoolError):
    """The request would pass the user's quota or one of their groups'."""

    reason = "quota_exceeded"

    def __init__(self, *, owner: str, profile: str, scope: str, resource: str, limit: str, used: str,
                 asked: str, holdings: list[Lease], now: float):
        self.owner, self.profile, self.scope, self.resource = owner, profile, scope, resource
        self.limit, self.used, self.asked = limit, used, asked
        self.holdings = holdings
        whose = "you hold" if scope == "user" else f"group {scope!r} holds (all its members together)"
        quota = "your GPU quota" if scope == "user" else f"the GPU quota of group {scope!r}"
        super().__init__(
            f"GPU quota exceeded: a kernel on profile {profile!r} would pass {quota}. "
            f"{resource[0].upper() + resource[1:]}: {whose} {used} of {limit}, and this kernel needs {asked}. "
            f"{describe_holdings(holdings, now)} "
            "Shut down a kernel you no longer need (Kernel > Shut Down Kernel), or pick a smaller profile."
        )

    def to_dict(self) -> dict:
        return {**super().to_dict(), "scope": self.scope, "resource": self.resource, "limit": self.limit,
                "used": self.used, "asked": self.asked, "holdings": [h.id for h in self.holdings]}


class PoolExhausted(PoolError):
    """No GPU in the pool has room for the slice right now."""

    reason = "pool_exhausted"

    def __init__(self, *, profile: str, slice_text: str, gpu_count: int, largest: str | None,
                 holdings: list[Lease], queued: int, now: float):
        self.profile, self.slice_text, self.largest, self.holdings, self.queued = (
            profile, slice_text, largest, holdings, queued)
        if gpu_count == 0:
            where = "the pool has no GPUs (none detected, none declared). Ask your admin to check the inventory."
        elif largest:
            where = f"all {gpu_count} GPU(s) of the pool are taken; the largest free slice is {largest}."
        else:
            where = f"all {gpu_count} GPU(s) of the pool are fully taken."
        waiting = f" {queued} other request(s) are waiting in the queue." if queued else ""
        super().__init__(
            f"The GPU pool is full: no GPU has room for profile {profile!r} ({slice_text}); {where}{waiting} "
            f"{describe_holdings(holdings, now)} "
            "Try again in a few minutes, pick a smaller profile, or shut down a kernel you no longer need."
        )

    def to_dict(self) -> dict:
        return {**super().to_dict(), "profile": self.profile, "slice": self.slice_text, "largest_free": self.largest,
                "queued": self.queued, "holdings": [h.id for h in self.holdings]}


class MPSUserBusy(PoolError):
    """Every GPU with room for an MPS slice serves another user's MPS kernels: an MPS server serves one
    Unix user at a time on a GPU."""

    reason = "mps_user_busy"

    def __init__(self, *, profile: str, users: list[str]):
        self.profile, self.users = profile, users
        super().__init__(
            f"No GPU can take profile {profile!r} now: it runs under NVIDIA MPS, which serves one user at a time "
            f"on a GPU, and every GPU with room is serving another user's MPS kernels. Pick a profile without an "
            "SM share (it shares the GPU without MPS), or try again when those kernels end.")


class LeaseNotFound(PoolError, KeyError):
    reason = "lease_not_found"

    def __init__(self, lease_id: str):
        self.lease_id = lease_id
        super().__init__(f"No GPU lease {lease_id!r} is held (it was released, or never existed).")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]
