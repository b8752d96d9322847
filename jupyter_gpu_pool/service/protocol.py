"""The pool service's wire protocol: one JSON object a line over a Unix socket.

A request is ``{"id": 7, "op": "allocate", "args": {...}}``; the reply is ``{"id": 7, "ok": true,
"result": ...}`` or ``{"id": 7, "ok": false, "error": {"reason": ..., "message": ..., "status": ...}}``.
A request line longer than :data:`MAX_FRAME` bytes is refused (the connection is then closed: the
rest of the line cannot be told from the next request); a line that is not a JSON object, an unknown
operation or bad arguments get an error reply and change nothing.  A reply may be up to
:data:`MAX_REPLY` bytes (a pool's journal or leases); the service answers one that would be longer
with an error (``too_large``), and a client reads that much and no more.

The pool's domain types travel as plain JSON: :func:`encode` turns them into dicts (tagged with
their type), :func:`decode` turns such dicts back into the types.
"""

from __future__ import annotations

import dataclasses
import json

from ..pool import GPU, GPUUsage, JournalEntry, Lease, SliceSpec, Snapshot, Waiter
from ..pool.budgets import Budget, Scope, Standing

MAX_FRAME = 1 << 20  # bytes in one request line
MAX_REPLY = 32 << 20  # bytes in one reply line
DEFAULT_SOCKET = "/run/jupyter-gpu-pool/pool.sock"
HELP = "ask your admin to check the pool service (systemctl status jupyter-gpu-pool)"

_TYPES = {cls.__name__: cls for cls in (Lease, Waiter, JournalEntry, GPU, GPUUsage, Snapshot, Standing, Scope,
                                        Budget, SliceSpec)}


class ProtocolError(ValueError):
    """A request the service cannot read: the reply says why, nothing is changed."""

    reason = "bad_request"
    status = 400


def encode(value):
    """Domain values as JSON-able data (dataclasses tagged with ``"__type__"``; tuples as lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, SliceSpec):
            return {"__type__": "SliceSpec", "text": value.to_text()}
        out = {"__type__": type(value).__name__}
        for f in dataclasses.fields(value):
            if f.name == "extra":
                continue
            out[f.name] = encode(getattr(value, f.name))
        return out
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode(v) for v in value]
    return value


def decode(value):
    """The inverse of :func:`encode` (lists that were tuples in a dataclass become tuples again)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("__type__")
    if kind is None:
        return {k: decode(v) for k, v in value.items()}
    if kind == "SliceSpec":
        return SliceSpec.parse(value["text"])
    cls = _TYPES.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown type {kind!r} in a message")
    names = {f.name: f for f in dataclasses.fields(cls)}
    fields = {}
    for name, raw in value.items():
        if name == "__type__" or name not in names:
            continue
        item = decode(raw)
        if isinstance(item, list) and "tuple" in str(names[name].type):
            item = tuple(item)
        fields[name] = item
    return cls(**fields)


def dumps(message: dict) -> bytes:
    return json.dumps(encode(message), separators=(",", ":"), allow_nan=False).encode() + b"\n"


def loads(line: bytes) -> dict:
    """One message from one line; a ProtocolError for anything that is not a JSON object."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"the message is not JSON ({str(e)[:80]})") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a message is a JSON object, not {type(message).__name__}")
    return message
