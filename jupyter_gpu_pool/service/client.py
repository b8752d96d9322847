"""The clients' side of the pool service: a blocking client, the ledger as the service serves it, and
:class:`ServicePool`, which the provisioner, the server extension and the CLI use exactly as they use
a :class:`~jupyter_gpu_pool.local.pool.LocalPool`.

Calls run in threads (``asyncio.to_thread``), each thread with its own connection.  A connection
the service dropped (it restarted) is opened again once; a service that is not there refuses at once
(or within ``connect_timeout``), saying who to ask.  The refusals the service answers come back as
the pool's own exceptions (``QuotaExceeded``, ``PoolExhausted``, ``LeaseNotFound``...), so callers
handle them as they do the local ledger's.
"""

from __future__ import annotations

import math
import socket
import threading

from traitlets.config import Config

from ..config import GPUPool
from ..devices.nvml import Discovery
from ..local.pool import Inventory, Pool
from ..local.store import LeaseStore
from ..pool import HELD, Holder, Lease, LeaseNotFound, LeaseRequest, PoolError, PoolExhausted, QuotaExceeded
from ..pool.budgets import BudgetExceeded, Standing
from ..pool.errors import SERVICE_UNAVAILABLE, MPSUserBusy, UnknownProfile
from ..pool.phases import PhaseConflict, PhaseError
from ..pool.trace import TraceEvent, check
from . import protocol

TRACE_BATCH = 500  # trace events in one request (a request is at most protocol.MAX_FRAME bytes)


class ServiceUnavailable(PoolError):
    """The pool service cannot be reached: nothing can start or change until it is back."""

    reason = SERVICE_UNAVAILABLE
    status = 503

    def __init__(self, path: str, why: str):
        super().__init__(f"The GPU pool service is not answering on {path} ({why}), so no GPU kernel can start "
                         f"right now: {protocol.HELP}.")


class ServiceError(PoolError):
    """The service refused a request for a reason that is not a pool refusal (not yours, a bad request)."""

    def __init__(self, reason: str, status: int, message: str):
        super().__init__(message)
        self.reason, self.status = reason, status


_REFUSALS = {cls.reason: cls for cls in (QuotaExceeded, PoolExhausted, BudgetExceeded, MPSUserBusy, UnknownProfile,
                                         LeaseNotFound)}


def _rebuild(error: dict) -> Exception:
    """The pool's own exception for an error reply (its message as the service wrote it)."""
    reason, message, detail = error.get("reason"), error.get("message", ""), error.get("detail") or {}
    if reason == "phase_conflict":
        return PhaseConflict(detail.get("lease_id", ""), detail.get("expected", ""), detail.get("found", ""),
                             detail.get("state", ""))
    if reason == "phase_error":
        return PhaseError(message)
    cls = _REFUSALS.get(reason)
    if cls is None:
        return ServiceError(reason or "error", error.get("status", 500), message)
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    for key, value in detail.items():
        if key not in ("reason", "message"):
            setattr(err, key, value)
    return err


class ServiceClient:
    """Requests to the pool service on ``path``, one connection per thread."""

    def __init__(self, path: str, *, timeout: float = 15.0, connect_timeout: float = 1.0,
                 max_reply: int = protocol.MAX_REPLY):
        self.path, self.timeout, self.connect_timeout = path, timeout, connect_timeout
        self.max_reply = max_reply
        self._local = threading.local()
        self._ids = 0

    def _connection(self) -> tuple[socket.socket, object]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout)
            try:
                sock.connect(self.path)
            except OSError as e:
                sock.close()
                raise ServiceUnavailable(self.path, e.strerror or str(e)) from None
            sock.settimeout(self.timeout)
            conn = self._local.conn = (sock, sock.makefile("rb"))
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn[1].close()
            conn[0].close()
            self._local.conn = None

    def call(self, op: str, **args):
        """One request; the decoded result, or the error reply raised as the pool's exception."""
        operation = protocol.OPERATIONS.get(op)
        if operation is None or not set(args) <= set(operation.args):  # a mistake of ours, not the user's
            raise ValueError(f"the pool service's protocol has no operation {op!r} taking {sorted(args)}")
        self._ids += 1
        request = protocol.dumps({"id": self._ids, "op": op, "args": args})
        for attempt in (1, 2):
            sock, reader = self._connection()
            try:
                sock.sendall(request)
                line = reader.readline(self.max_reply + 1)
            except TimeoutError:  # there, but stuck: asking again would wait as long again
                self.close()
                raise ServiceUnavailable(self.path, f"no answer within {self.timeout:g} s") from None
            except OSError as e:
                line, why = b"", e.strerror or str(e)
            else:
                why = "the service closed the connection"
            if line.endswith(b"\n"):
                break
            self.close()
            if len(line) > self.max_reply:  # the service's whole answer, cut: asking again gets the same
                raise ServiceError("too_large", 413, f"The pool service's reply is longer than the {self.max_reply} "
                                   "bytes this client reads; ask for less (a smaller 'limit', a shorter time span).")
            # dropped (the service restarted): one new connection
            if attempt == 2:
                raise ServiceUnavailable(self.path, why)
        reply = protocol.loads(line)
        if reply.get("ok"):
            return protocol.decode(reply.get("result"))
        raise _rebuild(reply.get("error") or {})


