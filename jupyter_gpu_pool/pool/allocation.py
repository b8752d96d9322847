"""The allocation decision: given what is held, who waits and what is asked, which GPU(s), or
which refusal.  Pure: every store (the SQLite ledger on one machine, the operator's admission on
a cluster, the planner's virtual pool) reads its state into :class:`Holdings` and calls
:func:`allocate`; none of them decides on its own.

The rules, in the order they apply:

1. Placement (where a store places slices: ``Holdings.gpus`` is not None): the GPUs left after
   every earlier waiter of the queue that fits took its slice, restricted to ``Ask.only``, chosen
   by the placement rule (``binpack`` / ``spread``), ``Ask.prefer`` first.
   An MPS slice goes only on a GPU whose MPS kernels are all its owner's: an MPS server serves one
   Unix user at a time on a GPU.
2. Budget: a user whose GPU-hours for the period are spent starts and resumes nothing.
3. Quota, checked before room (it is what a user can act on): the user's own limit, then each of
   their groups' limits, against what they hold now.  Memory and SM share count active leases;
   the kernel count counts every held lease, and a resume adds no kernel.
4. Room: no GPU fits the slice, so the pool is full for it (or every GPU with room serves another
   user's MPS kernels).

Where the admin shares the pool beyond first come, first served (``sharing``: reservations, a fair
queue; ``pool.sharing``), the queue is taken in the order sharing gives it, and a non-member of a
reservation in its lead time or window sees the room its members leave unused as taken (during the
window it may borrow that room while no member waits: the grant names what it borrowed).  Without
sharing (or with ``fifo`` and no reservation) the decision is exactly first come, first served.

A refusal names what would start instead (``Ask.alternatives``, judged by this same decision): a
smaller profile that fits the quota or the room left, never one for a kernel-count limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .budgets import BudgetExceeded, Standing
from .errors import MPSUserBusy, PoolError, PoolExhausted, QuotaExceeded
from .gpus import GPU
from .leases import ACTIVE, HELD, Holder, Lease
from .placement import BINPACK, GPUUsage, choose, largest_free
from .profiles import MPS, Profile
from .queue import Waiter, ahead_of, reserve_for_waiters
from .quotas import QuotaBook, Usage, excesses, usage_of
from .sharing import Line, Sharing
from .slices import format_size


@dataclass(frozen=True)
class Ask:
    """One request for a slice: a kernel's start, or a hibernated kernel's resume."""

    owner: str
    kernel_id: str
    profile: Profile
    groups: tuple[str, ...] = ()
    new_kernel: bool = True  # False for a resume: the kernel is counted already
    prefer: tuple[str, ...] = ()  # GPU uuids to take first when they fit (where a resume's memory was)
    only: tuple[str, ...] | None = None  # GPU uuids it may take (None: any)
    asked: Usage | None = None  # what the slice holds where a cluster scheduler places it (no ``gpus``)
    # Profiles a refusal may suggest instead ("'Python 3 · GPU 10 GiB' would start now"), each judged by
    # this same decision; empty: suggest none.
    alternatives: tuple[Profile, ...] = ()


@dataclass(frozen=True)
class LeaseRequest(Ask):
    """A kernel's start as a store records it: the ask, the notebook's name, and the server managing it."""

    label: str = ""
    manager: Holder | None = None


@dataclass(frozen=True)
class Holdings:
    """The pool as the decision sees it.

    ``leases``: held leases; at least the asker's own and those of the asker's quota-limited
    groups (more are ignored).  ``gpus``: each GPU's usage, or None where a cluster's scheduler
    places slices and only quotas are decided here.  ``waiters``: the live queue, in order."""

    leases: tuple[Lease, ...] = ()
    gpus: tuple[GPUUsage, ...] | None = None
    waiters: tuple[Waiter, ...] = ()
    mps_users: Mapping[str, frozenset[str]] = field(default_factory=dict)  # GPU uuid -> owners of MPS slices on it
    budget: Standing | None = None  # the asker's tightest GPU-hour budget, where budgets apply
    # Where sharing applies: every held lease (members' use of reserved room; None: ``leases`` stand for
    # it), and each share group's decayed use (the fair queue's).
    everyone: tuple[Lease, ...] | None = None
    group_use: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, gpus: list[GPU] | None, leases: list[Lease], waiters: list[Waiter] = (),
           budget: Standing | None = None) -> Holdings:
        """From every held lease (a store that keeps no per-GPU totals of its own)."""
        held = tuple(lease for lease in leases if lease.state in HELD)
        usage = tuple(gpu_usage(gpus, held)) if gpus is not None else None
        return cls(leases=held, gpus=usage, waiters=tuple(waiters), mps_users=mps_users(held), budget=budget)


@dataclass(frozen=True)
class Grant:
    """Where the slice goes: ``gpus`` (empty where the cluster places it) and the bytes it holds on each."""

    gpus: tuple[GPU, ...]
    memory: int  # bytes on each GPU
    asked: Usage  # what it counts against quotas
    borrowed: tuple[str, ...] = ()  # the reservations whose unused room it borrows (and may be reclaimed for)


def gpu_usage(gpus: list[GPU], leases: tuple[Lease, ...] | list[Lease]) -> list[GPUUsage]:
    """Each GPU's usage from the active leases on it."""
    totals = {g.uuid: GPUUsage(g) for g in gpus}
    for lease in leases:
        if lease.state != ACTIVE:
            continue
        for uuid in lease.gpus:
            u = totals.get(uuid)
            if u is None:
                continue
            totals[uuid] = GPUUsage(u.gpu, u.memory + (u.gpu.memory if lease.whole else lease.memory),
                                    u.sm_percent + (100 if lease.whole else lease.sm_percent or 0),
                                    u.exclusive or lease.whole, u.leases + 1)
    return [totals[g.uuid] for g in gpus]


