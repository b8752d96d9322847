"""Synthetic workloads: a teaching lab, a hub's week, and a department box's week (a class twice a week
and a research group in between), deterministic for a seed.

The shape follows what NotebookOS (Carver et al., ASPLOS 2026, arXiv:2503.20591) reports of production
notebook sessions: long-running, with sporadic GPU use and long gaps between cells.  The numbers are
our assumptions (one kernel's memory aside, measured on the project's H100), each with its basis in
docs/planning.md, "Synthetic workloads": record your own users (``jupyter gpu-pool trace export``) and
replay them instead, or set the numbers you know (--think, --cell, --memory, --arrive-within, --retry).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from .costs import GiB
from .workload import BUSY, END, GPU, IDLE, Activity, Session, Workload

EPOCH = 1704067200.0  # Monday 1 January 2024, 00:00 UTC: synthetic time starts on a Monday


@dataclass(frozen=True)
class Behaviour:
    """How one user works in a session (all durations in seconds; lognormal: median and sigma)."""

    think_median: float = 60.0  # between two cells: reading, thinking, editing (assumption)
    think_sigma: float = 1.0
    cell_median: float = 5.0  # a cell's run time; the long tail is training cells (assumption)
    cell_sigma: float = 1.5
    cell_max: float = 1800.0
    break_chance: float = 0.03  # after a cell, the chance the next pause is a break (assumption)
    break_min: float = 600.0
    break_max: float = 1800.0
    memory_min: float = 1.0  # GiB the kernel holds once it used the GPU, uniform (assumption)
    memory_max: float = 6.0
    utilization: float = 70.0  # percent while a cell runs (only its side of the GPU-idle threshold matters)

    def cells(self, rng: random.Random, begin: float, end: float, memory: int) -> Iterator[Activity]:
        """Cells from ``begin`` until ``end``: busy, a GPU reading, idle, a GPU reading."""
        t = begin + rng.lognormvariate(math.log(self.think_median), self.think_sigma)
        while t < end:
            run = min(rng.lognormvariate(math.log(self.cell_median), self.cell_sigma), self.cell_max)
            done = min(t + run, end)
            yield (t, BUSY, None)
            yield (t, GPU, (memory, self.utilization))
            yield (done, IDLE, None)
            yield (done, GPU, (memory, 0.0))
            if rng.random() < self.break_chance:
                pause = rng.uniform(self.break_min, self.break_max)
            else:
                pause = rng.lognormvariate(math.log(self.think_median), self.think_sigma)
            t = done + pause


@dataclass(frozen=True)
class Lab:
    """A teaching lab: ``students`` arrive at the start, work through the lab, and leave near its end."""

    students: int = 40
    hours: float = 3.0
    profile: str | None = None  # None: the configuration's default profile
    group: str = "students"
    arrive_within: float = 600.0  # students come in during the first 10 minutes (assumption)
    leave_early: float = 600.0  # mean of how long before the end a student leaves (exponential; assumption)
    forget: float = 0.3  # the chance a student leaves without shutting the kernel down (assumption)
    retry: float = 30.0  # a refused student tries again this much later (assumption)
    behaviour: Behaviour = Behaviour()
    seed: int = 0

    def workload(self, start: float = EPOCH + 9 * 3600) -> Workload:
        end = start + self.hours * 3600
        sessions = []
        for i in range(self.students):
            rng = random.Random(f"lab:{self.seed}:{i}")
            arrival = start + rng.uniform(0, min(self.arrive_within, self.hours * 3600 / 2))
            leave = max(end - rng.expovariate(1 / self.leave_early), arrival + 60)
            memory = int(rng.uniform(self.behaviour.memory_min, self.behaviour.memory_max) * GiB)
            sessions.append(Session(
                id=f"student-{i + 1:03d}", user=f"student{i + 1:03d}", groups=(self.group,), profile=self.profile or "",
                arrival=arrival, activity=_activity(self.behaviour, rng.getrandbits(64), arrival, leave, memory,
                                                    rng.random() >= self.forget),
                memory=memory, retry=self.retry))
        return Workload(sessions, start, end, source={
            "kind": "synthetic lab", "students": self.students, "hours": self.hours, "seed": self.seed,
            "profile": self.profile})


@dataclass(frozen=True)
class Hub:
    """A hub's week: each user works on some days, in one to three sessions within working hours."""

    users: int = 500
    days: float = 7.0
    profile: str | None = None
    group: str = "users"
    weekday_chance: float = 0.6  # the chance a user works on a weekday (assumption)
    weekend_chance: float = 0.15
    day_start: float = 8.0  # sessions start between these hours (assumption)
    day_end: float = 18.0
    session_median: float = 7200.0  # a session's length: lognormal, median 2 h (assumption)
    session_sigma: float = 0.6
    forget: float = 0.4  # the chance a user leaves the kernel running (assumption)
    retry: float = 60.0
    behaviour: Behaviour = Behaviour(think_median=35.0, cell_median=10.0)  # longer cells than a lab (assumption)
    seed: int = 0

    def workload(self, start: float = EPOCH) -> Workload:
        end = start + self.days * 86400
        sessions = []
        for i in range(self.users):
            rng = random.Random(f"hub:{self.seed}:{i}")
            for day in range(math.ceil(self.days)):
                chance = self.weekday_chance if day % 7 < 5 else self.weekend_chance
                if rng.random() >= chance:
                    continue
                for j in range(rng.randint(1, 3)):
                    arrival = start + day * 86400 + rng.uniform(self.day_start, self.day_end) * 3600
                    length = rng.lognormvariate(math.log(self.session_median), self.session_sigma)
                    memory = int(rng.uniform(self.behaviour.memory_min, self.behaviour.memory_max) * GiB)
                    if arrival >= end:
                        continue
                    sessions.append(Session(
                        id=f"user{i + 1:03d}-d{day + 1}-{j + 1}", user=f"user{i + 1:03d}", groups=(self.group,),
                        profile=self.profile or "", arrival=arrival,
                        activity=_activity(self.behaviour, rng.getrandbits(64), arrival, arrival + length, memory,
                                           rng.random() >= self.forget),
                        memory=memory, retry=self.retry))
        sessions.sort(key=lambda s: s.arrival)
        return Workload(sessions, start, end, source={
            "kind": "synthetic hub", "users": self.users, "days": self.days, "seed": self.seed,
            "profile": self.profile})


