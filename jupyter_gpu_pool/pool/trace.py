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
    "restored": {"w": (_NUMBER, True)},
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


class TraceError(ValueError):
    """A trace event (or line) that cannot be read: the message says which field and why."""


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
        raise TraceError(f"'e': {kind!r} is not an event kind this version reads ({', '.join(KINDS)})")
    at = raw.get("t")
    if isinstance(at, bool) or not isinstance(at, _NUMBER) or not math.isfinite(at) or at < 0:
        raise TraceError(f"'t' must be a time in Unix seconds, not {at!r}")
    kernel_id, owner = raw.get("k"), raw.get("u")
    for name, value in (("k", kernel_id), ("u", owner)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > MAX_TEXT):
            raise TraceError(f"'{name}' must be a non-empty name, not {value!r}")
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
                             f"not {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise TraceError(f"'{name}' must be a finite number, not {value!r}")
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise TraceError(f"'{name}' is too long ({len(value)} characters; at most {MAX_TEXT})")
        if isinstance(value, list) and (len(value) > 64 or not all(
                isinstance(v, str if name == "g" else _NUMBER) and not isinstance(v, bool) for v in value)):
            raise TraceError(f"'{name}' must be a list of at most 64 "
                             f"{'names' if name == 'g' else 'numbers'}, not {value!r}")
        data[name] = value
    if kind == "kernel" and "grid" in data and (len(data["grid"]) != 2 or not data["grid"][1] > 0):
        raise TraceError(f"'grid' must be [first pass, interval above 0], not {data['grid']!r}")
    return TraceEvent(float(at), kind, kernel_id, owner, data)


def _name(t: type) -> str:
    return {str: "text", int: "a whole number", float: "a number", bool: "true or false", list: "a list",
            type(None): "null"}[t]
