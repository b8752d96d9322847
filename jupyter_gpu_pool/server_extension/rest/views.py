"""The JSON the REST API answers (docs/api.md): a user's view (``me``) and the admin's (``pool``).

Built from one ledger snapshot plus what this server knows live (execution
state, telemetry, the culler's warnings), read through the server's read-only
:class:`ServerContext`, so every number a user sees is what the ledger holds at
that moment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from ...pool import HIBERNATED, JournalEntry, Lease, Profile, Snapshot, usage_of
from ...pool import policy as P
from ...pool.leases import ACTIVE
from ...pool.liveness import ended_with_server
from ...pool.phases import HIBERNATING, IN_FLIGHT, NO_GPU_YET, STOPPING, display_state
from ...pool.rules import Policy, Rule
from ...pool.units import unix_time
from ...pool.words import notebook_label
from . import dashboard
from ..backends.base import PoolBackend
from ..context import ServerContext
from ..notebooks import name_of

# Journal kinds a user's "recent" list explains; ours carry detail.source == "policy".
RECENT_KINDS = ("warned", "snoozed", "culled", "hibernated", "released", "resumed", "refused", "reclaimed",
                "hibernation_failed")
DECISION_KINDS = ("warned", "snoozed", "culled", "hibernated", "released", "resumed")



def gpu_refs(backend: PoolBackend, uuids) -> list[dict]:
    by_uuid = {g.uuid: g for g in backend.gpus()}
    out = []
    for uuid in uuids:
        g = by_uuid.get(uuid)
        out.append({"uuid": uuid, "label": g.label if g else uuid, "source": g.source if g else "unknown"})
    return out


def under_way(lease: Lease, context: ServerContext) -> str:
    """The kernel's state as the user sees it: the ledger's phase says what is under way, for every server
    alike; an action this server has begun but whose move has not claimed the lease yet (a hibernation
    waiting for its turn, a shutdown) shows as under way already, never as a kernel still to be kept alive."""
    state = display_state(lease)
    doing = context.doing(lease.kernel_id)
    if doing is None or lease.phase in IN_FLIGHT or state != ACTIVE:
        return state
    return HIBERNATING if doing == P.HIBERNATE else STOPPING


def warning_shown(kstate: P.KernelState, rule: Rule, context: ServerContext) -> dict | None:
    """The culler's warning of the kernel as the user reads it (none in a dry run: nothing will happen)."""
    w = kstate.warning
    if w is None or context.policy.dry_run:
        return None
    return {"action": w.action, "reason": w.reason, "message": w.message, "deadline": w.deadline,
            "snoozes_left": P.snoozes_left(kstate, rule), "snooze_seconds": rule.snooze,
            "reservation": w.reservation or None}  # reason reserved: the reservation it gives room back for


def next_idle_action(lease: Lease, rule: Rule, kstate: P.KernelState, context: ServerContext, *, now: float,
                     last_activity: float | None, execution_state: str | None) -> dict | None:
    """When the policy acts on a kernel of this server if it stays idle: the last pass's facts, with any
    activity since; none while it runs, moves or has not been judged yet."""
    kid = lease.kernel_id
    seen = context.seen.get(kid)
    if seen is None or lease.phase or context.busy(kid) or execution_state == "busy":
        return None
    facts = replace(seen.facts, last_activity=max(seen.facts.last_activity, last_activity or 0.0))
    found = P.next_action(facts, rule, kstate)
    if found is None or found[0] <= now:
        return None
    return {"at": found[0], "reason": found[1], "action": found[2]}


def user_actions(lease: Lease, rule: Rule, kstate: P.KernelState, context: ServerContext, *,
                 warning: dict | None) -> list[str]:
    """What the user may do to a kernel of this server: nothing while a move is under way; a snooze while
    any is left (never of an over-memory warning, nor of a reserved one: the server refuses both); Release
    a held slice, Resume a hibernated kernel (a first slice is taken by a cell); Shut down."""
    if lease.phase or context.busy(lease.kernel_id):
        return []
    actions = []
    if P.snoozes_left(kstate, rule) > 0 and not (warning and warning["reason"] in (P.OVER_MEMORY, P.RESERVED)):
        actions.append("snooze")
    if lease.state != HIBERNATED:
        actions.append("release")
    elif context.hibernator.enabled and not lease.awaits_first_cell:
        actions.append("resume")
    actions.append("shutdown")
    return actions


