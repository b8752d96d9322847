"""The API server's state: objects, resource versions, watches, garbage collection.

One process-wide counter gives every write a ``resourceVersion``; every write is
kept in a bounded history so that a watch can resume from the version its client
last saw (an older version gets ``410 Gone``, as after a real server's compaction).
Watches see an object move in and out of their selectors as ``ADDED`` / ``DELETED``,
as on a real server.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import secrets
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import jsonschema
import kubernetes_validate

from .errors import ApiError, conflict, invalid, not_found
from .patches import json_patch, merge_patch
from .quantities import QuantityFields
from .quota import admit_pod, check_quota, status_of
from .selectors import field_matcher, label_matcher

KUBERNETES_VERSION = "1.34.0"  # the schemas built-in objects are validated against
HISTORY = 100_000
# Feature gates this server knows, with Kubernetes 1.34's defaults (``--feature-gates`` changes them).
FEATURE_GATES = {"DRAConsumableCapacity": False}


def now_rfc3339(at: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if at is None else at, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    schema: dict | None = None  # a custom resource's openAPIV3Schema
    custom: bool = False
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


BUILTIN = [
    Kind("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), ("status",)),
    Kind("", "v1", "nodes", "Node", False, "node", ("no",), ("status",)),
    Kind("", "v1", "pods", "Pod", True, "pod", ("po",), ("status", "log", "eviction")),
    Kind("", "v1", "secrets", "Secret", True, "secret"),
    Kind("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",)),
    Kind("", "v1", "events", "Event", True, "event", ("ev",)),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",)),
    Kind("", "v1", "resourcequotas", "ResourceQuota", True, "resourcequota", ("quota",), ("status",)),
    Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
         "customresourcedefinition", ("crd", "crds"), ("status",)),
    Kind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, "networkpolicy", ("netpol",)),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True, "lease"),
    Kind("", "v1", "services", "Service", True, "service", ("svc",), ("status",)),
    Kind("apps", "v1", "deployments", "Deployment", True, "deployment", ("deploy",), ("status",)),
    Kind("apps", "v1", "daemonsets", "DaemonSet", True, "daemonset", ("ds",), ("status",)),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", True, "role"),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "rolebinding"),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, "clusterrole"),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False,
         "clusterrolebinding"),
    # Dynamic Resource Allocation (GA in 1.34): see dra.py for the claim controller and allocation.
    Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, "deviceclass"),
    Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, "resourceslice"),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, "resourceclaim", (), ("status",)),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
         "resourceclaimtemplate"),
]


def _meta(obj: dict) -> dict:
    return obj.setdefault("metadata", {})


def drop_disabled_fields(obj: dict, gates: dict[str, bool]) -> dict:
    """What a real API server drops from a new object for a feature gate that is off (its strategies'
    ``dropDisabledFields``).  DRAConsumableCapacity: a device request's ``capacity`` (in claims and claim
    templates, ``exactly`` and ``firstAvailable``), a claim's consumed capacity and share id, and a
    ResourceSlice device's ``allowMultipleAllocations`` and capacities' ``requestPolicy``."""
    if gates.get("DRAConsumableCapacity") or obj.get("apiVersion") != "resource.k8s.io/v1":
        return obj
    kind = obj.get("kind")
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        spec = (obj.get("spec") or {}).get("spec") if kind == "ResourceClaimTemplate" else obj.get("spec")
        for request in ((spec or {}).get("devices") or {}).get("requests") or []:
            for one in [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]:
                one.pop("capacity", None)
        for result in ((((obj.get("status") or {}).get("allocation") or {}).get("devices") or {})
                       .get("results") or []):
            result.pop("consumedCapacity", None)
            result.pop("shareID", None)
    elif kind == "ResourceSlice":
        for device in (obj.get("spec") or {}).get("devices") or []:
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    return obj


def drop_empty_lists(value):
    """What a real API server stores of a built-in object: Go's JSON encoding leaves out empty lists
    (``omitempty``), so ``ingress: []`` is stored, and read back, as no ``ingress`` at all."""
    if isinstance(value, dict):
        return {k: drop_empty_lists(v) for k, v in value.items() if not (isinstance(v, list) and not v)}
    if isinstance(value, list):
        return [drop_empty_lists(v) for v in value]
    return value


# -- custom resource schemas ----------------------------------------------------------------------

def _to_json_schema(schema: dict) -> dict:
    """An openAPIV3Schema as JSON Schema: ``nullable`` and ``x-kubernetes-int-or-string`` made explicit."""
    if not isinstance(schema, dict):
        return schema
    out = {k: _to_json_schema(v) if isinstance(v, dict) else v for k, v in schema.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in schema:
        out["properties"] = {k: _to_json_schema(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _to_json_schema(schema["additionalProperties"])
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        elif "anyOf" in out:
            out["anyOf"] = [*out["anyOf"], {"type": "null"}]
    return out


def prune(value, schema: dict | None):
    """Drop fields the schema does not declare, and nulls of fields not ``nullable``, as a real server
    does for structural schemas."""
    if schema is None or not isinstance(value, (dict, list)):
        return value
    if isinstance(value, list):
        return [prune(v, schema.get("items")) for v in value]
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return value
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    out = {}
    for key, item in value.items():
        if item is None and not ((props or {}).get(key) or {}).get("nullable"):
            continue  # a real server drops a null it was not told to keep
        if props is not None and key in props:
            out[key] = prune(item, props[key])
        elif isinstance(extra, dict):
            out[key] = prune(item, extra)
        elif schema.get("x-kubernetes-preserve-unknown-fields") or extra is True:
            out[key] = item
    return out


def validate_custom(kind: Kind, obj: dict) -> dict:
    """Prune and validate a custom object against its CRD's schema; 422 naming the field."""
    schema = kind.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    pruned = prune(body, schema)
    try:
        jsonschema.Draft7Validator(_to_json_schema(schema)).validate(pruned)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "<root>"
        raise invalid(kind.kind, _meta(obj).get("name", ""), f"{where}: {e.message}") from None
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": obj["metadata"], **pruned}


