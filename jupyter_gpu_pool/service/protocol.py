"""The pool service's wire protocol: one JSON object a line over a Unix socket.

A request is ``{"id": 7, "op": "allocate", "args": {...}}``; the reply is ``{"id": 7, "ok": true,
"result": ...}`` or ``{"id": 7, "ok": false, "error": {"reason": ..., "message": ..., "status": ...}}``.
A request line longer than :data:`MAX_FRAME` bytes is refused (the connection is then closed: the
rest of the line cannot be told from the next request); a line that is not a JSON object, names a key
twice in any of its objects, an unknown operation or bad arguments get an error reply and change nothing.  A reply may be up to
:data:`MAX_REPLY` bytes (a pool's journal or leases); the service answers one that would be longer
with an error (``too_large``), and a client reads that much and no more.

The operations are declared once, in :data:`OPERATIONS` (each with its arguments and who may call it):
the service serves them and the client sends them from that table.

The pool's domain types travel as plain JSON objects tagged with their type (``"__type__"``), and
:func:`decode` reads such tags only where the protocol puts domain values: the result itself, the items
of a list result, the values of an object result (and the items of lists there), and inside a domain
value its fields declared as domain types.  Everything else is data and stays as it came, so a user's
text (a journal entry's ``detail``) can never be taken for a type.
"""

from __future__ import annotations

import dataclasses
import json
import re

from ..pool import GPU, GPUUsage, JournalEntry, Lease, SliceSpec, Snapshot, Waiter
from ..pool.budgets import Budget, Scope, Standing

MAX_FRAME = 1 << 20  # bytes in one request line
MAX_REPLY = 32 << 20  # bytes in one reply line
DEFAULT_SOCKET = "/run/jupyter-gpu-pool/pool.sock"
HELP = "ask your admin to check the pool service (systemctl status jupyter-gpu-pool)"

_TYPES = {cls.__name__: cls for cls in (Lease, Waiter, JournalEntry, GPU, GPUUsage, Snapshot, Standing, Scope,
                                        Budget, SliceSpec)}


OWN = "own"  # a pool user, on their own rows only (admins: anyone's)
POOL = "pool"  # a pool user, on the pool as a whole: no one's rows


@dataclasses.dataclass(frozen=True)
class Operation:
    """One operation of the protocol, declared once: what it takes and who may call it; the service
    serves it so (its handler reads only these arguments), the client sends it so."""

    name: str
    args: tuple[str, ...] = ()
    who: str = OWN
    reads: bool = False  # a read: served in the caller's own turn to read (the service's turns.py)
    bulky: bool = False  # a read whose reply may be large: encoded in that turn's thread too


OPERATIONS = {op.name: op for op in (
    Operation("whoami", who=POOL),
    Operation("settings", who=POOL),
    Operation("mps_env", ("lease_id",)),
    Operation("allocate", ("kernel_id", "profile", "label", "waiter_id", "record_refusal")),
    Operation("start_without_slice", ("kernel_id", "profile", "label")),
    Operation("resume", ("lease_id", "waiter_id", "same_gpu", "record_refusal")),
    Operation("release", ("lease_id", "reason")),
    Operation("set_holder", ("lease_id", "pid", "phase")),
    Operation("relabel", ("lease_id", "label")),
    Operation("stop", ("lease_id", "expect")),
    Operation("set_phase", ("lease_id", "to", "expect", "deadline")),
    Operation("adopt", ("lease_id",)),
    Operation("hibernate", ("lease_id", "host_bytes", "reason", "last_gpus", "phase")),
    Operation("reserve_host_bytes", ("lease_id", "host_bytes")),
    Operation("get", ("lease_id",), reads=True),
    Operation("by_kernel", ("kernel_id",), reads=True),
    Operation("leases", ("owner", "states"), reads=True, bulky=True),
    Operation("snapshot", (), reads=True, bulky=True),
    Operation("waiters", (), reads=True, bulky=True),
    Operation("journal", ("since", "kinds", "owner", "limit", "after_seq"), reads=True, bulky=True),
    Operation("budget_standing", ("owner",), reads=True),
    Operation("spenders", ("since",), reads=True),
    Operation("host_bytes_on", ("host",), who=POOL, reads=True),
    Operation("reserved", ("candidates", "freeing", "warned"), reads=True),
    Operation("enqueue", ("kernel_id", "profile", "lease_id", "label")),
    Operation("heartbeat", ("waiter_id",)),
    Operation("dequeue", ("waiter_id",)),
    Operation("record", ("kind", "lease_id", "kernel_id", "reason", "detail")),
    Operation("record_refusal", ("kernel_id", "profile", "reason", "message", "label")),
    Operation("reconcile", who=POOL),
    Operation("trace_record", ("events",)),
    Operation("trace_export", ("since", "until", "owner", "after", "limit"), reads=True, bulky=True),
)}