def slice_shown(lease: Lease, profile: Profile | None) -> dict:
    """The kernel's slice: its profile's words, and what the lease holds (no memory figure for a whole GPU)."""
    spec = profile.slice if profile else None
    return {"label": str(spec) if spec else "", "memory": lease.memory if not lease.whole else None,
            "sm_percent": lease.sm_percent, "whole": lease.whole, "gpu_count": lease.gpu_count}


def kernel_object(lease: Lease, *, backend: PoolBackend, context: ServerContext, snapshot: Snapshot,
                  now: float, notebooks: Mapping[str, str]) -> dict:
    """One kernel as the user sees it.  Kernels of other servers (same user, shared ledger) show
    what the ledger knows, with null for what only their own server knows.  ``notebooks``: the
    notebook each kernel of this server serves now (``ServerContext.notebooks``)."""
    kid = lease.kernel_id
    profile = backend.profile(lease.profile)
    kernel = context.kernel(kid)
    here = kernel is not None
    rule = context.rule_for(kernel, lease)
    waiter = snapshot.waiter_of_kernel(kid)
    queue_position = waiter.position if waiter is not None else None
    execution_state = kernel.execution_state if here else None
    last_activity = min(unix_time(kernel.last_activity), now) if here else None  # no later than the "now" shown
    reading = context.sampler.reading(kid) if here and lease.state != HIBERNATED else None
    samples = context.sampler.samples(kid) if here else []
    can, why = context.hibernation(lease) if here else (False, "the kernel runs in another server")
    action, _note = P.release_action(rule, can, why)
    kstate = context.states.get(kid, P.FRESH)
    warning = warning_shown(kstate, rule, context)
    next_action = (next_idle_action(lease, rule, kstate, context, now=now, last_activity=last_activity,
                                    execution_state=execution_state) if here and warning is None else None)
    actions = user_actions(lease, rule, kstate, context, warning=warning) if here else []
    return {
        "kernel_id": kid,
        "lease_id": lease.id,
        "name": name_of(lease, notebooks),  # the notebook's path now: it follows a rename
        "profile": lease.profile,
        "profile_display_name": profile.display_name if profile else lease.profile,
        "slice": slice_shown(lease, profile),
        "isolation": lease.isolation,
        "gpus": gpu_refs(backend, lease.gpus or lease.last_gpus),
        "state": under_way(lease, context),
        "execution_state": execution_state,
        "last_activity": last_activity,
        "idle_since": last_activity if here and execution_state != "busy" else None,
        "memory_used": reading.memory_used if reading else None,
        "memory_limit": lease.total_memory,
        "utilization": {"current": reading.utilization if reading else None,
                        "samples": [[t, u] for t, u in samples]},
        "queue_position": queue_position,
        "woken_on_hint": here and context.hibernator.hinted(kid),  # its notebook opened: woken before a cell
        # its rule puts it to sleep this long after each cell (it can here): it holds its GPU only while cells run
        "sleeps_after_cell": rule.hibernate_after_cell if can else None,
        "queue_reason": context.hibernator.queue_reason(kid) if here and queue_position is not None else None,
        "warning": warning,
        "next_action": next_action,
        "snoozed_until": kstate.snoozed_until if kstate.snoozed_until > now else None,
        "can_hibernate": can,
        "hibernate_unavailable": None if can else why,
        "release_action": action,
        "rule": rule.name,
        "rule_label": rule.label,  # what the UI shows: a rule given no name is said by whom it covers
        "started": lease.created,
        "here": here,
        "actions": actions,
        "progress": lease.extra.get("progress"),  # a cluster kernel's start, in words, while it starts
        # room reserved for others it holds, in words, while their window is open (a hibernated kernel gave it back)
        "borrowed": (backend.sharing.borrowed(lease, now) or None) if lease.state == ACTIVE else None,
    }


