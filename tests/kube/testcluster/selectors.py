"""Label and field selectors, as the API server reads them from ``?labelSelector=`` and
``?fieldSelector=``."""

from __future__ import annotations

import re

from .errors import ApiError

_SET = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*$")


def _split(text: str) -> list[str]:
    """Split on commas that are not inside ``in (a, b)``."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return parts


def label_matcher(text: str | None):
    """A predicate over a labels dict; ``ApiError`` 400 for a malformed selector."""
    if not text:
        return lambda labels: True
    tests = []
    for part in _split(text):
        if m := _SET.match(part):
            key, op, values = m.group(2), m.group(3), {v.strip() for v in m.group(4).split(",") if v.strip()}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := _EQ.match(part):
            key, op, value = m.groups()
            if op == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := _EXISTS.match(part):
            negate, key = m.group(1) == "!", m.group(2)
            tests.append(lambda labels, k=key, n=negate: (k in labels) != n)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part.strip()!r} in labelSelector {text!r}")
    return lambda labels: all(t(labels) for t in tests)


# Fields each kind can be selected on; the real server refuses others with this same message.
FIELDS = {
    "Pod": {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
            "spec.serviceAccountName", "status.phase", "status.podIP", "status.nominatedNodeName"},
    "Event": {"metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
              "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
              "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
              "source", "type"},
    "Secret": {"metadata.name", "metadata.namespace", "type"},
    "Node": {"metadata.name", "spec.unschedulable"},
    "Namespace": {"metadata.name", "status.phase"},
    "ResourceSlice": {"metadata.name", "spec.nodeName", "spec.driver"},
}
DEFAULT_FIELDS = {"metadata.name", "metadata.namespace"}


def field_value(obj: dict, path: str) -> str:
    """A field of an object as a field selector compares it (a string)."""
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path == "source" and isinstance(value, dict):  # events: source is the component
        value = value.get("component")
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_equalities(text: str | None) -> dict[str, str]:
    """The ``path=value`` terms of a field selector (for an index to narrow a list; ``field_matcher`` judges
    the whole selector, and refuses a bad one)."""
    found = {}
    for part in _split(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|=)\s*(.*?)\s*$", part)
        if m:
            found[m.group(1)] = m.group(3)
    return found


def field_matcher(text: str | None, kind: str):
    if not text:
        return lambda obj: True
    allowed = FIELDS.get(kind, DEFAULT_FIELDS)
    tests = []
    for part in _split(text):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part.strip()!r}")
        path, op, value = m.groups()
        if path not in allowed:
            raise ApiError(400, "BadRequest", f'field label not supported: {path}')
        if op == "!=":
            tests.append(lambda obj, p=path, v=value: field_value(obj, p) != v)
        else:
            tests.append(lambda obj, p=path, v=value: field_value(obj, p) == v)
    return lambda obj: all(t(obj) for t in tests)
