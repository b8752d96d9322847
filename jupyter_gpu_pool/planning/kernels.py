"""One session's kernel in one replay: where it is in its GPU residency (``pool.residency``), what waits for
it, what the policy remembers of it; and its moves through the residency model."""

from __future__ import annotations

import math

from ..pool import ACTIVE as LEASE_ACTIVE, Profile, Waiter
from ..pool import policy as P
from ..pool import residency as M
from ..pool.words import MPS_CANNOT_HIBERNATE
from .configuration import Configuration, PlanError
from .virtual_pool import VirtualPool
from .workload import Session, Workload

# Where a session's kernel is: its GPU residency's stage (pool.residency; WAKING is a resume under way,
# resuming, queued or restoring, as the kernel's waiter and lease tell), or around it the replay's own words:
# asking for a start (no lease yet), its session ended.  (UNSLICED: slice_at first-cell, before its first cell.)
RUNNING, HIBERNATING, ASLEEP, WAKING, LOST, UNSLICED = M.ACTIVE, M.HIBERNATING, M.HIBERNATED, M.RESUMING, M.GONE, \
    M.NO_GPU_YET
ASKING, DONE = "asking", "done"
_RESIDENCY = {(s.stage, s.hint): s for s in M.STATES if not s.first and not s.was}  # (stage, woken on a hint)
_WAKING = (M.RESUMING, M.QUEUED, M.RESTORING)
_HINTABLE = (M.ACTIVE, M.RESUMING, M.RESTORING)


class Kernel:
    """One session in one replay."""

    __slots__ = ("s", "events", "pending", "delay", "state", "lease", "starts", "ask_at", "asking", "waiter",
                 "busy", "busy_at", "busy_share", "last_activity", "busy_since", "use", "reading", "kstate", "grid",
                 "can", "why", "token", "profile", "wake", "room_only", "hinted", "hint_token", "cell_at",
                 "resume_wait", "seen", "deadline", "used", "resumed")

    def __init__(self, session: Session, profile: Profile, can: bool, why: str | None, grid: tuple[float, float]):
        self.s = session
        self.profile = profile
        self.events = session.activity()
        self.pending = None  # (user time, code, value): an event that waits for the kernel (a slice, a restore)
        self.delay = 0.0  # what the replay made this user wait so far
        self.state = ASKING
        self.lease = None
        self.starts = 0
        self.ask_at = session.arrival
        self.asking = "start"  # start, restart or resume
        self.waiter = None
        self.busy = False
        self.busy_at = 0.0
        self.busy_share = 0.0  # the GPUs' worth it keeps busy while a cell runs
        self.last_activity = None
        self.busy_since = None
        self.use = None  # GPUUse, once a reading came
        self.reading = (0, 0.0)  # (memory, utilization) of the last reading
        self.kstate = P.FRESH  # the policy's memory of it
        self.grid = grid
        self.can, self.why = can, why
        self.token = 0  # a queued start's timeout counts only for the ask it was set for
        self.wake = 0.0  # no pass before this can change the policy's answer (0: its facts changed)
        self.room_only = False  # a start of its user can be refused for room only (no quota, no budget)
        self.deadline = None  # its warning's deadline, when the culler judges it again (None: no warning)
        self.hinted = False  # resumed by a hint, and no cell came since
        self.hint_token = 0  # a hint's expiry counts only for the hint it was set for
        self.cell_at = None  # when the cell that waits for this resume came (None: no cell waits yet)
        self.resume_wait = None  # what the last resume made its cell wait, until that cell ends
        self.seen = session.arrival  # the user's last event so far
        self.used = 0  # counts its uses (cells, activity): an after-cell hibernation counts only for the last
        self.resumed = None  # when a resume its user asked for last put it on its slice: its idle clocks start there

    @classmethod
    def of(cls, s: Session, config: Configuration, workload: Workload, pool: VirtualPool) -> Kernel:
        """The kernel of session ``s``, under its profile of ``config`` (a clear error if it has none)."""
        profile = config.profiles.get(s.profile or config.default_profile)
        if profile is None:
            where = f"{workload.source.get('file', 'trace')} line {s.line}: " if s.line else ""
            raise PlanError(f"{where}profile {s.profile!r} of kernel {s.id} is not a profile of configuration "
                            f"{config.name!r} (its profiles: {', '.join(config.profiles)}); replay it under a "
                            "configuration that has it (--config)")
        if s.can_hibernate is None:
            can = profile.hibernation_possible
            why = None if can else MPS_CANNOT_HIBERNATE
        else:
            can, why = s.can_hibernate, s.why
        phase, interval = s.grid or (workload.start, workload.interval)
        k = cls(s, profile, can, why, (phase % interval, interval))
        k.room_only = pool.only_room_refuses(s.user, s.groups)
        return k

    def moved(self) -> int:
        """What a hibernation moves: what the kernel holds on its GPU (its last reading, else its slice)."""
        if self.use is not None and self.reading[0] is not None:
            return self.reading[0]
        if self.s.memory is not None:
            return self.s.memory
        return self.lease.total_memory


def move(k: Kernel, event: str) -> tuple[str, ...]:
    """Step the kernel's GPU residency through the lifecycle's model by ``event``; return the step's effects for
    the caller to carry out.  Its stage now is the replay's (a resume under way is queued while it has a place
    in the queue, restoring once its lease holds a slice again, else resuming)."""
    stage = k.state
    if stage == WAKING:
        stage = M.RESTORING if k.lease.state == LEASE_ACTIVE else M.QUEUED if k.waiter is not None else M.RESUMING
    done = M.step(_RESIDENCY[(stage, k.hinted and stage in _HINTABLE)], event)
    k.state = WAKING if done.state.stage in _WAKING else done.state.stage
    return done.effects


def plain_start(k: Kernel, w: Waiter) -> bool:
    """A start in the queue that only room can refuse (no quota, no budget)."""
    return k.room_only and w.lease_id is None


def started_first(k: Kernel) -> tuple[float, str]:
    return (k.lease.created if k.lease is not None else math.inf, k.s.id)