def admin_actions(lease: Lease, context: ServerContext) -> list[str]:
    """What an admin may do to a lease from the dashboard: nothing while a move is under way; a
    hibernated kernel can only be shut down; one of another server is asked of that server."""
    if lease.phase or context.busy(lease.kernel_id):
        return []
    if lease.state == HIBERNATED:
        return ["shutdown"]
    if lease.kernel_id in context.km and not context.hibernation(lease)[0]:
        return ["release", "shutdown"]
    return ["release", "hibernate", "shutdown"]


def journal_item(e: JournalEntry, policy: Policy | None = None) -> dict:
    """One journal entry as the UI lists it; ``rule_label`` is its rule as :attr:`Rule.label` reads, where
    ``policy`` still has that rule (else its name as recorded)."""
    d = e.detail
    rule = d.get("rule")
    found = next((r for r in policy.rules if r.name == rule), None) if policy is not None and rule else None
    message = d.get("message") or (f"Lease released: {e.reason}" if e.kind == "reclaimed" else "")
    # The server's own entries name the notebook as it was called then; the ledger's, as at its start.
    return {"at": e.at, "kind": e.kind, "kernel_id": e.kernel_id, "owner": e.owner,
            "name": notebook_label(d.get("name") or d.get("label", "")),
            "profile": d.get("profile"), "reason": e.reason, "message": message,
            "dry_run": bool(d.get("dry_run", False)), "rule": rule,
            "rule_label": found.label if found is not None else rule, "action": d.get("action"),
            "note": d.get("note"), "declared": bool(d.get("declared", False)),
            "with_server": ended_with_server(e.reason)}


def _ours(e: JournalEntry) -> bool:
    """Entries the policy wrote, plus the ledger's own refusals, reclaims and resumes."""
    return e.detail.get("source") == "policy" or e.kind in ("refused", "reclaimed", "resumed")


def _once(entries: list[JournalEntry]) -> list[JournalEntry]:
    """One entry per happening: where the server put a resume on record (with what it moved), the
    ledger's own entry of the same resume (within a minute) is left out."""
    recorded = [e for e in entries if e.kind == "resumed" and e.detail.get("source") == "policy"]
    return [e for e in entries if not (e.kind == "resumed" and e.detail.get("source") != "policy" and any(
        r.kernel_id == e.kernel_id and abs(r.at - e.at) < 60 for r in recorded))]


def pool_summary(backend: PoolBackend, snapshot: Snapshot) -> dict:
    return {
        "enabled": backend.enabled,
        "declared": backend.declared,
        "note": backend.note,
        "gpus": len(snapshot.gpus),
        "memory_total": sum(u.gpu.memory for u in snapshot.gpus),
        "memory_free": sum(u.free_memory for u in snapshot.gpus),
    }


