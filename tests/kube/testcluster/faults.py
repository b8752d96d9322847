"""Faults a test injects into the test API server (``POST /testcluster/faults``), to show that the
product's watches and lists survive what a real cluster does to them now and then.

A body is one of:

- ``{"resources": ["gpukernels"], "status": 503, "seconds": 3}``: requests for those resources (by
  plural; ``"verbs"`` narrows them: ``["list", "watch"]``) answer that status for that long, as an API
  server behind a load balancer does while it restarts; their open watch streams end at once, so
  that their clients ask again (and meet the fault);
- ``{"resources": ["pods"], "verbs": ["list"], "hang": true, "seconds": 5}``: those requests get no
  answer for that long (a half-open connection), then the real one;
- ``{"stall": ["gpukernels", "gpuquotas"]}``: watches of those resources go quiet (what they would
  have been sent is lost: the client's watch is down without knowing it), until
- ``{"resume": true}``: the history is compacted, as etcd's is while a client is away, and every quiet
  watch gets a ``410 Gone``: its client must list afresh, and an object deleted meanwhile is simply not
  listed (no DELETED event reaches it);
- ``{"restart": true, "seconds": 2}``: the API server restarts, its state kept (as etcd keeps it): every
  connection is closed and every watch stream cut at once, nothing answers (connections are refused) for
  that long, and it comes back on the same address with its history compacted (a restarted server's
  watch cache starts afresh), so a watch resuming from before the restart gets a ``410 Gone``.  The
  cluster's own controllers (scheduler, kubelets, garbage collector) carry on meanwhile, as they do
  where several API servers serve one cluster and the one the clients use restarts;
- ``{"gc_delay": 5}``: the garbage collector acts on a dependent that long after its owner went
  (``garbage.py``; ``--gc-delay`` sets it at start);
- ``{"clear": true}``: no more faults.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from .errors import ApiError
from .store import Store


@dataclass
class Fault:
    resources: frozenset[str]
    verbs: frozenset[str] | None
    until: float
    status: int = 0
    hang: bool = False

    def applies(self, plural: str, verb: str, now: float) -> bool:
        return now < self.until and plural in self.resources and (self.verbs is None or verb in self.verbs)


class Faults:
    def __init__(self, store: Store, restart: Callable[[float], Awaitable[None]] | None = None):
        self.store = store
        self.restart = restart  # the HTTP face's restart (apiserver.py)
        self.active: list[Fault] = []
        self._restarting: asyncio.Task | None = None

    def apply(self, body: dict) -> None:
        if body.get("clear"):
            self.active.clear()
            return
        if "stall" in body:
            self.store.watches.stall(set(body["stall"]))
            return
        if body.get("resume"):
            self.store.watches.resume(self.store.rv)
            return
        if "gc_delay" in body:
            self.store.gc.delay = _seconds(body["gc_delay"], "gc_delay")
            return
        if body.get("restart"):
            if self.restart is None or (self._restarting is not None and not self._restarting.done()):
                raise ApiError(409, "Conflict", "the API server cannot restart now")
            self._restarting = asyncio.get_running_loop().create_task(
                self.restart(_seconds(body.get("seconds", 1), "seconds")))
            return
        resources = frozenset(body.get("resources") or ())
        if not resources or not (body.get("status") or body.get("hang")):
            raise ApiError(400, "BadRequest", "a fault names its resources and a status or hang")
        fault = Fault(resources, frozenset(body["verbs"]) if body.get("verbs") else None,
                      time.monotonic() + float(body.get("seconds", 1)), int(body.get("status") or 0),
                      bool(body.get("hang")))
        self.active.append(fault)
        if fault.status and (fault.verbs is None or "watch" in fault.verbs):
            self.store.watches.cut(resources)

    def cancel(self) -> None:
        """No more faults, and no restart under way (the cluster's run is over)."""
        self.active.clear()
        if self._restarting is not None:
            self._restarting.cancel()

    async def check(self, plural: str, verb: str) -> None:
        """Raise the status a fault answers for this request, or hold it while a hang lasts."""
        now = time.monotonic()
        for fault in list(self.active):
            if not fault.applies(plural, verb, now):
                continue
            if fault.hang:
                await asyncio.sleep(fault.until - now)
                continue
            raise ApiError(fault.status, "ServiceUnavailable" if fault.status == 503 else "InternalError",
                           f"the test cluster's injected fault: {fault.status} for {plural}")
        self.active = [f for f in self.active if f.until > time.monotonic()]


def _seconds(value, name: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 <= seconds <= 3600:
        raise ApiError(400, "BadRequest", f"{name} must be a number of seconds from 0 to 3600, not {value!r}")
    return seconds