def mps_users(leases) -> dict[str, frozenset[str]]:
    """The owners of the active MPS slices on each GPU."""
    found: dict[str, set[str]] = {}
    for lease in leases:
        if lease.state == ACTIVE and lease.isolation == MPS:
            for uuid in lease.gpus:
                found.setdefault(uuid, set()).add(lease.owner)
    return {uuid: frozenset(owners) for uuid, owners in found.items()}


def resume_candidates(usage: list[GPUUsage] | tuple[GPUUsage, ...], last_gpus: tuple[str, ...], *,
                      same_gpu: bool, same_model: bool) -> tuple[str, ...] | None:
    """The GPUs a resume may take: its last GPUs only (a driver that cannot restore elsewhere),
    else GPUs of the same model as those (memory restores onto the same model), else any."""
    if not last_gpus:
        return None
    if same_gpu:
        return tuple(last_gpus)
    if same_model:
        models = {(u.gpu.name, u.gpu.memory) for u in usage if u.gpu.uuid in last_gpus}
        if models:
            return tuple(u.gpu.uuid for u in usage if (u.gpu.name, u.gpu.memory) in models)
    return None


def _asked(ask: Ask, usage: list[GPUUsage], chosen: list[GPU] | None) -> Usage:
    if ask.asked is not None:
        return Usage(ask.asked.memory, ask.asked.sm_percent, 1 if ask.new_kernel else 0)
    spec = ask.profile.slice
    if chosen:
        memory = sum(spec.memory_on(g.memory) for g in chosen)
    else:  # refused anyway for room: judge the quota on the GPUs it could get
        sizes = sorted((u.gpu.memory for u in usage), reverse=True)[: spec.gpu_count] or [0]
        memory = sum(spec.memory_on(m) for m in sizes)
    return Usage(memory, spec.sm_on() * spec.gpu_count, 1 if ask.new_kernel else 0)


def check_quota(leases: tuple[Lease, ...], ask: Ask, quotas: QuotaBook, asked: Usage,
                now: float, starts_now: tuple[str, ...] = ()) -> QuotaExceeded | None:
    """The first quota (the user's, then each limited group's) the ask would pass, as a refusal."""
    mine = [lease for lease in leases if lease.owner == ask.owner and lease.state in HELD]
    scopes = [("user", usage_of(mine), quotas.user_quota(ask.owner))]
    for group in quotas.limited_groups(ask.groups):
        members = [lease for lease in leases if group in lease.groups and lease.state in HELD]
        scopes.append((group, usage_of(members), quotas.groups[group]))
    # A slice that a quota refuses even with nothing held can never start under it: shutting kernels down
    # does not help, so such a limit is the one the user is told about.
    passed = []  # (never fits, scope, (resource, limit, used, asked)) for each limit passed
    for scope, used, quota in scopes:
        never = {e[0] for e in excesses(quota, Usage(), asked)}
        passed += [(e[0] in never, scope, e) for e in excesses(quota, used, asked)]
    if not passed:
        return None
    never_fits, scope, (resource, limit, used_text, asked_text) = next((p for p in passed if p[0]), passed[0])
    return QuotaExceeded(owner=ask.owner, profile=ask.profile.name, scope=scope, resource=resource, limit=limit,
                         used=used_text, asked=asked_text, holdings=mine, now=now,
                         launcher_name=ask.profile.launcher_name, starts_now=starts_now, never_fits=never_fits)


