"""The pool service's operations (``protocol.OPERATIONS`` declares each: its arguments and who may call it)
and whose rows each may touch: every caller acts on their own leases, queue places, journal and trace
only (admins on anyone's); another user's ids are answered as ids that do not exist; what one user may
put on the journal is capped (:data:`JOURNAL_CAPS`).  The decisions are the pool core's, through the
local :class:`~jupyter_gpu_pool.local.Ledger`: the service is an adapter, not a second allocator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import math
import time

import psutil

from ..local import processes
from ..local.pool import LocalPool
from ..pool import HELD, Holder, Lease, LeaseNotFound, LeaseRequest, PoolError
from ..pool.reclaim import Candidate
from ..pool.trace import TraceError, check
from . import arguments, protocol
from .arguments import LARGEST, Args
from .enforcement import Enforcement
from .identity import Caller, Identities, Peer
from .protocol import ProtocolError
from .turns import Turns

MAX_WAITERS = 8  # places one user may hold in the queue at once
MAX_ROWS = 10_000  # leases in one reply (the journal's reads have their limit, the trace's pages theirs)
MAX_TRACE_EVENTS = 1000  # trace events in one trace_record request


@dataclasses.dataclass(frozen=True)
class JournalCaps:
    """What one (non-admin) user may put on the journal through ``record``: the entries the pool itself
    writes about their leases are not counted against the rate, but are counted as kept."""

    entry_bytes: int = 16 * 1024  # one entry's detail, as JSON
    entries: int = 1000  # kept at once (the ledger keeps entries for its history_seconds: a week)
    bytes: int = 1 << 20  # of detail kept at once
    per_minute: int = 120


JOURNAL_CAPS = JournalCaps()


class Denied(PermissionError):
    reason, status = "not_yours", 403


class Busy(RuntimeError):
    reason, status = "too_many", 429


class TooLarge(RuntimeError):
    reason, status = "too_large", 413


class Operations:
    """The handlers of the protocol's operations, one ``op_<name>`` each, on one pool."""

    def __init__(self, pool: LocalPool, identities: Identities, turns: Turns, enforcement: Enforcement, *,
                 max_rows: int = MAX_ROWS):
        self.pool, self.ledger, self.identities = pool, pool.ledger, identities
        self.max_rows = max_rows
        self.turns, self.enforcement = turns, enforcement
        self._recorded: dict[int, list[float]] = {}  # uid -> when its last journal entries were recorded
        self.handlers = {name: getattr(self, f"op_{name}") for name in protocol.OPERATIONS}  # each declared one

    # -- whose is it -----------------------------------------------------------------------------

    async def _lease(self, caller: Caller, lease_id: str, *, held: bool = True) -> Lease:
        return await asyncio.to_thread(self._lease_of, caller, lease_id, held=held)

    def _lease_of(self, caller: Caller, lease_id: str, *, held: bool = True) -> Lease:
        lease = self.ledger.get(lease_id)
        if lease is None or (held and lease.state not in HELD):
            raise LeaseNotFound(lease_id)
        if lease.owner != caller.user and not caller.admin:
            raise LeaseNotFound(lease_id)  # answered as an unknown id is: whose it is is not told
        return lease

    def _visible(self, caller: Caller, owner: str) -> bool:
        return caller.admin or owner == caller.user

    @staticmethod
    def _holder(caller: Caller, pid: int) -> Holder:
        """A kernel process of the caller's own uid (a lease's holder may be no one else's process)."""
        try:
            proc = psutil.Process(pid)
            uid, start = proc.uids().real, proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            raise Denied(f"process {pid} is not running") from None
        if uid != caller.uid and caller.uid != 0:
            raise Denied(f"process {pid} is not yours: a lease's kernel must be a process of your own user")
        return Holder(pid, start, processes.hostname())

    async def _kernel(self, caller: Caller, args: Args) -> tuple[str, Lease | None]:
        """A kernel id for a new lease or place in the queue, and the caller's lease of it if one is held:
        refused where another user's kernel holds it."""
        kernel_id = arguments.kernel_id(args)
        return kernel_id, await asyncio.to_thread(self._held_kernel, caller, kernel_id)

    def _held_kernel(self, caller: Caller, kernel_id: str) -> Lease | None:
        held = self.ledger.by_kernel(kernel_id)
        if held is not None and held.owner != caller.user:
            raise Denied(f"kernel id {kernel_id[:36]!r} is another user's kernel's")
        return held

    # -- operations: who am I, what is the pool -------------------------------------------------------

    async def op_whoami(self, caller: Caller, peer: Peer, args: Args) -> dict:
        return {"user": caller.user, "groups": list(caller.groups), "admin": caller.admin, "uid": caller.uid}

    async def op_settings(self, caller: Caller, peer: Peer, args: Args) -> dict:
        """What a client needs to work like the pool: the admin's settings, the inventory, this host."""
        inventory = self.pool.inventory
        config = self.pool.settings.raw_config
        if not caller.admin:
            config = _own_settings(config, caller, self.pool.settings.policy)
        return {"config": config, "gpus": inventory.gpus, "note": inventory.note,
                "driver_version": inventory.discovery.driver_version, "host": self.pool.host,
                "user": caller.user, "groups": list(caller.groups), "admin": caller.admin}

    async def op_mps_env(self, caller: Caller, peer: Peer, args: Args) -> dict:
        """The MPS environment for a kernel of the caller's lease on its GPU (the daemon started if needed)."""
        lease = await self._lease(caller, args.text("lease_id"))
        return await asyncio.to_thread(self.pool.mps_env, lease)

    # -- operations: leases ---------------------------------------------------------------------------

    # Allocate and release run on the loop, not in a thread (see Turns.write_here): an allocation (about a
    # millisecond) costs less than handing it to a thread and back (measured: 502 against 946 allocations/s
    # from 16 clients). A refusal's reconcile checks holders with psutil at most once a second.

    async def op_allocate(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        kernel_id = arguments.kernel_id(args)
        profile = self.pool.settings.profile(args.text("profile", required=False, default=""))
        label, waiter_id = args.text("label", default=""), args.text("waiter_id", required=False)
        record_refusal = args.flag("record_refusal", True)
        manager = Holder(peer.pid, _start_of(peer.pid), processes.hostname())

        def allocate() -> Lease:
            existing = self._held_kernel(caller, kernel_id)
            if existing is not None:
                return existing  # a retry after a lost reply: the same lease, not a second one
            request = LeaseRequest(owner=caller.user, kernel_id=kernel_id, profile=profile, groups=caller.groups,
                                   label=label, manager=manager,
                                   alternatives=tuple(self.pool.settings.profiles.values()))  # "… would start now"
            return self.pool.allocate(request, self._own_waiter_of(caller, waiter_id), record_refusal)

        return await self.turns.write_here(caller.uid, allocate)

    async def op_start_without_slice(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        """A kernel of the caller's that holds no slice until its first cell (its rule's slice_at)."""
        kernel_id = arguments.kernel_id(args)
        profile = self.pool.settings.profile(args.text("profile", required=False, default=""))
        label = args.text("label", default="")
        manager = Holder(peer.pid, _start_of(peer.pid), processes.hostname())

        def start() -> Lease:
            existing = self._held_kernel(caller, kernel_id)
            if existing is not None:
                return existing  # a retry after a lost reply: the same lease, not a second one
            return self.pool.start_without_slice(LeaseRequest(owner=caller.user, kernel_id=kernel_id, profile=profile,
                                                              groups=caller.groups, label=label, manager=manager))

        return await self.turns.write_here(caller.uid, start)

    async def op_resume(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        waiter_id = await self._own_waiter(caller, args.text("waiter_id", required=False))
        return await self.turns.write(caller.uid, self.pool.resume, lease, args.flag("same_gpu"), waiter_id,
                                 args.flag("record_refusal", True))

    async def op_release(self, caller: Caller, peer: Peer, args: Args) -> Lease | None:
        lease_id, reason = args.text("lease_id"), args.text("reason", default="shutdown")

        def release() -> Lease | None:
            lease = self.ledger.get(lease_id)
            if lease is None or lease.state not in HELD or not self._visible(caller, lease.owner):
                return None  # releasing is idempotent (and another's lease is answered as no lease)
            return self.ledger.release(lease_id, reason)

        return await self.turns.write_here(caller.uid, release)  # on the loop, as an allocation

    async def op_set_holder(self, caller: Caller, peer: Peer, args: Args) -> None:
        lease = await self._lease(caller, args.text("lease_id"))
        pid = args.integer("pid")
        holder = await asyncio.to_thread(self._holder, caller, pid) if pid is not None else None
        await self.turns.write(caller.uid, self.ledger.set_holder, lease.id, holder, args.phase("phase", required=False))

    async def op_relabel(self, caller: Caller, peer: Peer, args: Args) -> None:
        """A renamed notebook: its user's own lease only (an admin names no one else's notebooks)."""
        lease = await self._lease(caller, args.text("lease_id"))
        if lease.owner != caller.user:
            raise LeaseNotFound(lease.id)
        await self.turns.write(caller.uid, self.ledger.relabel, lease.id, args.text("label"))

    async def op_stop(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        return await self.turns.write(caller.uid, self.ledger.stop, lease.id, expect=args.phase("expect", required=False))

    async def op_set_phase(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        return await self.turns.write(caller.uid, self.ledger.set_phase, lease.id, args.phase("to"),
                                 expect=args.phase("expect", required=False), deadline=args.number("deadline"))

    async def op_adopt(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        manager = Holder(peer.pid, await asyncio.to_thread(_start_of, peer.pid), processes.hostname())
        return await self.turns.write(caller.uid, self.ledger.adopt, lease.id, manager)

    async def op_hibernate(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        """The caller's server checkpointed its kernel: the slice goes back, but on a real GPU only once
        NVML shows that no process of the owner's holds memory there beyond their other kernels' (a
        client cannot just say so, nor name some other process of theirs as the kernel)."""
        lease = await self._lease(caller, args.text("lease_id"))
        host_bytes = args.integer("host_bytes", default=0)
        if host_bytes < 0:
            raise ProtocolError("'host_bytes' must be 0 or more")
        real = {u for u in lease.gpus if (g := self.pool.gpu(u)) is not None and not g.declared}
        if real:
            await self.enforcement.gpu_freed(lease, real, caller.uid)
        return await self.turns.write(caller.uid, self.ledger.hibernate, lease.id, host_bytes,
                                 args.text("reason", default="idle"),
                                 tuple(args.texts("last_gpus")) or None, args.phase("phase", required=False) or "")

    async def op_reserve_host_bytes(self, caller: Caller, peer: Peer, args: Args) -> list:
        lease = await self._lease(caller, args.text("lease_id"))
        host_bytes = args.integer("host_bytes", default=0)
        if host_bytes < 0:
            raise ProtocolError("'host_bytes' must be 0 or more")
        cap = self.pool.settings.hibernation.cap_bytes(psutil.virtual_memory().total)  # the admin's, not the caller's
        granted, others = await self.turns.write(caller.uid, self.ledger.reserve_host_bytes, lease.id, host_bytes,
                                            cap if host_bytes else None, lease.host)
        return [granted, others]

    # -- operations: reading ----------------------------------------------------------------------------

    async def op_get(self, caller: Caller, peer: Peer, args: Args) -> Lease | None:
        lease = await asyncio.to_thread(self.ledger.get, args.text("lease_id"))
        return lease if lease is not None and self._visible(caller, lease.owner) else None

    async def op_by_kernel(self, caller: Caller, peer: Peer, args: Args) -> Lease | None:
        lease = await asyncio.to_thread(self.ledger.by_kernel, args.text("kernel_id"))
        return lease if lease is not None and self._visible(caller, lease.owner) else None

    async def op_leases(self, caller: Caller, peer: Peer, args: Args) -> list[Lease]:
        owner, states = args.text("owner", required=False), args.states("states")
        if not caller.admin:
            if owner not in (None, caller.user):
                return []
            owner = caller.user  # (read only the caller's rows, not everyone's to filter)
        found = await asyncio.to_thread(self.ledger.leases, owner, states)
        if len(found) > self.max_rows:  # refused before it is encoded: a reply that large stalls its thread
            raise TooLarge(f"{len(found)} leases are {' or '.join(states)}: a reply carries at most {self.max_rows}; "
                           "ask for fewer states or one owner (released leases are kept a week)")
        return [lease for lease in found if self._visible(caller, lease.owner)]

    async def op_snapshot(self, caller: Caller, peer: Peer, args: Args):
        """Every GPU's usage (not who holds it) and the caller's own leases and waiters (admins: all)."""
        snap = await asyncio.to_thread(self.ledger.snapshot)
        if caller.admin:
            return snap
        return dataclasses.replace(snap, leases=[x for x in snap.leases if x.owner == caller.user],
                                   waiters=[w for w in snap.waiters if w.owner == caller.user])

    async def op_waiters(self, caller: Caller, peer: Peer, args: Args) -> list:
        return [w for w in await asyncio.to_thread(self.ledger.waiters) if self._visible(caller, w.owner)]

    async def op_journal(self, caller: Caller, peer: Peer, args: Args) -> list:
        owner = args.text("owner", required=False)
        if not caller.admin:
            owner = caller.user
        limit = args.integer("limit", default=200)
        return await asyncio.to_thread(self.ledger.journal, since=args.number("since", default=0.0),
                                       kinds=args.texts("kinds"), owner=owner, limit=max(1, min(limit, 10_000)),
                                       after_seq=args.integer("after_seq", default=0))

    async def op_budget_standing(self, caller: Caller, peer: Peer, args: Args):
        user = args.text("owner", default=caller.user)
        if not self._visible(caller, user):
            raise Denied("another user's GPU time is theirs to see (and the admins')")
        if user == caller.user:
            groups = caller.groups
        else:
            other = await asyncio.to_thread(self.identities.by_name, user)
            groups = other.groups if other is not None else self.pool.settings.groups_of(user)
        book = self.pool.settings.budget_book
        if not book.scopes(user, groups):
            return None
        return await asyncio.to_thread(self.ledger.budget_standing, user, groups, book)

    async def op_spenders(self, caller: Caller, peer: Peer, args: Args) -> list[str]:
        """Who spent GPU time since ``since``: everyone, for an admin; a user learns only of themselves."""
        found = await asyncio.to_thread(self.ledger.spenders, args.number("since", required=True))
        return [user for user in found if self._visible(caller, user)]

    async def op_reserved(self, caller: Caller, peer: Peer, args: Args) -> dict[str, str]:
        """Which of the caller's own kernels give back reserved room now (``LocalPool.reserved``, on the
        whole pool, which the caller may not read): only their kernel ids and the reason come back."""
        offered = arguments.candidates(args)
        return await asyncio.to_thread(reserved_of, self.pool, caller.user, offered, args.texts("freeing"),
                                       args.texts("warned"))

    async def op_host_bytes_on(self, caller: Caller, peer: Peer, args: Args) -> int:
        return await asyncio.to_thread(self.ledger.host_bytes_on, args.text("host", default=""))

    # -- operations: the queue and the journal -------------------------------------------------------------

    async def _own_waiter(self, caller: Caller, waiter_id: str | None) -> str | None:
        return await asyncio.to_thread(self._own_waiter_of, caller, waiter_id)

    def _own_waiter_of(self, caller: Caller, waiter_id: str | None) -> str | None:
        """``waiter_id`` where that place in the queue is the caller's (admins: anyone's), live or not; None
        where it is another user's, so that it is answered as a place that does not exist is: nothing of
        it is touched or told, and the caller cannot tell whose it is."""
        if waiter_id is None:
            return None
        owner = self.ledger.waiter_owner(waiter_id)
        return waiter_id if owner is None or self._visible(caller, owner) else None

    async def op_enqueue(self, caller: Caller, peer: Peer, args: Args):
        """A place in the queue, for one of the admin's profiles (a start) or the caller's hibernated
        lease (a resume): what it waits for is the profile's or the lease's slice, never the caller's word."""
        lease_id = args.text("lease_id", required=False)
        kernel_id, _held = await self._kernel(caller, args)
        if lease_id is not None:
            lease = await self._lease(caller, lease_id)
            if lease.kernel_id != kernel_id:
                raise ProtocolError("'kernel_id' is not the kernel of that lease")
            profile, spec = lease.profile, lease.slice
        else:
            profile = self.pool.settings.profile(args.text("profile")).name
            spec = self.pool.settings.profiles[profile].slice
        mine = [w for w in await asyncio.to_thread(self.ledger.waiters) if w.owner == caller.user]
        if len(mine) >= MAX_WAITERS:
            raise Busy(f"you hold {len(mine)} places in the GPU queue already (at most {MAX_WAITERS})")
        return await self.turns.write(caller.uid, self.ledger.enqueue, caller.user, kernel_id, profile, spec,
                                      lease_id=lease_id, label=args.text("label", default=""), groups=caller.groups)

    async def op_heartbeat(self, caller: Caller, peer: Peer, args: Args):
        waiter_id = await self._own_waiter(caller, args.text("waiter_id"))
        if waiter_id is None:
            return None  # as for a place that is gone
        return await self.turns.write(caller.uid, self.ledger.heartbeat, waiter_id)

    async def op_dequeue(self, caller: Caller, peer: Peer, args: Args) -> None:
        waiter_id = await self._own_waiter(caller, args.text("waiter_id"))
        if waiter_id is not None:
            await self.turns.write(caller.uid, self.ledger.dequeue, waiter_id)

    async def op_record(self, caller: Caller, peer: Peer, args: Args) -> None:
        """An entry on the journal about one of the caller's kernels (its owner is the caller), within the
        caps on what one user may record (:data:`JOURNAL_CAPS`; admins are not capped)."""
        lease_id = args.text("lease_id", required=False)
        kernel_id = args.text("kernel_id", required=False)
        kind, reason = args.word("kind"), args.text("reason", default="")
        owner = caller.user
        if lease_id is not None:
            lease = await self._lease(caller, lease_id, held=False)
            owner = lease.owner
            if kernel_id is not None and kernel_id != lease.kernel_id:
                raise ProtocolError("'kernel_id' is not the kernel of that lease")
        detail = args.get("detail") or {}
        if not isinstance(detail, dict):
            raise ProtocolError("'detail' must be an object")
        size = len(protocol.dumps(detail)) - 1
        if size > JOURNAL_CAPS.entry_bytes:
            raise ProtocolError(f"'detail' is {size} bytes: an entry's detail may be at most "
                                         f"{JOURNAL_CAPS.entry_bytes}")
        if kernel_id is not None:
            await asyncio.to_thread(self._own_kernels, caller, {kernel_id})
        if not caller.admin:
            self._recording_rate(caller)

        def record() -> None:
            if not caller.admin:  # checked in the caller's turn to write: two at once cannot both pass
                entries, stored = self.ledger.journal_held(caller.user)
                if entries >= JOURNAL_CAPS.entries or stored + size > JOURNAL_CAPS.bytes:
                    raise Busy(f"you have {entries} entries ({stored} bytes of detail) on the pool's journal, the "
                               f"most one user may keep (at most {JOURNAL_CAPS.entries} entries, "
                               f"{JOURNAL_CAPS.bytes} bytes); they are kept "
                               f"{self.ledger.history_seconds / 86400:g} days. Record less "
                               "(or ask an admin)")
            self.ledger.record(kind, lease_id=lease_id, kernel_id=kernel_id, owner=owner, reason=reason,
                               detail=detail)

        await self.turns.write(caller.uid, record)

    def _recording_rate(self, caller: Caller) -> None:
        """At most ``JOURNAL_CAPS.per_minute`` entries a minute from one user."""
        now = time.monotonic()
        recent = [t for t in self._recorded.get(caller.uid, ()) if now - t < 60.0]
        if len(recent) >= JOURNAL_CAPS.per_minute:
            self._recorded[caller.uid] = recent
            raise Busy(f"you recorded {len(recent)} journal entries in the last minute, the most one user may "
                       f"(at most {JOURNAL_CAPS.per_minute} a minute): wait a minute, and record less")
        recent.append(now)
        self._recorded[caller.uid] = recent

    def _own_kernels(self, caller: Caller, kernel_ids: set[str]) -> None:
        """Refuse kernel ids another user's lease was taken for (an entry about a kernel is its owner's)."""
        if caller.admin:
            return
        for kernel_id in kernel_ids:
            if self.ledger.kernel_owners(kernel_id) - {caller.user}:
                raise Denied(f"kernel {kernel_id[:40]!r} is not one of your kernels: you can record about your "
                             "own kernels only")

    async def op_record_refusal(self, caller: Caller, peer: Peer, args: Args) -> None:
        refusal = PoolError(args.text("message"))
        refusal.reason = args.word("reason")
        kernel_id, _held = await self._kernel(caller, args)
        await self.turns.write(caller.uid, self.ledger.record_refusal, kernel_id, caller.user,
                               args.text("profile"), refusal, args.text("label", default=""))

    async def op_reconcile(self, caller: Caller, peer: Peer, args: Args) -> list:
        """The service reconciles on its own interval; a caller's ask runs one now, unless one ran in
        the last second (a refused allocation reconciles as often)."""
        def unless_just_done() -> list:  # asked again in its turn: many callers at once run one reconcile
            return [] if self.ledger.reconciled_within(1.0) else self.pool.reconcile()

        if self.ledger.reconciled_within(1.0):
            return []
        return await self.turns.write(caller.uid, unless_just_done)

    # -- the activity trace (pool.trace) -----------------------------------------------------------------

    async def op_trace_record(self, caller: Caller, peer: Peer, args: Args) -> int:
        """Activity of the caller's own kernels (admins: anyone's), kept as the admin's settings say."""
        raw = args.get("events")
        if not isinstance(raw, list) or len(raw) > MAX_TRACE_EVENTS:
            raise ProtocolError(f"'events' must be a list of at most {MAX_TRACE_EVENTS} trace events")
        events = []
        for i, item in enumerate(raw):
            try:
                event = check(item)
            except TraceError as e:
                raise ProtocolError(f"events[{i}]: {e}") from None
            if event.owner is None:
                event = dataclasses.replace(event, owner=caller.user)
            if not self._visible(caller, event.owner):
                raise Denied(f"events[{i}] is about {event.owner}'s kernel: you can record your own kernels' "
                             "activity only")
            events.append(event)
        await asyncio.to_thread(self._own_kernels, caller, {e.kernel_id for e in events if e.kernel_id})
        settings = self.pool.settings
        if not settings.trace_recording:
            return 0
        await self.turns.write(caller.uid, self.ledger.trace_record, events, settings.trace_retention)
        return len(events)

    async def op_trace_export(self, caller: Caller, peer: Peer, args: Args) -> dict:
        """One page of the trace: the caller's own kernels' (admins: everyone's, or ``owner``'s)."""
        owner = args.text("owner", required=False)
        if owner is not None and not self._visible(caller, owner):
            raise Denied("another user's activity is theirs to export (and the admins')")
        if not caller.admin:
            owner = caller.user
        after = args.get("after")
        if after is not None and (not isinstance(after, list) or len(after) != 2 or isinstance(after[0], bool)
                                  or not isinstance(after[0], (int, float)) or isinstance(after[1], bool)
                                  or not isinstance(after[1], int) or not abs(after[0]) <= LARGEST
                                  or not abs(after[1]) <= LARGEST):
            raise ProtocolError("'after' must be [time, row] from the previous page's 'next'")
        limit = max(1, min(args.integer("limit", default=2000), 2000))
        events, following = await asyncio.to_thread(
            self.ledger.trace_export, since=args.number("since", default=0.0),
            until=args.number("until", default=math.inf), owner=owner,
            after=(float(after[0]), after[1]) if after else None, limit=limit)
        return {"events": [e.to_dict() for e in events], "next": list(following) if following else None}


def _own_settings(config: dict, caller: Caller, rules: tuple) -> dict:
    """The admin's settings as a user may see them: the pool-wide ones, and of the settings by user or
    group only the caller's own entries and their groups' (no other user's quota, budget or groups); of
    the idle policy, the rules that may match the caller's kernels (in their order: the first that fits
    is the same rule)."""
    members = config.get("group_members") or {}
    mine = {caller.user, *caller.groups, *(k for k, v in members.items() if caller.user in v)}
    written = config.get("policy") or []
    if len(written) == len(rules):
        groups = tuple(sorted(mine - {caller.user}))
        config = {**config, "policy": [w for w, rule in zip(written, rules) if _may_match(rule, caller.user, groups)]}
    return {**config,
            "user_quotas": {k: v for k, v in (config.get("user_quotas") or {}).items() if k == caller.user},
            "group_quotas": {k: v for k, v in (config.get("group_quotas") or {}).items() if k in mine},
            "group_members": {k: [caller.user] for k, v in members.items() if caller.user in v},
            "budgets": {k: v for k, v in (config.get("budgets") or {}).items() if k in mine}}


def _may_match(rule, user: str, groups: tuple[str, ...]) -> bool:
    """Whether a rule of the idle policy may match a kernel of ``user`` (in ``groups``)."""
    match = rule.match
    return (not match.user or any(fnmatch.fnmatchcase(user, p) for p in match.user)) and \
        (not match.group or any(fnmatch.fnmatchcase(g, p) for p in match.group for g in groups))


def _start_of(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def reserved_of(pool: LocalPool, user: str, offered: list[tuple[str, str, float]], freeing: tuple[str, ...],
                warned: tuple[str, ...]) -> dict[str, str]:
    """``LocalPool.reserved`` for ``user``'s kernels only: another user's lease among ``offered`` is left
    out, and so are kernel ids in ``freeing``/``warned`` that are not theirs."""
    found, own = [], set()
    for lease_id, action, idle_since in offered:
        lease = pool.ledger.get(lease_id)
        if lease is not None and lease.owner == user:
            found.append(Candidate(lease, action, idle_since))
            own.add(lease.kernel_id)
    return pool.reserved(found, tuple(k for k in freeing if k in own or _theirs(pool, k, user)),
                         tuple(k for k in warned if k in own))


def _theirs(pool: LocalPool, kernel_id: str, user: str) -> bool:
    lease = pool.ledger.by_kernel(kernel_id)
    return lease is not None and lease.owner == user
