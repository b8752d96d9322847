"""The admin's idle-policy rules: what they may write, checked, and which rule governs a kernel.

An admin writes an ordered list of rules; the first rule whose ``match`` fits a kernel (on user,
group, profile or kernelspec) governs it.  A kernel that matches none follows :data:`DEFAULT_RULE`.
Each rule says when a kernel is due (idle, GPU-idle, busy too long, too old, hibernated too long,
over its memory) and what happens then (``hibernate`` where the kernel can, else ``shutdown``).
:func:`parse_policy` turns the admin's list into a :class:`Policy`, with errors that name the rule
and the field; :mod:`.policy` decides with the rule a kernel falls under.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from .entries import entry as checked_entry
from .units import format_duration, parse_duration

HIBERNATE = "hibernate"
SHUTDOWN = "shutdown"
ACTIONS = (HIBERNATE, SHUTDOWN)

# When a GPU kernel takes its slice (``slice_at``): at its first cell (it starts holding nothing), or at start.
FIRST_CELL = "first-cell"
AT_START = "start"
SLICE_AT = (FIRST_CELL, AT_START)

MATCH_KEYS = ("user", "group", "profile", "kernelspec")

_UNNAMED = re.compile(r"rule \d+")  # the name parse_rule gives a rule the admin did not name

# Durations the admin may turn off with null / "never".
_OPTIONAL_DURATIONS = ("idle_timeout", "gpu_idle_timeout", "max_busy", "max_age", "max_hibernated",
                       "hibernate_after_cell")
_DURATIONS = (*_OPTIONAL_DURATIONS, "warn", "snooze", "over_memory_grace")
_RULE_KEYS = {"name", "match", *_DURATIONS, "gpu_idle_threshold", "max_snoozes", "action", "pressure_factor", "slice_at"}


class PolicyError(ValueError):
    """A bad rule: the message names the rule (index and name) and the field."""


@dataclass(frozen=True)
class Match:
    """Glob patterns per key; a rule matches when every given key matches (any of its patterns)."""

    user: tuple[str, ...] = ()
    group: tuple[str, ...] = ()
    profile: tuple[str, ...] = ()
    kernelspec: tuple[str, ...] = ()

    def fits(self, user: str, groups: tuple[str, ...], profile: str, kernelspec: str) -> bool:
        if self.user and not _any(self.user, (user,)):
            return False
        if self.group and not _any(self.group, groups):
            return False
        if self.profile and not _any(self.profile, (profile,)):
            return False
        if self.kernelspec and not _any(self.kernelspec, (kernelspec,)):
            return False
        return True

    def to_dict(self) -> dict:
        return {k: list(getattr(self, k)) for k in MATCH_KEYS if getattr(self, k)}

    def words(self) -> str:
        """Whom the match covers, in words: "group students, profile gpu-*"; "everyone" for an empty one."""
        return ", ".join(f"{k} {' or '.join(v)}" for k, v in self.to_dict().items()) or "everyone"


def _any(patterns: tuple[str, ...], values: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(v, p) for p in patterns for v in values)


@dataclass(frozen=True)
class Rule:
    """One rule of the policy.  Durations are seconds; ``None`` turns a limit off."""

    name: str = "default"
    match: Match = field(default_factory=Match)
    idle_timeout: float | None = 3600.0  # not executing and no activity for this long
    gpu_idle_timeout: float | None = 3600.0  # holds GPU memory with utilization under the threshold
    gpu_idle_threshold: float = 5.0  # percent
    max_busy: float | None = None  # longest one execution may run
    max_age: float | None = None  # longest a kernel may live
    max_hibernated: float | None = 86400.0  # a hibernated kernel is shut down after this
    warn: float = 300.0  # lead time of the warning before acting
    snooze: float = 1800.0  # longest one snooze
    max_snoozes: int = 2  # snoozes per episode (given back once the kernel is used again)
    action: str = HIBERNATE
    pressure_factor: float = 0.5  # idle for idle_timeout x this: may be reclaimed for a waiter (pool.reclaim)
    over_memory_grace: float = 120.0  # soft isolation: from the warning to the action
    slice_at: str = FIRST_CELL  # a new kernel takes its GPU slice at its first cell, or at start
    # Hibernate this long after each cell ends when no other cell has started, without a warning: the
    # kernel loses nothing, and its next cell (or the resume hint as its user starts editing) wakes it.
    # The GPU is held about only while cells run.  Off by default.
    hibernate_after_cell: float | None = None

    @property
    def snoozable(self) -> bool:
        return self.max_snoozes > 0

    @property
    def label(self) -> str:
        """The rule as users and admins read it (the UI, the CLI, REST's ``rule_label``): the admin's name
        for it; a rule given none (``rule N``, as :func:`parse_rule` calls it) by whom it covers, "for
        group students" or "for everyone", rather than by its place in the list."""
        return f"for {self.match.words()}" if _UNNAMED.fullmatch(self.name) else self.name

    @property
    def described(self) -> str:
        """The rule in a sentence: "rule 'gpu-class'", "rule for group students"."""
        return f"rule {self.label}" if _UNNAMED.fullmatch(self.name) else f"rule {self.name!r}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "match": self.match.to_dict(),
            "idle_timeout": self.idle_timeout,
            "gpu_idle_timeout": self.gpu_idle_timeout,
            "gpu_idle_threshold": self.gpu_idle_threshold,
            "max_busy": self.max_busy,
            "max_age": self.max_age,
            "max_hibernated": self.max_hibernated,
            "warn": self.warn,
            "snooze": self.snooze,
            "max_snoozes": self.max_snoozes,
            "action": self.action,
            "pressure_factor": self.pressure_factor,
            "over_memory_grace": self.over_memory_grace,
            "slice_at": self.slice_at,
            "hibernate_after_cell": self.hibernate_after_cell,
        }


