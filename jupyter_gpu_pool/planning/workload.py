"""What users do, whatever its source (a recorded trace, a synthetic lab or hub): sessions.

A :class:`Session` is one user's kernel as they work with it: when they ask for it, the cells they
run (busy, then idle), other activity, GPU readings, snoozes and when they shut it down, all in *user
time*: the pool's own delays (time in the queue, a restore) are taken out, and a replay puts its own
back in (every later event of the session moves by what the replay made the user wait).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# Activity codes (small ints: a week of a hub is a million of them).  HIBERNATE: its user (or an admin)
# asked for the kernel's hibernation (Release GPU): what a person did, carried out whatever the policy.
# HINT: its user opened its notebook or started typing in it, and the live server woke it on that hint.
BUSY, IDLE, ACTIVE, GPU, SNOOZE, END, HIBERNATE, HINT = range(1, 9)
NAMES = {BUSY: "busy", IDLE: "idle", ACTIVE: "active", GPU: "gpu", SNOOZE: "snooze", END: "end",
         HIBERNATE: "hibernate", HINT: "hint"}

# (user time, code, value): GPU (memory, utilization), SNOOZE seconds, HIBERNATE who asked (user or admin),
# HINT the seconds the woken kernel waits for a cell (None: the replay's hint hold)
Activity = tuple[float, int, object]


@dataclass
class Session:
    id: str  # the kernel id in a trace; a made-up name in a synthetic workload
    user: str
    groups: tuple[str, ...]
    profile: str
    arrival: float  # when the user asks for the kernel
    activity: Callable[[], Iterator[Activity]]  # its events in user-time order, afresh for each replay
    kernelspec: str = ""
    can_hibernate: bool | None = None  # None: as its profile's isolation allows
    why: str | None = None  # why it cannot hibernate, as the live culler was told
    declared: bool = False  # on declared GPUs: a hibernation moves nothing and costs nothing
    memory: int | None = None  # bytes it holds on its GPU when no reading says (None: its slice's)
    retry: float | None = None  # a refused start asks again this long after (synthetic users); None: it gives up
    grid: tuple[float, float] | None = None  # (first pass, interval) of the culler that ran it
    once: bool = False  # refused when recorded: asks once, holds nothing (its user's retry is a session of its own)
    line: int = 0  # the trace line that introduced it (errors name it)


@dataclass
class Workload:
    sessions: list[Session]
    start: float
    end: float  # the replay's horizon
    interval: float = 30.0  # the culling interval for sessions whose culler is not recorded
    source: dict = field(default_factory=dict)  # what it is, for the report (kind, parameters, file)
    events: int = 0  # activity events in all, for the progress bar and the report
    recorded: dict = field(default_factory=dict)  # the live pool's decisions and refusals, where a trace has them
    # Timetabled windows of a group (a synthetic week's class): name -> (group, each window's start), whose
    # members' waits at the start a replay reports, reservation or not
    classes: dict[str, tuple[str, tuple[float, ...]]] = field(default_factory=dict)

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600
