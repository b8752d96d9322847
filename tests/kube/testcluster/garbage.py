"""The garbage collector and the namespace controller of the test cluster.

Dependents whose owners are all gone are deleted (background propagation); an owner deleted with
``Orphan`` has its dependents' references removed; a ``Foreground`` owner goes once its blocking
dependents are gone; a terminating namespace empties, then goes.  Owners are matched by uid, as the real
collector does: an object of the same name made again is another owner.

``delay``: a real garbage collector acts on a dependent some time after its owner went (its graph builder
follows watch events, and under load that takes seconds), and meanwhile the dependent, a pod or a Secret,
still holds its name.  With a delay (``--gc-delay``, or the ``gc_delay`` fault), a dependent whose owner is
gone is acted on only that long after the collector first saw it so; 0 (the default) acts at the next
pass.  The namespace controller and foreground and orphan deletion are not delayed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from .indexes import Key

if TYPE_CHECKING:
    from .store import Store

MERGE = "application/merge-patch+json"


class GarbageCollector:
    def __init__(self, store: Store, delay: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.delay = delay
        self.clock = clock
        self._waiting: dict[Key, tuple[str, float]] = {}  # dependents in their delay: (uid, first seen orphaned)

    def collect(self) -> int:
        """One pass; how many objects it acted on."""
        return self._owners_gone() + self._terminating()

    def _owners_gone(self) -> int:
        """The dependents whose owners went or changed since the last pass (the store marks them, as the
        real collector's graph follows events), and those still in their delay."""
        store, now, acted = self.store, self.clock(), 0
        look, store.index.owners_changed = store.index.owners_changed | set(self._waiting), set()
        waiting: dict[Key, tuple[str, float]] = {}
        for key in look:
            obj = store.objects.get(key)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            alive = [ref for ref in refs if self._owner_holds(ref)]
            if len(alive) == len(refs):
                continue
            uid = obj["metadata"]["uid"]
            since = self._waiting.get(key, (uid, now))
            since = since if since[0] == uid else (uid, now)  # another object of that name: its own delay
            kind = store.kind_by_key(key[0])
            if now - since[1] < self.delay or kind is None:
                waiting[key] = since
                continue
            acted += 1
            if alive:
                store.patch(kind, key[1] or None, key[2], MERGE, {"metadata": {"ownerReferences": alive}})
            elif any(store.index.by_uid.get(r.get("uid")) for r in refs):  # every owner orphans it
                store.patch(kind, key[1] or None, key[2], MERGE, {"metadata": {"ownerReferences": None}})
            else:
                store.delete(kind, key[1] or None, key[2], {"propagationPolicy": "Background"})
        self._waiting = waiting
        return acted

    def _owner_holds(self, ref: dict) -> bool:
        """Whether the owner a reference names (by uid) exists and is not orphaning its dependents."""
        key = self.store.index.by_uid.get(ref.get("uid"))
        owner = self.store.objects.get(key) if key else None
        return owner is not None and "orphan" not in (owner["metadata"].get("finalizers") or [])

    def _terminating(self) -> int:
        store, acted = self.store, 0
        for key in list(store.index.terminating):
            obj, kind = store.objects.get(key), store.kind_by_key(key[0])
            if obj is None or kind is None:
                continue
            finalizers = list(obj["metadata"].get("finalizers") or [])
            if "foregroundDeletion" in finalizers:
                acted += self._foreground(key, obj, kind, finalizers)
            elif "orphan" in finalizers:
                acted += self._orphan(key, obj, kind, finalizers)
            elif kind.kind == "Namespace":
                acted += self._empty_namespace(obj, kind, finalizers)
        return acted

    def _dependents(self, uid: str) -> list[tuple[Key, dict]]:
        store = self.store
        return [(k, store.objects[k]) for k in list(store.index.dependents.get(uid, ())) if k in store.objects]

    def _foreground(self, key: Key, obj: dict, kind, finalizers: list[str]) -> int:
        store, acted, uid = self.store, 0, obj["metadata"]["uid"]
        dependents = self._dependents(uid)
        for dep_key, dep in dependents:
            dep_kind = store.kind_by_key(dep_key[0])
            if dep_kind and not dep["metadata"].get("deletionTimestamp"):
                store.delete(dep_kind, dep_key[1] or None, dep_key[2], {"propagationPolicy": "Foreground"})
                acted += 1
        blocking = [d for _, d in dependents if any(r.get("uid") == uid and r.get("blockOwnerDeletion")
                                                    for r in d["metadata"].get("ownerReferences") or [])]
        if not blocking:
            finalizers.remove("foregroundDeletion")
            store.patch(kind, key[1] or None, key[2], MERGE, {"metadata": {"finalizers": finalizers or None}})
            acted += 1
        return acted

    def _orphan(self, key: Key, obj: dict, kind, finalizers: list[str]) -> int:
        store, uid = self.store, obj["metadata"]["uid"]
        for dep_key, dep in self._dependents(uid):
            dep_kind = store.kind_by_key(dep_key[0])
            refs = [r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != uid]
            if dep_kind:
                store.patch(dep_kind, dep_key[1] or None, dep_key[2], MERGE,
                            {"metadata": {"ownerReferences": refs or None}})
        finalizers.remove("orphan")
        store.patch(kind, key[1] or None, key[2], MERGE, {"metadata": {"finalizers": finalizers or None}})
        return 1

    def _empty_namespace(self, obj: dict, kind, finalizers: list[str]) -> int:
        store, acted, name = self.store, 0, obj["metadata"]["name"]
        contents = [(k, o) for k, o in list(store.objects.items()) if k[1] == name and k[0] != kind.key]
        for c_key, c_obj in contents:
            c_kind = store.kind_by_key(c_key[0])
            if c_kind and not c_obj["metadata"].get("deletionTimestamp"):
                store.delete(c_kind, c_key[1], c_key[2], {"gracePeriodSeconds": 0})
                acted += 1
        if not contents and not finalizers:
            store.remove(kind, obj)
            acted += 1
        return acted
