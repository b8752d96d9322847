"""The culler: gathers each pool kernel's facts, asks the policy, carries the decision out.

It runs on the server's event loop and never blocks it: the ledger and NVML are
read in threads (the backend, the telemetry sampler), deciding is pure and
fast, and actions (shutdown, hibernation) run as their own tasks so that one
slow checkpoint does not hold up the pass.  Every decision that acts, warns or
snoozes is put on record in the ledger's journal with its reason, emitted as a
``kernel-action`` event and counted in the metrics.

A *pool kernel* is a kernel of this server that holds a lease.  Other kernels
are left to jupyter_server (and its own culler, if on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_core.utils import ensure_async

from ..pool import HIBERNATED, Lease, Snapshot
from ..pool import policy as P
from ..pool.profiles import MPS
from . import events, metrics
from .backend import PoolBackend

log = logging.getLogger(__name__)

# jupyter_server's culler reads a per-kernelspec ``cull_idle_timeout`` from the kernel's spec
# metadata; this value (ten years) exempts pool kernels from it.
SERVER_CULLER_EXEMPT = 10 * 365 * 86400

HIBERNATING = "hibernating"
SHUTTING_DOWN = "shutting_down"


class Hibernator(Protocol):
    """The hibernation hook (see docs/server-extension.md, "Plugging in hibernation").

    ``hibernate`` moves the kernel's GPU memory to host RAM and marks its lease
    ``hibernated`` in the ledger (``Ledger.hibernate``), which gives the slice back;
    it returns a dict or object with ``duration`` (seconds) and ``bytes`` (moved), or raises.
    Optional: ``shown(kernel_id)`` (or ``state_of``) -> the state the UI shows (``hibernating``,
    ``resuming``, ...), and ``emits_events = True`` when the hook emits its own ``hibernated`` /
    ``resumed`` events (the culler then only journals and counts them)."""

    def can_hibernate(self, kernel_id: str, lease: Lease | None = None) -> tuple[bool, str | None]: ...

    async def hibernate(self, kernel_id: str, reason: str) -> dict: ...

    async def resume(self, kernel_id: str) -> Any: ...


@dataclass
class Seen:
    """What the last pass learned about one kernel (the ``me`` view reads it)."""

    rule: P.Rule
    facts: P.Facts
    decision: P.Decision


class Culler:
    def __init__(self, *, kernel_manager, backend: PoolBackend, sampler, event_logger=None,
                 web_settings: dict | None = None, hibernator_getter=lambda: None, exempt_server_culler: bool = True,
                 clock=time.time):
        self.km = kernel_manager
        self.backend = backend
        self.sampler = sampler
        self.event_logger = event_logger
        self.web_settings = web_settings if web_settings is not None else {}
        self._hibernator = hibernator_getter
        self.exempt_server_culler = exempt_server_culler
        self.clock = clock
        self.states: dict[str, P.KernelState] = {}
        self.busy_since: dict[str, float] = {}
        self.in_flight: dict[str, str] = {}
        self.seen: dict[str, Seen] = {}
        self.last_snapshot: Snapshot | None = None
        self.tasks: set[asyncio.Task] = set()
        self._journal_seq: int | None = None
        self._waiters_seen: set[str] = set()
        self.passes = 0

    @property
    def hibernator(self) -> Hibernator | None:
        return self._hibernator()

    @property
    def policy(self) -> P.Policy:
        return self.backend.policy

    # -- facts ----------------------------------------------------------------------------

    def pool_kernels(self, snapshot: Snapshot) -> dict[str, tuple[Any, Lease]]:
        """This server's kernels that hold a lease: kernel id -> (kernel manager, lease)."""
        leases = {lease.kernel_id: lease for lease in snapshot.leases}
        found = {}
        for kid in list(self.km.list_kernel_ids()):
            lease = leases.get(kid)
            if lease is None:
                continue
            try:
                found[kid] = (self.km.get_kernel(kid), lease)
            except KeyError:  # shut down meanwhile
                continue
        return found

    def rule_for(self, kernel, lease: Lease) -> P.Rule:
        return self.policy.rule_for(lease.owner, lease.groups, lease.profile, getattr(kernel, "kernel_name", "") or "")

    def hibernation(self, kernel_id: str, lease: Lease) -> tuple[bool, str | None]:
        """Whether this kernel can hibernate now, and why not."""
        if lease.isolation == MPS:
            return False, "an MPS client cannot be checkpointed (CUDA error 801)"
        hibernator = self.hibernator
        if hibernator is None:
            return False, "no hibernator is installed on this server"
        try:
            try:  # hooks that take the lease need no ledger read of their own (no I/O on the event loop)
                ok, why = hibernator.can_hibernate(kernel_id, lease=lease)
            except TypeError:
                ok, why = hibernator.can_hibernate(kernel_id)
        except Exception as e:  # the hook must not break a culling pass
            return False, f"the hibernator failed: {e}"
        return bool(ok), why

    def facts(self, kernel_id: str, kernel, lease: Lease, rule: P.Rule, now: float) -> P.Facts:
        execution_state = getattr(kernel, "execution_state", "unknown") or "unknown"
        if execution_state == "busy":
            self.busy_since.setdefault(kernel_id, min(now, _ts(getattr(kernel, "last_activity", None)) or now))
        else:
            self.busy_since.pop(kernel_id, None)
        last_activity = _ts(getattr(kernel, "last_activity", None)) or lease.created
        gpu_active = self.sampler.last_gpu_activity(kernel_id, rule.gpu_idle_threshold)
        if gpu_active is not None:  # a kernel using its GPU is not idle, whatever it prints
            last_activity = max(last_activity, gpu_active)
        reading = self.sampler.reading(kernel_id)
        can, why = self.hibernation(kernel_id, lease)
        return P.Facts(
            kernel_id=kernel_id,
            state=lease.state,
            execution_state=execution_state,
            last_activity=last_activity,
            started=lease.created,
            state_since=lease.state_since,
            busy_since=self.busy_since.get(kernel_id),
            connections=getattr(self.km, "_kernel_connections", {}).get(kernel_id, 0),
            isolation=lease.isolation,
            memory_used=reading.memory_used if reading and lease.state != HIBERNATED else None,
            memory_limit=lease.total_memory,
            gpu_idle_since=(self.sampler.gpu_idle_since(kernel_id, rule.gpu_idle_threshold)
                            if lease.state != HIBERNATED else None),
            can_hibernate=can,
            hibernate_unavailable=why,
        )

    # -- one pass -----------------------------------------------------------------------------

    async def pass_once(self) -> None:
        await self.backend.reconcile()
        snapshot = await self.backend.snapshot()
        self.last_snapshot = snapshot
        now = self.clock()
        kernels = self.pool_kernels(snapshot)
        self.sampler.track({kid: (getattr(k.provisioner, "pid", None) or -1, frozenset(lease.gpus))
                            for kid, (k, lease) in kernels.items() if getattr(k, "provisioner", None) is not None})
        pressure = bool(snapshot.waiters)
        dry_run = self.policy.dry_run
        gpu_active = False
        for i, (kid, (kernel, lease)) in enumerate(kernels.items()):
            if i % 500 == 499:
                await asyncio.sleep(0)  # thousands of kernels: let requests in between
            self._exempt_from_server_culler(kernel)
            if kid in self.in_flight:
                continue
            rule = self.rule_for(kernel, lease)
            facts = self.facts(kid, kernel, lease, rule, now)
            reading = self.sampler.reading(kid)
            if reading and reading.utilization is not None and reading.utilization >= rule.gpu_idle_threshold:
                gpu_active = True
            decision = P.decide(facts, rule, now, self.states.get(kid, P.FRESH), pressure=pressure, dry_run=dry_run)
            self.states[kid] = decision.state
            self.seen[kid] = Seen(rule, facts, decision)
            if decision.verb != P.NONE:
                await self.apply(kid, lease, rule, decision)
        for gone in set(self.states) - set(kernels):
            self.states.pop(gone, None)
            self.seen.pop(gone, None)
            self.busy_since.pop(gone, None)
        if gpu_active:
            self.report_gpu_activity()
        await self._follow_journal(snapshot)
        self._update_metrics(snapshot, kernels)
        self.passes += 1

    def report_gpu_activity(self) -> None:
        """Count GPU use as server activity (``/api/status``, JupyterHub's idle culler)."""
        from jupyter_server._tz import utcnow

        self.web_settings["gpu_pool_last_activity"] = utcnow()

    def _exempt_from_server_culler(self, kernel) -> None:
        if not self.exempt_server_culler or not getattr(self.km, "cull_idle_timeout", 0):
            return
        spec = getattr(kernel, "kernel_spec", None)
        if spec is not None and spec.metadata.get("cull_idle_timeout") != SERVER_CULLER_EXEMPT:
            spec.metadata["cull_idle_timeout"] = SERVER_CULLER_EXEMPT

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Pass after pass until ``stop`` is set; a pass under way finishes first (its ledger work
        runs in threads, which a cancellation would leave running behind a closed ledger)."""
        while not stop.is_set():
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not end culling for good
                log.exception("GPU pool culling pass failed")
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass

    # -- carrying decisions out -----------------------------------------------------------------

    async def apply(self, kid: str, lease: Lease, rule: P.Rule, decision: P.Decision) -> None:
        if decision.verb == P.WITHDRAW:
            log.info("kernel %s: warning (%s) withdrawn, it is in use again", kid, decision.reason)
            return
        if decision.verb == P.WARN:
            await self.record("warned", lease, decision.reason, decision.message, rule, dry_run=decision.dry_run,
                              deadline=decision.deadline, action=decision.action, note=decision.note)
            return
        kind = "hibernated" if decision.action == P.HIBERNATE else "culled"
        if decision.dry_run:
            await self.record(kind, lease, decision.reason, decision.message, rule, dry_run=True,
                              action=decision.action, note=decision.note)
            return
        self.spawn(kid, self.carry_out(kid, lease, rule, decision.action, decision.reason, decision.message,
                                       decision.note, user_release=False))

    def spawn(self, kid: str, coro) -> None:
        self.in_flight[kid] = SHUTTING_DOWN
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def carry_out(self, kid: str, lease: Lease, rule: P.Rule, action: str, reason: str, message: str,
                        note: str | None, user_release: bool) -> None:
        kind = "released" if user_release else ("hibernated" if action == P.HIBERNATE else "culled")
        try:
            if action == P.HIBERNATE:
                self.in_flight[kid] = HIBERNATING
                try:
                    result = await self.hibernator.hibernate(kid, reason)  # type: ignore[union-attr]
                except Exception as e:
                    if getattr(e, "keep_running", False):  # refused for now (busy GPU, host RAM): leave it be
                        log.info("kernel %s: not hibernated now, it keeps running: %s", kid, e)
                        await self.record("refused", lease, getattr(e, "reason", "hibernation_refused"), str(e),
                                          rule, action=action)
                        return
                    log.warning("kernel %s: hibernation failed (%s); shutting it down instead", kid, e)
                    note = f"hibernation failed ({e}), so shut down instead"
                    action = P.SHUTDOWN
                    self.in_flight[kid] = SHUTTING_DOWN
                else:
                    self.states[kid] = P.FRESH
                    result = result or {}
                    await self.record(kind, lease, reason, message, rule, action=action, note=note,
                                      duration=_get(result, "duration"), bytes=_get(result, "bytes"))
                    return
            why = "released by its user" if user_release else f"culled: {reason} (rule {rule.name!r})"
            await self.shutdown(kid, why, lease)
            if user_release and kind == "released" and note:
                message = "Shut down at your request: the GPU slice is back in the pool."
            if note:
                message = f"{message} ({note})"
            await self.record("released" if user_release else "culled", lease, reason, message, rule,
                              action=P.SHUTDOWN, note=note)
        except Exception:
            log.exception("kernel %s: %s (%s) failed", kid, action, reason)
        finally:
            self.in_flight.pop(kid, None)

    async def shutdown(self, kid: str, release_reason: str, lease: Lease | None = None) -> None:
        """Shut the kernel down through jupyter_server; its provisioner releases the lease with our reason."""
        try:
            kernel = self.km.get_kernel(kid)
        except KeyError:
            return
        provisioner = getattr(kernel, "provisioner", None)
        if provisioner is not None and hasattr(provisioner, "release_reason"):
            provisioner.release_reason = release_reason
        if lease is not None:
            await self.backend.stopping(lease.id)
        log.info("GPU pool: shutting down kernel %s (%s)", kid, release_reason)
        await ensure_async(self.km.shutdown_kernel(kid))

    async def record(self, kind: str, lease: Lease, reason: str | None, message: str, rule: P.Rule, *,
                     dry_run: bool = False, deadline: float | None = None, action: str | None = None,
                     note: str | None = None, duration: float | None = None, bytes: int | None = None) -> None:
        """Journal, event and metric for one decision."""
        reason = reason or ""
        detail = {"source": "policy", "message": message, "dry_run": dry_run, "rule": rule.name,
                  "action": action, "profile": lease.profile, "name": lease.label}
        for key, value in (("deadline", deadline), ("note", note), ("duration", duration), ("bytes", bytes)):
            if value is not None:
                detail[key] = value
        try:
            await self.backend.record(kind, lease_id=lease.id, kernel_id=lease.kernel_id, owner=lease.owner,
                                      reason=reason, detail=detail)
        except Exception:
            log.exception("could not journal %s of kernel %s", kind, lease.kernel_id)
        if not (kind == "hibernated" and not dry_run and getattr(self.hibernator, "emits_events", False)):
            self.emit(kind, kernel_id=lease.kernel_id, user=lease.owner, reason=reason, message=message,
                      profile=lease.profile, deadline=deadline, dry_run=dry_run, duration=duration, bytes=bytes)
        metrics.count(kind, reason, dry_run)
        (log.warning if kind in ("culled", "hibernated") and not dry_run else log.info)(
            "GPU pool %s%s kernel %s of %s: %s", "(dry run) " if dry_run else "", kind, lease.kernel_id,
            lease.owner, message)

    def emit(self, action: str, **data) -> None:
        try:
            events.emit(self.event_logger, events.kernel_action(action, **data))
        except Exception:  # an event is a notification; its failure must not stop the policy
            log.exception("could not emit the %s event", action)

    # -- user requests ----------------------------------------------------------------------------

    async def snooze(self, kid: str, lease: Lease, rule: P.Rule, seconds: float | None) -> P.KernelState:
        now = self.clock()
        state = self.states.get(kid, P.FRESH)
        seen = self.seen.get(kid)
        over = bool(seen and seen.facts.memory_used is not None and seen.facts.memory_limit is not None
                    and seen.facts.isolation == "soft" and seen.facts.memory_used > seen.facts.memory_limit)
        new = P.snooze(state, rule, now, seconds, over_memory=over)  # raises SnoozeRefused
        self.states[kid] = new
        await self.record("snoozed", lease, "user",
                          f"Snoozed until {time.strftime('%H:%M', time.localtime(new.snoozed_until))}; "
                          f"{P.snoozes_left(new, rule)} snooze(s) left.", rule, deadline=new.snoozed_until)
        return new

    def release(self, kid: str, lease: Lease, rule: P.Rule) -> str:
        """Give the slice back now, as the rule says (hibernate where it can, else shut down)."""
        can, why = self.hibernation(kid, lease)
        action, note = P.release_action(rule, can, why)
        message = ("Hibernated at your request: the GPU slice is back in the pool, your variables are kept."
                   if action == P.HIBERNATE else "Shut down at your request: the GPU slice is back in the pool.")
        self.states[kid] = P.FRESH
        self.spawn(kid, self.carry_out(kid, lease, rule, action, "user", message, note, user_release=True))
        return action

    # -- what others did (refusals, the queue) -------------------------------------------------------

    async def _follow_journal(self, snapshot: Snapshot) -> None:
        owner = self.backend.owner
        entries = await self.backend.journal(kinds=("refused",), owner=owner, limit=50)
        if self._journal_seq is None:  # at start: only what happens from now on
            self._journal_seq = max((e.seq for e in entries), default=0)
        else:
            for e in sorted(entries, key=lambda e: e.seq):
                if e.seq <= self._journal_seq:
                    continue
                self._journal_seq = e.seq
                self.emit("refused", kernel_id=e.kernel_id or "", user=e.owner or owner, reason=e.reason,
                          message=str(e.detail.get("message", "")), profile=e.detail.get("profile"))
                metrics.count("refused", e.reason)
        mine = [w for w in snapshot.waiters if w.owner == owner]
        for w in mine:
            if w.id not in self._waiters_seen:
                self.emit("queued", kernel_id=w.kernel_id, user=w.owner, reason="pool_exhausted",
                          message=f"Waiting for a GPU slice ({w.profile}): position {w.position} in the queue.",
                          profile=w.profile)
        self._waiters_seen = {w.id for w in mine}

    def _update_metrics(self, snapshot: Snapshot, kernels: dict) -> None:
        per_kernel = {}
        for kid, (_, lease) in kernels.items():
            r = self.sampler.reading(kid)
            per_kernel[kid] = (lease.owner, lease.profile, r.utilization if r else None, r.memory_used if r else None)
        devices = {u.gpu.uuid: d for u in snapshot.gpus
                   if (d := self.sampler.device_utilization(u.gpu.uuid)) is not None}
        profiles = getattr(getattr(self.backend, "settings", None), "profiles", {})
        metrics.COLLECTOR.view = metrics.MetricsView(snapshot, profiles, devices, per_kernel)

    async def stop(self) -> None:
        for task in list(self.tasks):
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=30)
            except Exception:
                task.cancel()


def _ts(value) -> float | None:
    if value is None:
        return None
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def _get(result, key: str):
    return result.get(key) if isinstance(result, dict) else getattr(result, key, None)
