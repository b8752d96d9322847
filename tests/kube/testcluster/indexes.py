"""The store's indexes of its objects, kept on every write: by resource, by uid, by owner (an owner's
dependents, and the dependents whose owners went or changed since the garbage collector last looked, as the
real collector's graph follows events), the objects being deleted, and a few fields that selectors name."""

from __future__ import annotations

from collections import defaultdict

from .selectors import field_value

Key = tuple[tuple[str, str], str, str]  # (kind.key, namespace or "", name)
# Fields a list's selector finds through an index rather than a walk over every object of the resource (a
# starting kernel's Events by its pod's uid, a node's pods): the result is the same.
INDEXED_FIELDS = {("", "events"): ("involvedObject.uid", "involvedObject.name"), ("", "pods"): ("spec.nodeName",)}


class Indexes:
    def __init__(self) -> None:
        self.of_resource: dict[tuple[str, str], dict[Key, dict]] = defaultdict(dict)
        self.by_uid: dict[str, Key] = {}
        self.dependents: dict[str, set[Key]] = defaultdict(set)  # owner uid -> keys of objects it owns
        self.owners_changed: set[Key] = set()  # dependents whose owners went or changed since the collector looked
        self.terminating: set[Key] = set()  # objects with a deletionTimestamp
        self.by_field: dict[tuple[tuple[str, str], str], dict[str, set[Key]]] = defaultdict(lambda: defaultdict(set))

    def add(self, key: Key, obj: dict) -> None:
        meta = obj["metadata"]
        self.of_resource[key[0]][key] = obj
        self.by_uid[meta["uid"]] = key
        for ref in meta.get("ownerReferences") or []:
            if ref.get("uid"):
                self.dependents[ref["uid"]].add(key)
        if meta.get("ownerReferences"):
            self.owners_changed.add(key)  # its owners may be gone already
        if meta.get("deletionTimestamp"):
            self.terminating.add(key)
        for path in INDEXED_FIELDS.get(key[0], ()):
            self.by_field[(key[0], path)][field_value(obj, path)].add(key)

    def remove(self, key: Key, old: dict) -> None:
        meta = old["metadata"]
        self.of_resource[key[0]].pop(key, None)
        self.by_uid.pop(meta["uid"], None)
        for ref in meta.get("ownerReferences") or []:
            owned = self.dependents.get(ref.get("uid"))
            if owned is not None:
                owned.discard(key)
                if not owned:
                    del self.dependents[ref["uid"]]
        self.owners_changed |= self.dependents.get(meta["uid"], set())  # gone, or orphaning from now on
        self.terminating.discard(key)
        for path in INDEXED_FIELDS.get(key[0], ()):
            held = self.by_field[(key[0], path)]
            value = field_value(old, path)
            held[value].discard(key)
            if not held[value]:
                del held[value]

    def candidates(self, resource: tuple[str, str], equalities: dict[str, str], objects: dict[Key, dict]) -> dict:
        """The objects of a resource a selector's ``path=value`` terms may match: all of them, or, where a term
        names an indexed field, those with that value."""
        for path, value in equalities.items():
            if path in INDEXED_FIELDS.get(resource, ()):
                return {k: objects[k] for k in self.by_field[(resource, path)].get(value, ())}
        return self.of_resource.get(resource, {})
