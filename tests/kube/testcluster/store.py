"""The API server's state: objects, resource versions, and the indexes its readers need.

One process-wide counter gives every write a ``resourceVersion``; every write goes to the watches
(``watches.py``: selectors, the history a watch resumes from).  What is checked and stored of an object
is ``schemas.py``'s; the garbage collector is ``garbage.py``'s.

Objects are kept once, by key, and indexed (``indexes.py``) by resource (a list of one resource never walks
the others: a cluster of thousands of pods, Secrets and Events lists its GPUQuotas as fast as an empty one),
by uid, by owner, and by a few fields selectors name (a pod's Events).  A stored object is
never changed in place: a write stores a new one, so the history and the watches share it, and readers
get copies (``get``, ``list``) or, in-process and read-only, the stored objects themselves (``scan``).
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import time
import uuid

from .errors import ApiError, conflict, invalid, not_found
from .garbage import GarbageCollector
from .indexes import Indexes, Key
from .kinds import BUILTIN, Kind, crd_kinds, crd_status
from .patches import clone, json_patch, merge_patch
from .quantities import QuantityFields
from .quota import admit_pod, check_quota, status_of
from .schemas import (KUBERNETES_VERSION, default_pod, drop_disabled_fields, drop_empty_lists, fold_string_data,
                      validate_builtin, validate_custom)
from .selectors import field_equalities, field_matcher, label_matcher
from .watches import Change, Watcher, Watches

# Feature gates this server knows, with Kubernetes 1.34's defaults (``--feature-gates`` changes them).
FEATURE_GATES = {"DRAConsumableCapacity": False}



def now_rfc3339(at: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if at is None else at, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: dict) -> dict:
    return obj.setdefault("metadata", {})


def main_resource_write(kind: Kind, current: dict, new: dict) -> dict:
    """What a write of the main resource stores: status kept (it changes only through /status), the
    server's metadata kept, generation bumped on a change of a custom object's spec."""
    meta = current["metadata"]
    obj = clone(new)
    if "status" in kind.subresources:  # status changes only through /status
        if "status" in current:
            obj["status"] = clone(current["status"])
        else:
            obj.pop("status", None)
    new_meta = obj.setdefault("metadata", {})
    for field_name in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                       "deletionGracePeriodSeconds", "generation"):
        if field_name in meta:
            new_meta[field_name] = meta[field_name]
        else:
            new_meta.pop(field_name, None)
    if meta.get("deletionTimestamp"):
        added = set(new_meta.get("finalizers") or []) - set(meta.get("finalizers") or [])
        if added:
            raise invalid(kind.kind, meta["name"], "metadata.finalizers: Forbidden: no new finalizers can "
                          "be added if the object is being deleted")
    if kind.custom:
        def body(o):
            return {k: v for k, v in o.items() if k not in ("metadata", "status")}
        if body(obj) != body(current):
            new_meta["generation"] = meta.get("generation", 1) + 1
    obj["apiVersion"], obj["kind"] = current["apiVersion"], current["kind"]
    return obj



class Store:
    def __init__(self, feature_gates: dict[str, bool] | None = None, gc_delay: float = 0.0) -> None:
        self.gates = {**FEATURE_GATES, **(feature_gates or {})}
        self.quantities = QuantityFields(KUBERNETES_VERSION)
        self.kinds: dict[tuple[str, str, str], Kind] = {}
        self.objects: dict[Key, dict] = {}
        self.index = Indexes()
        self.rv = 0
        self.watches = Watches()
        self.gc = GarbageCollector(self, gc_delay)
        self.log_reader = None  # set by the kubelet: pod -> its container's log text
        for kind in BUILTIN:
            self.register(kind)
        for ns in ("default", "kube-system"):
            self.create(self.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                                  "metadata": {"name": ns}})

    @property
    def history(self):
        return self.watches.history

    @history.setter
    def history(self, value) -> None:  # a test shortens it
        self.watches.history = value

    # -- kinds --

    def register(self, kind: Kind) -> None:
        self.kinds[(kind.group, kind.version, kind.plural)] = kind

    def kind(self, group: str, version: str, plural: str) -> Kind:
        try:
            return self.kinds[(group, version, plural)]
        except KeyError:
            where = f"{group}/{version}" if group else version
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural} in {where})")\
                from None

    def kind_of(self, api_version: str, kind_name: str) -> Kind | None:
        group, _, version = api_version.rpartition("/")
        return next((k for k in self.kinds.values()
                     if k.group == group and k.version == version and k.kind == kind_name), None)

    def kind_by_key(self, key: tuple[str, str]) -> Kind | None:
        return next((k for k in self.kinds.values() if k.key == key), None)

    # -- reads --

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict:
        obj = self.objects.get((kind.key, namespace or "", name))
        if obj is None:
            raise not_found(kind.plural if not kind.group else f"{kind.plural}.{kind.group}", name)
        return clone(obj)

    def page(self, kind: Kind, namespace: str | None, label_selector: str | None, field_selector: str | None,
             limit: int, token: str | None) -> tuple[list[dict], int, str | None, int]:
        """One page of a list (``limit`` items from the ``continue`` token on): items, resourceVersion,
        the next token (None at the end), and how many items remain after this page."""
        offset, at = 0, self.rv
        if token:
            try:
                at, offset = json.loads(base64.urlsafe_b64decode(token.encode()))
            except (ValueError, TypeError):
                raise ApiError(400, "BadRequest", f"invalid continue token {token!r}") from None
            if at < self.watches.oldest(self.rv) - 1:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent "
                               "list result. You can start a new list without the continue parameter.")
        found = self.scan(kind, namespace, label_selector, field_selector)
        if limit <= 0:
            return [clone(o) for o in found[offset:]], at, None, 0
        chunk = [clone(o) for o in found[offset:offset + limit]]
        rest = len(found) - offset - len(chunk)
        following = base64.urlsafe_b64encode(json.dumps([at, offset + limit]).encode()).decode() if rest > 0 else None
        return chunk, at, following, rest

    def list(self, kind: Kind, namespace: str | None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[dict], int]:
        return [clone(o) for o in self.scan(kind, namespace, label_selector, field_selector)], self.rv

    def scan(self, kind: Kind, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        """The stored objects of a resource that match, by namespace and name: **read-only** (the cluster's own
        components read them without a copy; ``list`` gives copies)."""
        labels = label_matcher(label_selector)
        fields = field_matcher(field_selector, kind.kind)
        candidates = self.index.candidates(kind.key, field_equalities(field_selector), self.objects)
        items = [obj for (_, ns, _), obj in candidates.items()
                 if (namespace is None or ns == namespace)
                 and labels(obj["metadata"].get("labels") or {}) and fields(obj)]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    def live_uids(self) -> set[str]:
        return set(self.index.by_uid)

    # -- writes --

    def _commit(self, kind: Kind, obj: dict, type_: str) -> dict:
        """Store ``obj`` (the store's own from now on) as the next version; a copy for the caller."""
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        key = (kind.key, meta.get("namespace", ""), meta["name"])
        old = self.objects.pop(key, None)
        if old is not None:
            self.index.remove(key, old)
        if type_ != "DELETED":
            self.objects[key] = obj
            self.index.add(key, obj)
        self.watches.publish(Change(self.rv, kind, type_, old, obj))
        return clone(obj)

    def _check(self, kind: Kind, obj: dict, validate: bool = True) -> dict:
        """What is stored of an object: a custom one pruned and validated; a built-in one validated and
        encoded as a real server stores it.  ``validate`` off: a write of the cluster's own components (the
        scheduler, the kubelets, the Events they post), which no client's bug can be in, and which adds no
        quantity or empty list to what is stored encoded already: stored as it is."""
        if kind.custom:
            return validate_custom(kind, obj)
        if not validate:
            return obj
        validate_builtin(obj)
        return drop_empty_lists(drop_disabled_fields(self.quantities.canonicalize(obj), self.gates))

    def create(self, kind: Kind, namespace: str | None, body: dict, validate: bool = True) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a create must be an object")
        obj = clone(body)
        if obj.get("kind") != kind.kind or obj.get("apiVersion") != kind.api_version:
            raise ApiError(400, "BadRequest",
                           f"the object's kind {obj.get('apiVersion')}/{obj.get('kind')} does not match the "
                           f"resource {kind.api_version}/{kind.kind} it was posted to")
        meta = _meta(obj)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            else:
                raise invalid(kind.kind, "", "metadata.name: Required value: name or generateName is required")
        if kind.namespaced:
            meta["namespace"] = self._namespace_for(namespace, meta)
        else:
            meta.pop("namespace", None)
        if (kind.key, meta.get("namespace", ""), meta["name"]) in self.objects:
            # An object on its way out (a pod in its grace period, anything held by a finalizer) still holds
            # its name, as on a real server: a new object of that name waits until the old one is removed.
            name = kind.plural if not kind.group else f"{kind.plural}.{kind.group}"
            raise ApiError(409, "AlreadyExists", f'{name} "{meta["name"]}" already exists',
                           {"name": meta["name"], "kind": kind.plural})
        for field_name in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "generation"):
            meta.pop(field_name, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if kind.custom:
            meta["generation"] = 1
            if "status" in kind.subresources:
                obj.pop("status", None)  # status is written only through /status
        if kind.kind == "Secret":
            fold_string_data(obj)
        if kind.kind == "Pod":
            default_pod(obj)
        if kind.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        obj = self._check(kind, obj, validate)
        if kind.kind == "ResourceQuota":  # its status as the quota controller would write it at once
            check_quota(obj)
            obj["status"] = status_of(obj, self._namespace_pods(meta["namespace"]))
        if kind.kind == "Pod":
            self._admit_pod(obj)
        created = self._commit(kind, obj, "ADDED")
        if kind.kind == "Pod":
            self._count_quotas(meta["namespace"])
        if kind.kind == "CustomResourceDefinition":
            self._register_crd(created)
        return created

    def _namespace_for(self, namespace: str | None, meta: dict) -> str:
        """The namespace a namespaced object is created in: the request's, which must exist and not be
        terminating."""
        ns = namespace or meta.get("namespace")
        if not ns:
            raise ApiError(400, "BadRequest", "a namespaced object needs a namespace")
        if meta.get("namespace") and meta["namespace"] != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the request's")
        namespace_obj = self.objects.get((("", "namespaces"), "", ns))
        if namespace_obj is None:
            raise not_found("namespaces", ns)
        if namespace_obj["metadata"].get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f'unable to create new content in namespace {ns} because it is '
                           "being terminated")
        return ns

    # -- admission: ResourceQuota (quota.py) --

    def _namespace_objects(self, plural: str, namespace: str) -> list[dict]:
        return [o for (_, ns, _), o in self.index.of_resource.get(("", plural), {}).items() if ns == namespace]

    def _namespace_pods(self, namespace: str) -> list[dict]:
        return self._namespace_objects("pods", namespace)

    def _admit_pod(self, pod: dict) -> None:
        namespace = pod["metadata"]["namespace"]
        quotas = self._namespace_objects("resourcequotas", namespace)
        if quotas:
            admit_pod(pod, quotas, self._namespace_pods(namespace))

    def _count_quotas(self, namespace: str) -> None:
        """Each quota of the namespace's ``status.used`` after a pod was admitted."""
        kind = self.kind("", "v1", "resourcequotas")
        quotas = self._namespace_objects("resourcequotas", namespace)
        pods = self._namespace_pods(namespace) if quotas else []
        for quota in quotas:
            wanted = status_of(quota, pods)
            if quota.get("status") != wanted:
                updated = clone(quota)
                updated["status"] = wanted
                self._commit(kind, updated, "MODIFIED")

    def _register_crd(self, crd: dict) -> None:
        for kind in crd_kinds(crd):
            self.register(kind)
        crd = clone(crd)
        crd["status"] = crd_status(crd, now_rfc3339())
        self._commit(self.kind("apiextensions.k8s.io", "v1", "customresourcedefinitions"), crd, "MODIFIED")

    def _unregister_crd(self, crd: dict) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            kind = self.kinds.pop((spec["group"], version["name"], spec["names"]["plural"]), None)
            if kind is None:
                continue
            for obj in list(self.index.of_resource.get(kind.key, {}).values()):
                self._commit(kind, clone(obj), "DELETED")

    def _preconditions(self, kind: Kind, current: dict, new_meta: dict | None) -> None:
        wanted = (new_meta or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise conflict(kind.plural, current["metadata"]["name"],
                           "the object has been modified; please apply your changes to the latest version "
                           "and try again")

    def _write(self, kind: Kind, current: dict, new: dict, subresource: str | None, validate: bool = True) -> dict:
        """Apply an update or patch result, honouring the status subresource."""
        meta = current["metadata"]
        if subresource == "status":
            obj = clone(current)
            obj["status"] = clone(new.get("status"))
            if obj["status"] is None:
                obj.pop("status")
        elif subresource:
            raise ApiError(405, "MethodNotAllowed", f"the subresource {subresource!r} cannot be written")
        else:
            obj = main_resource_write(kind, current, new)
        if kind.kind == "Secret":
            fold_string_data(obj)
        obj = self._check(kind, obj, validate)
        if kind.kind == "ResourceQuota" and subresource != "status":  # a new spec.hard: its status follows
            check_quota(obj)
            obj["status"] = status_of(obj, self._namespace_pods(meta["namespace"]))
        if obj == current:
            return clone(current)  # a no-op write changes no resourceVersion
        updated = self._commit(kind, obj, "MODIFIED")
        if updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers") \
                and not updated["metadata"].get("deletionGracePeriodSeconds"):
            self.remove(kind, updated)
        return updated

    def replace(self, kind: Kind, namespace: str | None, name: str, body: dict, subresource: str | None = None):
        current = self.get(kind, namespace, name)
        self._preconditions(kind, current, body.get("metadata"))
        if not subresource and _meta(body).get("resourceVersion") is None:
            raise invalid(kind.kind, name, "metadata.resourceVersion: Invalid value: 0x0: must be specified "
                          "for an update")
        return self._write(kind, current, body, subresource)

    def patch(self, kind: Kind, namespace: str | None, name: str, content_type: str, patch,
              subresource: str | None = None, validate: bool = True) -> dict:
        """A patch (``validate`` off: the cluster's own components' writes, see ``_check``)."""
        current = self.objects.get((kind.key, namespace or "", name))  # read-only: the patch makes a copy
        if current is None:
            self.get(kind, namespace, name)  # 404
        content_type = (content_type or "").split(";")[0].strip()
        if content_type == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            self._preconditions(kind, current, patch.get("metadata"))
            new = merge_patch(current, patch)
        elif content_type == "application/json-patch+json":
            new = json_patch(current, patch)
            self._preconditions(kind, current, new.get("metadata"))  # a resourceVersion it replaced is one too
        elif content_type == "application/strategic-merge-patch+json":
            if kind.custom:
                raise ApiError(415, "UnsupportedMediaType",
                               "the body of the request was in an unknown format - accepted media types include: "
                               "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a strategic merge patch must be a JSON object")
            new = merge_patch(current, patch)  # see the package docstring: lists are replaced, not merged by key
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"{content_type!r} is not supported by this test server")
        return self._write(kind, current, new, subresource, validate)

    # -- deletion --

    def delete(self, kind: Kind, namespace: str | None, name: str, options: dict | None = None) -> dict:
        options = options or {}
        current = self.get(kind, namespace, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
            raise conflict(kind.plural, name, "Precondition failed: UID in precondition does not match the object")
        if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise conflict(kind.plural, name, "Precondition failed: resourceVersion does not match")
        meta = current["metadata"]
        grace = options.get("gracePeriodSeconds")
        if meta.get("deletionTimestamp"):
            if kind.kind == "Pod" and grace == 0:  # a force delete of a pod already terminating
                self.remove(kind, current)
            return current
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground":
            finalizers.append("foregroundDeletion")
        elif policy == "Orphan":
            finalizers.append("orphan")
        running_pod = (kind.kind == "Pod" and current["spec"].get("nodeName")
                       and current.get("status", {}).get("phase") not in ("Succeeded", "Failed"))
        if running_pod and grace != 0:
            grace = current["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
            obj = clone(current)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339(time.time() + grace)
            obj["metadata"]["deletionGracePeriodSeconds"] = max(int(grace), 1)
            obj["metadata"]["finalizers"] = finalizers or None
            if not finalizers:
                obj["metadata"].pop("finalizers")
            return self._commit(kind, obj, "MODIFIED")  # the kubelet stops it and removes it
        if finalizers or kind.kind == "Namespace":
            obj = clone(current)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            if finalizers:
                obj["metadata"]["finalizers"] = finalizers
            if kind.kind == "Namespace":
                obj["status"] = {"phase": "Terminating"}
            return self._commit(kind, obj, "MODIFIED")
        return self.remove(kind, current)

    def evict(self, kind: Kind, namespace: str, name: str, eviction: dict | None) -> dict:
        """``POST pods/<name>/eviction`` (what ``kubectl drain`` sends for each pod): the pod is deleted with
        the eviction's deleteOptions, else its own grace period.  No PodDisruptionBudgets are modelled: an
        eviction is always allowed."""
        if kind.kind != "Pod":
            raise ApiError(404, "NotFound", f"{kind.plural} have no eviction subresource")
        if not isinstance(eviction, dict) or eviction.get("kind") != "Eviction":
            raise ApiError(400, "BadRequest", "the body of an eviction must be an Eviction (policy/v1)")
        self.delete(kind, namespace, name, eviction.get("deleteOptions") or {})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def remove(self, kind: Kind, current: dict) -> dict:
        removed = self._commit(kind, clone(current), "DELETED")
        if kind.kind == "CustomResourceDefinition":
            self._unregister_crd(removed)
        return removed

    def finish_pod_deletion(self, pod: dict) -> None:
        """The kubelet has stopped a terminating pod's containers: remove the object."""
        kind = self.kind("", "v1", "pods")
        current = self.objects.get((kind.key, pod["metadata"]["namespace"], pod["metadata"]["name"]))
        if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
            return
        if current["metadata"].get("finalizers"):
            obj = clone(current)
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            self._commit(kind, obj, "MODIFIED")
            return
        self.remove(kind, current)

    def collect_garbage(self) -> int:
        """One pass of the garbage collector and namespace controller (``garbage.py``); how many objects it
        acted on."""
        return self.gc.collect()

    # -- watching --

    def watch(self, kind: Kind, namespace: str | None, label_selector: str | None, field_selector: str | None,
              since: str | None, send_initial: bool, remote: bool = False) -> Watcher:
        """Register a watch (``remote``: a client's stream); its queue first gets the events it must replay.

        ``since`` unset or "0": the current objects as ADDED, then new events.  A version:
        every event after it, or a 410 ERROR event when the history no longer reaches back.
        """
        watcher = Watcher(kind, namespace, label_matcher(label_selector), field_matcher(field_selector, kind.kind),
                          remote=remote)
        if remote and kind.plural in self.watches.stalled:  # a stalled watch: nothing, until the stall ends
            pass
        elif since in (None, "", "0") or send_initial:
            items = self.scan(kind, namespace, label_selector, field_selector)
            for obj in sorted(items, key=lambda o: int(o["metadata"]["resourceVersion"])):
                watcher.queue.put_nowait({"type": "ADDED", "object": obj})
            if send_initial:
                watcher.queue.put_nowait({"type": "BOOKMARK", "object": {
                    "kind": kind.kind, "apiVersion": kind.api_version,
                    "metadata": {"resourceVersion": str(self.rv),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})
        else:
            try:
                from_rv = int(since)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resource version {since!r}") from None
            if not self.watches.replay(watcher, from_rv, self.rv):
                return watcher
        self.watches.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watches.remove(watcher)

    def close_watches(self) -> None:
        """End every watch stream (the server is stopping)."""
        self.watches.close_all()
