"""The one place where what happened to a kernel is put on record: the journal (the pool's own
record, which the UI's "What happened" list and the admin's decision log read), the
``kernel-action`` event (pushed to JupyterLab) and the metrics, with a log line.

The culler (warnings, snoozes, culls, hibernations it ordered), the hibernation hook (resumes,
evictions, failures) and the handlers all call :meth:`Recorder.record`; none of them emits or
counts on its own, so nothing is announced twice.
"""

from __future__ import annotations

import logging

from ..pool import Lease
from ..pool.words import notebook_label
from . import events, metrics
from .notebooks import Notebooks
from .sleep.timers import AFTER_CELL, HINT_UNUSED

log = logging.getLogger(__name__)

# Journal kinds announced under another event action (the event schema's enum).
_EVENT_ACTION = {"hibernation_failed": "refused"}
# What an admin reads at WARNING: a kernel shut down, hibernated, or failing to.  A hibernation between
# cells or after an unused hint is routine (a line per cell in a lab) and loses nothing: INFO.
_LOUD = ("culled", "hibernated", "hibernation_failed")
_QUIET = (AFTER_CELL, HINT_UNUSED)


def named(name: str, kernel_id: str) -> str:
    """A kernel as a log line names it: its notebook, with the kernel's id to find it in jupyter_server's lines."""
    return f"{name!r} (kernel {kernel_id[:8]})" if notebook_label(name) else f"kernel {kernel_id}"


class Recorder:
    def __init__(self, backend, event_logger=None, notebooks: Notebooks | None = None):
        self.backend = backend
        self.event_logger = event_logger
        self.notebooks = notebooks or Notebooks()  # the entry names the notebook as it is called now

    async def record(self, kind: str, lease: Lease, *, reason: str = "", message: str = "", rule: str | None = None,
                     dry_run: bool = False, deadline: float | None = None, action: str | None = None,
                     note: str | None = None, duration: float | None = None, bytes: int | None = None,
                     declared: bool = False, name: str | None = None, extra: dict | None = None) -> None:
        """Journal, event, metric and log line for one thing that happened to ``lease``'s kernel.

        ``action``: what was (or will be) done (hibernate, shutdown, resume); ``rule``: the policy rule
        that decided it; ``note``: why it was done another way (hibernation unavailable, so shut down);
        ``declared``: a hibernation or resume on declared GPUs (no GPU memory to move); ``name``: the
        kernel's notebook as named before it was shut down (by default, as it is named now)."""
        if name is None:
            name = await self.notebooks.name(lease)
        detail = {"source": "policy", "message": message, "dry_run": dry_run, "rule": rule, "action": action,
                  "profile": lease.profile, "name": name, **(extra or {})}
        for key, value in (("deadline", deadline), ("note", note), ("duration", duration), ("bytes", bytes)):
            if value is not None:
                detail[key] = value
        if declared:
            detail["declared"] = True
        try:
            await self.backend.record(kind, lease_id=lease.id, kernel_id=lease.kernel_id, owner=lease.owner,
                                      reason=reason, detail=detail)
        except Exception:  # the journal explains; its failure must not stop the policy
            log.exception("could not journal %s of kernel %s", kind, lease.kernel_id)
        self.announce(_EVENT_ACTION.get(kind, kind), kernel_id=lease.kernel_id, user=lease.owner,
                      reason=reason if kind not in _EVENT_ACTION else kind, message=message, profile=lease.profile,
                      deadline=deadline, dry_run=dry_run, duration=duration, bytes=bytes, declared=declared)
        metrics.count_move(kind, action, dry_run, duration, bytes)
        loud = kind in _LOUD and not dry_run and not (kind == "hibernated" and reason in _QUIET)
        (log.warning if loud else log.info)(
            "GPU pool %s%s %s of %s: %s", "(dry run) " if dry_run else "", kind, named(name, lease.kernel_id),
            lease.owner, message)

    def announce(self, action: str, *, kernel_id: str, user: str, reason: str, message: str,
                 profile: str | None = None, deadline: float | None = None, dry_run: bool = False,
                 duration: float | None = None, bytes: int | None = None, declared: bool = False) -> None:
        """The event and the action counter only, for what is on the journal already (a refusal the
        ledger wrote, a queued start)."""
        metrics.count(action, reason, dry_run)
        try:
            events.emit(self.event_logger, events.kernel_action(
                action, kernel_id=kernel_id, user=user, reason=reason, message=message, profile=profile,
                deadline=deadline, dry_run=dry_run, duration=duration, bytes=bytes, declared=declared))
        except Exception:  # an event is a notification; its failure must not stop the policy
            log.exception("could not emit the %s event", action)
