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

from ..pool.trace import FORMAT, REQUESTED, VERSION, TraceError, TraceEvent, check, quoted
from .configuration import PlanError
from .workload import ACTIVE, BUSY, END, GPU, HIBERNATE, HINT, IDLE, SNOOZE, Activity, Session, Workload


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


def read(lines: Iterable[str | bytes], name: str = "trace") -> Trace:
    """Every line checked; :class:`PlanError` naming ``name`` and the line for anything wrong (quoting at
    most a short prefix of a bad value).  Besides each event's own fields (``pool.trace.check``): lines
    are UTF-8, in time order, every event names its user (``u``), and no kernel's lease ends before the
    trace starts it."""
    trace: Trace | None = None
    closed_at = None
    number = 0
    order = _Order(name)
    for number, line in enumerate(lines, start=1):
        if isinstance(line, bytes):
            line = _decoded(line, name, number)
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
                raise PlanError(f"{name} line {number}: the closing line counts {quoted(raw.get('events'))} events "
                                f"but the trace has {len(trace.events)}: lines are missing or were added; export it "
                                "again")
            continue
        try:
            event = check(raw)
        except TraceError as e:
            raise PlanError(f"{name} line {number}: {e}") from None
        order.check(number, event)
        trace.events.append((number, event))
    if trace is None:
        raise PlanError(f"{name} is empty: a trace starts with its header line (jupyter gpu-pool trace export "
                        "writes one)")
    if closed_at is None:
        raise PlanError(f"{name} ends at line {number} without its closing line: the trace is truncated (was its "
                        "export interrupted?); export it again")
    return trace


