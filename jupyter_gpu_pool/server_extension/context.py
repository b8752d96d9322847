"""What the REST views read of this server: one small, read-only :class:`ServerContext`.

The views (``views``, ``dashboard``), the handlers and the activity trace read the kernel manager,
the sampler, the hibernation hook, the policy, the notebook each kernel serves (jupyter_server's
sessions) and the culler's memory of each kernel (its warning and snoozes, the last pass's facts,
the actions under way).  They read them here, never through the
culler: the culler owns that memory and acts; this context only shows it (the mappings are
read-only views of the culler's own, so they are always current).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..devices.telemetry import Sampler
from ..pool import Lease
from ..pool import policy as P
from ..pool.rules import Policy
from ..pool.profiles import MPS
from ..pool.words import MPS_CANNOT_HIBERNATE
from .backends.base import PoolBackend
from .sleep.hook import HibernationHook
from .notebooks import Notebooks


@dataclass
class Seen:
    """What the last pass learned about one kernel (the ``me`` view reads it)."""

    rule: P.Rule
    facts: P.Facts
    decision: P.Decision


@dataclass(frozen=True)
class Acting:
    """An action of this server under way on one kernel: what it does (hibernate or shutdown), since when."""

    task: asyncio.Task
    action: str
    since: float


@dataclass(frozen=True)
class ServerContext:
    km: Any  # jupyter_server's kernel manager
    backend: PoolBackend
    sampler: Sampler
    hook: Callable[[], HibernationHook]  # the extension's hibernation hook, as it is now
    states: Mapping[str, P.KernelState]  # the policy's memory of each kernel: warnings given, snoozes used
    seen: Mapping[str, Seen]  # the last pass's facts and decision, per kernel
    acting: Mapping[str, Acting]  # this server's actions under way, by kernel
    passes: Callable[[], int]  # culling passes done
    notebooks: Notebooks = field(default_factory=Notebooks)  # which notebook each kernel serves now

    @property
    def hibernator(self) -> HibernationHook:
        return self.hook()

    @property
    def policy(self) -> Policy:
        return self.backend.policy

    def busy(self, kernel_id: str) -> bool:
        """An action of this server on the kernel is under way."""
        return kernel_id in self.acting

    def doing(self, kernel_id: str) -> str | None:
        """The action of this server under way on the kernel (hibernate or shutdown), or None."""
        found = self.acting.get(kernel_id)
        return found.action if found is not None else None

    def kernel(self, kernel_id: str):
        """This server's kernel manager of the kernel, or None (another server's, or shut down meanwhile)."""
        try:
            return self.km.get_kernel(kernel_id) if kernel_id in self.km else None
        except KeyError:
            return None

    def rule_for(self, kernel, lease: Lease) -> P.Rule:
        """The rule that governs a kernel; one of another server (``kernel`` None) by its lease alone."""
        name = (kernel.kernel_name or "") if kernel is not None else ""
        return self.policy.rule_for(lease.owner, lease.groups, lease.profile, name)

    def hibernation(self, lease: Lease) -> tuple[bool, str | None]:
        """Whether this kernel can hibernate now, and why not."""
        if lease.isolation == MPS:
            return False, MPS_CANNOT_HIBERNATE
        try:
            ok, why = self.hibernator.can_hibernate(lease)
        except Exception as e:  # the hook must not break a culling pass
            return False, f"the hibernator failed: {e}"
        return bool(ok), why
