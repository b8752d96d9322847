"""The idle policy's decision: which kernels give their GPU slice back, when, and how.

The rule a kernel falls under comes from :mod:`.rules` (the admin's list, parsed and checked).
:func:`decide` is pure: given one kernel's facts, its rule, the time and the
kernel's policy state (the warning given, the snoozes used) it returns what to
do and the new state.  The server's culler gathers facts and carries the
decision out; nothing here does I/O, so every case is a table row in the tests.

Lifecycle of one episode: a condition comes within ``warn`` seconds of being
due -> *warn* (with a deadline at least ``warn`` away, so every action is
warned) -> the user may *snooze* (postpones every condition but over-memory) ->
at the deadline, if the condition still holds, *act*.  If the kernel is used
again before the deadline the warning is *withdrawn*, and its snoozes are given
back once nothing is due any more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .leases import HIBERNATED
from .profiles import SOFT
from .rules import HIBERNATE, SHUTDOWN, Rule
from .units import format_duration, format_size
from .words import (ACTIONS, BUDGET, GPU_IDLE, IDLE, MAX_AGE, MAX_BUSY, MAX_HIBERNATED, OVER_MEMORY, PRESSURE,
                    RESERVED, REASONS as CATALOGUE, seconds_text, shut_down_instead, snooze_limit, this_period)

# The policy's reasons, as recorded and sent to the UI: their words are the catalogue's (``words``).
# RESERVED: chosen (pool.reclaim.choose_for_reservations) to give back room reserved for others, before their
# window or borrowed during it when a member asks; not snoozable, and using the kernel does not keep it.
REASONS = (IDLE, GPU_IDLE, MAX_BUSY, MAX_AGE, MAX_HIBERNATED, OVER_MEMORY, BUDGET, PRESSURE, RESERVED)

# Decision verbs.
NONE = "none"
WARN = "warn"
ACT = "act"
WITHDRAW = "withdraw"


@dataclass(frozen=True, slots=True)
class Facts:
    """What the culler knows about one kernel at one moment.  Times are Unix seconds."""

    kernel_id: str
    state: str = "active"  # the lease's state: active or hibernated
    execution_state: str = "idle"  # jupyter_server's: idle, busy, starting, dead, ...
    last_activity: float = 0.0  # last user activity on the kernel (or GPU use above the threshold)
    started: float = 0.0  # when the kernel took its lease
    state_since: float = 0.0  # when the lease entered its state (hibernated since ...)
    busy_since: float | None = None  # set while busy
    isolation: str = SOFT
    memory_used: int | None = None  # bytes on the GPU (None: no reading)
    memory_limit: int | None = None
    gpu_idle_since: float | None = None  # holding GPU memory under the rule's threshold since (None: not so)
    can_hibernate: bool = False
    hibernate_unavailable: str | None = None  # why not, in words
    # The owner's tightest GPU-hour budget (None: no budget applies): when the spending of their active
    # slices reaches 90% and 100% of it at the current rate (None: not within the period), and where it is.
    budget_warn_at: float | None = None
    budget_due: float | None = None
    budget_used: float | None = None
    budget_limit: float | None = None
    budget_period: str = "week"


@dataclass(frozen=True, slots=True)
class Warning:
    reason: str
    action: str
    warned_at: float
    deadline: float
    message: str
    reservation: str = ""  # reason ``reserved``: the reservation whose room the kernel gives back (by name)


@dataclass(frozen=True, slots=True)
class KernelState:
    """The policy's memory of one kernel, kept by the culler between passes."""

    warning: Warning | None = None
    snoozes_used: int = 0
    snoozed_until: float = 0.0
    reported: str | None = None  # dry run: the reason whose action was already reported
    retry_after: float = 0.0  # a hibernation failed and was undone: nothing is due again before this


FRESH = KernelState()


@dataclass(frozen=True, slots=True)
class Decision:
    verb: str  # none, warn, act, withdraw
    state: KernelState
    reason: str | None = None
    action: str | None = None  # hibernate or shutdown
    deadline: float | None = None
    message: str = ""
    note: str | None = None  # e.g. why hibernation was unavailable
    dry_run: bool = False


def release_action(rule: Rule, can_hibernate: bool, why_not: str | None) -> tuple[str, str | None]:
    """The action the rule asks for, as this kernel can take it, and a note when it falls back."""
    if rule.action == HIBERNATE:
        if can_hibernate:
            return HIBERNATE, None
        return SHUTDOWN, shut_down_instead(why_not)
    return SHUTDOWN, None


def retry_delay(rule: Rule) -> float:
    """How long the policy leaves a kernel be after its hibernation failed and was undone (it runs on
    with its slice): the rule's idle time, else its GPU-idle time, else its warning time (a minute at least)."""
    return next((d for d in (rule.idle_timeout, rule.gpu_idle_timeout) if d), None) or max(rule.warn, 60.0)