class ProtocolError(ValueError):
    """A request the service cannot read: the reply says why, nothing is changed."""

    reason = "bad_request"
    status = 400


def _tagged(value):
    """json's hook for what it cannot write itself: dataclasses tagged with their type, sets as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, SliceSpec):
            return {"__type__": "SliceSpec", "text": value.to_text()}
        out = {"__type__": type(value).__name__}
        for f in dataclasses.fields(value):
            if f.name != "extra":
                out[f.name] = getattr(value, f.name)
        return out
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not a value the protocol carries")


def dumps(message) -> bytes:
    """One line (json's own C encoder does the walking: a large reply costs milliseconds, not seconds)."""
    return json.dumps(message, default=_tagged, separators=(",", ":"), allow_nan=False).encode() + b"\n"


class Encoded(bytes):
    """A reply's result encoded already (in a thread, off the service's event loop)."""


def dumps_reply(reply: dict) -> bytes:
    """A reply's line; a result :class:`Encoded` already goes in as it is."""
    result = reply.get("result")
    if not isinstance(result, Encoded):
        return dumps(reply)
    head = dumps({k: v for k, v in reply.items() if k != "result"})[:-2]  # without its closing brace
    return head + b',"result":' + result + b"}\n"


def encode(value):
    """Domain values as JSON-able data (dataclasses tagged with ``"__type__"``; tuples as lists)."""
    return json.loads(dumps(value))


def decode(value, *, outer: bool = True):
    """A reply's result as the domain values it carries (see the module's doc for where tags are read)."""
    if isinstance(value, list):
        return [decode(v, outer=outer) for v in value]
    if not isinstance(value, dict):
        return value
    if "__type__" in value:
        return _object(value)
    if outer:
        return {k: decode(v, outer=False) for k, v in value.items()}
    return value  # data


_DECLARED = re.compile(r"\b(" + "|".join(_TYPES) + r")\b")


def _object(value: dict):
    kind = value["__type__"]
    if kind == "SliceSpec":
        return SliceSpec.parse(value["text"])
    cls = _TYPES.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown type {kind!r} in a message")
    names = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    fields = {}
    for name, raw in value.items():
        if name not in names:
            continue
        declared = names[name]
        item = decode(raw, outer=False) if _DECLARED.search(declared) else raw
        if isinstance(item, list) and "tuple" in declared:
            item = tuple(item)
        fields[name] = item
    return cls(**fields)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's hook for each object of a request: a key named twice is refused (json would keep the last one,
    so a frame could read as one operation to a person or a proxy and act as another)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _value in pairs if key in seen or seen.add(key))
        raise ProtocolError(f"the message is malformed: it names {twice[:64]!r} twice (each key may appear once)")
    return found


def loads(line: bytes, *, strict: bool = False) -> dict:
    """One message from one line; a ProtocolError for anything that is not a JSON object.  ``strict``: a
    request to the service, where an object that names a key twice is refused too (a reply comes from
    the service itself, and is read at json's full speed)."""
    try:
        message = json.loads(line, object_pairs_hook=_unique_keys if strict else None)
    except ProtocolError:
        raise
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"the message is not JSON ({str(e)[:80]})") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a message is a JSON object, not {type(message).__name__}")
    return message
