"""Watches: who is told of each write, and the history a watch resumes from.

Every write is kept (the last ``HISTORY``) so that a watch can resume from the version its client last
saw; an older version gets ``410 Gone``, as after a real server's compaction.  Watches see an object move
in and out of their selectors as ``ADDED`` / ``DELETED``, as on a real server.  A write is offered only to
the watches of its own resource (an index by resource), so a busy resource's writes cost nothing to the
watches of the others.

The objects in a ``Change`` are the store's own (never changed in place once written): an in-process
watcher (the scheduler, the kubelets) must not change what it is given.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass, field

from .errors import ApiError
from .kinds import Kind

HISTORY = 100_000


@dataclass
class Change:
    rv: int
    kind: Kind
    type: str  # ADDED / MODIFIED / DELETED
    old: dict | None
    new: dict


@dataclass(eq=False)
class Watcher:
    kind: Kind
    namespace: str | None
    labels: object
    fields: object
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    quiet: bool = False  # stalled (faults.py): sent nothing until the stall ends with a 410
    remote: bool = False  # a client's watch stream (faults and restarts reach these only, not the cluster's own)

    def matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels(meta.get("labels") or {}) and self.fields(obj)  # type: ignore[operator]

    def event(self, change: Change) -> dict | None:
        was = self.matches(change.old) if change.type != "ADDED" else False
        now = self.matches(change.new) if change.type != "DELETED" else False
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.new} if self.matches(change.new) else None
        if was and now:
            return {"type": "MODIFIED", "object": change.new}
        if now:
            return {"type": "ADDED", "object": change.new}
        if was:
            return {"type": "DELETED", "object": change.new}
        return None


class Watches:
    """The open watches (by resource) and the history of writes."""

    def __init__(self) -> None:
        self.history: deque[Change] = deque(maxlen=HISTORY)
        self.by_resource: dict[tuple[str, str], set[Watcher]] = defaultdict(set)
        self.stalled: set[str] = set()  # plurals whose watches are quiet (faults.py)

    def __iter__(self):
        for watchers in list(self.by_resource.values()):
            yield from list(watchers)

    def oldest(self, current: int) -> int:
        """The oldest version the history still holds (``current + 1`` when it holds none)."""
        return self.history[0].rv if self.history else current + 1

    def publish(self, change: Change) -> None:
        self.history.append(change)
        for watcher in list(self.by_resource.get(change.kind.key, ())):
            if not watcher.quiet:
                event = watcher.event(change)
                if event:
                    watcher.queue.put_nowait(event)

    def add(self, watcher: Watcher) -> None:
        if watcher.remote and watcher.kind.plural in self.stalled:
            watcher.quiet = True
        self.by_resource[watcher.kind.key].add(watcher)

    def replay(self, watcher: Watcher, since: int, current: int) -> bool:
        """Queue every event after ``since`` for a new watch; False (and a 410 ERROR queued) when the history
        no longer reaches back that far."""
        oldest = self.oldest(current)
        if since < oldest - 1:
            watcher.queue.put_nowait({"type": "ERROR", "object": ApiError(
                410, "Expired", f"too old resource version: {since} ({oldest - 1})").status()})
            return False
        key = watcher.kind.key
        for change in self.history:
            if change.rv > since and change.kind.key == key:
                event = watcher.event(change)
                if event:
                    watcher.queue.put_nowait(event)
        return True

    def remove(self, watcher: Watcher) -> None:
        self.by_resource.get(watcher.kind.key, set()).discard(watcher)

    def close_all(self) -> None:
        """End every watch (the cluster is stopping)."""
        for watcher in self:
            watcher.queue.put_nowait(None)

    # -- faults (faults.py) and restarts: clients' watch streams only --

    def cut(self, plurals: set[str] | frozenset[str] | None = None) -> None:
        """End the watch streams of these resources (of all, for None): their clients watch again."""
        for watcher in self:
            if watcher.remote and (plurals is None or watcher.kind.plural in plurals):
                watcher.queue.put_nowait(None)

    def stall(self, plurals: set[str]) -> None:
        """Watch streams of these resources go quiet: what would be sent to them is lost."""
        self.stalled |= plurals
        for watcher in self:
            if watcher.remote and watcher.kind.plural in plurals:
                watcher.quiet = True

    def compact(self) -> None:
        """The history is gone (etcd compacted it, or a restarted API server's watch cache starts afresh):
        a watch resuming from an older version gets a 410."""
        self.history.clear()

    def resume(self, current: int) -> None:
        """End a stall as a compaction would: the history is gone, and every quiet watch gets a 410."""
        self.stalled.clear()
        self.compact()
        for watcher in self:
            if watcher.quiet:
                watcher.queue.put_nowait({"type": "ERROR", "object": ApiError(
                    410, "Expired", f"too old resource version (compacted at {current})").status()})