def validate_builtin(obj: dict) -> None:
    """Validate against the real Kubernetes schema (kubernetes-validate, strict: no unknown fields)."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:  # a jsonschema ValidationError
        where = ".".join(str(p) for p in e.absolute_path) or "<root>"
        raise invalid(obj.get("kind", "?"), _meta(obj).get("name", ""), f"{where}: {e.message}") from None
    except kubernetes_validate.SchemaNotFoundError:
        raise invalid(obj.get("kind", "?"), _meta(obj).get("name", ""), "no schema for this kind") from None


# -- watches ----------------------------------------------------------------------------------------

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


# -- the store --------------------------------------------------------------------------------------

class Store:
    def __init__(self, feature_gates: dict[str, bool] | None = None) -> None:
        self.gates = {**FEATURE_GATES, **(feature_gates or {})}
        self.quantities = QuantityFields(KUBERNETES_VERSION)
        self.kinds: dict[tuple[str, str, str], Kind] = {}
        self.objects: dict[tuple[tuple[str, str], str, str], dict] = {}
        self.rv = 0
        self.history: deque[Change] = deque(maxlen=HISTORY)
        self.watchers: set[Watcher] = set()
        self.stalled: set[str] = set()  # plurals whose watches are quiet (faults.py)
        self.log_reader = None  # set by the kubelet: pod -> its container's log text
        for kind in BUILTIN:
            self.register(kind)
        for ns in ("default", "kube-system"):
            self.create(self.kind("", "v1", "namespaces"), None, {"apiVersion": "v1", "kind": "Namespace",
                                                                  "metadata": {"name": ns}})

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

    # -- reads --

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict:
        obj = self.objects.get((kind.key, namespace or "", name))
        if obj is None:
            raise not_found(kind.plural if not kind.group else f"{kind.plural}.{kind.group}", name)
        return copy.deepcopy(obj)

    def page(self, kind: Kind, namespace: str | None, label_selector: str | None, field_selector: str | None,
             limit: int, token: str | None) -> tuple[list[dict], int, str | None, int]:
        """One page of a list (``limit`` items from the ``continue`` token on): items, resourceVersion,
        the next token (None at the end), and how many items remain after this page."""
        items, rv = self.list(kind, namespace, label_selector, field_selector)
        offset, at = 0, rv
        if token:
            try:
                at, offset = json.loads(base64.urlsafe_b64decode(token.encode()))
            except (ValueError, TypeError):
                raise ApiError(400, "BadRequest", f"invalid continue token {token!r}") from None
            oldest = self.history[0].rv if self.history else self.rv + 1
            if at < oldest - 1:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent "
                               "list result. You can start a new list without the continue parameter.")
        if limit <= 0:
            return items[offset:], at, None, 0
        chunk = items[offset:offset + limit]
        rest = len(items) - offset - len(chunk)
        following = base64.urlsafe_b64encode(json.dumps([at, offset + limit]).encode()).decode() if rest > 0 else None
        return chunk, at, following, rest

    def list(self, kind: Kind, namespace: str | None, label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[dict], int]:
        labels = label_matcher(label_selector)
        fields = field_matcher(field_selector, kind.kind)
        items = []
        for (key, ns, _), obj in self.objects.items():
            if key != kind.key or (namespace is not None and ns != namespace):
                continue
            if labels(obj["metadata"].get("labels") or {}) and fields(obj):
                items.append(copy.deepcopy(obj))
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items, self.rv

    def live_uids(self) -> set[str]:
        return {o["metadata"]["uid"] for o in self.objects.values()}

    # -- writes --

    def _commit(self, kind: Kind, obj: dict, type_: str, old: dict | None) -> dict:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        key = (kind.key, meta.get("namespace", ""), meta["name"])
        if type_ == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        change = Change(self.rv, kind, type_, copy.deepcopy(old) if old else None, copy.deepcopy(obj))
        self.history.append(change)
        for watcher in list(self.watchers):
            if watcher.kind.key == kind.key and not watcher.quiet:
                event = watcher.event(change)
                if event:
                    watcher.queue.put_nowait(event)
        return copy.deepcopy(obj)

    def _check(self, kind: Kind, obj: dict) -> dict:
        if kind.custom:
            return validate_custom(kind, obj)
        validate_builtin(obj)
        return drop_empty_lists(drop_disabled_fields(self.quantities.canonicalize(obj), self.gates))

    def create(self, kind: Kind, namespace: str | None, body: dict) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a create must be an object")
        obj = copy.deepcopy(body)
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
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if (kind.key, meta.get("namespace", ""), meta["name"]) in self.objects:
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
            self._fold_string_data(obj)
        if kind.kind == "Pod":
            self._default_pod(obj)
        if kind.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        obj = self._check(kind, obj)
        if kind.kind == "ResourceQuota":  # its status as the quota controller would write it at once
            check_quota(obj)
            obj["status"] = status_of(obj, self._namespace_pods(meta["namespace"]))
        if kind.kind == "Pod":
            self._admit_pod(obj)
        created = self._commit(kind, obj, "ADDED", None)
        if kind.kind == "Pod":
            self._count_quotas(meta["namespace"])
        if kind.kind == "CustomResourceDefinition":
            self._register_crd(created)
        return created

    # -- admission: ResourceQuota (quota.py) --

    def _namespace_objects(self, plural: str, namespace: str) -> list[dict]:
        return [o for (key, ns, _), o in self.objects.items() if key == ("", plural) and ns == namespace]

    def _namespace_pods(self, namespace: str) -> list[dict]:
        return self._namespace_objects("pods", namespace)

    def _admit_pod(self, pod: dict) -> None:
        namespace = pod["metadata"]["namespace"]
        admit_pod(pod, self._namespace_objects("resourcequotas", namespace), self._namespace_pods(namespace))

    def _count_quotas(self, namespace: str) -> None:
        """Each quota of the namespace's ``status.used`` after a pod was admitted."""
        kind = self.kind("", "v1", "resourcequotas")
        pods = self._namespace_pods(namespace)
        for quota in self._namespace_objects("resourcequotas", namespace):
            wanted = status_of(quota, pods)
            if quota.get("status") != wanted:
                updated = copy.deepcopy(quota)
                updated["status"] = wanted
                self._commit(kind, updated, "MODIFIED", quota)

    @staticmethod
    def _fold_string_data(obj: dict) -> None:
        string_data = obj.pop("stringData", None) or {}
        data = obj.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(value.encode()).decode()
        for key, value in data.items():
            try:
                base64.b64decode(value, validate=True)
            except Exception:
                raise invalid("Secret", obj["metadata"]["name"], f"data[{key}]: illegal base64 data") from None

    @staticmethod
    def _default_pod(obj: dict) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}

    def _register_crd(self, crd: dict) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            subresources = tuple(version.get("subresources", {}) or {})
            self.register(Kind(
                group=spec["group"], version=version["name"], plural=spec["names"]["plural"],
                kind=spec["names"]["kind"], namespaced=spec["scope"] == "Namespaced",
                singular=spec["names"].get("singular", spec["names"]["kind"].lower()),
                short_names=tuple(spec["names"].get("shortNames", [])), subresources=subresources,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"), custom=True,
            ))
        crd_kind = self.kind("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        crd = copy.deepcopy(crd)
        crd["status"] = {
            "acceptedNames": spec["names"],
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
                 "lastTransitionTime": now_rfc3339()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()},
            ],
        }
        self._commit(crd_kind, crd, "MODIFIED", crd)

    def _unregister_crd(self, crd: dict) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            kind = self.kinds.pop((spec["group"], version["name"], spec["names"]["plural"]), None)
            if kind is None:
                continue
            for (key, ns, name), obj in list(self.objects.items()):
                if key == kind.key:
                    self._commit(kind, copy.deepcopy(obj), "DELETED", obj)

    def _preconditions(self, kind: Kind, current: dict, new_meta: dict | None) -> None:
        wanted = (new_meta or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise conflict(kind.plural, current["metadata"]["name"],
                           "the object has been modified; please apply your changes to the latest version "
                           "and try again")

    def _write(self, kind: Kind, current: dict, new: dict, subresource: str | None) -> dict:
        """Apply an update or patch result, honouring the status subresource."""
        meta = current["metadata"]
        if subresource == "status":
            obj = copy.deepcopy(current)
            obj["status"] = new.get("status")
            if obj["status"] is None:
                obj.pop("status")
        elif subresource:
            raise ApiError(405, "MethodNotAllowed", f"the subresource {subresource!r} cannot be written")
        else:
            obj = copy.deepcopy(new)
            if "status" in kind.subresources:  # status changes only through /status
                if "status" in current:
                    obj["status"] = copy.deepcopy(current["status"])
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
        if kind.kind == "Secret":
            self._fold_string_data(obj)
        obj = self._check(kind, obj)
        if kind.kind == "ResourceQuota" and subresource != "status":  # a new spec.hard: its status follows
            check_quota(obj)
            obj["status"] = status_of(obj, self._namespace_pods(meta["namespace"]))
        if obj == current:
            return copy.deepcopy(current)  # a no-op write changes no resourceVersion
        updated = self._commit(kind, obj, "MODIFIED", current)
        if updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers") \
                and not updated["metadata"].get("deletionGracePeriodSeconds"):
            self._remove(kind, updated)
        return updated

    def replace(self, kind: Kind, namespace: str | None, name: str, body: dict, subresource: str | None = None):
        current = self.get(kind, namespace, name)
        self._preconditions(kind, current, body.get("metadata"))
        if not subresource and _meta(body).get("resourceVersion") is None:
            raise invalid(kind.kind, name, "metadata.resourceVersion: Invalid value: 0x0: must be specified "
                          "for an update")
        return self._write(kind, current, body, subresource)

    def patch(self, kind: Kind, namespace: str | None, name: str, content_type: str, patch,
              subresource: str | None = None) -> dict:
        current = self.get(kind, namespace, name)
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
        return self._write(kind, current, new, subresource)

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
                self._remove(kind, current)
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
            obj = copy.deepcopy(current)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339(time.time() + grace)
            obj["metadata"]["deletionGracePeriodSeconds"] = max(int(grace), 1)
            obj["metadata"]["finalizers"] = finalizers or None
            if not finalizers:
                obj["metadata"].pop("finalizers")
            return self._commit(kind, obj, "MODIFIED", current)  # the kubelet stops it and removes it
        if finalizers or kind.kind == "Namespace":
            obj = copy.deepcopy(current)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            if finalizers:
                obj["metadata"]["finalizers"] = finalizers
            if kind.kind == "Namespace":
                obj["status"] = {"phase": "Terminating"}
            return self._commit(kind, obj, "MODIFIED", current)
        return self._remove(kind, current)

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

    def _remove(self, kind: Kind, current: dict) -> dict:
        removed = self._commit(kind, copy.deepcopy(current), "DELETED", current)
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
            obj = copy.deepcopy(current)
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            self._commit(kind, obj, "MODIFIED", current)
            return
        self._remove(kind, copy.deepcopy(current))

    def collect_garbage(self) -> int:
        """One pass of the garbage collector and namespace controller; returns how many objects it acted on.

        Dependents whose owners are all gone are deleted (background propagation); an owner
        deleted with ``Orphan`` has its dependents' references removed; a ``Foreground`` owner
        goes once its blocking dependents are gone; a terminating namespace empties, then goes.
        """
        acted = 0
        by_uid = {o["metadata"]["uid"]: (key, o) for key, o in self.objects.items()}
        for key, obj in list(self.objects.items()):
            meta = obj["metadata"]
            refs = meta.get("ownerReferences") or []
            if not refs or meta.get("deletionTimestamp"):
                continue
            alive = []
            for ref in refs:
                owner = by_uid.get(ref.get("uid"))
                orphaning = owner is not None and "orphan" in (owner[1]["metadata"].get("finalizers") or [])
                if owner is not None and not orphaning:
                    alive.append(ref)
            if len(alive) == len(refs):
                continue
            kind = self._kind_by_key(key[0])
            if kind is None:
                continue
            acted += 1
            if alive:
                self.patch(kind, key[1] or None, key[2], "application/merge-patch+json",
                           {"metadata": {"ownerReferences": alive}})
            elif any(by_uid.get(r.get("uid")) for r in refs):  # every owner orphans it
                self.patch(kind, key[1] or None, key[2], "application/merge-patch+json",
                           {"metadata": {"ownerReferences": None}})
            else:
                self.delete(kind, key[1] or None, key[2], {"propagationPolicy": "Background"})
        for key, obj in list(self.objects.items()):
            meta = obj["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            kind = self._kind_by_key(key[0])
            if kind is None:
                continue
            uid = meta["uid"]
            finalizers = list(meta.get("finalizers") or [])
            dependents = [(k, o) for k, o in self.objects.items()
                          if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]
            if "foregroundDeletion" in finalizers:
                for dep_key, dep in dependents:
                    dep_kind = self._kind_by_key(dep_key[0])
                    if dep_kind and not dep["metadata"].get("deletionTimestamp"):
                        self.delete(dep_kind, dep_key[1] or None, dep_key[2], {"propagationPolicy": "Foreground"})
                        acted += 1
                blocking = [d for _, d in dependents if any(r.get("uid") == uid and r.get("blockOwnerDeletion")
                                                            for r in d["metadata"].get("ownerReferences") or [])]
                if not blocking:
                    finalizers.remove("foregroundDeletion")
                    self.patch(kind, key[1] or None, key[2], "application/merge-patch+json",
                               {"metadata": {"finalizers": finalizers or None}})
                    acted += 1
            elif "orphan" in finalizers:
                for dep_key, dep in dependents:
                    dep_kind = self._kind_by_key(dep_key[0])
                    refs = [r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != uid]
                    if dep_kind:
                        self.patch(dep_kind, dep_key[1] or None, dep_key[2], "application/merge-patch+json",
                                   {"metadata": {"ownerReferences": refs or None}})
                finalizers.remove("orphan")
                self.patch(kind, key[1] or None, key[2], "application/merge-patch+json",
                           {"metadata": {"finalizers": finalizers or None}})
                acted += 1
            elif kind.kind == "Namespace":
                contents = [(k, o) for k, o in self.objects.items() if k[1] == meta["name"] and k[0] != kind.key]
                for c_key, c_obj in contents:
                    c_kind = self._kind_by_key(c_key[0])
                    if c_kind and not c_obj["metadata"].get("deletionTimestamp"):
                        self.delete(c_kind, c_key[1], c_key[2], {"gracePeriodSeconds": 0})
                        acted += 1
                if not contents and not finalizers:
                    self._remove(kind, copy.deepcopy(obj))
                    acted += 1
        return acted

    def _kind_by_key(self, key: tuple[str, str]) -> Kind | None:
        return next((k for k in self.kinds.values() if k.key == key), None)

    # -- watching --

    def watch(self, kind: Kind, namespace: str | None, label_selector: str | None, field_selector: str | None,
              since: str | None, send_initial: bool) -> Watcher:
        """Register a watch; its queue first gets the events it must replay.

        ``since`` unset or "0": the current objects as ADDED, then new events.  A version:
        every event after it, or a 410 ERROR event when the history no longer reaches back.
        """
        watcher = Watcher(kind, namespace, label_matcher(label_selector), field_matcher(field_selector, kind.kind))
        if kind.plural in self.stalled:  # a stalled watch: nothing, until the stall ends
            watcher.quiet = True
        elif since in (None, "", "0") or send_initial:
            items, rv = self.list(kind, namespace, label_selector, field_selector)
            for obj in sorted(items, key=lambda o: int(o["metadata"]["resourceVersion"])):
                watcher.queue.put_nowait({"type": "ADDED", "object": obj})
            if send_initial:
                watcher.queue.put_nowait({"type": "BOOKMARK", "object": {
                    "kind": kind.kind, "apiVersion": kind.api_version,
                    "metadata": {"resourceVersion": str(rv),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})
        else:
            try:
                from_rv = int(since)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resource version {since!r}") from None
            oldest = self.history[0].rv if self.history else self.rv + 1
            if from_rv < oldest - 1:
                watcher.queue.put_nowait({"type": "ERROR", "object": ApiError(
                    410, "Expired", f"too old resource version: {from_rv} ({oldest - 1})").status()})
                return watcher
            for change in self.history:
                if change.rv > from_rv and change.kind.key == kind.key:
                    event = watcher.event(change)
                    if event:
                        watcher.queue.put_nowait(event)
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def close_watches(self) -> None:
        """End every watch stream (the server is stopping)."""
        for watcher in self.watchers:
            watcher.queue.put_nowait(None)

    # -- faults (faults.py) --

    def cut_watches(self, plurals: set[str] | frozenset[str]) -> None:
        """End the watch streams of these resources (their clients watch again)."""
        for watcher in self.watchers:
            if watcher.kind.plural in plurals:
                watcher.queue.put_nowait(None)

    def stall(self, plurals: set[str]) -> None:
        """Watches of these resources go quiet: what would be sent to them is lost."""
        self.stalled |= plurals
        for watcher in self.watchers:
            if watcher.kind.plural in plurals:
                watcher.quiet = True

    def resume(self) -> None:
        """End a stall as a compaction would: the history is gone, and every quiet watch gets a 410."""
        self.stalled.clear()
        self.history.clear()
        for watcher in list(self.watchers):
            if watcher.quiet:
                watcher.queue.put_nowait({"type": "ERROR", "object": ApiError(
                    410, "Expired", f"too old resource version (compacted at {self.rv})").status()})