DEFAULT_RULE = Rule()


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    dry_run: bool = False
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def thresholds(self) -> tuple[float, ...]:
        """The GPU-idle thresholds in use (the telemetry keeps a last-busy time per threshold)."""
        return tuple(sorted({r.gpu_idle_threshold for r in (*self.rules, DEFAULT_RULE)}))

    def rule_for(self, user: str, groups: tuple[str, ...], profile: str, kernelspec: str) -> Rule:
        """The first rule that matches, else the default rule."""
        key = (user, groups, profile, kernelspec)
        rule = self._cache.get(key)
        if rule is None:
            rule = next((r for r in self.rules if r.match.fits(user, groups, profile, kernelspec)), DEFAULT_RULE)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = rule
        return rule

    def to_dict(self) -> dict:
        return {"dry_run": self.dry_run, "rules": [r.to_dict() for r in self.rules],
                "default": DEFAULT_RULE.to_dict()}


def parse_rule(index: int, entry, profiles: tuple[str, ...] | None = None) -> Rule:
    """One rule; every error names ``[index] ('name').field``."""
    try:
        checked_entry(entry, f"[{index}]", _RULE_KEYS, "{'match': {'group': 'students'}, 'idle_timeout': '30m'}",
               noun="field")
    except ValueError as e:
        raise PolicyError(str(e)) from None
    name = entry.get("name", f"rule {index}")
    where = f"[{index}] ({name!r})" if "name" in entry else f"[{index}]"
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"[{index}].name must be non-empty text, not {name!r}")
    values: dict = {"name": name, "match": _parse_match(where, entry.get("match", {}), profiles)}
    values.update(_parse_durations(where, entry))
    if "gpu_idle_threshold" in entry:
        values["gpu_idle_threshold"] = _parse_threshold(where, entry["gpu_idle_threshold"])
    values.update(_parse_choices(where, entry))
    rule = Rule(**values)
    _check_together(where, rule, warn_given="warn" in entry)
    return rule


def _parse_durations(where: str, entry: dict) -> dict[str, float | None]:
    """The rule's durations given, in seconds (None: turned off, where the field may be)."""
    values = {}
    for key in _DURATIONS:
        if key not in entry:
            continue
        try:
            seconds = parse_duration(entry[key])
        except ValueError as e:
            raise PolicyError(f"{where}.{key}: {e}") from None
        if seconds is None and key not in _OPTIONAL_DURATIONS:
            raise PolicyError(f"{where}.{key} cannot be turned off; give a duration such as 5m")
        values[key] = seconds
    return values


def _parse_threshold(where: str, given) -> float:
    """``gpu_idle_threshold``: a percentage, as a number or text such as '5%'."""
    t = given.strip().rstrip("%") if isinstance(given, str) else given
    try:
        t = float(t)
    except (TypeError, ValueError):
        raise PolicyError(f"{where}.gpu_idle_threshold: {given!r} is not a percentage "
                          "such as 5 or '5%'") from None
    if not 0 < t <= 100:
        raise PolicyError(f"{where}.gpu_idle_threshold must be above 0 and at most 100, not {t:g}")
    return t


