"""Reservations: room of the pool kept for a group (or some users) in a window of time, a class's lab on
Tuesdays and Thursdays 10:00-12:00.  Pure.

A reservation names who may use it (``groups``, ``users``), when (one window, or weekly on some days,
in a named time zone), how much (``memory`` in all, and/or ``gpus`` whole GPUs) and on which GPU models
(glob patterns of GPU names; empty: any).  Around each window it is in one of four phases:

- ``before``: more than ``lead`` seconds before the window: it changes nothing;
- ``making_room``: within ``lead`` of the window: non-members are no longer admitted into the room it
  keeps, and what non-members hold there is reclaimed (``pool.reclaim.choose_for_reservations``);
- ``open``: the window: members are admitted into the room first; from ``lead`` after it opens (the
  members' time to come in), a non-member may *borrow* what members leave unused while no member waits
  (the grant says it is borrowed), and is reclaimed when one does;
- ``after``: a one-off window that is over (a weekly one is ``before`` its next day again).

The room a reservation keeps from a non-member is what its members do not use now (:func:`unused`):
held back on the eligible GPUs (:func:`hold_back`), whole GPUs first on the emptiest, memory on the
GPUs with most free; what is not free there is room to make.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .entries import entry as checked_entry
from .gpus import GPU
from .leases import ACTIVE, Lease
from .placement import GPUUsage
from .units import format_size, parse_seconds, parse_size

BEFORE, MAKING_ROOM, OPEN, AFTER = "before", "making_room", "open", "after"
PHASES = (BEFORE, MAKING_ROOM, OPEN, AFTER)
DEFAULT_LEAD = 600.0  # seconds before a window that the pool starts making its room
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_NAMES = {**{d: i for i, d in enumerate(DAYS)},
              **{n: i for i, n in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
                                              "sunday"))}}
_KEYS = {"name", "groups", "users", "days", "start", "end", "timezone", "memory", "gpus", "models", "lead"}
_EXAMPLE = ("{'name': 'ML 101 lab', 'groups': ['ml101'], 'days': ['tue', 'thu'], 'start': '10:00', 'end': '12:00', "
            "'timezone': 'Europe/Paris', 'memory': '160GiB'}")
_CLOCK = re.compile(r"^\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s*$")  # 10:00, or 10:00:30
_MOMENT = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})[ T](\d{1,2}):(\d{2})(?::(\d{2}))?\s*$")
HORIZON = 371 * 86400.0  # how far ahead overlaps are looked for: a year of weekly windows, and a week more


class ReservationError(ValueError):
    """A bad reservation: the message names the reservation (index and name) and the field."""


@dataclass(frozen=True)
class Window:
    """When a reservation holds: weekly on ``days`` (0 is Monday) from ``start`` to ``end`` (wall-clock
    times in ``zone``), or once (no days) from ``once[0]`` to ``once[1]`` (Unix times)."""

    zone: ZoneInfo
    days: tuple[int, ...] = ()
    start: dt.time = dt.time(0)
    end: dt.time = dt.time(0)
    once: tuple[float, float] | None = None

    def occurrences(self, since: float, until: float) -> Iterator[tuple[float, float]]:
        """Each (start, end) of the window that ends after ``since`` and starts before ``until``, in order."""
        if self.once is not None:
            if self.once[1] > since and self.once[0] < until:
                yield self.once
            return
        day = dt.datetime.fromtimestamp(since, self.zone).date() - dt.timedelta(days=1)
        while True:
            if day.weekday() in self.days:
                begin = dt.datetime.combine(day, self.start, self.zone).timestamp()
                end = dt.datetime.combine(day, self.end, self.zone).timestamp()
                if begin >= until:
                    return
                if end > since:
                    yield begin, end
            elif dt.datetime.combine(day, dt.time(0), self.zone).timestamp() >= until:
                return
            day += dt.timedelta(days=1)

    def next(self, now: float) -> tuple[float, float] | None:
        """The occurrence under way at ``now``, else the next one (None: a one-off window that is over)."""
        return next(self.occurrences(now, now + 8 * 86400), None)

    def clock(self, at: float, now: float | None = None) -> str:
        """``at`` as the window's zone reads it: "10:00" on ``now``'s day, else "Tue 10:00" (a one-off
        window's dates with no ``now``: "Tue 04 Mar 10:00")."""
        t = dt.datetime.fromtimestamp(at, self.zone)
        if now is not None and dt.datetime.fromtimestamp(now, self.zone).date() == t.date():
            return t.strftime("%H:%M")
        return t.strftime("%a %d %b %H:%M" if self.once is not None and now is None else "%a %H:%M")

    def words(self) -> str:
        """The window as its admin wrote it: "Tue, Thu 10:00-12:00 (Europe/Paris)"."""
        zone = self.zone.key
        if self.once is not None:
            return f"{self.clock(self.once[0])} to {self.clock(self.once[1])} ({zone})"
        days = ", ".join(DAYS[d].capitalize() for d in self.days)
        return f"{days} {self.start.strftime('%H:%M')}-{self.end.strftime('%H:%M')} ({zone})"


@dataclass(frozen=True)
class Reservation:
    """Room kept for members in a window: ``memory`` bytes in all and/or ``gpus`` whole GPUs, on GPUs
    whose name matches one of ``models`` (any GPU where empty), from ``lead`` seconds before it."""

    name: str
    window: Window
    groups: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    memory: int | None = None
    gpus: int | None = None
    models: tuple[str, ...] = ()
    lead: float = DEFAULT_LEAD

    def member(self, user: str, groups: Iterable[str]) -> bool:
        return user in self.users or any(g in self.groups for g in groups)

    def on(self, gpu: GPU) -> bool:
        """Whether ``gpu`` is one of the models the room is on."""
        return not self.models or any(fnmatch.fnmatch(gpu.name.lower(), m.lower()) for m in self.models)

    def slot(self, now: float) -> Slot:
        """Where the reservation stands at ``now``: its phase and the occurrence it concerns."""
        found = self.window.next(now)
        if found is None:
            return Slot(self, AFTER, self.window.once[0], self.window.once[1])  # type: ignore[index]
        start, end = found
        phase = OPEN if now >= start else MAKING_ROOM if now >= start - self.lead else BEFORE
        return Slot(self, phase, start, end, borrowing=phase == OPEN and now >= start + self.lead)

    @property
    def amount(self) -> str:
        """What it keeps, in words: "160 GiB", "2 GPUs", "2 GPUs and 40 GiB"."""
        parts = []
        if self.gpus:
            parts.append(f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}")
        if self.memory:
            parts.append(format_size(self.memory))
        return " and ".join(parts)

    def demand(self, gpus: list[GPU]) -> int:
        """The GPU memory it keeps on ``gpus`` (its eligible ones), whole GPUs counted as the smallest's."""
        smallest = min((g.memory for g in gpus), default=0)
        return (self.memory or 0) + (self.gpus or 0) * smallest


@dataclass(frozen=True)
class Slot:
    """A reservation at one moment: its phase and the occurrence (start, end) it concerns."""

    reservation: Reservation
    phase: str
    start: float
    end: float
    borrowing: bool = False  # open for ``lead`` already: non-members may borrow what members leave unused

    @property
    def active(self) -> bool:
        """Whether it keeps room now (from its lead time to its end)."""
        return self.phase in (MAKING_ROOM, OPEN)

    def words(self, now: float, member: bool) -> str:
        """What a user reads: members "ML 101 lab: 160 GiB reserved until 12:00"; others "160 GiB
        reserved for ML 101 lab from 10:00 to 12:00"."""
        r, w = self.reservation, self.reservation.window
        if member:
            if self.phase == OPEN:
                return f"{r.name}: {r.amount} reserved until {w.clock(self.end, now)}"
            return f"{r.name}: {r.amount} reserved from {w.clock(self.start, now)} to {w.clock(self.end, now)}"
        if self.phase == OPEN:
            return f"{r.amount} reserved for {r.name} until {w.clock(self.end, now)}"
        return f"{r.amount} reserved for {r.name} from {w.clock(self.start, now)} to {w.clock(self.end, now)}"

    def reason(self, now: float) -> str:
        """Why a non-member's kernel gives its room back: "reserved for ML 101 lab from 10:00"."""
        w = self.reservation.window
        if self.phase == OPEN:
            needs = ", and a member needs it" if self.borrowing else ""
            return f"reserved for {self.reservation.name} until {w.clock(self.end, now)}{needs}"
        return f"reserved for {self.reservation.name} from {w.clock(self.start, now)}"

    def borrowed(self, now: float) -> str:
        """What a non-member's kernel that borrowed this room reads while the window is open."""
        return (f"Borrowed from the room reserved for {self.reservation.name} until "
                f"{self.reservation.window.clock(self.end, now)}: it may be hibernated (its variables kept), with a "
                "warning, when a member needs the room.")

    def to_dict(self, now: float, member: bool) -> dict:
        """As a user reads it (``words``); ``lead``: seconds before ``start`` from which it keeps its room,
        ``borrowing``: non-members may borrow what members leave unused now (the UIs draw and say both)."""
        r = self.reservation
        return {"name": r.name, "phase": self.phase, "start": self.start, "end": self.end, "member": member,
                "memory": r.memory, "gpus": r.gpus, "models": list(r.models), "words": self.words(now, member),
                "lead": r.lead, "borrowing": self.borrowing}

    def listed(self, now: float) -> dict:
        """As an admin lists it: who it is for and its window as written, besides what anyone reads."""
        r = self.reservation
        return {**self.to_dict(now, member=False), "groups": list(r.groups), "users": list(r.users),
                "window": r.window.words()}


@dataclass(frozen=True)
class Unused:
    """The room of an active reservation that its members do not use now: ``memory`` bytes and ``gpus``
    whole GPUs, to be kept on the ``eligible`` GPUs (uuids)."""

    slot: Slot
    eligible: tuple[str, ...]
    memory: int
    gpus: int

    @property
    def name(self) -> str:
        return self.slot.reservation.name

    def less(self, memory: int, gpus: int) -> Unused:
        return replace(self, memory=max(self.memory - memory, 0), gpus=max(self.gpus - gpus, 0))


def named_in(words: str, reservations: Iterable[Reservation]) -> str:
    """The reservation that the words of a reclaim (:meth:`Slot.reason`: "reserved for ML 101 lab from
    10:00") name, the longest name where one begins another; "" where none does."""
    named = [r.name for r in reservations
             if words.startswith((f"reserved for {r.name} from ", f"reserved for {r.name} until "))]
    return max(named, key=len, default="")


def unused(slot: Slot, gpus: Iterable[GPUUsage], leases: Iterable[Lease]) -> Unused:
    """What of ``slot``'s room its members leave unused now: members' active leases on its GPUs count,
    whole GPUs against its GPUs first (the rest as memory), slices as memory."""
    r = slot.reservation
    eligible = tuple(u.gpu.uuid for u in gpus if r.on(u.gpu))
    sizes = {u.gpu.uuid: u.gpu.memory for u in gpus if r.on(u.gpu)}
    whole: set[str] = set()
    memory = 0
    for lease in leases:
        if lease.state != ACTIVE or not r.member(lease.owner, lease.groups):
            continue
        on = [uuid for uuid in lease.gpus if uuid in sizes]
        if lease.whole:
            whole.update(on)
        else:
            memory += lease.memory * len(on)
    counted = min(len(whole), r.gpus or 0)
    memory += sum(sorted(sizes[u] for u in whole)[counted:])  # whole GPUs past its GPUs count as memory
    return Unused(slot, eligible, max((r.memory or 0) - memory, 0), max((r.gpus or 0) - counted, 0))


def hold_back(usage: list[GPUUsage], needs: Iterable[Unused]) -> dict[str, GPUUsage]:
    """Each GPU's usage as a non-member may see it: the unused room of ``needs`` held on their eligible
    GPUs, whole GPUs on the emptiest ones, memory on those with most free memory.  Only GPUs whose usage
    changes are in the answer."""
    sim = {u.gpu.uuid: u for u in usage}
    changed: dict[str, GPUUsage] = {}
    for need in needs:
        eligible = [sim[uuid] for uuid in need.eligible if uuid in sim]
        for u in sorted((u for u in eligible if not u.exclusive), key=lambda u: (u.leases, u.memory, u.gpu.index))[
                : need.gpus]:
            sim[u.gpu.uuid] = changed[u.gpu.uuid] = replace(u, memory=max(u.memory, u.gpu.memory), exclusive=True)
        left = need.memory
        for u in sorted((sim[uuid] for uuid in need.eligible if uuid in sim),
                        key=lambda u: (-u.free_memory, u.gpu.index)):
            if left <= 0 or u.free_memory <= 0:
                break
            take = min(u.free_memory, left)
            sim[u.gpu.uuid] = changed[u.gpu.uuid] = replace(u, memory=u.memory + take)
            left -= take
    return changed


def free_on(usage: Iterable[GPUUsage], eligible: Iterable[str]) -> int:
    """The free memory of the ``eligible`` GPUs, all together."""
    on = set(eligible)
    return sum(u.free_memory for u in usage if u.gpu.uuid in on)


# -- the admin's entries ---------------------------------------------------------------------------------


def parse_reservations(entries) -> tuple[Reservation, ...]:
    """The admin's list of reservations; ReservationError naming ``[index] ('name').field`` for a bad one."""
    if not isinstance(entries, (list, tuple)):
        raise ReservationError(f"must be a list of reservations such as [{_EXAMPLE}], not {type(entries).__name__}")
    found = tuple(parse_reservation(i, e) for i, e in enumerate(entries))
    names = [r.name for r in found]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ReservationError(f"[{i}] ({name!r}).name: {name!r} is used by reservation {names.index(name)} "
                                   "too; names must be unique")
    return found


def parse_reservation(index: int, entry) -> Reservation:
    try:
        checked_entry(entry, f"[{index}]", _KEYS, _EXAMPLE, noun="field")
    except ValueError as e:
        raise ReservationError(str(e)) from None
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ReservationError(f"[{index}].name must be non-empty text such as 'ML 101 lab', not {name!r}")
    where = f"[{index}] ({name!r})"
    groups, users = _names(where, entry, "groups"), _names(where, entry, "users")
    if not groups and not users:
        raise ReservationError(f"{where} needs 'groups' or 'users': whom the room is for")
    memory = gpus = None
    if entry.get("memory") is not None:
        try:
            memory = parse_size(entry["memory"])
        except ValueError as e:
            raise ReservationError(f"{where}.memory: {e}") from None
    if entry.get("gpus") is not None:
        gpus = entry["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ReservationError(f"{where}.gpus must be a whole number of GPUs of at least 1, not {gpus!r}")
    if memory is None and gpus is None:
        raise ReservationError(f"{where} needs 'memory' (such as '160GiB') or 'gpus' (whole GPUs), or both")
    models = _names(where, entry, "models")
    try:
        lead = parse_seconds(entry.get("lead", DEFAULT_LEAD), zero_allowed=True)
    except ValueError as e:
        raise ReservationError(f"{where}.lead {e}") from None
    return Reservation(name=name, window=_window(where, entry), groups=groups, users=users, memory=memory,
                       gpus=gpus, models=models, lead=lead)


def _names(where: str, entry: dict, key: str) -> tuple[str, ...]:
    value = entry.get(key, ())
    value = (value,) if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ReservationError(f"{where}.{key} must be a name or a list of names, not {entry.get(key)!r}")
    return tuple(value)


def _window(where: str, entry: dict) -> Window:
    zone_name = entry.get("timezone")
    if not isinstance(zone_name, str) or not zone_name.strip():
        raise ReservationError(f"{where} needs 'timezone', an IANA name such as 'Europe/Paris' (the window's "
                               "times are read there)")
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ReservationError(f"{where}.timezone: {zone_name!r} is not a time zone this machine knows (write an "
                               "IANA name such as 'Europe/Paris')") from None
    for key in ("start", "end"):
        if not isinstance(entry.get(key), str):
            raise ReservationError(f"{where} needs '{key}': a time such as '10:00' with 'days', or a date and time "
                                   f"such as '2025-03-04 10:00' for a one-off window")
    if "days" in entry:
        days = entry["days"]
        days = (days,) if isinstance(days, str) else days
        if not isinstance(days, (list, tuple)) or not days or not all(
                isinstance(d, str) and d.strip().lower() in _DAY_NAMES for d in days):
            raise ReservationError(f"{where}.days must be a list of days such as ['tue', 'thu'] (of "
                                   f"{', '.join(DAYS)}), not {entry['days']!r}")
        start, end = (_clock(where, key, entry[key]) for key in ("start", "end"))
        if end <= start:
            raise ReservationError(f"{where}.end: the window ends at {entry['end']}, before it starts at "
                                   f"{entry['start']}; a weekly window ends on the day it starts")
        return Window(zone, tuple(sorted({_DAY_NAMES[d.strip().lower()] for d in days})), start, end)
    start, end = (_moment(where, key, entry[key], zone) for key in ("start", "end"))
    if end <= start:
        raise ReservationError(f"{where}.end: the window ends at {entry['end']}, before it starts at {entry['start']}")
    return Window(zone, once=(start, end))


def _clock(where: str, key: str, text: str) -> dt.time:
    m = _CLOCK.match(text)
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59 or int(m.group(3) or 0) > 59:
        raise ReservationError(f"{where}.{key}: {text!r} is not a time of day such as '10:00' (with 'days'; "
                               "without them, a date and time such as '2025-03-04 10:00')")
    return dt.time(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def _moment(where: str, key: str, text: str, zone: ZoneInfo) -> float:
    m = _MOMENT.match(text)
    try:
        if not m:
            raise ValueError
        day = dt.date.fromisoformat(m.group(1))
        return dt.datetime.combine(day, dt.time(int(m.group(2)), int(m.group(3)), int(m.group(4) or 0)),
                                   zone).timestamp()
    except ValueError:
        raise ReservationError(f"{where}.{key}: {text!r} is not a date and time such as '2025-03-04 10:00' (or "
                               "give 'days' for a weekly window, with times such as '10:00')") from None


# -- what the pool can hold --------------------------------------------------------------------------------


def check_fit(reservations: tuple[Reservation, ...], gpus: list[GPU], now: float, horizon: float = HORIZON) -> None:
    """Every reservation fits the pool's GPUs of its models, and reservations whose rooms are kept at the
    same time (lead times included) fit them together; else ReservationError naming them."""
    if not gpus:
        return
    eligible = {r.name: [g for g in gpus if r.on(g)] for r in reservations}
    for i, r in enumerate(reservations):
        _fits(f"[{i}] ({r.name!r})", [r], eligible, gpus, None)
    spans = sorted((start - r.lead, end, i) for i, r in enumerate(reservations)
                   for start, end in r.window.occurrences(now, now + horizon))
    under_way: list[tuple[float, int]] = []  # (end, reservation) of the spans begun and not ended
    checked: set[frozenset[int]] = set()
    for begin, end, i in spans:
        under_way = [(e, j) for e, j in under_way if e > begin]
        along = sorted({j for _e, j in under_way if j != i})
        under_way.append((end, i))
        for size in range(1, min(len(along), 6) + 1):
            for others in itertools.combinations(along, size):
                key = frozenset((i, *others))
                if key not in checked:
                    checked.add(key)
                    group = [reservations[i], *(reservations[j] for j in others)]
                    _fits(f"[{i}] ({reservations[i].name!r})", group, eligible, gpus, begin)


def _fits(where: str, group: list[Reservation], eligible: dict[str, list[GPU]], gpus: list[GPU],
          at: float | None) -> None:
    first = group[0]
    on = {g.uuid: g for r in group for g in eligible[r.name]}
    if not eligible[first.name]:
        raise ReservationError(f"{where}.models: no GPU of the pool is one of {list(first.models)} (its GPUs: "
                               f"{', '.join(sorted({g.name for g in gpus}))})")
    wanted = sum(r.demand(eligible[r.name]) for r in group)
    capacity = sum(g.memory for g in on.values())
    whole = sum(r.gpus or 0 for r in group)
    if wanted <= capacity and whole <= len(on):
        return
    what = (f"{whole} whole GPUs on {len(on)} GPUs" if whole > len(on) else
            f"{format_size(wanted)} on GPUs that hold {format_size(capacity)}")
    if len(group) == 1:
        raise ReservationError(f"{where}: it reserves {what}: it cannot fit the pool")
    names = ", ".join(repr(r.name) for r in group[1:])
    when = f" from {first.window.clock(at)} {first.window.zone.key}, its lead time included" if at is not None else ""
    raise ReservationError(f"{where}: it overlaps {names}{when}, and they cannot both fit the pool: together "
                           f"they reserve {what}")