async def me(user: str, admin: bool, *, backend: PoolBackend, context: ServerContext) -> dict:
    snapshot = await backend.snapshot()
    mine = [lease for lease in snapshot.leases if lease.owner == user]
    groups = []
    for group in backend.groups_of(user):
        quota = backend.group_quota(group)
        if quota is None:
            continue
        members = [lease for lease in snapshot.leases if group in lease.groups]
        groups.append({"name": group, "quota": quota.to_dict(), "usage": usage_of(members).to_dict()})
    notebooks = await context.notebooks.paths()
    now = time.time()  # after the awaits: a kernel's activity read next is never later than "now"
    kernels = [kernel_object(lease, backend=backend, context=context, snapshot=snapshot, now=now, notebooks=notebooks)
               for lease in mine]
    leased = {lease.kernel_id for lease in mine}
    queue = []
    for w in snapshot.waiters:
        if w.owner != user:
            continue
        profile = backend.profile(w.profile)
        name = notebooks.get(w.kernel_id, w.label)  # the notebook as it is called now
        queue.append({"position": w.position, "kernel_id": w.kernel_id, "name": name, "profile": w.profile,
                      "profile_display_name": profile.display_name if profile else w.profile,
                      "for": "resume" if w.lease_id else "start", "enqueued": w.enqueued,
                      "why": w.why or None})  # where sharing orders the queue: why it is there
        if w.kernel_id not in leased:  # a start waiting for its first slice
            kernels.append({"kernel_id": w.kernel_id, "lease_id": None, "name": name, "profile": w.profile,
                            "profile_display_name": profile.display_name if profile else w.profile,
                            "state": "queued", "queue_position": w.position, "warning": None, "actions": []})
    recent = [journal_item(e, backend.policy) for e in _once(await backend.journal(kinds=RECENT_KINDS, owner=user, limit=100))
              if _ours(e) and not e.detail.get("dry_run")][:30]
    budget = await backend.budget(user, backend.groups_of(user))
    starts = await backend.starts_now(user, backend.groups_of(user), snapshot)
    profiles = [{**p.to_dict(), "starts_now": starts.get(name)} for name, p in backend.profiles().items()]
    return {
        "now": now,
        "user": user,
        "admin": admin,
        "budget": budget.to_dict() if budget is not None else None,
        "pool": pool_summary(backend, snapshot),
        "quota": backend.user_quota(user).to_dict(),
        "usage": usage_of(mine).to_dict(),
        "groups": groups,
        "kernels": kernels,
        "queue": queue,
        "recent": recent,
        "profiles": profiles,
        "reservations": backend.sharing.shown(now, user, backend.groups_of(user)),
    }


async def pool(*, backend: PoolBackend, context: ServerContext) -> dict:
    now = time.time()
    snapshot = await backend.snapshot()
    gpus = []
    for u in snapshot.gpus:
        g = u.gpu
        gpus.append({"uuid": g.uuid, "label": g.label, "name": g.name, "memory": g.memory, "source": g.source,
                     "index": g.index, "node": g.node, "used_memory": u.memory, "used_sm_percent": u.sm_percent,
                     "free_memory": u.free_memory, "exclusive": u.exclusive, "slices": u.leases,
                     "utilization": context.sampler.device_utilization(g.uuid)})
    leases = []
    notebooks = await context.notebooks.paths()
    for lease in snapshot.leases:
        item = lease.to_dict()
        reading = context.sampler.reading(lease.kernel_id)
        kstate = context.states.get(lease.kernel_id, P.FRESH)
        kernel = context.kernel(lease.kernel_id)
        here = kernel is not None
        execution_state = kernel.execution_state if here else None
        # a kernel that has held no slice yet is not "hibernated": nothing was put to sleep
        item.update({"label": name_of(lease, notebooks), "state": NO_GPU_YET if lease.awaits_first_cell else lease.state,
                     "here": here, "execution_state": execution_state,
                     "idle_since": (unix_time(kernel.last_activity)
                                    if here and execution_state != "busy" else None),
                     "actions": admin_actions(lease, context),
                     "memory_used": reading.memory_used if reading else None,
                     "utilization": reading.utilization if reading else None,
                     "warning": ({"reason": kstate.warning.reason, "action": kstate.warning.action,
                                  "deadline": kstate.warning.deadline, "message": kstate.warning.message}
                                 if kstate.warning else None)})
        leases.append(item)
    decisions = [journal_item(e, backend.policy) for e in _once(await backend.journal(kinds=DECISION_KINDS + ("refused", "reclaimed"),
                                                                      limit=200)) if _ours(e)]
    return {
        "now": now,
        "note": backend.note,
        "budgets": await dashboard.budgets(backend=backend, snapshot=snapshot),
        "enabled": backend.enabled,
        "declared": backend.declared,
        "gpus": gpus,
        "leases": leases,
        "queue": [{**w.to_dict(), "label": notebooks.get(w.kernel_id, w.label)} for w in snapshot.waiters],
        "decisions": decisions,
        "policy": context.policy.to_dict(),
        "reservations": [s.listed(now) for s in backend.sharing.slots(now)],
        "pressure": bool(snapshot.waiters),
        "passes": context.passes(),
    }
