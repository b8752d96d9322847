"""Dynamic Resource Allocation (``resource.k8s.io/v1``) for the test cluster: what the resource claim
controller, the scheduler's DRA plugin and a DRA driver's kubelet plugin do, in small.

- A node spec's ``"dra"`` list is its devices: the cluster publishes them as the node's
  ResourceSlice (driver ``gpu.nvidia.com``, pool = the node), as NVIDIA's DRA driver's kubelet
  plugin does, and creates that driver's DeviceClasses (``gpu.nvidia.com``: devices of type
  ``gpu``; ``mig.nvidia.com``: of type ``mig``), as its Helm chart does.
- :class:`ClaimController`: for each pod claim that names a ResourceClaimTemplate, a ResourceClaim
  (``<pod>-<claim>-<random>``, owned by the pod, annotated with the pod's claim name) and the pod's
  ``status.resourceClaimStatuses``; a missing template is a ``FailedResourceClaimCreation`` Event and
  a retry; the claims of a pod that is done are deleted (the pod's deletion takes them with it, by
  the garbage collector).
- :class:`Allocator` (called by the scheduler for each node): every request of every claim of the
  pod gets devices of that node that match its DeviceClass's and its own CEL selectors (evaluated by
  cel-python, with Kubernetes' ``quantity()`` and ``compareTo()``), ``count`` of them
  (``ExactCount``) or all (``All``); a device is used by one claim at a time, unless it allows
  multiple allocations and the request asks for ``capacity`` (consumable capacity: what is left of
  the capacity must cover it, and the result records what it consumed).  The claims' status gets
  the allocation (results, class and claim configuration, a node selector) and ``reservedFor`` the
  pod, then the pod is bound; where no node can satisfy them the pod is ``Unschedulable`` with the
  real scheduler's words, "cannot allocate all claims".
- The kubelet gives the container ``TESTCLUSTER_DRA_DEVICES`` (``driver/pool/device``, comma
  separated) in place of the CDI devices a real driver injects.

A missing DeviceClass makes the pod unschedulable with the allocator's error ("could not retrieve device
class ...") as its reason, where the real scheduler may word it otherwise.  Consumable capacity follows
the DRAConsumableCapacity feature gate (``--feature-gates``; off by default, as in 1.34): off, the API
server drops a request's ``capacity`` and a device's ``allowMultipleAllocations`` (store.py), so such a
claim takes a whole device.

Where it differs: no ``firstAvailable`` requests, constraints, admin access, device taints or
tolerations, partitionable devices (shared counters) or binding conditions; a CEL expression that
fails to evaluate for a device counts as no match (the real allocator reports the error); quantities
in CEL are whole numbers of base units, so ``>=`` works where Kubernetes needs ``compareTo``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import uuid

import celpy
from celpy import celtypes

from .errors import ApiError
from .events import record_event
from .quantities import parse_quantity
from .store import Store, now_rfc3339

log = logging.getLogger("testcluster.dra")

DRIVER = "gpu.nvidia.com"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
TERMINAL = ("Succeeded", "Failed")


def nvidia_device_classes() -> list[dict]:
    """The DeviceClasses NVIDIA's DRA driver's Helm chart creates."""
    def device_class(name: str, kind: str) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                              f"device.attributes['{DRIVER}'].type == '{kind}'"}}]}}
    return [device_class("gpu.nvidia.com", "gpu"), device_class("mig.nvidia.com", "mig")]


def resource_slice(node: dict) -> dict:
    """A node's devices (``{"name", "attributes": {name: value}, "capacity": {name: quantity},
    "allowMultipleAllocations"}``) as the ResourceSlice a DRA driver publishes."""
    devices = []
    for d in node["dra"]:
        attributes = {}
        for name, value in d.get("attributes", {}).items():
            kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"
            attributes[name] = {kind: value}
        device = {"name": d["name"], "attributes": attributes,
                  "capacity": {name: {"value": str(v), **({"requestPolicy": d["requestPolicy"][name]}
                                                          if name in d.get("requestPolicy", {}) else {})}
                               for name, v in d.get("capacity", {}).items()}}
        if d.get("allowMultipleAllocations"):
            device["allowMultipleAllocations"] = True
        devices.append(device)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node['name']}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node["name"],
                     "pool": {"name": node["name"], "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


# -- CEL ------------------------------------------------------------------------------------------

def _quantity(text) -> celtypes.IntType:
    return celtypes.IntType(math.ceil(parse_quantity(str(text))))


def _compare_to(a, b) -> celtypes.IntType:
    return celtypes.IntType((a > b) - (a < b))


_FUNCTIONS = {"quantity": _quantity, "compareTo": _compare_to,
              "isGreaterThan": lambda a, b: celtypes.BoolType(a > b),
              "isLessThan": lambda a, b: celtypes.BoolType(a < b)}
_PROGRAMS: dict[str, object] = {}


@functools.cache
def _environment() -> celpy.Environment:
    """Built at the first selector (its parser takes half a second: most test clusters never see a claim)."""
    return celpy.Environment()


def _program(expression: str):
    if expression not in _PROGRAMS:
        env = _environment()
        _PROGRAMS[expression] = env.program(env.compile(expression), functions=_FUNCTIONS)
    return _PROGRAMS[expression]


def _qualified(driver: str, name: str) -> tuple[str, str]:
    return tuple(name.split("/", 1)) if "/" in name else (driver, name)  # type: ignore[return-value]


def cel_device(driver: str, device: dict) -> dict:
    """The ``device`` variable of a selector: driver, attributes and capacity by domain."""
    attributes: dict[str, dict] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, short = _qualified(driver, name)
        attributes.setdefault(domain, {})[short] = next(iter(value.values()))
    capacity: dict[str, dict] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, short = _qualified(driver, name)
        capacity.setdefault(domain, {})[short] = math.ceil(parse_quantity(value["value"]))
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


def matches(expression: str, device: dict) -> bool:
    try:
        result = _program(expression).evaluate({"device": celpy.json_to_cel(device)})
    except Exception as e:  # noqa: BLE001 (see the module docstring)
        log.debug("CEL %r failed on %s: %s", expression, device, e)
        return False
    return bool(result) and not isinstance(result, celpy.CELEvalError)


# -- allocation -----------------------------------------------------------------------------------

class Unsatisfiable(Exception):
    pass


class Allocator:
    def __init__(self, store: Store):
        self.store = store
        self.claims_kind = store.kind("resource.k8s.io", "v1", "resourceclaims")
        self.slices_kind = store.kind("resource.k8s.io", "v1", "resourceslices")
        self.classes_kind = store.kind("resource.k8s.io", "v1", "deviceclasses")

    def claims_of(self, pod: dict) -> list[dict] | None:
        """The pod's ResourceClaims, or None while the claim controller has not made them all."""
        statuses = {s["name"]: s.get("resourceClaimName") for s in
                    (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        claims = []
        for ref in pod["spec"].get("resourceClaims") or []:
            name = ref.get("resourceClaimName") or statuses.get(ref["name"])
            if not name:
                return None
            try:
                claims.append(self.store.get(self.claims_kind, pod["metadata"]["namespace"], name))
            except ApiError:
                return None
        return claims

    def _used(self) -> tuple[set[tuple[str, str, str]], dict[tuple[str, str, str], dict[str, float]]]:
        """Devices held whole, and what was consumed of the others' capacity."""
        whole: set[tuple[str, str, str]] = set()
        consumed: dict[tuple[str, str, str], dict[str, float]] = {}
        for claim in self.store.list(self.claims_kind, None)[0]:
            for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                    "results") or []:
                key = (r["driver"], r["pool"], r["device"])
                if r.get("consumedCapacity"):
                    per = consumed.setdefault(key, {})
                    for name, value in r["consumedCapacity"].items():
                        per[name] = per.get(name, 0) + parse_quantity(value)
                else:
                    whole.add(key)
        return whole, consumed

    def allocate(self, pod: dict, claims: list[dict], node: str) -> list[tuple[dict, dict]]:
        """(claim, its status) for each claim not yet allocated, on ``node``; :class:`Unsatisfiable`."""
        slices = [s for s in self.store.list(self.slices_kind, None)[0] if s["spec"].get("nodeName") == node]
        devices = [(s["spec"]["driver"], s["spec"]["pool"]["name"], d) for s in slices for d in s["spec"]["devices"]]
        whole, consumed = self._used()
        out = []
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
                if terms and node not in terms[0]["matchFields"][0]["values"]:
                    raise Unsatisfiable("cannot allocate all claims")
                continue
            results, configs = [], []
            for request in claim["spec"]["devices"].get("requests") or []:
                exactly = request.get("exactly")
                if exactly is None:
                    raise Unsatisfiable("the test scheduler allocates only 'exactly' requests")
                try:
                    klass = self.store.get(self.classes_kind, None, exactly["deviceClassName"])
                except ApiError as e:  # the real allocator's words
                    raise Unsatisfiable(f"claim {claim['metadata']['namespace']}/{claim['metadata']['name']}, "
                                        f"request {request['name']}: could not retrieve device class "
                                        f"{exactly['deviceClassName']}: {e.message}") from None
                selectors = [s["cel"]["expression"] for s in (klass["spec"].get("selectors") or [])]
                selectors += [s["cel"]["expression"] for s in exactly.get("selectors") or []]
                configs += [{"source": "FromClass", "requests": [request["name"]], **c}
                            for c in klass["spec"].get("config") or []]
                wanted = (exactly.get("capacity") or {}).get("requests") or {}
                picked = []
                for driver, pool, device in devices:
                    key = (driver, pool, device["name"])
                    if key in whole or not all(matches(e, cel_device(driver, device)) for e in selectors):
                        continue
                    if wanted:
                        if not device.get("allowMultipleAllocations"):
                            continue
                        left = {n: parse_quantity(c["value"]) - consumed.get(key, {}).get(n, 0)
                                for n, c in (device.get("capacity") or {}).items()}
                        if any(parse_quantity(v) > left.get(n, 0) for n, v in wanted.items()):
                            continue
                        per = consumed.setdefault(key, {})
                        for n, v in wanted.items():
                            per[n] = per.get(n, 0) + parse_quantity(v)
                        picked.append({"request": request["name"], "driver": driver, "pool": pool,
                                       "device": device["name"], "consumedCapacity": dict(wanted),
                                       "shareID": str(uuid.uuid4())})
                    else:
                        if key in consumed:
                            continue  # shared already: not to be had whole
                        whole.add(key)
                        picked.append({"request": request["name"], "driver": driver, "pool": pool,
                                       "device": device["name"]})
                    if exactly.get("allocationMode", "ExactCount") == "ExactCount" and \
                            len(picked) == int(exactly.get("count", 1)):
                        break
                if exactly.get("allocationMode", "ExactCount") == "ExactCount" and \
                        len(picked) < int(exactly.get("count", 1)) or not picked:
                    raise Unsatisfiable("cannot allocate all claims")
                results += picked
            configs += [{"source": "FromClaim", **c} for c in claim["spec"]["devices"].get("config") or []]
            devices_result: dict = {"results": results}
            if configs:
                devices_result["config"] = configs
            out.append((claim, {"allocation": {
                "devices": devices_result, "allocationTimestamp": now_rfc3339(),
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                                 "uid": pod["metadata"]["uid"]}]}))
        return out

    def commit(self, allocations: list[tuple[dict, dict]]) -> None:
        for claim, status in allocations:
            self.store.patch(self.claims_kind, claim["metadata"]["namespace"], claim["metadata"]["name"],
                             "application/merge-patch+json", {"status": status}, "status")


