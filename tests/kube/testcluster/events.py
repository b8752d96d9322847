"""Events about pods, written the way the scheduler and kubelet write them (core/v1 Event)."""

from __future__ import annotations

from .errors import ApiError
from .store import Store, now_rfc3339


def record_event(store: Store, obj: dict, type_: str, reason: str, message: str, component: str) -> None:
    meta = obj["metadata"]
    at = now_rfc3339()
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"kind": obj.get("kind", "Pod"), "apiVersion": obj.get("apiVersion", "v1"),
                           "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
        "type": type_, "reason": reason, "message": message,
        "source": {"component": component}, "reportingComponent": component, "reportingInstance": component,
        "firstTimestamp": at, "lastTimestamp": at, "count": 1,
    }
    try:
        store.create(store.kind("", "v1", "events"), meta["namespace"], event, validate=False)
    except ApiError:  # the namespace is going away
        pass