def _decoded(line: bytes, name: str, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError(f"{name} line {number}: byte {line[e.start]:#04x} at column {e.start + 1} is not UTF-8 "
                        "text; a trace is UTF-8 JSON lines (was it edited or converted?): export it again") from None


def _header(raw, name: str) -> dict:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise PlanError(f"{name} line 1 is not a jupyter-gpu-pool trace header (it needs \"format\": \"{FORMAT}\"); "
                        "write a trace with jupyter gpu-pool trace export")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise PlanError(f"{name} line 1: the trace format version must be a whole number, not {quoted(version)}")
    if version > VERSION:
        raise PlanError(f"{name} line 1: this trace is format version {version}, newer than the version this "
                        f"jupyter-gpu-pool reads ({VERSION}); upgrade jupyter-gpu-pool to replay it")
    for key in ("since", "until"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise PlanError(f"{name} line 1: {key!r} must be a time in Unix seconds, not {quoted(value)}")
    return raw


class _Order:
    """What holds between a trace's lines: time order, every event's user, no lease ended before its start."""

    def __init__(self, name: str):
        self.name = name
        self.last = (0.0, 0)  # the latest time so far, and its line
        self.started: set[str] = set()  # kernels whose start was read
        self.ended: dict[str, tuple[int, float]] = {}  # kernels ended before any start was read: line, time

    def check(self, number: int, event: TraceEvent) -> None:
        name = self.name
        if event.owner is None:
            raise PlanError(f"{name} line {number}: a '{event.kind}' event needs 'u', the kernel's user (every event "
                            "names it); export the trace again")
        if event.at < self.last[0]:
            raise PlanError(f"{name} line {number}: its time ({event.at:.3f}) is before line {self.last[1]}'s "
                            f"({self.last[0]:.3f}); a trace's events are in time order (jupyter gpu-pool trace "
                            "export writes them so): sort the lines by 't', or export the trace again")
        self.last = (event.at, number)
        kernel = event.kernel_id
        if event.kind == "start":
            if kernel in self.ended:
                line, at = self.ended[kernel]
                raise PlanError(f"{name} line {number}: kernel {quoted(kernel)} starts at {event.at:.3f}, after "
                                f"its lease ended (line {line}, at {at:.3f}): an end before its start; correct the "
                                "times, or export the trace again")
            self.started.add(kernel)
        elif event.kind == "end" and kernel not in self.started:
            self.ended.setdefault(kernel, (number, event.at))  # began before the trace: fine unless it starts later


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
    unsliced: bool = False  # seen before its lease began (slice_at first-cell): no use until its start was a cell
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
    - a resume a hint started (a ``restored`` with ``r`` hint) is the hint, at its start, with the live
      server's hold: no cell, and no wait of its user's;
    - a start the live pool refused is asked once and holds nothing (the user's retry is a kernel of
      its own in the trace);
    - a kernel seen before its start (slice_at first-cell: it held nothing until its first cell) arrives
      when seen, its start is its first cell's, only a queue before that start was the pool's delay, and
      its use before that start (its start-up, completions) is no cell.

    Each kind of event has its handler (:data:`_HANDLERS`); they share the kernel's :class:`_Life`."""
    story = _Story()
    for line, e in trace.events:  # in time order: read() refuses a line out of it
        life = story.life(line, e)
        life.user = life.user or e.owner or ""
        _HANDLERS[e.kind](story, life, line, e)
    story.done.extend(story.lives.values())
    intervals = story.intervals
    default_interval = interval or (intervals.most_common(1)[0][0] if intervals else 30.0)
    sessions = [_session(life) for life in story.done if life.arrival is not None and (
        life.started or life.refused or life.activity or life.unsliced)]
    times = [e.at for _, e in trace.events]
    start = trace.header.get("since") or (min(times) if times else 0.0)
    end = trace.header.get("until") or (max(times) if times else start)
    sessions.sort(key=lambda s: s.arrival)
    return Workload(sessions, float(start), float(max(end, start)), interval=default_interval,
                    source={"kind": "trace", "file": trace.name, "kernels": len(sessions),
                            "users": len({s.user for s in sessions})},
                    events=len(trace.events), recorded={"decisions": story.decisions, "refusals": story.refusals})


@dataclass
class _Story:
    """What :func:`to_workload` has read so far: each kernel's current lease, the finished ones, and what
    the live pool decided."""

    lives: dict[str, _Life] = field(default_factory=dict)
    done: list[_Life] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    refusals: list[dict] = field(default_factory=list)
    intervals: Counter = field(default_factory=Counter)

    def life(self, line: int, e: TraceEvent) -> _Life:
        """The kernel's lease this event belongs to (a start after an end is a lease of its own)."""
        life = self.lives.get(e.kernel_id)
        if life is None or (life.ended and e.kind in ("start", "queued", "refused")):
            if life is not None:
                self.done.append(life)
            life = self.lives[e.kernel_id] = _Life(e.kernel_id, line)
        return life


def _on_kernel(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    data = e.data
    life.profile = data.get("p", life.profile)
    life.groups = tuple(data.get("g", life.groups))
    life.kernelspec = data.get("s", life.kernelspec)
    if not life.started and not life.refused:
        # Seen before its lease began: a kernel without a slice yet (slice_at first-cell), whose "cannot
        # hibernate" only says it held nothing then (the replay asks its profile instead, unless a kernel
        # event written once it held its slice says), and whose use so far (its start-up, a completion)
        # was no cell: a cell would have taken a slice first.
        data = {k: v for k, v in data.items() if k not in ("hib", "why")}
        life.unsliced = True
        life.activity = [a for a in life.activity if a[1] not in _USE]
    life.info = data
    if "grid" in data:
        story.intervals[data["grid"][1]] += 1
    if life.arrival is None:
        life.arrival = e.at


def _on_start(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    data = e.data
    life.profile = data.get("p", life.profile)
    life.groups = tuple(data.get("g", life.groups))
    life.line = line
    life.started = True
    if life.arrival is None:
        life.arrival = life.queued_at if life.queued_at is not None else e.at
        life.shift = e.at - life.arrival
    else:  # seen before its slice (slice_at first-cell): this is its first cell's, and only a queue was the pool's
        life.shift = e.at - life.queued_at if life.queued_at is not None else 0.0


def _on_queued(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    if not life.started and life.queued_at is None:
        life.queued_at = e.at


def _on_refused(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    data = e.data
    what = data.get("a", "start")
    story.refusals.append({"t": e.at, "kernel": e.kernel_id, "reason": data["r"], "what": what})
    if what == "start" and not life.started:
        life.profile = data.get("p", life.profile)
        life.refused, life.line = True, line
        life.arrival = life.queued_at if life.queued_at is not None else e.at
        life.ended = True


def _on_restored(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    """The user woke it (a cell) when the resume began: their time, less the wait.  A resume a hint
    started (``r`` hint) is no cell and nobody waited for it: the hint, at that time."""
    if e.data.get("r") == "hint":
        life.activity.append((e.at - e.data["w"] - life.shift, HINT, e.data.get("hold")))
        return
    life.activity.append((e.at - e.data["w"] - life.shift, ACTIVE, None))
    life.shift += e.data["w"]


def _on_policy(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    """A warning or an action: the live policy's (compared with the replay's), or what a person asked for."""
    data, kind = e.data, e.kind
    if data["r"] in REQUESTED:
        if kind == "act" and data["a"] == "hibernate" and not data.get("dry"):
            life.activity.append((e.at - life.shift, HIBERNATE, data["r"]))
        return
    story.decisions.append({"t": e.at, "kernel": e.kernel_id, "verb": kind, "reason": data["r"],
                            "action": data["a"], **({"dry_run": True} if data.get("dry") else {})})
    if kind == "act" and data["a"] == "shutdown" and not data.get("dry"):
        life.policy_end = True


def _on_end(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    life.ended = True
    if not life.policy_end:
        life.activity.append((e.at - life.shift, END, None))


def _on_activity(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    if life.arrival is None:
        life.arrival = e.at
    code = _ACTIVITY[e.kind]
    if life.unsliced and not life.started and code in _USE:
        return  # no cell: a cell would have taken a slice first
    value = None
    if code == GPU:
        value = (e.data.get("mem"), e.data.get("util"))
    elif code == SNOOZE:
        value = e.data["until"] - e.at
    life.activity.append((e.at - life.shift, code, value))


def _on_nothing(story: _Story, life: _Life, line: int, e: TraceEvent) -> None:
    """The hibernation itself and the resume's grant: the replay decides its own (a ``restored`` says
    when the user woke the kernel)."""


_ACTIVITY = {"busy": BUSY, "idle": IDLE, "active": ACTIVE, "gpu": GPU, "snooze": SNOOZE}
_USE = (BUSY, IDLE, ACTIVE)
_HANDLERS = {"kernel": _on_kernel, "start": _on_start, "queued": _on_queued, "refused": _on_refused,
             "restored": _on_restored, "warn": _on_policy, "act": _on_policy, "end": _on_end,
             "hibernated": _on_nothing, "resumed": _on_nothing, **dict.fromkeys(_ACTIVITY, _on_activity)}


def _session(life: _Life) -> Session:
    arrival = life.arrival
    events = sorted(((max(t, arrival), code, value) for t, code, value in life.activity), key=lambda a: a[0])
    info = life.info
    grid = tuple(info["grid"]) if "grid" in info else None
    return Session(id=life.kernel, user=life.user, groups=life.groups, profile=life.profile, arrival=arrival,
                   activity=lambda: iter(events), kernelspec=life.kernelspec,
                   can_hibernate=info.get("hib"), why=info.get("why"), declared=bool(info.get("declared")),
                   grid=grid, once=life.refused and not life.started, line=life.line)


def lines_of(path: str) -> Iterator[bytes]:
    """The file's lines as bytes: :func:`read` decodes each, so that a byte that is not UTF-8 is named
    by its line."""
    with open(path, "rb") as f:
        yield from f