class ClaimController:
    """Makes each pod's claims from their templates, and deletes the claims of pods that are done.  It keeps
    the pods that claim from templates from its watch (the others are none of its business)."""

    def __init__(self, store: Store):
        self.store = store
        self.pods = store.kind("", "v1", "pods")
        self.claims = store.kind("resource.k8s.io", "v1", "resourceclaims")
        self.templates = store.kind("resource.k8s.io", "v1", "resourceclaimtemplates")
        self._reported: set[tuple[str, str]] = set()
        self._claiming: dict[str, dict] = {}  # pod uid -> the pod (as stored, read-only)

    def observe(self, event: dict) -> None:
        pod = event["object"]
        if event["type"] == "DELETED":
            self._claiming.pop(pod["metadata"]["uid"], None)
        elif any(r.get("resourceClaimTemplateName") for r in pod["spec"].get("resourceClaims") or []):
            self._claiming[pod["metadata"]["uid"]] = pod

    def sync_once(self) -> None:
        for pod in list(self._claiming.values()):
            refs = [r for r in pod["spec"].get("resourceClaims") or [] if r.get("resourceClaimTemplateName")]
            if not refs:
                continue
            statuses = {s["name"]: s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                for s in statuses.values():
                    try:
                        self.store.delete(self.claims, pod["metadata"]["namespace"], s["resourceClaimName"])
                    except ApiError:
                        pass
                continue
            missing = [r for r in refs if r["name"] not in statuses]
            if not missing or pod["metadata"].get("deletionTimestamp"):
                continue
            made = dict(statuses)
            for ref in missing:
                claim = self._make_claim(pod, ref)
                if claim is not None:
                    made[ref["name"]] = {"name": ref["name"], "resourceClaimName": claim["metadata"]["name"]}
            if len(made) > len(statuses):
                try:
                    self.store.patch(self.pods, pod["metadata"]["namespace"], pod["metadata"]["name"],
                                     "application/merge-patch+json",
                                     {"status": {"resourceClaimStatuses": list(made.values())}}, "status")
                except ApiError:
                    pass

    def _make_claim(self, pod: dict, ref: dict) -> dict | None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            template = self.store.get(self.templates, ns, ref["resourceClaimTemplateName"])
        except ApiError as e:
            if (pod["metadata"]["uid"], ref["name"]) not in self._reported:
                self._reported.add((pod["metadata"]["uid"], ref["name"]))
                record_event(self.store, pod, "Warning", "FailedResourceClaimCreation",
                             f"PodResourceClaim {ref['name']}: resource claim template "
                             f"\"{ref['resourceClaimTemplateName']}\": {e.message}", "resource_claim")
            return None
        meta = {"generateName": f"{name}-{ref['name']}-", "namespace": ns,
                "annotations": {POD_CLAIM_ANNOTATION: ref["name"]},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"],
                                     "controller": True, "blockOwnerDeletion": True}]}
        labels = (template["spec"].get("metadata") or {}).get("labels")
        if labels:
            meta["labels"] = labels
        return self.store.create(self.claims, ns, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                                   "metadata": meta, "spec": template["spec"]["spec"]})

    async def run(self) -> None:
        wake = self.store.watch(self.pods, None, None, None, None, False)
        try:
            while True:
                while not wake.queue.empty():
                    event = wake.queue.get_nowait()
                    if event is not None:
                        self.observe(event)
                self.sync_once()
                try:
                    event = await asyncio.wait_for(wake.queue.get(), 1.0)
                    if event is not None:
                        self.observe(event)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.store.unwatch(wake)