def _parse_choices(where: str, entry: dict) -> dict:
    """The rule's other settings given: how many snoozes, what it does, when a kernel takes its slice, how much
    sooner a kernel is taken back for a waiter."""
    values: dict = {}
    if "max_snoozes" in entry:
        n = entry["max_snoozes"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicyError(f"{where}.max_snoozes must be a whole number of at least 0, not {n!r}")
        values["max_snoozes"] = n
    if "action" in entry:
        if entry["action"] not in ACTIONS:
            raise PolicyError(f"{where}.action: {entry['action']!r} is not one of {', '.join(ACTIONS)}")
        values["action"] = entry["action"]
    if "slice_at" in entry:
        if entry["slice_at"] not in SLICE_AT:
            raise PolicyError(f"{where}.slice_at: {entry['slice_at']!r} is not one of {', '.join(SLICE_AT)} "
                              f"({FIRST_CELL}: a kernel takes its GPU slice when its first cell runs; "
                              f"{AT_START}: when it starts)")
        values["slice_at"] = entry["slice_at"]
    if "pressure_factor" in entry:
        f = entry["pressure_factor"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise PolicyError(f"{where}.pressure_factor must be a number above 0 and at most 1 (1: a kernel is "
                              f"taken back for a waiter only once idle for its whole idle_timeout), not {f!r}")
        values["pressure_factor"] = float(f)
    return values


def _check_together(where: str, rule: Rule, *, warn_given: bool) -> None:
    """Settings each valid alone that make no sense together."""
    if rule.hibernate_after_cell is not None and rule.action != HIBERNATE:
        raise PolicyError(f"{where}.hibernate_after_cell needs action: hibernate (a kernel shut down after each "
                          "cell would lose its variables); remove hibernate_after_cell or set action: hibernate")
    if warn_given:  # an explicit warning longer than what it warns of would come before the kernel is idle
        for key in ("idle_timeout", "gpu_idle_timeout"):
            limit = getattr(rule, key)
            if limit is not None and rule.warn > limit:
                raise PolicyError(f"{where}.warn ({format_duration(rule.warn)}) is longer than its {key} "
                                  f"({format_duration(limit)}): the warning would come before the kernel is idle; "
                                  "make warn shorter")


def _parse_match(where: str, match, profiles: tuple[str, ...] | None) -> Match:
    try:
        checked_entry(match, f"{where}.match", set(MATCH_KEYS), "{'group': 'students'}")
    except ValueError as e:
        raise PolicyError(str(e)) from None
    parsed = {}
    for key, value in match.items():
        patterns = (value,) if isinstance(value, str) else value
        if not isinstance(patterns, (list, tuple)) or not patterns or not all(
                isinstance(p, str) and p for p in patterns):
            raise PolicyError(f"{where}.match.{key} must be a name or a non-empty list of names "
                              f"(glob patterns allowed), not {value!r}")
        parsed[key] = tuple(patterns)
    found = Match(**parsed)
    if profiles is not None:
        _check_profile_names(where, found, profiles)
    return found


def _check_profile_names(where: str, match: Match, profiles: tuple[str, ...]) -> None:
    for p in match.profile:
        if not any(c in p for c in "*?[") and p not in profiles:
            raise PolicyError(f"{where}.match.profile: {p!r} is not a profile; the profiles are {', '.join(profiles)}")


def check_profile_names(rules: tuple[Rule, ...], profiles: tuple[str, ...]) -> None:
    """Every profile a rule matches by name (not by pattern) exists; else PolicyError naming the rule."""
    for i, rule in enumerate(rules):
        _check_profile_names(f"[{i}]" if rule.name == f"rule {i}" else f"[{i}] ({rule.name!r})", rule.match, profiles)


def parse_policy(entries, dry_run: bool = False, profiles: tuple[str, ...] | None = None) -> Policy:
    """The admin's list of rules; raises PolicyError naming the bad rule and field."""
    if not isinstance(entries, (list, tuple)):
        raise PolicyError(f"must be a list of rules, not {type(entries).__name__}")
    if not isinstance(dry_run, bool):
        raise PolicyError(f"dry_run must be true or false, not {dry_run!r}")
    rules = tuple(parse_rule(i, e, profiles) for i, e in enumerate(entries))
    names = [r.name for r in rules]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise PolicyError(f"[{i}].name: {name!r} is used by rule {names.index(name)} too; names must be unique")
    return Policy(rules=rules, dry_run=dry_run)
