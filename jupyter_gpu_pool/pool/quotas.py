"""Quotas: how much of the pool a user, and a group together, may hold.

- a user's limit: their own entry, else the default user quota;
- a group's limit: the combined holdings of all its members;
A request must fit under the user's limit and under every group the user is in.
Memory and SM share count active leases (a hibernated kernel holds no GPU);
the kernel count counts active and hibernated kernels (both are kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .entries import entry as checked_entry
from .leases import ACTIVE
from .slices import format_size, parse_size

_KEYS = {"memory", "sm_percent", "kernels"}


@dataclass(frozen=True)
class Quota:
    memory: int | None = None
    sm_percent: int | None = None  # sum of SM shares; 100 = all SMs of one GPU
    kernels: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.memory is None and self.sm_percent is None and self.kernels is None

    def to_dict(self) -> dict:
        return {"memory": self.memory, "sm_percent": self.sm_percent, "kernels": self.kernels}


@dataclass(frozen=True)
class Usage:
    memory: int = 0
    sm_percent: int = 0
    kernels: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.memory + other.memory, self.sm_percent + other.sm_percent, self.kernels + other.kernels)

    def to_dict(self) -> dict:
        return {"memory": self.memory, "sm_percent": self.sm_percent, "kernels": self.kernels}


def usage_of(leases) -> Usage:
    """What these held leases count against a quota: memory and SM share of the active ones,
    and every one as a kernel (a hibernated kernel is still a kernel)."""
    active = [lease for lease in leases if lease.state == ACTIVE]
    return Usage(sum(lease.total_memory for lease in active), sum(lease.total_sm for lease in active), len(leases))


def parse_quota(entry, where: str) -> Quota:
    """``{"memory": "40GiB", "sm_percent": 100, "kernels": 4}``; any field may be left out."""
    checked_entry(entry, where, _KEYS, "{'memory': '40GiB', 'kernels': 4}")
    memory = entry.get("memory")
    sm = entry.get("sm_percent")
    kernels = entry.get("kernels")
    try:
        memory = parse_size(memory) if memory is not None else None
    except ValueError as e:
        raise ValueError(f"{where}.memory: {e}") from None
    if sm is not None:
        # A quota's SM share may exceed 100: it is a sum across kernels and GPUs.
        if isinstance(sm, bool) or not isinstance(sm, (int, str)):
            raise ValueError(f"{where}.sm_percent must be a whole percentage, not {sm!r}")
        try:
            sm = int(str(sm).strip().rstrip("%"))
        except ValueError:
            raise ValueError(f"{where}.sm_percent: {sm!r} is not a whole percentage") from None
        if sm < 1:
            raise ValueError(f"{where}.sm_percent must be at least 1, not {sm!r}")
    if kernels is not None and (isinstance(kernels, bool) or not isinstance(kernels, int) or kernels < 0):
        raise ValueError(f"{where}.kernels must be a whole number of at least 0, not {kernels!r}")
    return Quota(memory=memory, sm_percent=sm, kernels=kernels)


@dataclass(frozen=True)
class QuotaBook:
    users: dict[str, Quota] = field(default_factory=dict)
    groups: dict[str, Quota] = field(default_factory=dict)
    default_user: Quota = Quota()
    members: dict[str, frozenset[str]] = field(default_factory=dict)  # group -> users

    def user_quota(self, user: str) -> Quota:
        return self.users.get(user, self.default_user)

    def groups_of(self, user: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The user's groups: the admin's membership lists plus any the edge found (unix groups)."""
        found = {g for g, users in self.members.items() if user in users} | set(extra)
        return tuple(sorted(found))

    def limited_groups(self, groups: tuple[str, ...]) -> list[str]:
        return [g for g in groups if g in self.groups]


def parse_quotas(entries, what: str) -> dict[str, Quota]:
    """Quotas by user or group name: ``{"alice": {"memory": "80GiB"}}``; ``what`` names them in errors."""
    if not isinstance(entries, dict):
        raise ValueError(f"must be a dict of name to quota such as {{'alice': {{'memory': '80GiB'}}}}, not {entries!r}")
    return {name: parse_quota(quota, f"{what} {name!r}") for name, quota in entries.items()}


def parse_members(entries) -> dict[str, frozenset[str]]:
    """Group membership: ``{"students": ["alice", "bob"]}``."""
    if not isinstance(entries, dict):
        raise ValueError(f"must be a dict of group to user names such as {{'students': ['alice']}}, not {entries!r}")
    members = {}
    for group, names in entries.items():
        if not isinstance(names, (list, tuple, set)) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"group members[{group!r}] must be a list of user names, not {names!r}")
        members[group] = frozenset(names)
    return members


def build_quota_book(users: dict, groups: dict, default_user: dict, members: dict) -> QuotaBook:
    """A quota book from the admin's raw entries (tests and tools; the settings parse each on its own)."""
    return QuotaBook(users=parse_quotas(users, "user quota"), groups=parse_quotas(groups, "group quota"),
                     default_user=parse_quota(default_user, "default user quota"), members=parse_members(members))


def excesses(quota: Quota, used: Usage, asked: Usage) -> list[tuple[str, str, str, str]]:
    """Each limit the request would pass, as (resource, limit, used, asked) text: kernels, memory, SM share."""
    found = []
    if quota.kernels is not None and used.kernels + asked.kernels > quota.kernels:
        found.append(("kernels", str(quota.kernels), str(used.kernels), str(asked.kernels)))
    if quota.memory is not None and used.memory + asked.memory > quota.memory:
        found.append(("GPU memory", format_size(quota.memory), format_size(used.memory), format_size(asked.memory)))
    if quota.sm_percent is not None and used.sm_percent + asked.sm_percent > quota.sm_percent:
        found.append(("SM share", f"{quota.sm_percent}%", f"{used.sm_percent}%", f"{asked.sm_percent}%"))
    return found
