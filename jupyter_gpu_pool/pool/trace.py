"""The activity trace: what the idle policy needs to replay a pool's use, one event at a time.

Per GPU kernel: its lease (start, end, hibernation, resume, refusals, time in the queue), what the
culler saw of it (profile, kernelspec, whether it can hibernate, the culler's pass schedule), its
execution (busy, idle, other activity), coarse GPU readings, its user's snoozes, and the policy's
warnings and actions.  Never any code, output or notebook name.  The server extension records it,
the ledger keeps it, ``jupyter gpu-pool trace export`` writes it as JSON lines, and the planner
replays it (docs/planning.md describes the format).

Pure: :func:`check` validates one event (as a dict) and is used alike by the pool service (what a
client sends) and the planner (each line of a file).
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, field

FORMAT = "jupyter-gpu-pool-trace"
VERSION = 1

START, RESUME = "start", "resume"
_TEXT = (str,)
_NUMBER = (int, float)

# Each kind's fields: name -> (types, required).  Every event has "t" (Unix seconds) and "e" (its kind);
# kernel events have "k" (kernel id) and "u" (its owner).
FIELDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "kernel": {"p": (_TEXT, True), "g": ((list,), False), "s": (_TEXT, False), "hib": ((bool,), False),
               "why": ((str, type(None)), False), "grid": ((list,), False), "declared": ((bool,), False)},
    "queued": {"p": (_TEXT, False), "a": (_TEXT, False)},
    "start": {"p": (_TEXT, True), "g": ((list,), False)},
    "refused": {"p": (_TEXT, False), "r": (_TEXT, True), "a": (_TEXT, False)},
    "end": {"r": (_TEXT, False)},
    "hibernated": {"bytes": ((int,), False)},
    "resumed": {},
    "restored": {"w": (_NUMBER, True), "r": (_TEXT, False), "hold": (_NUMBER, False)},
    "busy": {},
    "idle": {},
    "active": {},
    "gpu": {"mem": ((int, type(None)), False), "util": ((int, float, type(None)), False)},
    "snooze": {"until": (_NUMBER, True)},
    "warn": {"r": (_TEXT, True), "a": (_TEXT, True), "d": (_NUMBER, False), "dry": ((bool,), False)},
    "act": {"r": (_TEXT, True), "a": (_TEXT, True), "dry": ((bool,), False), "rule": (_TEXT, False)},
}
KINDS = tuple(FIELDS)
MAX_TEXT = 256  # characters in one text field (names, reasons): a trace carries no free text
MAX_LIST = 64  # entries in one list field (a kernel's groups)
# An "act" whose reason is one of these was asked for by a person (Release GPU, an admin's action), not
# decided by the policy: a replay carries it out when it was asked, and compares it with no decision.
REQUESTED = ("user", "admin")


class TraceError(ValueError):
    """A trace event (or line) that cannot be read: the message says which field and why."""


QUOTE = 40  # characters of a bad value an error quotes

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = QUOTE
_SHORT.maxlist = _SHORT.maxdict = 4
_SHORT.maxlevel = 2


def quoted(value) -> str:
    """``value`` as an error shows it: at most a short prefix (a field of a gigabyte is not echoed back)."""
    if isinstance(value, str) and len(value) > QUOTE:
        return f"{value[:QUOTE]!r}… ({len(value):,} characters)"
    text = _SHORT.repr(value) if isinstance(value, (list, dict, tuple)) else repr(value)
    return text if len(text) <= 2 * QUOTE else f"{text[:QUOTE]}… ({len(text):,} characters)"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    at: float
    kind: str
    kernel_id: str | None = None
    owner: str | None = None
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """As a line of the exported trace."""
        out: dict = {"t": round(self.at, 3), "e": self.kind}
        if self.kernel_id is not None:
            out["k"] = self.kernel_id
        if self.owner is not None:
            out["u"] = self.owner
        out.update(self.data)
        return out


def check(raw) -> TraceEvent:
    """One event from its dict form; :class:`TraceError` naming the field that is wrong.  Fields a
    kind does not know are dropped (a later 1.x writer may add some)."""
    if not isinstance(raw, dict):
        raise TraceError(f"an event is a JSON object, not {type(raw).__name__}")
    kind = raw.get("e")
    if kind not in FIELDS:
        raise TraceError(f"'e': {quoted(kind)} is not an event kind this version reads ({', '.join(KINDS)})")
    at = raw.get("t")
    if isinstance(at, bool) or not isinstance(at, _NUMBER) or not math.isfinite(at) or at < 0:
        raise TraceError(f"'t' must be a time in Unix seconds, not {quoted(at)}")
    kernel_id, owner = raw.get("k"), raw.get("u")
    for name, value in (("k", kernel_id), ("u", owner)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > MAX_TEXT):
            long = f" of at most {MAX_TEXT} characters" if isinstance(value, str) and value else ""
            raise TraceError(f"'{name}' must be a non-empty name{long}, not {quoted(value)}")
    if kernel_id is None:
        raise TraceError(f"a '{kind}' event needs 'k', the kernel id")
    data = {}
    for name, (types, required) in FIELDS[kind].items():
        if name not in raw:
            if required:
                raise TraceError(f"a '{kind}' event needs '{name}'")
            continue
        value = raw[name]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise TraceError(f"'{name}' of a '{kind}' event must be {' or '.join(_name(t) for t in types)}, "
                             f"not {quoted(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise TraceError(f"'{name}' must be a finite number, not {quoted(value)}")
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise TraceError(f"'{name}' is too long ({len(value)} characters; at most {MAX_TEXT})")
        if isinstance(value, list) and (len(value) > MAX_LIST or not all(
                isinstance(v, str if name == "g" else _NUMBER) and not isinstance(v, bool) for v in value)):
            raise TraceError(f"'{name}' must be a list of at most {MAX_LIST} "
                             f"{'names' if name == 'g' else 'numbers'}, not {quoted(value)}")
        data[name] = value
    if kind == "kernel" and "grid" in data and (len(data["grid"]) != 2 or not data["grid"][1] > 0
                                                or not all(math.isfinite(v) for v in data["grid"])):
        raise TraceError(f"'grid' must be [first pass, interval above 0], not {quoted(data['grid'])}")
    _in_range(kind, at, data)
    return TraceEvent(float(at), kind, kernel_id, owner, data)


def _in_range(kind: str, at: float, data: dict) -> None:
    """Values that cannot happen (a negative size, a share over 100%, a snooze that ended before it began)."""
    def low(name: str, least: float, what: str) -> None:
        value = data.get(name)
        if value is not None and value < least:
            raise TraceError(f"'{name}' of a '{kind}' event must be {what}, not {value!r}")

    if kind == "gpu":
        low("mem", 0, "bytes held, 0 or more (null: held, size unknown)")
        util = data.get("util")
        if util is not None and not 0 <= util <= 100:
            raise TraceError(f"'util' of a 'gpu' event must be a percentage from 0 to 100, not {util!r}")
    elif kind == "hibernated":
        low("bytes", 0, "bytes moved, 0 or more")
    elif kind == "restored":
        low("w", 0, "seconds, 0 or more")
        low("hold", 0, "seconds, 0 or more")
    elif kind == "snooze":
        low("until", at, f"a time no earlier than the event's 't' ({at!r})")


def clipped(event: TraceEvent, *, first=lambda group: False) -> TraceEvent:
    """``event`` within what :func:`check` reads: each text cut to ``MAX_TEXT`` characters, the groups
    to ``MAX_LIST`` (those ``first`` says matter, such as the ones the admin's policy and quotas name,
    kept before the rest).  Every recording path writes events through this, so what is recorded can be
    replayed (a user in 70 Unix groups, a long failure message in 'why')."""
    data = event.data
    if any(isinstance(v, str) and len(v) > MAX_TEXT or isinstance(v, list) and len(v) > MAX_LIST
           for v in data.values()):
        data = {name: _clip(name, value, first) for name, value in data.items()}
    kernel_id, owner = (_cut(v) if isinstance(v, str) else v for v in (event.kernel_id, event.owner))
    if data is event.data and kernel_id == event.kernel_id and owner == event.owner:
        return event
    return TraceEvent(event.at, event.kind, kernel_id, owner, data)


def _clip(name: str, value, first):
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, list) and name == "g" and len(value) > MAX_LIST:
        return (sorted(value, key=lambda g: not first(g)))[:MAX_LIST]  # (sorted is stable: the order kept)
    return value


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def _name(t: type) -> str:
    return {str: "text", int: "a whole number", float: "a number", bool: "true or false", list: "a list",
            type(None): "null"}[t]