def hibernation_failed(state: KernelState, rule: Rule, now: float) -> KernelState:
    """The state after a hibernation that failed but left the kernel running: no warning pending, and
    nothing due again before :func:`retry_delay` has passed (so that no pass tries again at once)."""
    return replace(state, warning=None, retry_after=now + retry_delay(rule))


def _conditions(facts: Facts, rule: Rule, reclaim: bool = False,
                reserved: bool = False) -> list[tuple[float, str, bool, float]]:
    """(when due, reason, snoozable, warning lead) for every limit that applies to the kernel now.
    ``reclaim``: the kernel is chosen (``pool.reclaim``) for a waiter: due already, warned ``rule.warn``
    ahead like any other action; ``reserved``: chosen to give back reserved room, the same but not
    snoozable (a snooze would keep the room from the reservation's members)."""
    found: list[tuple[float, str, bool, float]] = []
    if reserved and facts.state != HIBERNATED:
        found.append((-math.inf, RESERVED, False, rule.warn))
    if rule.max_age is not None:
        found.append((facts.started + rule.max_age, MAX_AGE, True, rule.warn))
    if facts.state == HIBERNATED:
        if rule.max_hibernated is not None:
            found.append((facts.state_since + rule.max_hibernated, MAX_HIBERNATED, True, rule.warn))
        return found
    if (facts.isolation == SOFT and facts.memory_used is not None and facts.memory_limit is not None
            and facts.memory_used > facts.memory_limit):
        found.append((float("-inf"), OVER_MEMORY, False, rule.over_memory_grace))
    # Anything but busy counts: a kernel no client ever talked to stays "starting" for jupyter_server.
    if rule.idle_timeout is not None and facts.execution_state != "busy":
        found.append((facts.last_activity + rule.idle_timeout, IDLE, True, rule.warn))
    if rule.gpu_idle_timeout is not None and facts.gpu_idle_since is not None:
        found.append((facts.gpu_idle_since + rule.gpu_idle_timeout, GPU_IDLE, True, rule.warn))
    if rule.max_busy is not None and facts.execution_state == "busy" and facts.busy_since is not None:
        found.append((facts.busy_since + rule.max_busy, MAX_BUSY, True, rule.warn))
    if facts.budget_due is not None:  # warned from 90% of the budget on, acted on at 100%; no snooze adds time
        warn_at = facts.budget_warn_at if facts.budget_warn_at is not None else facts.budget_due
        lead = facts.budget_due - warn_at if facts.budget_due > warn_at else rule.warn  # spent already: the rule's lead
        found.append((facts.budget_due, BUDGET, False, lead))
    if reclaim:
        found.append((facts.last_activity, PRESSURE, True, rule.warn))
    return found


def _earliest(conditions: list[tuple[float, str, bool, float]],
              state: KernelState) -> tuple[float, str, float] | None:
    """The condition due first, snoozes and a failed hibernation's wait counted: (effective due, reason,
    warning lead)."""
    best: tuple[float, str, float] | None = None
    for due, reason, snoozable, lead in conditions:
        effective = max(due, state.snoozed_until, state.retry_after) if snoozable else max(due, state.retry_after)
        if best is None or effective < best[0]:
            best = (effective, reason, lead)
    return best


def next_action(facts: Facts, rule: Rule, state: KernelState = FRESH) -> tuple[float, str, str] | None:
    """When the policy will act on the kernel if nothing changes (it stays idle, nobody snoozes):
    (time, reason, action), or None where no limit applies.  What a user reads on an idle kernel's
    card ("will be hibernated at 14:05 if still idle"); the warning comes ``rule.warn`` before."""
    best = _earliest(_conditions(facts, rule), state)
    if best is None:
        return None
    action = SHUTDOWN if facts.state == HIBERNATED else release_action(rule, facts.can_hibernate,
                                                                         facts.hibernate_unavailable)[0]
    return best[0], best[1], action


def _reclaiming(reclaim: bool, rule: Rule, now: float, state: KernelState, reason: str = PRESSURE) -> bool:
    """Whether a kernel chosen for a waiter (or a reservation: ``reason``) is warned for it: not where it
    was warned already of another action as soon (a second warning would only postpone it)."""
    warning = state.warning
    return reclaim and not (warning is not None and warning.reason != reason and warning.deadline <= now + rule.warn)