def pool_full(ask: Ask, usage: list[GPUUsage], holdings: Holdings, now: float,
              starts_now: tuple[str, ...] = (), reserved: str = "") -> PoolExhausted:
    best = largest_free(usage)
    largest = None
    if best and best.free_memory > 0:
        sm = f" and {best.free_sm}% of its SMs" if ask.profile.slice.sm_percent else ""
        largest = f"{format_size(best.free_memory)}{sm} on {best.gpu.label}"
    waiting = len([w for w in holdings.waiters if w.kernel_id != ask.kernel_id])
    mine = [lease for lease in holdings.leases if lease.owner == ask.owner and lease.state in HELD]
    return PoolExhausted(profile=ask.profile.name, slice_text=str(ask.profile.slice), gpu_count=len(usage),
                         largest=largest, holdings=mine, queued=waiting, now=now,
                         launcher_name=ask.profile.launcher_name, starts_now=starts_now, reserved=reserved)


def starts_now(holdings: Holdings, ask: Ask, quotas: QuotaBook, profiles, *, now: float, placement: str = BINPACK,
               waiter_id: str | None = None, sharing: Sharing | None = None) -> tuple[str, ...]:
    """The launcher names of ``profiles`` (other than the ask's) that the same decision would grant the
    asker now."""
    return tuple(p.launcher_name for p in profiles if p.name != ask.profile.name and isinstance(
        allocate(holdings, replace(ask, profile=p, alternatives=()), quotas, now=now, placement=placement,
                 waiter_id=waiter_id, sharing=sharing), Grant))


ASKING = "(asking)"  # the place a new ask (one with no place in the queue) would take in a shared queue


def line_of(holdings: Holdings, sharing: Sharing | None, now: float, ask: Ask | None = None) -> Line | None:
    """The queue as ``sharing`` orders it at ``now`` (None: first come, first served, nothing reserved).
    With ``ask`` (one with no place yet), the queue as it would be with the ask in it, at :data:`ASKING`:
    a new ask is judged where it would stand (behind every waiter in a plain queue, as ever)."""
    if sharing is None or sharing.plain or holdings.gpus is None:
        return None
    waiters = holdings.waiters
    if ask is not None:
        waiters = (*waiters, Waiter(id=ASKING, owner=ask.owner, kernel_id=ask.kernel_id, lease_id=None,
                                    profile=ask.profile.name, slice=ask.profile.slice, label="", enqueued=now,
                                    heartbeat=now, groups=ask.groups))
    return sharing.line(waiters, now=now, gpus=holdings.gpus, use=holdings.group_use,
                        everyone=holdings.everyone if holdings.everyone is not None else holdings.leases)


@dataclass(frozen=True)
class _Placed:
    """Where the room decision put a slice: the GPUs (None: nowhere), the usage it judged (the GPUs the ask
    may take), whether MPS's one user a GPU stood in the way, the reservations it borrows from, and the
    words of a reservation that kept the room from it."""

    chosen: list[GPU] | None = None
    usage: list[GPUUsage] = field(default_factory=list)
    mps_blocked: bool = False
    borrowed: tuple[str, ...] = ()
    reserved: str = ""


def _mps_served(ahead: list[GPUUsage], ask: Ask, holdings: Holdings, placement: str) -> tuple[list[GPUUsage], bool]:
    """The GPUs an MPS slice may go on (one Unix user per GPU's MPS server), and whether that rule alone
    keeps it from a GPU that would fit it."""
    served = [u for u in ahead if not holdings.mps_users.get(u.gpu.uuid, frozenset()) - {ask.owner}]
    return served, len(served) < len(ahead) and choose(ahead, ask.profile.slice, placement) is not None