class ServiceLedger(LeaseStore):
    """The ledger as the service serves it, over the socket.  Who is asking is the service's to know:
    owners, managers, quotas and budgets given here are not sent."""

    def __init__(self, client: ServiceClient):
        self.client = client
        self.path = client.path

    @property
    def where(self) -> str:
        return f"pool service at {self.path}"

    def get(self, lease_id: str) -> Lease | None:
        return self.client.call("get", lease_id=lease_id)

    def by_kernel(self, kernel_id: str) -> Lease | None:
        return self.client.call("by_kernel", kernel_id=kernel_id)

    def leases(self, owner: str | None = None, states: tuple[str, ...] = HELD) -> list[Lease]:
        return self.client.call("leases", owner=owner, states=list(states))

    def snapshot(self):
        return self.client.call("snapshot")

    def waiters(self):
        return self.client.call("waiters")

    def allocate(self, request: LeaseRequest, quotas=None, *, waiter_id: str | None = None, record_refusal: bool = True,
                 **_store_args) -> Lease:
        return self.client.call("allocate", kernel_id=request.kernel_id, profile=request.profile.name,
                                label=request.label, waiter_id=waiter_id, record_refusal=record_refusal)

    def start_without_slice(self, request: LeaseRequest, quotas=None, **_store_args) -> Lease:
        return self.client.call("start_without_slice", kernel_id=request.kernel_id, profile=request.profile.name,
                                label=request.label)

    def resume(self, lease_id: str, quotas=None, *, same_gpu: bool = False, waiter_id: str | None = None,
               record_refusal: bool = True, **_store_args) -> Lease:
        return self.client.call("resume", lease_id=lease_id, same_gpu=same_gpu, waiter_id=waiter_id,
                                record_refusal=record_refusal)

    def release(self, lease_id: str, reason: str = "shutdown") -> Lease | None:
        return self.client.call("release", lease_id=lease_id, reason=reason)

    def set_holder(self, lease_id: str, holder: Holder | None, phase: str | None = None) -> None:
        self.client.call("set_holder", lease_id=lease_id, pid=holder.pid if holder else None, phase=phase)

    def relabel(self, lease_id: str, label: str) -> None:
        self.client.call("relabel", lease_id=lease_id, label=label)

    def stop(self, lease_id: str, *, expect: str | None = None) -> Lease:
        return self.client.call("stop", lease_id=lease_id, expect=expect)

    def set_phase(self, lease_id: str, to: str, *, expect: str | None = None, deadline: float | None = None) -> Lease:
        return self.client.call("set_phase", lease_id=lease_id, to=to, expect=expect, deadline=deadline)

    def adopt(self, lease_id: str, manager: Holder) -> Lease:
        return self.client.call("adopt", lease_id=lease_id)

    def hibernate(self, lease_id: str, host_bytes: int, reason: str = "idle",
                  last_gpus: tuple[str, ...] | None = None, phase: str = "") -> Lease:
        return self.client.call("hibernate", lease_id=lease_id, host_bytes=host_bytes, reason=reason,
                                last_gpus=list(last_gpus or ()), phase=phase)

    def reserve_host_bytes(self, lease_id: str, host_bytes: int, cap: int | None, host: str = "") -> tuple[bool, int]:
        granted, others = self.client.call("reserve_host_bytes", lease_id=lease_id, host_bytes=host_bytes)
        return granted, others

    def host_bytes_on(self, host: str = "") -> int:
        return self.client.call("host_bytes_on", host=host)

    def reconcile(self, is_alive=None, host: str = "") -> list[Lease]:
        return self.client.call("reconcile")

    def enqueue(self, owner: str, kernel_id: str, profile: str, spec, *, lease_id: str | None = None,
                label: str = "", groups: tuple[str, ...] = ()):
        # (the slice is the profile's or the lease's, the groups the caller's: the service's to say)
        return self.client.call("enqueue", kernel_id=kernel_id, profile=profile, lease_id=lease_id, label=label)

    def heartbeat(self, waiter_id: str):
        return self.client.call("heartbeat", waiter_id=waiter_id)

    def dequeue(self, waiter_id: str) -> None:
        self.client.call("dequeue", waiter_id=waiter_id)

    def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
               owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        self.client.call("record", kind=kind, lease_id=lease_id, kernel_id=kernel_id, reason=reason,
                         detail=detail or {})

    def record_refusal(self, kernel_id: str, owner: str, profile: str, err: PoolError, label: str = "") -> None:
        self.client.call("record_refusal", kernel_id=kernel_id, profile=profile, reason=err.reason, message=str(err),
                         label=label)

    def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                limit: int = 200, after_seq: int = 0):
        return self.client.call("journal", since=since, kinds=list(kinds), owner=owner, limit=limit,
                                after_seq=after_seq)

    def budget_standing(self, owner: str, groups: tuple[str, ...] = (), budgets=None) -> Standing | None:
        return self.client.call("budget_standing", owner=owner)

    def trace_record(self, events: list[TraceEvent], keep: float | None = None) -> None:
        """The service keeps the trace as its admin's settings say (``keep`` is theirs: not sent)."""
        for i in range(0, len(events), TRACE_BATCH):
            self.client.call("trace_record", events=[e.to_dict() for e in events[i:i + TRACE_BATCH]])

    def trace_export(self, *, since: float = 0.0, until: float = math.inf, owner: str | None = None,
                     after: tuple[float, int] | None = None,
                     limit: int = 2000) -> tuple[list[TraceEvent], tuple[float, int] | None]:
        page = self.client.call("trace_export", since=since, until=until if math.isfinite(until) else None,
                                owner=owner, after=list(after) if after else None, limit=limit)
        return [check(e) for e in page["events"]], (tuple(page["next"]) if page["next"] else None)

    def spenders(self, since: float) -> list[str]:
        return self.client.call("spenders", since=since)

    def close(self) -> None:
        self.client.close()


