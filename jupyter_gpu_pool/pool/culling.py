"""What a culling pass knows of one kernel, as the idle policy's facts.

Pure, and the one place this is decided: the server's culler (real kernels, NVML readings) and the
planner's replay (a recorded or synthetic workload in virtual time) both build each kernel's
:class:`~jupyter_gpu_pool.pool.policy.Facts` here and ask :func:`~jupyter_gpu_pool.pool.policy.decide`,
so that a replay decides what the live pool would have.
"""

from __future__ import annotations

from .budgets import WARN_AT, Standing
from .leases import ACTIVE, HIBERNATED, Lease
from .policy import Facts


def busy_since(previous: float | None, execution_state: str, last_activity: float | None, now: float) -> float | None:
    """When the kernel's running execution began, as passes see it: kept from the pass that first saw
    it busy (its last activity then, or the pass's time); None once it is not busy."""
    if execution_state != "busy":
        return None
    if previous is not None:
        return previous
    return min(now, last_activity or now)


def budget_facts(standing: Standing) -> dict:
    """The policy's facts of an owner's tightest budget: when their active slices reach 90% and 100%."""
    return {"budget_warn_at": standing.reaches(WARN_AT), "budget_due": standing.reaches(1.0),
            "budget_used": standing.spent, "budget_limit": standing.limit,
            "budget_period": standing.scope.budget.period}


def kernel_facts(lease: Lease, *, execution_state: str, last_activity: float | None, busy_since: float | None,
                 gpu_active: float | None, gpu_idle_since: float | None, memory_used: int | None,
                 can_hibernate: bool, why: str | None, budget: Standing | None = None,
                 resumed: float | None = None) -> Facts:
    """One kernel's facts.  ``last_activity``: the kernel's own (None: none seen, its lease's start
    counts); ``gpu_active``: the last time it used its GPU above its rule's threshold (a kernel using
    its GPU is not idle, whatever it prints); GPU readings of a hibernated kernel are ignored.
    ``resumed``: when a resume its user asked for (their Resume, a cell) last put it back on its slice:
    its idle clocks start there, so a kernel just asked for is not judged idle for the time before."""
    activity = last_activity or lease.created
    if gpu_active is not None:
        activity = max(activity, gpu_active)
    awake = lease.state != HIBERNATED
    if resumed is not None and awake:
        activity = max(activity, resumed)
        gpu_idle_since = None if gpu_idle_since is None else max(gpu_idle_since, resumed)
    return Facts(
        kernel_id=lease.kernel_id,
        state=lease.state,
        execution_state=execution_state,
        last_activity=activity,
        started=lease.created,
        state_since=lease.state_since,
        busy_since=busy_since,
        isolation=lease.isolation,
        memory_used=memory_used if awake else None,
        memory_limit=lease.total_memory,
        gpu_idle_since=gpu_idle_since if awake else None,
        can_hibernate=can_hibernate,
        hibernate_unavailable=why,
        **(budget_facts(budget) if budget is not None and lease.state == ACTIVE else {}),
    )
