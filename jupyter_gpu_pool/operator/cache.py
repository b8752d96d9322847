"""What the operator knows of the cluster: its kernels, their pods, the quotas and policies, kept from the
watches and from its own writes (each write's answer goes in at once, so the watch event it brings back
is seen as nothing new), with the indexes that keep each decision's cost to what it concerns.

- An object older than (or as old as) the one kept is stale: it changes nothing.  A kernel whose only
  change is its server's heartbeat annotation is kept without a reconcile: the heartbeat is judged on
  the sweep (:meth:`Cache.heartbeat_seen`), so a heartbeat costs the same with 10 kernels as with 2,000.
- Pods are kept under the uid of the GPUKernel that owns them (``ownerReferences``), never under the name
  in their labels: a GPUKernel made again under an old name never sees the pods of the one before it.
- The leases that count against quotas (those that hold a slice, and the admissions on their way to the
  API server) are indexed by owner and by group; the kernels by node (hibernation and resumes); the
  kernels by phase (the metric), each kept up to date on every change instead of counted afresh; and what
  the admin's sharing reads of the room (``room.py``: each node's memory held, share groups' decayed use,
  the starts waiting for room).
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from typing import Callable

from ..cluster import resources
from ..cluster.kernels import as_lease, controller_uid, holds_quota, key, meta, status
from ..cluster.quotas import Quotas, read_quotas
from ..cluster.room import start_waiter
from ..pool import Lease
from ..pool.sharing import Sharing
from .admission import Shared
from .plan import Refusal
from .room import RoomBook

Key = tuple[str, str]  # (namespace, name) of a GPUKernel


class Intake(enum.Enum):
    STALE = "stale"  # no newer than what is kept (the answer to this operator's own write, come back)
    HEARTBEAT = "heartbeat"  # only the server's heartbeat changed: nothing to decide
    CHANGED = "changed"


def _without_heartbeat(obj: dict) -> tuple:
    m = meta(obj)
    annotations = {k: v for k, v in (m.get("annotations") or {}).items() if k != resources.ANNOTATION_HEARTBEAT}
    rest = {k: v for k, v in m.items() if k not in ("resourceVersion", "managedFields", "annotations")}
    return obj.get("spec"), obj.get("status"), rest, annotations


def _version(obj: dict | None) -> int:
    return int(meta(obj or {}).get("resourceVersion") or 0)


def is_kernel_owned(obj: dict) -> bool:
    return any(ref.get("kind") == resources.KERNEL_KIND and ref.get("controller")
               for ref in meta(obj).get("ownerReferences") or [])


class Cache:
    def __init__(self, clock: Callable[[], float], sharing: Sharing | None = None):
        self.clock = clock
        self.room = RoomBook(clock, sharing or Sharing())  # what reservations and a fair queue read
        self.kernels: dict[Key, dict] = {}
        self.pods: dict[str, dict[str, dict]] = defaultdict(dict)  # owning kernel's uid -> pod name -> pod
        self.quotas: dict[str, dict] = {}
        self.policies: dict[str, dict] = {}
        self.gone: dict[str, float] = {}  # uid -> when: kernels deleted or found gone (late events must not revive them)
        self.deleting: set[str] = set()  # uids of pods this operator asked to delete (not yet seen going)
        self.refused: dict[Key, Refusal] = {}  # kernels whose pod the API server refused: back off
        self.pods_listed: set[str] = set()  # namespaces whose kernel pods have been listed once
        self.listed = False  # whether every kernel and quota has been listed once
        self.phases: Counter = Counter()
        self._beats: dict[Key, tuple[str | None, float]] = {}  # heartbeat value, when this operator saw it change
        self._leases: dict[str, Lease] = {}  # uid -> lease of a kernel that holds its slice
        self._by_owner: dict[str, set[str]] = defaultdict(set)
        self._by_group: dict[str, set[str]] = defaultdict(set)
        self._by_node: dict[str, set[Key]] = defaultdict(set)
        self._indexed: dict[Key, tuple[str, str]] = {}  # key -> (phase, node) it is counted under
        self._quotas: Quotas | None = None

    # -- kernels ---------------------------------------------------------------------------------

    def remember(self, body: dict) -> Intake:
        """Keep a kernel as listed, watched or written, unless an older one or a deleted one; what it means."""
        if meta(body).get("uid") in self.gone:
            return Intake.STALE
        k = key(body)
        old = self.kernels.get(k)
        if old is not None and meta(old).get("uid") != meta(body).get("uid"):  # made again under its name
            self.forget(k, meta(old).get("uid"), gone=True)
            old = None
        if old is not None and _version(body) <= _version(old):
            return Intake.STALE
        self.kernels[k] = body
        beat = (meta(body).get("annotations") or {}).get(resources.ANNOTATION_HEARTBEAT)
        if k not in self._beats or self._beats[k][0] != beat:
            self._beats[k] = (beat, self.clock())
        if old is not None and _without_heartbeat(old) == _without_heartbeat(body):
            return Intake.HEARTBEAT
        self._index(k, body)
        return Intake.CHANGED

    def forget(self, k: Key, uid: str | None, *, gone: bool = False) -> None:
        """Drop what is kept about a kernel (``gone``: deleted, so that a late event cannot bring it back)."""
        if gone and uid:
            self.gone.setdefault(uid, self.clock())
        self.kernels.pop(k, None)
        self._beats.pop(k, None)
        self.refused.pop(k, None)
        self._unindex(k)
        if uid:
            self._drop_lease(uid)
            self.room.count(uid, None)
            self.room.wait(uid, None)

    def heartbeat_seen(self, k: Key) -> float | None:
        """When this operator last saw the kernel's heartbeat change (its own clock: skew does not matter)."""
        seen = self._beats.get(k)
        return seen[1] if seen else None

    def _index(self, k: Key, kernel: dict) -> None:
        self._unindex(k)
        phase, node = status(kernel).get("phase") or resources.PENDING, status(kernel).get("node") or ""
        self._indexed[k] = (phase, node)
        self.phases[phase] += 1
        if node:
            self._by_node[node].add(k)
        uid = meta(kernel).get("uid", "")
        self._drop_lease(uid)
        lease = as_lease(kernel) if holds_quota(kernel) else None
        if lease is not None:
            self._add_lease(uid, lease)
        self.room.count(uid, lease, seed=not self.listed)
        self.room.wait(uid, start_waiter(kernel, self.clock()))

    def _unindex(self, k: Key) -> None:
        if k not in self._indexed:
            return
        phase, node = self._indexed.pop(k)
        self.phases[phase] -= 1
        if node:
            self._by_node[node].discard(k)
            if not self._by_node[node]:
                del self._by_node[node]

    # -- what counts against quotas ------------------------------------------------------------------

    def _add_lease(self, uid: str, lease: Lease) -> None:
        self._leases[uid] = lease
        self._by_owner[lease.owner].add(uid)
        for group in lease.groups:
            self._by_group[group].add(uid)

    def _drop_lease(self, uid: str) -> None:
        lease = self._leases.pop(uid, None)
        if lease is None:
            return
        for index, name in [(self._by_owner, lease.owner), *((self._by_group, g) for g in lease.groups)]:
            index[name].discard(uid)
            if not index[name]:
                del index[name]

    def holding(self, owner: str, groups: tuple[str, ...], but: str | None) -> tuple[Lease, ...]:
        """The leases an admission of ``owner`` counts: theirs and those of their groups, but ``but``'s."""
        uids = set(self._by_owner.get(owner, ()))
        for group in groups:
            uids |= self._by_group.get(group, set())
        uids.discard(but)
        return tuple(self._leases[u] for u in uids)

    def hold(self, kernel: dict, admitted: dict, on: str = "") -> None:
        """Count an admission from the moment it is decided, before its status write lands (so that the
        next admission, decided meanwhile, counts it); the write's answer, or :meth:`unhold`, replaces it.
        ``on``: the node entry the admission counted it on, where its pod is not placed yet."""
        held = {**kernel, "status": {**status(kernel), "admitted": admitted, "phase": resources.STARTING}}
        uid, lease = meta(kernel)["uid"], as_lease(held)
        self._drop_lease(uid)
        self._add_lease(uid, lease)
        self.room.wait(uid, None)
        if on:
            self.room.guess(uid, on, lease)
        else:
            self.room.count(uid, lease)

    def unhold(self, kernel: dict) -> None:
        """An admission whose write failed: count the kernel as it is kept."""
        uid = meta(kernel)["uid"]
        self._drop_lease(uid)
        kept = self.kernels.get(key(kernel))
        lease = as_lease(kept) if kept is not None and meta(kept).get("uid") == uid and holds_quota(kept) else None
        if lease is not None:
            self._add_lease(uid, lease)
        self.room.count(uid, lease)

    def shared(self, now: float) -> Shared:
        """What an admission reads for the admin's sharing while a reservation keeps room."""
        return self.room.shared(now, self._members)

    def _members(self, users: tuple[str, ...], groups: tuple[str, ...]) -> list[tuple[Lease, str]]:
        """The leases of ``users`` and of the members of ``groups``, each with the node it counts on."""
        uids: set[str] = set()
        for user in users:
            uids |= self._by_owner.get(user, set())
        for group in groups:
            uids |= self._by_group.get(group, set())
        return [(self._leases[u], self.room.where(u, self._leases[u])) for u in uids]

    def kernels_on(self, node: str) -> list[dict]:
        return [self.kernels[k] for k in self._by_node.get(node, ()) if k in self.kernels]

    # -- pods ------------------------------------------------------------------------------------

    def pod_seen(self, event_type: str | None, pod: dict) -> Key | None:
        """Keep (or drop) a kernel pod; the kernel to look at again, if one of that name is kept."""
        if not is_kernel_owned(pod):
            return None  # not made by this operator for a kernel
        owner, name = controller_uid(pod) or "", meta(pod)["name"]
        pods = self.pods[owner]
        kept = pods.get(name)
        if event_type == "DELETED":
            pods.pop(name, None)
            self.deleting.discard(meta(kept or pod).get("uid"))
        elif kept is None or meta(kept).get("uid") != meta(pod).get("uid") or _version(pod) > _version(kept):
            pods[name] = pod
        else:
            return None  # what is kept already (this operator's own create, come back)
        if not pods:
            del self.pods[owner]
        k = (meta(pod)["namespace"], (meta(pod).get("labels") or {}).get(resources.LABEL_KERNEL, ""))
        return k if k in self.kernels else None

    def pods_listed_in(self, namespace: str, items: list[dict]) -> None:
        """A fresh listing of a namespace's kernel pods: what it lacks is gone."""
        listed = {meta(p).get("uid") for p in items}
        for owner, pods in list(self.pods.items()):
            for name, pod in list(pods.items()):
                if meta(pod).get("namespace") == namespace and meta(pod).get("uid") not in listed:
                    self.pod_seen("DELETED", pod)
        for pod in items:
            self.pod_seen("MODIFIED", pod)
        self.pods_listed.add(namespace)

    def pods_of(self, kernel: dict) -> dict[str, dict]:
        return self.pods.get(meta(kernel).get("uid", ""), {})

    def going(self, pod: dict) -> bool:
        """Whether the pod is being deleted, or this operator has asked for that already."""
        return bool(meta(pod).get("deletionTimestamp")) or meta(pod).get("uid") in self.deleting

    def orphan_pods(self, linger: float) -> list[dict]:
        """Kernel pods whose GPUKernel is no live one (deleted over ``linger`` ago, or never seen), in
        namespaces listed, not already going: the garbage collector's work, done where it did not."""
        live = {meta(k).get("uid") for k in self.kernels.values()}
        now = self.clock()
        return [pod for owner, pods in self.pods.items() if owner not in live
                and now - self.gone.get(owner, now - linger) >= linger
                for pod in pods.values() if meta(pod).get("namespace") in self.pods_listed and not self.going(pod)]

    # -- quotas ----------------------------------------------------------------------------------

    def quota_seen(self, event_type: str | None, body: dict) -> bool:
        """Keep (or drop) a GPUQuota; whether anything changed."""
        name = meta(body)["name"]
        if event_type == "DELETED":
            changed = self.quotas.pop(name, None) is not None
        elif _version(body) <= _version(self.quotas.get(name)):
            changed = False
        else:
            self.quotas[name] = body
            changed = True
        if changed:
            self._quotas = None
        return changed

    def quota_book(self) -> Quotas:
        """The GPUQuotas read into the pool core's book (once per change, not once per admission)."""
        if self._quotas is None:
            self._quotas = read_quotas(list(self.quotas.values()))
        return self._quotas

    # -- upkeep ----------------------------------------------------------------------------------

    def prune(self, linger: float) -> None:
        """Forget pod lists of unknown kernels, delete requests of pods no longer kept, and deleted kernels'
        uids once no late event can bring them back (``linger`` seconds)."""
        for owner in [o for o, pods in self.pods.items() if not pods]:
            del self.pods[owner]
        kept = {meta(p).get("uid") for pods in self.pods.values() for p in pods.values()}
        self.deleting &= kept
        known = {meta(k).get("uid") for k in self.kernels.values()}
        now = self.clock()
        for uid in [u for u, at in self.gone.items() if u not in known and now - at > linger]:
            del self.gone[uid]