def decide(facts: Facts, rule: Rule, now: float, state: KernelState = FRESH, *,
           reclaim: bool = False, dry_run: bool = False, reserved: str = "", reservation: str = "") -> Decision:
    """What to do with one kernel now.  Pure: same inputs, same decision.

    ``reclaim``: the kernel is chosen to give its slice back to a waiter (``pool.reclaim``); it is
    warned for that (reason ``pressure``), and the warning is withdrawn once it is not chosen any more.
    ``reserved``: it is chosen to give back room a reservation keeps, and why in words ("reserved for ML
    101 lab from 10:00"); warned for that (reason ``reserved``, no snooze, ``Warning.reservation``: the
    ``reservation``'s name), withdrawn once not chosen."""
    conditions = _conditions(facts, rule, _reclaiming(reclaim, rule, now, state),
                             _reclaiming(bool(reserved), rule, now, state, RESERVED))
    best = _earliest(conditions, state)
    in_use = all(due - lead > now for due, _reason, _snoozable, lead in conditions)  # nothing close to due

    if best is None or best[0] - best[2] > now:
        new = state
        if in_use and (state.snoozes_used or state.snoozed_until or state.reported):
            new = KernelState()  # used again: snoozes are given back
        if state.warning is not None:
            message = "The kernel is in use again; the warning is withdrawn."
            if state.warning.reason == PRESSURE and facts.last_activity <= state.warning.warned_at:
                message = "Nobody waits for this kernel's GPU slice any more; the warning is withdrawn."
            elif state.warning.reason == RESERVED:
                message = "The reserved room no longer needs this kernel's GPU slice; the warning is withdrawn."
            return Decision(WITHDRAW, replace(new, warning=None), reason=state.warning.reason,
                            message=message, dry_run=dry_run)
        return Decision(NONE, new, dry_run=dry_run)

    effective, reason, lead = best
    if facts.state == HIBERNATED:
        action, note = SHUTDOWN, None
    else:
        action, note = release_action(rule, facts.can_hibernate, facts.hibernate_unavailable)
    if dry_run and state.reported == reason:
        return Decision(NONE, state, reason=reason, action=action, dry_run=True)

    warning = state.warning
    if warning is None or warning.reason != reason:
        deadline = max(effective, now + lead)
        message = _warning_message(reason, action, facts, rule, now, deadline, reserved)
        warning = Warning(reason, action, now, deadline, message, reservation if reason == RESERVED else "")
        return Decision(WARN, replace(state, warning=warning), reason=reason, action=action, deadline=deadline,
                        message=message, note=note, dry_run=dry_run)

    deadline = max(warning.deadline, effective)
    if now < deadline:
        if deadline != warning.deadline:
            state = replace(state, warning=replace(warning, deadline=deadline))
        return Decision(NONE, state, reason=reason, action=action, deadline=deadline, dry_run=dry_run)
    message = _action_message(reason, action, facts, rule, now, reserved)
    new = replace(state, warning=None, reported=reason if dry_run else state.reported)
    return Decision(ACT, new, reason=reason, action=action, deadline=deadline, message=message, note=note,
                    dry_run=dry_run)


def told(state: KernelState, at: float) -> KernelState:
    """The kernel's warning was put on record at ``at``, later than its pass decided it (the pass took its
    time to reach the kernel, the journal its write): its deadline moves as much later, so that its user has
    the rule's whole warning time from the moment they could know.  No warning: unchanged."""
    warning = state.warning
    if warning is None or at <= warning.warned_at:
        return state
    return replace(state, warning=replace(warning, deadline=warning.deadline + (at - warning.warned_at)))


def quiet_until(facts: Facts, rule: Rule, now: float, state: KernelState = FRESH, *, reclaim: bool = False,
                dry_run: bool = False, reserved: str = "") -> float:
    """Until when :func:`decide` keeps answering ``none`` and leaving ``state`` as it is, for these facts
    and this ``reclaim`` and ``reserved`` (``now`` itself when it might not).  A replay that knows a
    kernel's facts and whether it is chosen for a waiter stay the same skips its passes until then: the
    answer is decide's own rules read ahead, not a second policy."""
    reclaiming = _reclaiming(reclaim, rule, now, state)
    reserving = _reclaiming(bool(reserved), rule, now, state, RESERVED)
    until = _quiet_until(_conditions(facts, rule, reclaiming, reserving), now, state, dry_run)
    warning = state.warning
    for chosen, reason in ((reclaiming, PRESSURE), (reserving, RESERVED)):
        if chosen and warning is not None and warning.reason != reason:
            # from when that warning's deadline is within the rule's warning time on, the choice warns no more
            until = min(until, warning.deadline - rule.warn)
    return until