class ServicePool(Pool):
    """The pool of a machine whose ledger the pool service keeps: its settings, inventory and leases
    come from the service, and every change goes through it."""

    def __init__(self, client: ServiceClient):
        self.client = client
        reply = client.call("settings")
        # The admin's settings as the service read them: nothing of this user's own configuration.
        self.settings = GPUPool(config=Config({"GPUPool": {**reply["config"], "owner": reply["user"]}})).check()
        self.groups, self.admin = tuple(reply["groups"]), bool(reply["admin"])
        gpus = reply["gpus"]
        self.inventory = Inventory(gpus, Discovery(gpus=gpus, driver_version=reply.get("driver_version")),
                                   reply["note"])
        self.ledger = ServiceLedger(client)
        self.host = reply["host"]

    def groups_of(self, user: str) -> tuple[str, ...]:
        """The caller's groups as the service knows them (Unix and hub groups); another user's as the
        settings say."""
        return self.groups if user == self.settings.owner else self.settings.groups_of(user)

    def allocate(self, request: LeaseRequest, waiter_id: str | None = None, record_refusal: bool = True) -> Lease:
        return self.ledger.allocate(request, waiter_id=waiter_id, record_refusal=record_refusal)

    def start_without_slice(self, request: LeaseRequest) -> Lease:
        return self.ledger.start_without_slice(request)

    def resume(self, lease: Lease, same_gpu: bool = False, waiter_id: str | None = None,
               record_refusal: bool = True) -> Lease:
        return self.ledger.resume(lease.id, same_gpu=same_gpu, waiter_id=waiter_id, record_refusal=record_refusal)

    def reconcile(self) -> list[Lease]:
        return self.ledger.reconcile()

    def mps_env(self, lease: Lease) -> dict[str, str]:
        return self.client.call("mps_env", lease_id=lease.id)

    def reserved(self, candidates, freeing: tuple[str, ...] = (), warned: tuple[str, ...] = ()) -> dict[str, str]:
        if not candidates or not self.settings.sharing.reservations:
            return {}
        return self.client.call("reserved", candidates=[[c.lease.id, c.action, c.idle_since] for c in candidates],
                                freeing=list(freeing), warned=list(warned))
