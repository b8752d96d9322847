"""The activity trace of this server's GPU kernels, for the capacity planner (``pool.trace``).

The culler hands each pass's view (and the server's read-only context) to
:meth:`ActivityRecorder.observe`, which writes what changed, as one batch through the backend (the
ledger, or the pool service):

- each kernel when first seen: profile, groups, kernelspec, whether it can hibernate (and why not),
  whether its GPUs are declared (the pool's, where it holds none yet), and the culler's pass schedule;
  a kernel first seen holding no slice yet (slice_at first-cell: none to hibernate) again when first
  seen after it took one, as it is on that slice;
- its execution: ``busy`` and ``idle`` at the times jupyter_server saw them (the kernel's own last
  activity), ``active`` when it was used without a change of state;
- its GPU readings, coarsely: at once when it starts or stops holding memory, goes over or back under
  its soft slice's memory, or crosses one of the policy's GPU-idle thresholds, else at most every
  ``GPUPool.trace_sample_interval``;
- from the journal (exact times): its lease (start, end, hibernation, resume, refusals; a resume a hint
  started says so, with how long it waits for a cell), its place in the queue, its user's snoozes, the policy's warnings and actions, and the hibernations its user or an
  admin asked for (an ``act`` with reason ``user`` or ``admin``, at the time asked).

Never any code, output or notebook name.  Every event goes out through ``pool.trace.clipped``, so that
what is recorded is within what a reader accepts.  A failure to write is logged and never stops the culler.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from dataclasses import dataclass

from ..pool import HIBERNATED, SOFT, JournalEntry, Lease, Snapshot
from ..pool.trace import REQUESTED, RESUME, START, TraceEvent, clipped
from ..pool.units import unix_time
from .backends.base import PoolBackend
from .context import ServerContext

log = logging.getLogger(__name__)

HINT = "hint"  # the reason of a resume a hint started (the hibernation hook's), and of its restored event
# Journal kinds the trace takes, and what each becomes (policy: written by the recorder).
_JOURNAL = ("allocated", "released", "reclaimed", "hibernated", "resumed", "refused", "warned", "culled", "snoozed")


@dataclass
class _Kernel:
    busy: bool
    last_activity: float | None
    state: str
    sample: tuple[float, int | None, float | None] | None = None  # the last reading written: (at, memory, utilization)
    limit: int | None = None  # the memory of its soft slice: the policy acts on a kernel over it
    unsliced: bool = False  # first seen before its first slice: written again once it has held one


class ActivityRecorder:
    def __init__(self, backend: PoolBackend, *, sample_interval: float, thresholds: tuple[float, ...],
                 clock=time.time):
        self.backend = backend
        self.sample_interval = sample_interval
        self.thresholds = thresholds
        self.kernels: dict[str, _Kernel] = {}
        self._journal_seq = 0
        self._started = self._journal_at = clock()  # the journal from when this server started
        self._waiters: set[str] = set()

    async def observe(self, snapshot: Snapshot, kernels: dict, *, now: float, context: ServerContext,
                      grid: tuple[float, float] | None) -> None:
        """One pass: ``kernels`` is this server's pool kernels (kernel id -> (kernel, lease)); ``grid`` the
        culler's pass schedule (its first pass and interval)."""
        events: list[TraceEvent] = []
        for kid, (kernel, lease) in kernels.items():
            self._kernel(events, kid, kernel, lease, now, context, grid)
        for gone in set(self.kernels) - set(kernels):
            del self.kernels[gone]
        self._queue(events, snapshot)
        try:
            await self._journal(events)
            if events:
                await self.backend.trace([clipped(e, first=self._named) for e in events])
        except Exception:  # the trace is for planning: its failure must not stop the policy
            log.exception("GPU pool: could not write %d activity trace event(s)", len(events))

    def _named(self, group: str) -> bool:
        """Whether the admin's settings name ``group`` (a policy rule's match, a group quota): kept first
        where a user has more groups than a trace event holds."""
        patterns = [p for rule in self.backend.policy.rules for p in rule.match.group]
        return self.backend.group_quota(group) is not None or any(fnmatch.fnmatchcase(group, p) for p in patterns)

    # -- what the culler saw ---------------------------------------------------------------------

    def _kernel(self, events: list[TraceEvent], kid: str, kernel, lease: Lease, now: float, context: ServerContext,
                grid: tuple[float, float] | None) -> None:
        busy = kernel.execution_state == "busy"
        last = unix_time(kernel.last_activity)
        seen = self.kernels.get(kid)
        owner = lease.owner
        if seen is None:
            events.append(self._seen(kid, kernel, lease, now, context, grid))
            if last is not None:
                events.append(TraceEvent(last, "busy" if busy else "active", kid, owner))
            seen = self.kernels[kid] = _Kernel(busy, last, lease.state, unsliced=lease.awaits_first_cell,
                                               limit=lease.total_memory if lease.isolation == SOFT else None)
        elif seen.unsliced and not lease.awaits_first_cell:
            # Its first slice taken (held now, or held and hibernated since): whether it can hibernate and on
            # which GPUs, said again now that there is a slice to say it of (the reader takes the later).
            seen.unsliced = False
            events.append(self._seen(kid, kernel, lease, now, context, grid))
        elif lease.state != HIBERNATED and not lease.phase:
            # (While it sleeps or moves, what the kernel does is the hibernator's, not its user's: a use that
            # wakes it shows as the resume, and its activity from the first pass that sees it awake.)
            if busy != seen.busy:
                events.append(TraceEvent(last if last is not None else now, "busy" if busy else "idle", kid, owner))
            elif last is not None and not busy and (seen.last_activity is None or last > seen.last_activity):
                events.append(TraceEvent(last, "active", kid, owner))
            seen.busy, seen.last_activity = busy, last if last is not None else seen.last_activity
        if lease.state != seen.state:  # hibernated or woken: the sampler reads it afresh, so does the trace
            seen.state, seen.sample = lease.state, None
        if lease.state != HIBERNATED:
            self._reading(events, kid, owner, seen, context.sampler.reading(kid))

    def _seen(self, kid: str, kernel, lease: Lease, now: float, context: ServerContext,
              grid: tuple[float, float] | None) -> TraceEvent:
        """The kernel as the culler sees it: what it is, whether it can hibernate, on declared GPUs or not
        (one that has held no slice yet: whether the GPUs it can take, the pool's, are)."""
        can, why = context.hibernation(lease)
        gpus = {g.uuid: g for g in self.backend.gpus()}
        held = lease.gpus or lease.last_gpus
        mine = [gpus[u] for u in held if u in gpus] if held else list(gpus.values())
        info = {"p": lease.profile, "g": list(lease.groups), "s": kernel.kernel_name or "",
                "hib": bool(can), "why": why, "declared": bool(mine) and all(g.declared for g in mine)}
        if grid is not None:
            info["grid"] = [grid[0], grid[1]]
        return TraceEvent(now, "kernel", kid, lease.owner, info)

    def _reading(self, events: list[TraceEvent], kid: str, owner: str, seen: _Kernel, reading) -> None:
        if reading is None:
            return
        at, memory, util = reading.at, reading.memory_used, reading.utilization
        last = seen.sample
        if last is not None and (at <= last[0] or (memory, util) == last[1:]):
            return
        if (last is not None and not self._matters(last, memory, util, seen.limit)
                and at - last[0] < self.sample_interval):
            return
        seen.sample = (at, memory, util)
        events.append(TraceEvent(at, "gpu", kid, owner, {"mem": memory, "util": util}))

    def _matters(self, last: tuple, memory: int | None, util: float | None, limit: int | None) -> bool:
        """Whether a reading changes what the policy reads: holding memory or not, over its soft slice or
        not (the over-memory rule), or a GPU-idle threshold crossed."""
        _, was_memory, was_util = last
        if (was_memory is None or was_memory > 0) != (memory is None or memory > 0):
            return True
        if limit is not None and (was_memory is not None and was_memory > limit) != (memory is not None
                                                                                    and memory > limit):
            return True
        if (was_util is None) != (util is None):
            return True
        return util is not None and any((was_util >= t) != (util >= t) for t in self.thresholds)

    def _queue(self, events: list[TraceEvent], snapshot: Snapshot) -> None:
        owner = self.backend.owner
        mine = [w for w in snapshot.waiters if w.owner == owner]
        for w in mine:
            if w.id not in self._waiters:
                events.append(TraceEvent(w.enqueued, "queued", w.kernel_id, w.owner,
                                         {"p": w.profile, "a": RESUME if w.for_resume else START}))
        self._waiters = {w.id for w in mine}

    # -- what the journal says ----------------------------------------------------------------------

    async def _journal(self, events: list[TraceEvent]) -> None:
        # (a minute's margin: an entry's time is taken before its write waits for the lock, so a later row may
        # carry an earlier time; rows already taken are told apart by their number)
        entries = await self.backend.journal(since=self._journal_at - 60, kinds=_JOURNAL, owner=self.backend.owner,
                                             limit=1000)
        for e in sorted(entries, key=lambda e: e.seq):
            if e.seq <= self._journal_seq or e.at < self._started:
                continue
            self._journal_seq, self._journal_at = e.seq, max(self._journal_at, e.at)
            event = self._from_journal(e)
            if event is not None:
                events.append(event)

    def _from_journal(self, e: JournalEntry) -> TraceEvent | None:
        d = e.detail
        policy = d.get("source") == "policy"
        data: dict
        if e.kind == "allocated":
            kind, data = "start", {"p": d.get("profile", ""), "g": list(self.backend.groups_of(e.owner or ""))}
        elif e.kind in ("released", "reclaimed"):
            if policy:
                return None  # a user's release through the API: the ledger's own entry ends the lease
            kind, data = "end", {"r": e.reason[:200]}
        elif e.kind == "hibernated":
            kind, data = ("act", _act(e, "hibernate")) if policy else ("hibernated", {"bytes": d.get("host_bytes", 0)})
        elif e.kind == "resumed":
            if policy:
                if not d.get("duration"):
                    return None
                kind, data = "restored", {"w": float(d["duration"])}
                if e.reason == HINT:  # its user opened the notebook: no cell waited, and it sleeps again unused
                    data["r"] = HINT
                    if d.get("hold") is not None:
                        data["hold"] = float(d["hold"])
            else:
                kind, data = "resumed", {}
        elif e.kind == "refused":
            if policy and d.get("action") not in ("resume", "first_cell"):
                return None  # a hibernation refused for now: the kernel ran on
            # A first cell's slice refused is the kernel's ask for a slice refused: a start's, as the replay counts
            kind, data = "refused", {"r": e.reason or "refused",
                                     "a": RESUME if policy and d.get("action") == "resume" else START}
            if d.get("profile"):
                data["p"] = d["profile"]
        elif e.kind == "warned":
            kind, data = "warn", {"r": e.reason or "", "a": d.get("action") or "", "dry": bool(d.get("dry_run"))}
            if d.get("deadline") is not None:
                data["d"] = d["deadline"]
        elif e.kind == "culled":
            kind, data = "act", _act(e, "shutdown")
        elif e.kind == "snoozed":
            if d.get("deadline") is None:
                return None
            kind, data = "snooze", {"until": d["deadline"]}
        else:
            return None
        if not e.kernel_id:
            return None
        at = e.at
        if kind == "act":  # an action: when the pass decided it; one a person asked for: when it began
            at = d.get("decided", e.at - float(d.get("duration") or 0) if e.reason in REQUESTED else e.at)
        return TraceEvent(at, kind, e.kernel_id, e.owner, data)


def _act(e: JournalEntry, action: str) -> dict:
    d = e.detail
    out = {"r": e.reason or "", "a": action, "dry": bool(d.get("dry_run"))}
    if d.get("rule"):
        out["rule"] = str(d["rule"])[:200]
    return out