@dataclass(frozen=True)
class Week:
    """A department box's week: a class of ``students`` on ``class_days`` (0 is Monday) from
    ``class_start`` (hours, UTC) for ``class_hours``, each time a :class:`Lab`, and a research group of
    ``researchers`` working on weekdays in between, and across the class's hours too: one or two long
    sessions a day of longer cells and more GPU memory than a student's (assumptions, docs/planning.md)."""

    students: int = 40
    researchers: int = 12
    days: float = 7.0
    class_days: tuple[int, ...] = (1, 3)
    class_start: float = 10.0
    class_hours: float = 2.0
    profile: str | None = None  # the students' (None: the configuration's default)
    research_profile: str | None = None
    class_group: str = "ml101"
    research_group: str = "research"
    workday_chance: float = 0.9  # the chance a researcher works on a weekday (assumption)
    day_start: float = 8.0  # a research session starts between these hours (assumption)
    day_end: float = 16.0
    session_median: float = 4 * 3600.0  # lognormal (assumption)
    session_sigma: float = 0.4
    retry: float = 30.0
    behaviour: Behaviour = Behaviour(memory_min=1.0, memory_max=3.0)  # the students'
    research: Behaviour = Behaviour(think_median=180.0, cell_median=60.0, cell_sigma=1.2, memory_min=12.0,
                                    memory_max=18.0)
    seed: int = 0

    def workload(self, start: float = EPOCH) -> Workload:
        end = start + self.days * 86400
        sessions, starts = [], []
        for day in range(math.ceil(self.days)):
            begin = start + day * 86400 + self.class_start * 3600
            if day % 7 in self.class_days and begin < end:
                starts.append(begin)
                lab = Lab(students=self.students, hours=self.class_hours, profile=self.profile, group=self.class_group,
                          retry=self.retry, behaviour=self.behaviour, seed=self.seed * 1000 + day)
                sessions += [dataclasses.replace(s, id=f"{s.id}-d{day + 1}") for s in lab.workload(begin).sessions]
        sessions += self._research(start, end)
        sessions.sort(key=lambda s: s.arrival)
        return Workload(sessions, start, end, source={
            "kind": "synthetic week", "students": self.students, "researchers": self.researchers, "days": self.days,
            "class_days": list(self.class_days), "class_start": self.class_start, "class_hours": self.class_hours,
            "seed": self.seed, "profile": self.profile, "research_profile": self.research_profile},
            classes={f"class {self.class_group}": (self.class_group, tuple(starts))})

    def _research(self, start: float, end: float) -> list[Session]:
        found = []
        for i in range(self.researchers):
            rng = random.Random(f"week:{self.seed}:{i}")
            for day in range(math.ceil(self.days)):
                if day % 7 >= 5 or rng.random() >= self.workday_chance:
                    continue
                for j in range(rng.randint(1, 2)):
                    arrival = start + day * 86400 + rng.uniform(self.day_start, self.day_end) * 3600
                    length = rng.lognormvariate(math.log(self.session_median), self.session_sigma)
                    memory = int(rng.uniform(self.research.memory_min, self.research.memory_max) * GiB)
                    if arrival < end:
                        found.append(Session(
                            id=f"researcher{i + 1:02d}-d{day + 1}-{j + 1}", user=f"researcher{i + 1:02d}",
                            groups=(self.research_group,), profile=self.research_profile or "", arrival=arrival,
                            activity=_activity(self.research, rng.getrandbits(64), arrival, arrival + length, memory,
                                               True), memory=memory, retry=self.retry))
        return found


def _activity(behaviour: Behaviour, seed: int, begin: float, end: float, memory: int, shuts_down: bool):
    """A session's events, generated afresh (and alike) for each replay."""

    def events() -> Iterator[Activity]:
        yield from behaviour.cells(random.Random(seed), begin, end, memory)
        if shuts_down:
            yield (end, END, None)

    return events
