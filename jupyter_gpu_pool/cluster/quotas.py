"""Reading ``GPUQuota`` objects into the pool core's :class:`QuotaBook` (the same limits, and the same
refusal text, as on one machine).

A group's members come from its GPUQuota only: a kernel's own word about its
owner's groups is not trusted.  A quota object that does not parse is reported
(``problems``) and, for the users it covers, refuses kernels with a message
naming the object: a typo must not turn a limit off.  The operator admits
against these; the server extension shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..pool import PoolError, Quota, QuotaBook
from ..pool.quotas import parse_quota
from .kernels import meta, spec


class QuotaMisconfigured(PoolError):
    reason = "quota_misconfigured"

    def __init__(self, name: str, problem: str):
        self.name = name
        super().__init__(f"Your GPU quota cannot be read: GPUQuota {name!r} is invalid ({problem}). "
                         "Kernels are refused until it is fixed; ask your admin.")


@dataclass(frozen=True)
class Quotas:
    book: QuotaBook
    problems: dict[str, str] = field(default_factory=dict)  # GPUQuota name -> what is wrong
    subjects: dict[tuple[str, str], str] = field(default_factory=dict)  # (scope, name) -> GPUQuota name

    def problem_for(self, user: str) -> tuple[str, str] | None:
        """(object, problem) of a bad quota that covers this user, if any."""
        candidates = [("user", user)] if ("user", user) in self.subjects else [("default", "")]
        candidates += [("group", g) for g in self.book.groups_of(user)]
        for subject in candidates:
            name = self.subjects.get(subject)
            if name in self.problems:
                return name, self.problems[name]
        return None


def read_quotas(objects: list[dict]) -> Quotas:
    """The QuotaBook from GPUQuota objects, each checked on its own (one bad object spoils only itself)."""
    users: dict[str, Quota] = {}
    groups: dict[str, Quota] = {}
    members: dict[str, frozenset[str]] = {}
    default = Quota()
    problems: dict[str, str] = {}
    subjects: dict[tuple[str, str], str] = {}
    for obj in sorted(objects, key=lambda o: meta(o)["name"]):
        name, s = meta(obj)["name"], spec(obj)
        scope, subject = s.get("scope"), s.get("name", "")
        if scope in ("user", "group") and not subject:
            problems[name] = f"scope {scope!r} needs the {scope}'s name in spec.name"
            continue
        key = (scope, subject if scope != "default" else "")
        if key in subjects:
            problems[name] = f"{subjects[key]!r} already sets this {scope} quota; remove one of them"
            continue
        subjects[key] = name
        if scope == "group":
            members[subject] = frozenset(s.get("members") or ())
        entry = {k: v for k, v in (("memory", s.get("memory")), ("sm_percent", s.get("smPercent")),
                                   ("kernels", s.get("kernels"))) if v is not None}
        try:
            quota = parse_quota(entry, f"GPUQuota {name!r}")
        except ValueError as e:
            problems[name] = str(e)
            continue
        if scope == "user":
            users[subject] = quota
        elif scope == "group":
            groups[subject] = quota
        else:
            default = quota
    return Quotas(QuotaBook(users=users, groups=groups, default_user=default, members=members), problems, subjects)