def _place(holdings: Holdings, ask: Ask, placement: str, waiter_id: str | None, line: Line | None,
           now: float) -> _Placed:
    spec = ask.profile.slice
    usage = [u for u in holdings.gpus if ask.only is None or u.gpu.uuid in ask.only]
    waiting = ahead_of(line.waiters if line is not None else holdings.waiters, waiter_id)
    ahead = reserve_for_waiters(usage, waiting, placement)
    room = None
    if line is not None and line.unused:
        whole = ahead if ask.only is None else reserve_for_waiters(list(holdings.gpus), waiting, placement)
        room = line.room(ask.owner, ask.groups, whole, waiting, waiter_id)
        plain, ahead = ahead, _held(ahead, whole, room.strict)
    mps_blocked = False
    if ask.profile.isolation == MPS:  # one Unix user per GPU's MPS server
        ahead, mps_blocked = _mps_served(ahead, ask, holdings, placement)
    chosen = choose(ahead, spec, placement, prefer=ask.prefer)
    if room is None or chosen is not None or not (room.held or room.borrowable):
        return _Placed(chosen, usage, mps_blocked)
    if room.borrowable:
        lenient = _held(plain, whole, room.lenient)
        if ask.profile.isolation == MPS:
            lenient, mps_blocked = _mps_served(lenient, ask, holdings, placement)
        chosen = choose(lenient, spec, placement, prefer=ask.prefer)
        if chosen is not None:
            on = {g.uuid for g in chosen}
            return _Placed(chosen, usage, mps_blocked, tuple(n.name for n in room.borrowable if on & set(n.eligible)))
    fits = choose(plain, spec, placement) is not None  # it would fit but for the reserved room: say so
    words = "; ".join(n.slot.words(now, member=False) for n in (*room.held, *room.borrowable)) if fits else ""
    return _Placed(None, usage, mps_blocked, reserved=words)


def _held(ahead: list[GPUUsage], whole: list[GPUUsage], held: dict[str, GPUUsage]) -> list[GPUUsage]:
    """``ahead`` with the room ``held`` (computed on ``whole``, each GPU's usage) kept: what it adds to each GPU."""
    if not held:
        return ahead
    base = {u.gpu.uuid: u for u in whole}
    out = []
    for u in ahead:
        h = held.get(u.gpu.uuid)
        if h is not None:
            b = base[u.gpu.uuid]
            u = replace(u, memory=u.memory + h.memory - b.memory, exclusive=u.exclusive or (h.exclusive and not b.exclusive))
        out.append(u)
    return out


def allocate(holdings: Holdings, ask: Ask, quotas: QuotaBook, *, now: float, placement: str = BINPACK,
             waiter_id: str | None = None, sharing: Sharing | None = None) -> Grant | PoolError:
    """The grant for ``ask``, or the refusal (returned, not raised: the caller decides what a
    refusal means to it).  ``waiter_id``: the ask's own place in the queue, if it has one (only
    the waiters ahead of it are served first).  ``sharing``: the admin's reservations and queue order
    (None: first come, first served)."""
    spec = ask.profile.slice
    placed = _Placed()
    if holdings.gpus is not None:
        line = line_of(holdings, sharing, now, ask if waiter_id is None else None)
        placed = _place(holdings, ask, placement, ASKING if line is not None and waiter_id is None else waiter_id,
                        line, now)
    chosen, usage = placed.chosen, placed.usage
    if holdings.budget is not None and holdings.budget.exhausted:
        mine = [lease for lease in holdings.leases if lease.owner == ask.owner and lease.state in HELD]
        return BudgetExceeded(owner=ask.owner, profile=ask.profile.name, standing=holdings.budget, holdings=mine,
                              now=now, launcher_name=ask.profile.launcher_name)
    asked = _asked(ask, usage, chosen)

    def suggestions() -> tuple[str, ...]:
        return starts_now(holdings, ask, quotas, ask.alternatives, now=now, placement=placement, waiter_id=waiter_id,
                          sharing=sharing)

    refusal = check_quota(holdings.leases, ask, quotas, asked, now)
    if refusal is not None:
        if refusal.resource != "kernels" and ask.alternatives:  # another kernel would not fit a kernel count
            return check_quota(holdings.leases, ask, quotas, asked, now, suggestions())
        return refusal
    if holdings.gpus is None:
        return Grant(gpus=(), memory=asked.memory, asked=asked)
    if chosen is None:
        if placed.mps_blocked:
            return MPSUserBusy(profile=ask.profile.name, launcher_name=ask.profile.launcher_name, users=sorted(
                {o for owners in holdings.mps_users.values() for o in owners} - {ask.owner}))
        return pool_full(ask, usage, holdings, now, suggestions() if usage else (), placed.reserved)
    return Grant(gpus=tuple(chosen), memory=spec.memory_on(chosen[0].memory), asked=asked, borrowed=placed.borrowed)