def _quiet_until(conditions: list[tuple[float, str, bool, float]], now: float, state: KernelState,
                 dry_run: bool) -> float:
    best = _earliest(conditions, state)
    if best is None or best[0] - best[2] > now:
        in_use = all(due - lead > now for due, _reason, _snoozable, lead in conditions)
        if state.warning is not None or (in_use and (state.snoozes_used or state.snoozed_until or state.reported)):
            return now  # a withdrawal, or snoozes given back: the state changes
        return best[0] - best[2] if best is not None else math.inf
    effective, reason, _lead = best
    if dry_run and state.reported == reason:
        return math.inf
    if state.warning is None or state.warning.reason != reason:
        return now
    return max(state.warning.deadline, effective)


def snoozes_left(state: KernelState, rule: Rule) -> int:
    return max(rule.max_snoozes - state.snoozes_used, 0)


class SnoozeRefused(Exception):
    """A snooze the rule does not allow; ``status`` is 400 for a bad length, 409 for none left."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def bad_snooze(rule: Rule, asked: str) -> SnoozeRefused:
    """A Keep alive of a length the rule does not allow (``asked``: what was asked, as said back), in the
    same words wherever it is refused (the REST API's check of its body, :func:`snooze`)."""
    return SnoozeRefused(400, "bad_snooze", f"A Keep alive must be a number of seconds, more than 0 and "
                                            f"{snooze_limit(rule.snooze)} under the pool's {rule.described}, not "
                                            f"{asked}.")


def snooze(state: KernelState, rule: Rule, now: float, seconds: float | None = None,
           over_memory: bool = False) -> KernelState:
    """Postpone the pending or next action by ``seconds`` (default and at most the rule's snooze)."""
    if over_memory or (state.warning is not None and state.warning.reason == OVER_MEMORY):
        raise SnoozeRefused(409, "over_memory", "A kernel over its slice's GPU memory cannot be snoozed: "
                                                "free GPU memory in the kernel (del tensors, empty the cache) "
                                                "or restart it on a larger profile.")
    if state.warning is not None and state.warning.reason == BUDGET:
        raise SnoozeRefused(409, "budget", "A snooze cannot add GPU time: this kernel gives its GPU back when your "
                                           "GPU-hour budget runs out. Save your work.")
    if state.warning is not None and state.warning.reason == RESERVED:
        raise SnoozeRefused(409, "reserved", "A snooze cannot keep reserved room: the GPU room this kernel holds is "
                                             "reserved for others, and it gives it back at the time it was warned of. "
                                             "Its variables are kept where it is hibernated.")
    if not rule.snoozable:
        raise SnoozeRefused(409, "snooze_not_allowed", f"The pool's {rule.described} allows no snoozes.")
    if snoozes_left(state, rule) == 0:
        raise SnoozeRefused(409, "no_snoozes_left",
                            f"No snoozes left: the pool's {rule.described} allows {rule.max_snoozes}, and you have used "
                            "them. Run a cell to show the kernel is in use, or save your work.")
    if seconds is None:
        seconds = rule.snooze
    if not seconds > 0 or seconds > rule.snooze:
        raise bad_snooze(rule, seconds_text(seconds))
    return KernelState(warning=None, snoozes_used=state.snoozes_used + 1,
                       snoozed_until=max(state.snoozed_until, now + seconds), reported=None)


def _what(reason: str, facts: Facts, rule: Rule, now: float, reserved: str = "") -> str:
    return CATALOGUE[reason].says(
        reserved=reserved,
        idle=format_duration(now - facts.last_activity),
        gpu_idle=format_duration(now - (facts.gpu_idle_since or now)),
        threshold=rule.gpu_idle_threshold,
        busy=format_duration(now - (facts.busy_since or now)),
        max_busy=format_duration(rule.max_busy),
        age=format_duration(now - facts.started),
        max_age=format_duration(rule.max_age),
        hibernated=format_duration(now - facts.state_since),
        max_hibernated=format_duration(rule.max_hibernated),
        used=format_size(facts.memory_used),
        limit=format_size(facts.memory_limit),
        this_period=this_period(facts.budget_period or "week"),
        spent=f"{facts.budget_used or 0:.1f}",
        budget=f"{facts.budget_limit or 0:g}",
    )


def _warning_message(reason: str, action: str, facts: Facts, rule: Rule, now: float, deadline: float,
                     reserved: str = "") -> str:
    return f"{_what(reason, facts, rule, now, reserved)}: this kernel will be {ACTIONS[action].will_be} in " \
           f"{format_duration(max(deadline - now, 0))}{CATALOGUE[reason].unless}"


def _action_message(reason: str, action: str, facts: Facts, rule: Rule, now: float, reserved: str = "") -> str:
    if reason == RESERVED:  # the admin's reservation acts, not the kernel's rule
        return f"{ACTIONS[action].done} for a reservation: {_what(reason, facts, rule, now, reserved)}."
    return f"{ACTIONS[action].done} by the pool's {rule.described}. {_what(reason, facts, rule, now)}."
