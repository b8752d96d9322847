"""What the API server checks and stores of an object: custom objects pruned and validated against their
CRD's ``openAPIV3Schema``, built-in objects validated against the real Kubernetes schemas
(``kubernetes-validate``, strict), and what a real server's encoding drops (empty lists, the fields of a
feature gate that is off).

The built-in schemas are read once per kind: ``kubernetes_validate.validate`` reads and resolves the
whole definitions file on every call (about 6 ms a pod), which made validation most of the test
cluster's work once hundreds of pods start at once; the validator built here is the same schema, the same
draft and the same errors (about 0.5 ms a pod).
"""

from __future__ import annotations

import base64
import functools
import re
from typing import TYPE_CHECKING

import jsonschema
from kubernetes_validate.utils import all_versions, major_minor, schema_contents
from referencing import Registry, Resource

from .errors import invalid

if TYPE_CHECKING:
    from .store import Kind

KUBERNETES_VERSION = "1.34.0"  # the schemas built-in objects are validated against


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


_custom_validators: dict[int, tuple[dict, jsonschema.Validator]] = {}


def _custom_validator(schema: dict) -> jsonschema.Validator:
    """A CRD version's validator, built once per schema object (a CRD's schema is never changed in place:
    a new CRD brings new objects)."""
    held = _custom_validators.get(id(schema))
    if held is None or held[0] is not schema:
        held = _custom_validators[id(schema)] = (schema, jsonschema.Draft7Validator(_to_json_schema(schema)))
    return held[1]


def validate_custom(kind: Kind, obj: dict) -> dict:
    """Prune and validate a custom object against its CRD's schema; 422 naming the field."""
    schema = kind.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    pruned = prune(body, schema)
    try:
        _custom_validator(schema).validate(pruned)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "<root>"
        raise invalid(kind.kind, _meta(obj).get("name", ""), f"{where}: {e.message}") from None
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": obj["metadata"], **pruned}


@functools.lru_cache(maxsize=None)
def _builtin_validator(api_version: str, kind: str) -> jsonschema.Validator | None:
    """The strict schema of a built-in kind, as ``kubernetes_validate.validate`` finds and resolves it (the
    newest schema not newer than ``KUBERNETES_VERSION``), once; None where there is none."""
    version = [v for v in all_versions() if major_minor(v) <= major_minor(KUBERNETES_VERSION)][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # rbac.authorization.k8s.io/v1 -> rbac-v1
    try:
        schema = schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", KUBERNETES_VERSION)
    except FileNotFoundError:
        return None
    definitions = schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate_builtin(obj: dict) -> None:
    """Validate against the real Kubernetes schema (kubernetes-validate's, strict: no unknown fields)."""
    validator = _builtin_validator(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
    if validator is None:
        raise invalid(obj.get("kind", "?"), _meta(obj).get("name", ""), "no schema for this kind")
    try:
        validator.validate(obj)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "<root>"
        raise invalid(obj.get("kind", "?"), _meta(obj).get("name", ""), f"{where}: {e.message}") from None


# -- watches ----------------------------------------------------------------------------------------



def fold_string_data(obj: dict) -> None:
    """A Secret's ``stringData`` folded into ``data`` (base64), which must be base64."""
    string_data = obj.pop("stringData", None) or {}
    data = obj.setdefault("data", {})
    for key, value in string_data.items():
        data[key] = base64.b64encode(value.encode()).decode()
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except Exception:
            raise invalid("Secret", obj["metadata"]["name"], f"data[{key}]: illegal base64 data") from None


def default_pod(obj: dict) -> None:
    """What the server defaults in a new pod (of all its defaulting, what the tests meet)."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
