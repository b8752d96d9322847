"""The activity trace as a file: JSON lines, a header first and a closing line last.

::

    {"format": "jupyter-gpu-pool-trace", "version": 1, "since": ..., "until": ..., "exported": ..., "users": "all"}
    {"t": 1718000000.0, "e": "start", "k": "5f0c...", "u": "alice", "p": "gpu-10g", "g": ["students"]}
    ...
    {"end": true, "events": 1234}

The closing line tells a complete file from one cut short.  Reading checks every line
(``pool.trace.check``) and names the line of anything wrong; :func:`to_workload` turns the events
into the sessions a replay runs (docs/planning.md says how).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

from ..pool.trace import FORMAT, REQUESTED, VERSION, TraceError, TraceEvent, check
from .configuration import PlanError
from .workload import ACTIVE, BUSY, END, GPU, HIBERNATE, IDLE, SNOOZE, Activity, Session, Workload


@dataclass
class Trace:
    header: dict
    events: list[tuple[int, TraceEvent]] = field(default_factory=list)  # (line, event)
    name: str = "trace"


def write(out: IO[str], events: Iterable[TraceEvent], *, since: float, until: float, exported: float,
          users: str | list[str]) -> int:
    """The whole file: header, one line per event, closing line; the number of events."""
    out.write(json.dumps({"format": FORMAT, "version": VERSION, "since": since, "until": until,
                          "exported": exported, "users": users}) + "\n")
    n = 0
    for event in events:
        out.write(json.dumps(event.to_dict(), separators=(",", ":")) + "\n")
        n += 1
    out.write(json.dumps({"end": True, "events": n}) + "\n")
    return n


def read(lines: Iterable[str], name: str = "trace") -> Trace:
    """Every line checked; :class:`PlanError` naming ``name`` and the line for anything wrong."""
    trace: Trace | None = None
    closed_at = None
    number = 0
    for number, line in enumerate(lines, start=1):
        if closed_at is not None:
            if line.strip():
                raise PlanError(f"{name} line {number}: there is more after the closing line (line {closed_at}); "
                                "was another trace appended to this one?")
            continue
        if not line.endswith("\n"):
            raise PlanError(f"{name} line {number} is cut short (no end of line): the trace is truncated; export it "
                            "again")
        try:
            raw = json.loads(line)
        except ValueError as e:
            raise PlanError(f"{name} line {number} is not JSON ({e}); a trace is one JSON object per line") from None
        if trace is None:
            trace = Trace(_header(raw, name), name=name)
            continue
        if isinstance(raw, dict) and raw.get("end") is True:
            closed_at = number
            if raw.get("events") != len(trace.events):
                raise PlanError(f"{name} line {number}: the closing line counts {raw.get('events')!r} events but the "
                                f"trace has {len(trace.events)}: lines are missing or were added; export it again")
            continue
        try:
            trace.events.append((number, check(raw)))
        except TraceError as e:
            raise PlanError(f"{name} line {number}: {e}") from None
    if trace is None:
        raise PlanError(f"{name} is empty: a trace starts with its header line (jupyter gpu-pool trace export "
                        "writes one)")
    if closed_at is None:
        raise PlanError(f"{name} ends at line {number} without its closing line: the trace is truncated (was its "
                        "export interrupted?); export it again")
    return trace


def _header(raw, name: str) -> dict:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise PlanError(f"{name} line 1 is not a jupyter-gpu-pool trace header (it needs \"format\": \"{FORMAT}\"); "
                        "write a trace with jupyter gpu-pool trace export")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PlanError(f"{name} line 1: the trace format version must be a whole number, not {version!r}")
    if version > VERSION:
        raise PlanError(f"{name} line 1: this trace is format version {version}, newer than the version this "
                        f"jupyter-gpu-pool reads ({VERSION}); upgrade jupyter-gpu-pool to replay it")
    for key in ("since", "until"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise PlanError(f"{name} line 1: {key!r} must be a time in Unix seconds, not {value!r}")
    return raw


# -- from events to sessions ---------------------------------------------------------------------


@dataclass
class _Life:
    """One lease of one kernel, as the trace tells it."""

    kernel: str
    line: int
    user: str = ""
    groups: tuple[str, ...] = ()
    profile: str = ""
    kernelspec: str = ""
    arrival: float | None = None
    queued_at: float | None = None
    started: bool = False
    refused: bool = False
    ended: bool = False
    policy_end: bool = False  # the live policy shut it down: the replay's policy decides instead
    info: dict = field(default_factory=dict)  # the kernel event's hib, why, declared, grid
    shift: float = 0.0  # the live pool's delays so far (queue, restores)
    activity: list[Activity] = field(default_factory=list)


def to_workload(trace: Trace, *, interval: float | None = None) -> Workload:
    """The sessions a replay runs, in user time, and what the live pool decided (for comparison).

    - a kernel's session starts when it asked: its start, or its place in the queue before it;
    - the pool's own delays (queue, a resume's wait and restore) are taken out of what follows;
    - a kernel the live policy shut down has no end of its own (the replayed policy decides); any
      other end is its user's (or its crash's, or an admin's) and stays;
    - a hibernation its user or an admin asked for (an ``act`` with reason ``user`` or ``admin``) is
      something a person did: the replay carries it out then, and it is no decision of the policy's;
    - a start the live pool refused is asked once and holds nothing (the user's retry is a kernel of
      its own in the trace)."""
    lives: dict[str, _Life] = {}
    done: list[_Life] = []
    decisions, refusals, intervals = [], [], Counter()
    for line, e in sorted(trace.events, key=lambda item: (item[1].at, item[0])):
        life = lives.get(e.kernel_id)
        if life is None or (life.ended and e.kind in ("start", "queued", "refused")):
            if life is not None:
                done.append(life)
            life = lives[e.kernel_id] = _Life(e.kernel_id, line)
        life.user = life.user or e.owner or ""
        data, kind = e.data, e.kind
        if kind in ("kernel", "start"):
            life.profile = data.get("p", life.profile)
            life.groups = tuple(data.get("g", life.groups))
            if kind == "kernel":
                life.kernelspec = data.get("s", life.kernelspec)
                life.info = data
                if "grid" in data:
                    intervals[data["grid"][1]] += 1
            else:
                life.line = line
                life.started = True
                if life.arrival is None:
                    life.arrival = life.queued_at if life.queued_at is not None else e.at
                life.shift = e.at - life.arrival
            if life.arrival is None:
                life.arrival = e.at
        elif kind == "queued":
            if not life.started and life.queued_at is None:
                life.queued_at = e.at
        elif kind == "refused":
            refusals.append({"t": e.at, "kernel": e.kernel_id, "reason": data["r"], "what": data.get("a", "start")})
            if data.get("a", "start") == "start" and not life.started:
                life.profile = data.get("p", life.profile)
                life.refused, life.line = True, line
                life.arrival = life.queued_at if life.queued_at is not None else e.at
                life.ended = True
        elif kind == "restored":  # the user woke it (a cell) when the resume began: their time, less the wait
            life.activity.append((e.at - data["w"] - life.shift, ACTIVE, None))
            life.shift += data["w"]
        elif kind in ("warn", "act") and data["r"] in REQUESTED:
            if kind == "act" and data["a"] == "hibernate" and not data.get("dry"):
                life.activity.append((e.at - life.shift, HIBERNATE, data["r"]))
        elif kind in ("warn", "act"):
            decisions.append({"t": e.at, "kernel": e.kernel_id, "verb": kind, "reason": data["r"],
                              "action": data["a"], **({"dry_run": True} if data.get("dry") else {})})
            if kind == "act" and data["a"] == "shutdown" and not data.get("dry"):
                life.policy_end = True
        elif kind == "end":
            life.ended = True
            if not life.policy_end:
                life.activity.append((e.at - life.shift, END, None))
        elif kind in _ACTIVITY:
            if life.arrival is None:
                life.arrival = e.at
            code = _ACTIVITY[kind]
            value = None
            if code == GPU:
                value = (data.get("mem"), data.get("util"))
            elif code == SNOOZE:
                value = data["until"] - e.at
            life.activity.append((e.at - life.shift, code, value))
    done.extend(lives.values())
    default_interval = interval or (intervals.most_common(1)[0][0] if intervals else 30.0)
    sessions = [_session(life) for life in done if life.arrival is not None and (life.started or life.refused
                                                                                 or life.activity)]
    times = [e.at for _, e in trace.events]
    start = trace.header.get("since") or (min(times) if times else 0.0)
    end = trace.header.get("until") or (max(times) if times else start)
    sessions.sort(key=lambda s: s.arrival)
    return Workload(sessions, float(start), float(max(end, start)), interval=default_interval,
                    source={"kind": "trace", "file": trace.name, "kernels": len(sessions),
                            "users": len({s.user for s in sessions})},
                    events=len(trace.events), recorded={"decisions": decisions, "refusals": refusals})


_ACTIVITY = {"busy": BUSY, "idle": IDLE, "active": ACTIVE, "gpu": GPU, "snooze": SNOOZE}


def _session(life: _Life) -> Session:
    arrival = life.arrival
    events = sorted(((max(t, arrival), code, value) for t, code, value in life.activity), key=lambda a: a[0])
    info = life.info
    grid = tuple(info["grid"]) if "grid" in info else None
    return Session(id=life.kernel, user=life.user, groups=life.groups, profile=life.profile, arrival=arrival,
                   activity=lambda: iter(events), kernelspec=life.kernelspec,
                   can_hibernate=info.get("hib"), why=info.get("why"), declared=bool(info.get("declared")),
                   grid=grid, once=life.refused and not life.started, line=life.line)


def lines_of(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        yield from f
