"""Refusals a notebook user reads.  Each message says which limit was hit, what is held by whom
(only the user's own kernels, by name), and what to do next, in advice that fits that limit.
Profiles are named as the launcher shows them ("Python 3 · GPU 10 GiB"), never by their id."""

from __future__ import annotations

from .leases import Lease
from .words import count, holding, holds_a_slice


def describe_lease(lease: Lease, now: float) -> str:
    """``a.ipynb (10 GiB, slice held for 4m)``: one of the user's kernels in a refusal (``words.holding``)."""
    return holding(lease, now)


def describe_holdings(holdings: list[Lease], now: float) -> str:
    if not holdings:
        return "You hold no GPU kernel right now."
    lines = "; ".join(describe_lease(lease, now) for lease in holdings)
    return f"Your GPU kernels: {lines}."


def either(names: tuple[str, ...] | list[str]) -> str:
    """'A', 'A' or 'B', 'A', 'B' or 'C': launcher names, quoted as the launcher shows them."""
    quoted = [f"'{n}'" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def would_start(names: tuple[str, ...] | list[str]) -> str:
    """What the user could start instead, right now: "'Python 3 · GPU 10 GiB' would start now." """
    if not names:
        return ""
    return f"{either(names)} would start now."


SERVICE_UNAVAILABLE = "service_unavailable"  # the reason of a refusal because the pool service is not answering


class PoolError(Exception):
    """Base of every refusal; ``str(e)`` is the message for the user."""

    reason = "error"
    status: int | None = None  # the HTTP status where a refusal has its own (503: the pool service is down)

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
    """The request would pass the user's quota or one of their groups'.

    The advice fits the limit: a kernel-count limit is helped only by shutting a kernel down; a memory
    or SM-share limit also by a smaller profile, named as the launcher shows it where one would start now.
    A request the quota refuses even with nothing held (``never_fits``) is helped by neither shutting down
    nor waiting: a smaller profile, or a larger quota from the admin."""

    reason = "quota_exceeded"
    never_fits = False

    def __init__(self, *, owner: str, profile: str, scope: str, resource: str, limit: str, used: str,
                 asked: str, holdings: list[Lease], now: float, launcher_name: str = "",
                 starts_now: tuple[str, ...] = (), never_fits: bool = False):
        self.owner, self.profile, self.scope, self.resource = owner, profile, scope, resource
        self.limit, self.used, self.asked = limit, used, asked
        self.holdings = holdings
        self.launcher_name = launcher_name or profile
        self.starts_now = tuple(starts_now)
        self.never_fits = never_fits
        what = f"'{self.launcher_name}'"
        if never_fits:
            super().__init__(self._never_fits(what))
            return
        if resource == "kernels":
            headline = f"GPU quota exceeded: {self._kernels_held()}, so {what} cannot start."
        else:
            held = (f"you hold {used} of your {limit}" if scope == "user" else
                    f"group {scope!r} holds {used} of its {limit} (all its members together)")
            needs = f"{asked} of GPU memory" if resource == "GPU memory" else f"a {asked} {resource} (of a GPU's compute)"
            headline = f"GPU quota exceeded: {what} needs {needs}, and {held}."
        super().__init__(f"{headline} {describe_holdings(holdings, now)} {self._advice()}")

    def _kernels_held(self) -> str:
        """``you hold 2 GPU kernels, as many as your quota allows``: the count agreeing with its noun."""
        used, limit = int(self.used), int(self.limit)
        who, whose = ("you hold", "your quota") if self.scope == "user" else (
            f"group {self.scope!r} holds", "its quota")
        than = "as many as" if used <= limit else "more than"
        allows = f"{whose} allows" if used <= limit else f"{whose}'s {limit}"
        together = "" if self.scope == "user" else " (all its members together)"
        return f"{who} {count(used, 'GPU kernel')}{together}, {than} {allows}"

    def _advice(self) -> str:
        """What helps: shutting one of the user's own kernels down where that makes room (a kernel counts
        for a kernel limit; only a slice held counts for memory or SM share), a profile that would start
        now, else waiting for the group's other members."""
        mine = self.holdings if self.resource == "kernels" else [h for h in self.holdings if holds_a_slice([h])]
        if self.resource == "kernels":
            if mine:
                return "Shut one down (Kernel > Shut Down Kernel, or Shut down in the GPU panel), then start this one."
            return f"Try again when a member of group {self.scope!r} shuts a GPU kernel down."
        if mine:
            return (f"{would_start(self.starts_now)} Or shut down a kernel you no longer need." if self.starts_now
                    else "Shut down a kernel you no longer need to make room in your quota.")
        later = ("try again when one of your kernels gives its GPU slice back" if self.scope == "user" else
                 f"try again when a member of group {self.scope!r} gives a GPU slice back")
        return f"{would_start(self.starts_now)} Or {later}." if self.starts_now else f"{later[0].upper()}{later[1:]}."

    def _never_fits(self, what: str) -> str:
        if self.resource == "kernels":
            allows = (f"your quota allows {count(int(self.limit), 'GPU kernel')}" if self.scope == "user" else
                      f"group {self.scope!r} may hold {count(int(self.limit), 'GPU kernel')} (all its members "
                      "together)")
            return f"GPU quota exceeded: {allows}, so {what} cannot start. Ask your admin for a GPU quota."
        needs = (f"{self.asked} of GPU memory" if self.resource == "GPU memory" else
                 f"a {self.asked} {self.resource} (of a GPU's compute)")
        quota = (f"your whole quota of {self.limit}" if self.scope == "user" else
                 f"the {self.limit} that group {self.scope!r} may hold (all its members together)")
        headline = (f"GPU quota exceeded: {what} needs {needs}, more than {quota}: it cannot start even with no "
                    "kernel running.")
        smaller = f"{would_start(self.starts_now)} Or" if self.starts_now else "Pick a smaller profile, or"
        return f"{headline} {smaller} ask your admin for a larger quota."

    def to_dict(self) -> dict:
        return {**super().to_dict(), "scope": self.scope, "resource": self.resource, "limit": self.limit,
                "used": self.used, "asked": self.asked, "holdings": [h.id for h in self.holdings],
                "launcher_name": self.launcher_name, "starts_now": list(self.starts_now),
                "never_fits": self.never_fits}


class PoolExhausted(PoolError):
    """No GPU in the pool has room for the slice right now.

    Says how much is free (a pool with free memory is not "full" for a smaller slice), what would
    start now, and never "try again" where the pool has no GPUs at all."""

    reason = "pool_exhausted"
    reserved = ""  # the reservations keeping the room it would fit in (a refusal rebuilt from a reply may lack it)

    def __init__(self, *, profile: str, slice_text: str, gpu_count: int, largest: str | None,
                 holdings: list[Lease], queued: int, now: float, launcher_name: str = "",
                 starts_now: tuple[str, ...] = (), reserved: str = ""):
        self.profile, self.slice_text, self.largest, self.holdings, self.queued = (
            profile, slice_text, largest, holdings, queued)
        self.reserved = reserved  # the reservations that keep the room it would fit in, in words
        self.launcher_name = launcher_name or profile
        self.starts_now = tuple(starts_now)
        what = f"'{self.launcher_name}' ({slice_text})"
        if gpu_count == 0:
            super().__init__(f"{what} cannot start: the pool has no GPUs (none detected, none declared). "
                             "Tell your admin: the pool's GPU inventory is empty.")
            return
        waiting = (f" {count(queued, 'other request')} {'is' if queued == 1 else 'are'} waiting in the queue."
                   if queued else "")
        if reserved:
            headline = (f"{what} cannot start now: the room it would fit in is reserved ({reserved}), and only the "
                        f"reservation's members may use it.{waiting}")
        elif largest:
            headline = f"The GPU pool is full for {what}: the most free on one GPU is {largest}.{waiting}"
        else:
            headline = f"The GPU pool is full: every GPU slice is taken, so {what} cannot start now.{waiting}"
        # Shutting a kernel down makes room only where one of the user's holds GPU memory (a hibernated one,
        # or one with no GPU yet, holds none).
        later = "try again when an idle kernel gives its slice back"
        if holds_a_slice(holdings):
            later += ", or shut down a kernel you no longer need"
        advice = f"Or {later}." if self.starts_now else f"{later[0].upper()}{later[1:]}."
        super().__init__(" ".join(filter(None, (headline, describe_holdings(holdings, now),
                                                would_start(self.starts_now), advice))))

    def to_dict(self) -> dict:
        return {**super().to_dict(), "profile": self.profile, "slice": self.slice_text, "largest_free": self.largest,
                "queued": self.queued, "holdings": [h.id for h in self.holdings],
                "launcher_name": self.launcher_name, "starts_now": list(self.starts_now),
                **({"reserved": self.reserved} if self.reserved else {})}


class MPSUserBusy(PoolError):
    """Every GPU with room for an MPS slice serves another user's MPS kernels: an MPS server serves one
    Unix user at a time on a GPU."""

    reason = "mps_user_busy"

    def __init__(self, *, profile: str, users: list[str], launcher_name: str = ""):
        self.profile, self.users = profile, users
        self.launcher_name = launcher_name or profile
        super().__init__(
            f"No GPU can take '{self.launcher_name}' now: it runs under NVIDIA MPS, which serves one user at a time "
            f"on a GPU, and every GPU with room is serving another user's MPS kernels. Pick a profile without an "
            "SM share (it shares the GPU without MPS), or try again when those kernels end.")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "profile": self.profile, "launcher_name": self.launcher_name}


class LeaseNotFound(PoolError, KeyError):
    reason = "lease_not_found"

    def __init__(self, lease_id: str):
        self.lease_id = lease_id
        super().__init__(f"No GPU lease {lease_id!r} is held (it was released, or never existed).")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]
