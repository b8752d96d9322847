"""The pool service: the one process that owns the ledger on a shared machine.

Users' Jupyter servers (their provisioners, server extensions) and the CLI talk to it over a Unix
socket; it learns who each caller is from the kernel (``identity.py``), reads the admin's settings
from system locations only, keeps the ledger in a file no user can read or write, runs the MPS
control daemons (one per GPU: an MPS server serves one Unix user at a time), and lets every caller
act on their own leases only (admins on any).  The decisions are the pool core's, through the local
:class:`~jupyter_gpu_pool.local.Ledger`: the service is an adapter, not a second allocator.

Each connection is served by its own task; the ledger's reads run in threads, so a slow or stuck client
holds up nobody but itself, and one user holds at most :data:`MAX_CONNECTIONS` connections at once.
Writes take turns (:meth:`PoolService._writing`): one at a time, one user's at a time, so the event loop
never sleeps on SQLite's write lock and one user's flood of writes delays another's by one write.  Reads
take their user's turn too (:meth:`PoolService._reading`: one of a user's at a time, large replies encoded
in that thread), so one user's flood of large reads delays only that user.  What a user may put on the
journal is capped (:data:`JOURNAL_CAPS`), so what they may read back is bounded too.

The idle policy runs in each user's own Jupyter server, which its user controls.  The GPU-hour budget
is the rule the service also enforces itself: a kernel still active ``budget_grace`` seconds after its
owner's budget ran out (its server did not act on it) is ended by the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import logging
import math
import os
import re
import shutil
import socket
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable

import psutil

from ..local import processes
from ..local.pool import LocalPool
from ..pool import ACTIVE, HELD, HIBERNATED, RELEASED, Holder, Lease, LeaseNotFound, LeaseRequest, PoolError
from ..pool.phases import PHASES, PhaseConflict, PhaseError
from ..pool.trace import TraceError, check
from . import kernels, protocol
from .identity import Caller, Identities, NoSuchUser, Peer, peer_of

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 128  # per user at once: a server uses one per thread (up to 32 each); more is a client gone wrong
# Reads (in threads) take their user's turn (see PoolService._reading); the bulky ones are encoded there too.
READS = frozenset({"get", "by_kernel", "leases", "snapshot", "waiters", "journal", "budget_standing", "spenders",
                   "host_bytes_on", "trace_export"})
BULKY = frozenset({"leases", "snapshot", "waiters", "journal", "trace_export"})
MAX_WAITERS = 8  # places one user may hold in the queue at once
STATES = (ACTIVE, HIBERNATED, RELEASED)


@dataclasses.dataclass(frozen=True)
class JournalCaps:
    """What one (non-admin) user may put on the journal through ``record``: the entries the pool itself
    writes about their leases are not counted against the rate, but are counted as kept."""

    entry_bytes: int = 16 * 1024  # one entry's detail, as JSON
    entries: int = 1000  # kept at once (the ledger keeps entries for its history_seconds: a week)
    bytes: int = 1 << 20  # of detail kept at once
    per_minute: int = 120


JOURNAL_CAPS = JournalCaps()
KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LARGEST = 2**63 - 1  # what SQLite stores as an integer (and a float holds to well past any time or size)
WORD = re.compile(r"[a-z][a-z_]{0,39}")  # a journal entry's kind, a refusal's reason

# Per GPU uuid, per pid, the device memory NVML shows the process holding (None: it would not say);
# None where NVML cannot be read at all.
GPUProcesses = Callable[[set[str]], "dict[str, dict[int, int | None]] | None"]


class Denied(PermissionError):
    reason, status = "not_yours", 403


class Busy(RuntimeError):
    reason, status = "too_many", 429


class GPUMemoryHeld(RuntimeError):
    """A hibernation the service will not record: NVML still shows the kernel's user holding GPU memory."""

    reason, status = "gpu_memory_held", 409


class GPUUnreadable(RuntimeError):
    """A hibernation the service cannot check: NVML does not say what the kernel holds."""

    reason, status = "gpu_unreadable", 503


class StartError(RuntimeError):
    """The service cannot listen where it was told to (the message says why and what to do)."""


class Args:
    """A request's arguments, each checked for its type: a bad one is a :class:`ProtocolError`."""

    def __init__(self, raw):
        if not isinstance(raw, dict):
            raise protocol.ProtocolError(f"'args' must be an object, not {type(raw).__name__}")
        self.raw = raw

    def _get(self, name, kinds, default, required):
        if name not in self.raw or self.raw[name] is None:
            if required:
                raise protocol.ProtocolError(f"'{name}' is required")
            return default
        value = self.raw[name]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise protocol.ProtocolError(f"'{name}' must be {' or '.join(k.__name__ for k in kinds)}, not {value!r}"[:300])
        if isinstance(value, float) and not math.isfinite(value):
            raise protocol.ProtocolError(f"'{name}' must be a finite number, not {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and not -LARGEST <= value <= LARGEST:
            raise protocol.ProtocolError(f"'{name}' is out of range (at most {LARGEST} either way)")
        if isinstance(value, str) and len(value) > 4096:
            raise protocol.ProtocolError(f"'{name}' is too long ({len(value)} characters)")
        return value

    def text(self, name: str, default: str | None = None, required: bool = True) -> str:
        return self._get(name, (str,), default, required and default is None)

    def number(self, name: str, default: float | None = None, required: bool = False) -> float | None:
        value = self._get(name, (int, float), default, required)
        return float(value) if value is not None else None

    def integer(self, name: str, default: int | None = None, required: bool = False) -> int | None:
        return self._get(name, (int,), default, required)

    def flag(self, name: str, default: bool = False) -> bool:
        return self._get(name, (bool,), default, False)

    def texts(self, name: str) -> tuple[str, ...]:
        value = self._get(name, (list,), [], False)
        if not all(isinstance(v, str) and len(v) <= 4096 for v in value) or len(value) > 64:
            raise protocol.ProtocolError(f"'{name}' must be a list of at most 64 names")
        return tuple(value)

    def phase(self, name: str, required: bool = True) -> str | None:
        value = self._get(name, (str,), None, required)
        if value is not None and value not in ("", *PHASES):
            raise protocol.ProtocolError(f"'{name}': {value!r} is not a phase ({', '.join(PHASES)} or '')"[:300])
        return value

    def word(self, name: str) -> str:
        value = self.text(name)
        if not WORD.fullmatch(value):
            raise protocol.ProtocolError(f"'{name}' must be a word of small letters and '_', not {value[:40]!r}")
        return value

    def states(self, name: str) -> tuple[str, ...]:
        value = self.texts(name) or HELD
        unknown = set(value) - set(STATES)
        if unknown:
            raise protocol.ProtocolError(f"'{name}': {sorted(unknown)} are not lease states ({', '.join(STATES)})"[:300])
        return value


class PoolService:
    """Serves the pool's operations to the machine's users over one Unix socket."""

    def __init__(self, pool: LocalPool, identities: Identities, *, reconcile_interval: float = 15.0,
                 frame_timeout: float = 30.0, idle_timeout: float = 3600.0, budget_grace: float = 300.0,
                 gpu_processes: GPUProcesses | None = None, gpu_settle: float = 3.0,
                 max_reply: int = protocol.MAX_REPLY):
        self.pool = pool
        self.ledger = pool.ledger
        self.identities = identities
        self.reconcile_interval = reconcile_interval
        self.frame_timeout, self.idle_timeout = frame_timeout, idle_timeout
        self.budget_grace = budget_grace
        self._gpu_processes = gpu_processes or _nvml_processes
        self.gpu_settle = gpu_settle  # seconds NVML may lag behind a checkpoint before a hibernation is refused
        self.max_reply = max_reply
        self._server: asyncio.AbstractServer | None = None
        self._socket: tuple[str, int] | None = None  # where it listens, and that socket file's inode
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._per_uid: dict[int, int] = {}
        self._recorded: dict[int, list[float]] = {}  # uid -> when its last journal entries were recorded
        self._spent_since: dict[str, float] = {}  # lease id -> when its owner's budget was first seen spent
        self._turns: tuple[asyncio.AbstractEventLoop, asyncio.Lock, dict] | None = None  # see _writing
        self._read_turns: tuple[asyncio.AbstractEventLoop, dict] | None = None  # see _reading
        self._impatient = None  # the loop's ledger connection, which never waits on SQLite's lock
        self.served = 0

    # -- serving ---------------------------------------------------------------------------------

    async def start(self, path: str, *, group: str | None = None) -> None:
        """Listen on ``path``: a socket every user may connect to (``group``: only its members)."""
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o755)  # an existing directory (/run, /tmp) keeps its own mode
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            found = None
        if found is not None and not stat.S_ISSOCK(found.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "a directory" if stat.S_ISDIR(
                found.st_mode) else "a file"
            raise StartError(f"{path} is {kind}, not a socket: the pool service does not replace it. Remove it, or "
                             "give the service another path (PoolService.socket)")
        gid = None
        if group:
            import grp

            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise StartError(f"PoolService.socket_group: there is no Unix group {group!r} on this machine") from None
        # The socket is made, given its group and mode in a directory of the service's own, then renamed into
        # place (which replaces a socket left by a killed service, and follows no link): its path is never
        # chmod-ed or chown-ed where someone could have swapped it for a link to another file.
        try:
            private = tempfile.mkdtemp(prefix=".pool-sock-", dir=directory)
        except OSError as e:
            raise StartError(f"cannot make the socket in {directory}: {e.strerror}; run the service as a user who "
                             "may write there, or give it another path (PoolService.socket)") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            made = os.path.join(private, "s")
            sock.bind(made)
            if gid is not None:
                os.chown(made, -1, gid)
            os.chmod(made, 0o660 if gid is not None else 0o666)  # who may act on what is decided per request
            os.rename(made, path)
            self._socket = (path, os.lstat(path).st_ino)
        except OSError as e:
            sock.close()
            raise StartError(f"cannot put the socket at {path}: {e.strerror}; run the service as a user who may "
                             "write there, or give it another path (PoolService.socket)") from None
        except BaseException:
            sock.close()
            raise
        finally:
            shutil.rmtree(private, ignore_errors=True)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock, limit=protocol.MAX_FRAME)
        log.info("GPU pool service: listening on %s; ledger %s", path, self.ledger.path)

    async def upkeep_forever(self, stop: asyncio.Event) -> None:
        """Every ``reconcile_interval``: release dead kernels' leases, and end kernels past their budget."""
        from ..periodic import every

        async def upkeep() -> None:
            await self._write(None, self.pool.reconcile)
            await self.enforce_budgets()

        await every(self.reconcile_interval, upkeep, stop, what="the service's upkeep")

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task, writer in list(self._connections.items()):
            writer.close()  # its reader then ends too: Python 3.11's wait_for can swallow a cancellation
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=10)
        if self._server is not None:
            await self._server.wait_closed()
        if self._socket is not None:  # ours still (not one a newer service put there): clients find none
            path, inode = self._socket
            with contextlib.suppress(OSError):
                if os.lstat(path).st_ino == inode:
                    os.unlink(path)
            self._socket = None

    # -- writes take turns ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _writing(self, uid: int | None):
        """A turn to write to the ledger: the caller's own turn first (so one user's queued writes wait
        among themselves), then the service's one write lock.  Every write to the ledger, on the loop or
        in a thread, holds it: the loop never finds SQLite's lock taken by a thread of the service."""
        loop = asyncio.get_running_loop()
        if self._turns is None or self._turns[0] is not loop:
            self._turns = (loop, asyncio.Lock(), {})
        _, lock, per_uid = self._turns
        mine = per_uid.get(uid) or per_uid.setdefault(uid, asyncio.Lock())  # one per user of the machine
        async with mine, lock:
            yield

    @contextlib.asynccontextmanager
    async def _reading(self, uid: int):
        """A turn to read: one read of a user's at a time (reads run in threads, encoded there when large), so
        one user's flood of reads, however large, occupies one thread and delays that user only."""
        loop = asyncio.get_running_loop()
        if self._read_turns is None or self._read_turns[0] is not loop:
            self._read_turns = (loop, {})
        per_uid = self._read_turns[1]
        async with per_uid.get(uid) or per_uid.setdefault(uid, asyncio.Lock()):
            yield

    async def _write(self, uid: int | None, fn: Callable, *args, **kwargs):
        """``fn`` (a write to the ledger) in a thread, in its turn."""
        async with self._writing(uid):
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def _write_here(self, uid: int | None, fn: Callable):
        """``fn`` on the loop, in its turn: an allocation costs less than a trip to a thread and back.
        Should SQLite's lock be held all the same (by a process other than the service, or a thread of a
        request whose client hung up), ``fn`` runs again in a thread instead of the loop waiting on it:
        the loop's connection does not wait (its busy timeout is 0), and asking again is safe (each of
        ``fn``'s transactions happened wholly or not at all; an allocation asked again finds its lease)."""
        async with self._writing(uid):
            conn = self.ledger.db.connection()
            if conn is not self._impatient:
                conn.execute("PRAGMA busy_timeout = 0")
                self._impatient = conn
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
            return await asyncio.to_thread(fn)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections[task] = writer
        peer = None
        try:
            peer = peer_of(writer.get_extra_info("socket"))
            self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
            if self._per_uid[peer.uid] > MAX_CONNECTIONS:
                await self._reply(writer, _error(None, Busy.reason, Busy.status,
                                                 f"uid {peer.uid} has {MAX_CONNECTIONS} connections to the pool "
                                                 "service open already; close some"))
                return
            try:
                caller = await asyncio.to_thread(self.identities.caller, peer)
            except NoSuchUser as e:
                await self._reply(writer, _error(None, e.reason, 403, str(e)))
                return
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), self.idle_timeout)
                except ValueError:  # longer than a frame: the rest of it cannot be told from the next request
                    await self._reply(writer, _error(None, "too_large", 413,
                                                     f"a message may be at most {protocol.MAX_FRAME} bytes"))
                    return
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                if not line or not line.endswith(b"\n"):
                    return  # closed, or closed in the middle of a message: nothing to answer
                reply = await self.handle(caller, peer, line, encode=True)
                if not await self._reply(writer, reply):
                    return
        except asyncio.CancelledError:
            pass
        finally:
            if peer is not None:
                self._per_uid[peer.uid] -= 1
                if not self._per_uid[peer.uid]:
                    del self._per_uid[peer.uid]
            self._connections.pop(task, None)
            writer.close()

    async def _reply(self, writer: asyncio.StreamWriter, reply: dict) -> bool:
        line = protocol.dumps_reply(reply)
        if len(line) > self.max_reply:  # (only a read's reply grows: nothing was changed)
            line = protocol.dumps(_error(reply.get("id"), "too_large", 413,
                                         f"the reply would be {len(line)} bytes, more than the {self.max_reply} a "
                                         "reply may be: ask for less (a smaller 'limit', a shorter time span)"))
        try:
            writer.write(line)
            await asyncio.wait_for(writer.drain(), self.frame_timeout)  # a client that never reads stalls itself
            return True
        except (TimeoutError, ConnectionError):
            return False

    async def handle(self, caller: Caller, peer: Peer, line: bytes, *, encode: bool = False) -> dict:
        """One request line → one reply; nothing changes on an error.  ``encode``: a bulky read's result
        comes :class:`~.protocol.Encoded` for the socket (encoded in the caller's read turn, in a thread)."""
        request_id = None
        try:
            message = protocol.loads(line)
            request_id = message.get("id")
            if not isinstance(request_id, (int, str, type(None))) or isinstance(request_id, bool) or \
                    isinstance(request_id, str) and len(request_id) > 64:
                request_id = None
                raise protocol.ProtocolError("'id' must be a number or a short text")
            op = message.get("op")
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) and op.isidentifier() else None
            if handler is None:
                raise protocol.ProtocolError(f"unknown operation {op!r}"[:300])
            args = Args(message.get("args", {}))
            if op in READS:  # in the caller's own turn: one user's reads wait among themselves, not others'
                async with self._reading(caller.uid):
                    result = await handler(caller, peer, args)
                    if encode and op in BULKY:
                        result = protocol.Encoded((await asyncio.to_thread(protocol.dumps, result))[:-1])
            else:
                result = await handler(caller, peer, args)
            self.served += 1
            return {"id": request_id, "ok": True, "result": result}
        except protocol.ProtocolError as e:
            return _error(request_id, e.reason, e.status, str(e))
        except PhaseConflict as e:
            return _error(request_id, "phase_conflict", 409, str(e),
                          {"lease_id": e.lease_id, "expected": e.expected, "found": e.found, "state": e.state})
        except PhaseError as e:
            return _error(request_id, "phase_error", 409, str(e))
        except PoolError as e:
            return _error(request_id, e.reason, e.status or 409, str(e), e.to_dict())
        except (Denied, Busy, GPUMemoryHeld, GPUUnreadable) as e:
            return _error(request_id, e.reason, e.status, str(e))
        except Exception as e:  # a bug must not take the service down: the request fails, others go on
            log.exception("GPU pool service: %s failed", line[:200])
            return _error(request_id, "internal", 500, f"the pool service failed on this request ({e})")

    # -- whose is it -----------------------------------------------------------------------------

    async def _lease(self, caller: Caller, lease_id: str, *, held: bool = True) -> Lease:
        return await asyncio.to_thread(self._lease_of, caller, lease_id, held=held)

    def _lease_of(self, caller: Caller, lease_id: str, *, held: bool = True) -> Lease:
        lease = self.ledger.get(lease_id)
        if lease is None or (held and lease.state not in HELD):
            raise LeaseNotFound(lease_id)
        if lease.owner != caller.user and not caller.admin:
            raise LeaseNotFound(lease_id)  # answered as an unknown id is: whose it is is not told
        return lease

    def _visible(self, caller: Caller, owner: str) -> bool:
        return caller.admin or owner == caller.user

    @staticmethod
    def _holder(caller: Caller, pid: int) -> Holder:
        """A kernel process of the caller's own uid (a lease's holder may be no one else's process)."""
        try:
            proc = psutil.Process(pid)
            uid, start = proc.uids().real, proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            raise Denied(f"process {pid} is not running") from None
        if uid != caller.uid and caller.uid != 0:
            raise Denied(f"process {pid} is not yours: a lease's kernel must be a process of your own user")
        return Holder(pid, start, processes.hostname())

    async def _kernel(self, caller: Caller, args: Args) -> tuple[str, Lease | None]:
        """A kernel id for a new lease or place in the queue, and the caller's lease of it if one is held:
        refused where another user's kernel holds it."""
        kernel_id = _kernel_id(args)
        return kernel_id, await asyncio.to_thread(self._held_kernel, caller, kernel_id)

    def _held_kernel(self, caller: Caller, kernel_id: str) -> Lease | None:
        held = self.ledger.by_kernel(kernel_id)
        if held is not None and held.owner != caller.user:
            raise Denied(f"kernel id {kernel_id[:36]!r} is another user's kernel's")
        return held

    # -- operations: who am I, what is the pool -------------------------------------------------------

    async def op_whoami(self, caller: Caller, peer: Peer, args: Args) -> dict:
        return {"user": caller.user, "groups": list(caller.groups), "admin": caller.admin, "uid": caller.uid}

    async def op_settings(self, caller: Caller, peer: Peer, args: Args) -> dict:
        """What a client needs to work like the pool: the admin's settings, the inventory, this host."""
        inventory = self.pool.inventory
        config = self.pool.settings.raw_config
        if not caller.admin:
            config = _own_settings(config, caller, self.pool.settings.policy)
        return {"config": config, "gpus": inventory.gpus, "note": inventory.note,
                "driver_version": inventory.discovery.driver_version, "host": self.pool.host,
                "user": caller.user, "groups": list(caller.groups), "admin": caller.admin}

    async def op_mps_env(self, caller: Caller, peer: Peer, args: Args) -> dict:
        """The MPS environment for a kernel of the caller's lease on its GPU (the daemon started if needed)."""
        lease = await self._lease(caller, args.text("lease_id"))
        return await asyncio.to_thread(self.pool.mps_env, lease)

    # -- operations: leases ---------------------------------------------------------------------------

    # Allocate and release run on the loop, not in a thread (see _write_here): an allocation (about a
    # millisecond) costs less than handing it to a thread and back (measured: 502 against 946 allocations/s
    # from 16 clients). A refusal's reconcile checks holders with psutil at most once a second.

    async def op_allocate(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        kernel_id = _kernel_id(args)
        profile = self.pool.settings.profile(args.text("profile", required=False, default=""))
        label, waiter_id = args.text("label", default=""), args.text("waiter_id", required=False)
        record_refusal = args.flag("record_refusal", True)
        manager = Holder(peer.pid, _start_of(peer.pid), processes.hostname())

        def allocate() -> Lease:
            existing = self._held_kernel(caller, kernel_id)
            if existing is not None:
                return existing  # a retry after a lost reply: the same lease, not a second one
            request = LeaseRequest(owner=caller.user, kernel_id=kernel_id, profile=profile, groups=caller.groups,
                                   label=label, manager=manager,
                                   alternatives=tuple(self.pool.settings.profiles.values()))  # "… would start now"
            return self.pool.allocate(request, self._own_waiter_of(caller, waiter_id), record_refusal)

        return await self._write_here(caller.uid, allocate)

    async def op_resume(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        waiter_id = await self._own_waiter(caller, args.text("waiter_id", required=False))
        return await self._write(caller.uid, self.pool.resume, lease, args.flag("same_gpu"), waiter_id,
                                 args.flag("record_refusal", True))

    async def op_release(self, caller: Caller, peer: Peer, args: Args) -> Lease | None:
        lease_id, reason = args.text("lease_id"), args.text("reason", default="shutdown")

        def release() -> Lease | None:
            lease = self.ledger.get(lease_id)
            if lease is None or lease.state not in HELD or not self._visible(caller, lease.owner):
                return None  # releasing is idempotent (and another's lease is answered as no lease)
            return self.ledger.release(lease_id, reason)

        return await self._write_here(caller.uid, release)  # on the loop, as an allocation

    async def op_set_holder(self, caller: Caller, peer: Peer, args: Args) -> None:
        lease = await self._lease(caller, args.text("lease_id"))
        pid = args.integer("pid")
        holder = await asyncio.to_thread(self._holder, caller, pid) if pid is not None else None
        await self._write(caller.uid, self.ledger.set_holder, lease.id, holder, args.phase("phase", required=False))

    async def op_stop(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        return await self._write(caller.uid, self.ledger.stop, lease.id, expect=args.phase("expect", required=False))

    async def op_set_phase(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        return await self._write(caller.uid, self.ledger.set_phase, lease.id, args.phase("to"),
                                 expect=args.phase("expect", required=False), deadline=args.number("deadline"))

    async def op_adopt(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        lease = await self._lease(caller, args.text("lease_id"))
        manager = Holder(peer.pid, await asyncio.to_thread(_start_of, peer.pid), processes.hostname())
        return await self._write(caller.uid, self.ledger.adopt, lease.id, manager)

    async def op_hibernate(self, caller: Caller, peer: Peer, args: Args) -> Lease:
        """The caller's server checkpointed its kernel: the slice goes back, but on a real GPU only once
        NVML shows that no process of the owner's holds memory there beyond their other kernels' (a
        client cannot just say so, nor name some other process of theirs as the kernel)."""
        lease = await self._lease(caller, args.text("lease_id"))
        host_bytes = args.integer("host_bytes", default=0)
        if host_bytes < 0:
            raise protocol.ProtocolError("'host_bytes' must be 0 or more")
        real = {u for u in lease.gpus if (g := self.pool.gpu(u)) is not None and not g.declared}
        if real:
            await self._gpu_freed(lease, real, caller.uid)
        return await self._write(caller.uid, self.ledger.hibernate, lease.id, host_bytes,
                                 args.text("reason", default="idle"),
                                 tuple(args.texts("last_gpus")) or None, args.phase("phase", required=False) or "")

    async def _gpu_freed(self, lease: Lease, gpus: set[str], caller_uid: int) -> None:
        """Return once NVML shows no process of the lease's owner holding memory on ``gpus`` but for the
        process trees of the owner's other active kernels; NVML may lag a moment behind a checkpoint, so
        it is asked again for up to ``gpu_settle`` seconds before the hibernation is refused."""
        deadline = time.monotonic() + self.gpu_settle
        while True:
            held = await asyncio.to_thread(self._gpu_held, lease, gpus, caller_uid)
            if held is not None and not held:
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if held is None:
            raise GPUUnreadable("NVML cannot say what the kernel holds on the GPU, so its slice stays held "
                                "(the admin may check the driver: nvidia-smi)")
        total = sum(held.values())
        pids = ", ".join(f"{pid} ({used // 2**20} MiB)" if used else f"{pid}" for pid, used in sorted(held.items()))
        amount = f"{max(total, 2**20) // 2**20} MiB" if total else "memory"  # (NVML need not say how much)
        raise GPUMemoryHeld(f"NVML still shows the kernel's user holding {amount} on the GPU "
                            f"{self.gpu_settle:g} s after its checkpoint (processes {pids}): a hibernated kernel holds "
                            "none, so its slice stays held")

    def _gpu_held(self, lease: Lease, gpus: set[str], caller_uid: int) -> dict[int, int] | None:
        """Per pid, the memory NVML shows the owner's processes holding on ``gpus`` (0 where NVML does not
        say how much), leaving out the owner's other active kernels; None where NVML cannot be read."""
        found = self._gpu_processes(gpus)
        if found is None:
            return None
        uid = next((u for u in (_uid_of(lease.holder_pid), _uid_of(lease.manager_pid)) if u is not None), caller_uid)
        others = {pid for other in self.ledger.leases(lease.owner, states=(ACTIVE,)) if other.id != lease.id
                  for pid in processes.process_tree(other.holder_pid)}
        kernel = set(processes.process_tree(lease.holder_pid))
        held: dict[int, int] = {}
        for per_pid in found.values():
            for pid, used in per_pid.items():
                if pid in others or (pid not in kernel and _uid_of(pid) != uid):
                    continue
                held[pid] = held.get(pid, 0) + (used or 0)
        return held

    async def op_reserve_host_bytes(self, caller: Caller, peer: Peer, args: Args) -> list:
        lease = await self._lease(caller, args.text("lease_id"))
        host_bytes = args.integer("host_bytes", default=0)
        if host_bytes < 0:
            raise protocol.ProtocolError("'host_bytes' must be 0 or more")
        cap = self.pool.settings.hibernation.cap_bytes(psutil.virtual_memory().total)  # the admin's, not the caller's
        granted, others = await self._write(caller.uid, self.ledger.reserve_host_bytes, lease.id, host_bytes,
                                            cap if host_bytes else None, lease.host)
        return [granted, others]

    # -- operations: reading ----------------------------------------------------------------------------

    async def op_get(self, caller: Caller, peer: Peer, args: Args) -> Lease | None:
        lease = await asyncio.to_thread(self.ledger.get, args.text("lease_id"))
        return lease if lease is not None and self._visible(caller, lease.owner) else None

    async def op_by_kernel(self, caller: Caller, peer: Peer, args: Args) -> Lease | None:
        lease = await asyncio.to_thread(self.ledger.by_kernel, args.text("kernel_id"))
        return lease if lease is not None and self._visible(caller, lease.owner) else None

    async def op_leases(self, caller: Caller, peer: Peer, args: Args) -> list[Lease]:
        owner = args.text("owner", required=False)
        found = await asyncio.to_thread(self.ledger.leases, owner, args.states("states"))
        return [lease for lease in found if self._visible(caller, lease.owner)]

    async def op_snapshot(self, caller: Caller, peer: Peer, args: Args):
        """Every GPU's usage (not who holds it) and the caller's own leases and waiters (admins: all)."""
        snap = await asyncio.to_thread(self.ledger.snapshot)
        if caller.admin:
            return snap
        return dataclasses.replace(snap, leases=[x for x in snap.leases if x.owner == caller.user],
                                   waiters=[w for w in snap.waiters if w.owner == caller.user])

    async def op_waiters(self, caller: Caller, peer: Peer, args: Args) -> list:
        return [w for w in await asyncio.to_thread(self.ledger.waiters) if self._visible(caller, w.owner)]

    async def op_journal(self, caller: Caller, peer: Peer, args: Args) -> list:
        owner = args.text("owner", required=False)
        if not caller.admin:
            owner = caller.user
        limit = args.integer("limit", default=200)
        return await asyncio.to_thread(self.ledger.journal, since=args.number("since", default=0.0),
                                       kinds=args.texts("kinds"), owner=owner, limit=max(1, min(limit, 10_000)),
                                       after_seq=args.integer("after_seq", default=0))

    async def op_budget_standing(self, caller: Caller, peer: Peer, args: Args):
        user = args.text("owner", default=caller.user)
        if not self._visible(caller, user):
            raise Denied("another user's GPU time is theirs to see (and the admins')")
        if user == caller.user:
            groups = caller.groups
        else:
            other = await asyncio.to_thread(self.identities.by_name, user)
            groups = other.groups if other is not None else self.pool.settings.groups_of(user)
        book = self.pool.settings.budget_book
        if not book.scopes(user, groups):
            return None
        return await asyncio.to_thread(self.ledger.budget_standing, user, groups, book)

    async def op_spenders(self, caller: Caller, peer: Peer, args: Args) -> list[str]:
        """Who spent GPU time since ``since``: everyone, for an admin; a user learns only of themselves."""
        found = await asyncio.to_thread(self.ledger.spenders, args.number("since", required=True))
        return [user for user in found if self._visible(caller, user)]

    async def op_host_bytes_on(self, caller: Caller, peer: Peer, args: Args) -> int:
        return await asyncio.to_thread(self.ledger.host_bytes_on, args.text("host", default=""))

    # -- operations: the queue and the journal -------------------------------------------------------------

    async def _own_waiter(self, caller: Caller, waiter_id: str | None) -> str | None:
        return await asyncio.to_thread(self._own_waiter_of, caller, waiter_id)

    def _own_waiter_of(self, caller: Caller, waiter_id: str | None) -> str | None:
        """``waiter_id`` where that place in the queue is the caller's (admins: anyone's), live or not; None
        where it is another user's, so that it is answered as a place that does not exist is: nothing of
        it is touched or told, and the caller cannot tell whose it is."""
        if waiter_id is None:
            return None
        owner = self.ledger.waiter_owner(waiter_id)
        return waiter_id if owner is None or self._visible(caller, owner) else None

    async def op_enqueue(self, caller: Caller, peer: Peer, args: Args):
        """A place in the queue, for one of the admin's profiles (a start) or the caller's hibernated
        lease (a resume): what it waits for is the profile's or the lease's slice, never the caller's word."""
        lease_id = args.text("lease_id", required=False)
        kernel_id, _held = await self._kernel(caller, args)
        if lease_id is not None:
            lease = await self._lease(caller, lease_id)
            if lease.kernel_id != kernel_id:
                raise protocol.ProtocolError("'kernel_id' is not the kernel of that lease")
            profile, spec = lease.profile, lease.slice
        else:
            profile = self.pool.settings.profile(args.text("profile")).name
            spec = self.pool.settings.profiles[profile].slice
        mine = [w for w in await asyncio.to_thread(self.ledger.waiters) if w.owner == caller.user]
        if len(mine) >= MAX_WAITERS:
            raise Busy(f"you hold {len(mine)} places in the GPU queue already (at most {MAX_WAITERS})")
        return await self._write(caller.uid, self.ledger.enqueue, caller.user, kernel_id, profile, spec,
                                 lease_id=lease_id, label=args.text("label", default=""))

    async def op_heartbeat(self, caller: Caller, peer: Peer, args: Args):
        waiter_id = await self._own_waiter(caller, args.text("waiter_id"))
        if waiter_id is None:
            return None  # as for a place that is gone
        return await self._write(caller.uid, self.ledger.heartbeat, waiter_id)

    async def op_dequeue(self, caller: Caller, peer: Peer, args: Args) -> None:
        waiter_id = await self._own_waiter(caller, args.text("waiter_id"))
        if waiter_id is not None:
            await self._write(caller.uid, self.ledger.dequeue, waiter_id)

    async def op_record(self, caller: Caller, peer: Peer, args: Args) -> None:
        """An entry on the journal about one of the caller's kernels (its owner is the caller), within the
        caps on what one user may record (:data:`JOURNAL_CAPS`; admins are not capped)."""
        lease_id = args.text("lease_id", required=False)
        kernel_id = args.text("kernel_id", required=False)
        kind, reason = args.word("kind"), args.text("reason", default="")
        owner = caller.user
        if lease_id is not None:
            lease = await self._lease(caller, lease_id, held=False)
            owner = lease.owner
            if kernel_id is not None and kernel_id != lease.kernel_id:
                raise protocol.ProtocolError("'kernel_id' is not the kernel of that lease")
        detail = args.raw.get("detail") or {}
        if not isinstance(detail, dict):
            raise protocol.ProtocolError("'detail' must be an object")
        size = len(protocol.dumps(detail)) - 1
        if size > JOURNAL_CAPS.entry_bytes:
            raise protocol.ProtocolError(f"'detail' is {size} bytes: an entry's detail may be at most "
                                         f"{JOURNAL_CAPS.entry_bytes}")
        if kernel_id is not None:
            await asyncio.to_thread(self._own_kernels, caller, {kernel_id})
        if not caller.admin:
            self._recording_rate(caller)

        def record() -> None:
            if not caller.admin:  # checked in the caller's turn to write: two at once cannot both pass
                entries, stored = self.ledger.journal_held(caller.user)
                if entries >= JOURNAL_CAPS.entries or stored + size > JOURNAL_CAPS.bytes:
                    raise Busy(f"you have {entries} entries ({stored} bytes of detail) on the pool's journal, the "
                               f"most one user may keep (at most {JOURNAL_CAPS.entries} entries, "
                               f"{JOURNAL_CAPS.bytes} bytes); they are kept "
                               f"{self.ledger.history_seconds / 86400:g} days. Record less "
                               "(or ask an admin)")
            self.ledger.record(kind, lease_id=lease_id, kernel_id=kernel_id, owner=owner, reason=reason,
                               detail=detail)

        await self._write(caller.uid, record)

    def _recording_rate(self, caller: Caller) -> None:
        """At most ``JOURNAL_CAPS.per_minute`` entries a minute from one user."""
        now = time.monotonic()
        recent = [t for t in self._recorded.get(caller.uid, ()) if now - t < 60.0]
        if len(recent) >= JOURNAL_CAPS.per_minute:
            self._recorded[caller.uid] = recent
            raise Busy(f"you recorded {len(recent)} journal entries in the last minute, the most one user may "
                       f"(at most {JOURNAL_CAPS.per_minute} a minute): wait a minute, and record less")
        recent.append(now)
        self._recorded[caller.uid] = recent

    def _own_kernels(self, caller: Caller, kernel_ids: set[str]) -> None:
        """Refuse kernel ids another user's lease was taken for (an entry about a kernel is its owner's)."""
        if caller.admin:
            return
        for kernel_id in kernel_ids:
            if self.ledger.kernel_owners(kernel_id) - {caller.user}:
                raise Denied(f"kernel {kernel_id[:40]!r} is not one of your kernels: you can record about your "
                             "own kernels only")

    async def op_record_refusal(self, caller: Caller, peer: Peer, args: Args) -> None:
        refusal = PoolError(args.text("message"))
        refusal.reason = args.word("reason")
        kernel_id, _held = await self._kernel(caller, args)
        await self._write(caller.uid, self.ledger.record_refusal, kernel_id, caller.user,
                          args.text("profile"), refusal)

    async def op_reconcile(self, caller: Caller, peer: Peer, args: Args) -> list:
        """The service reconciles on its own interval; a caller's ask runs one now, unless one ran in
        the last second (a refused allocation reconciles as often)."""
        def unless_just_done() -> list:  # asked again in its turn: many callers at once run one reconcile
            return [] if self.ledger.reconciled_within(1.0) else self.pool.reconcile()

        if self.ledger.reconciled_within(1.0):
            return []
        return await self._write(caller.uid, unless_just_done)

    # -- the activity trace (pool.trace) -----------------------------------------------------------------

    async def op_trace_record(self, caller: Caller, peer: Peer, args: Args) -> int:
        """Activity of the caller's own kernels (admins: anyone's), kept as the admin's settings say."""
        raw = args.raw.get("events")
        if not isinstance(raw, list) or len(raw) > 1000:
            raise protocol.ProtocolError("'events' must be a list of at most 1000 trace events")
        events = []
        for i, item in enumerate(raw):
            try:
                event = check(item)
            except TraceError as e:
                raise protocol.ProtocolError(f"events[{i}]: {e}") from None
            if event.owner is None:
                event = dataclasses.replace(event, owner=caller.user)
            if not self._visible(caller, event.owner):
                raise Denied(f"events[{i}] is about {event.owner}'s kernel: you can record your own kernels' "
                             "activity only")
            events.append(event)
        await asyncio.to_thread(self._own_kernels, caller, {e.kernel_id for e in events if e.kernel_id})
        settings = self.pool.settings
        if not settings.trace_recording:
            return 0
        await self._write(caller.uid, self.ledger.trace_record, events, settings.trace_retention)
        return len(events)

    async def op_trace_export(self, caller: Caller, peer: Peer, args: Args) -> dict:
        """One page of the trace: the caller's own kernels' (admins: everyone's, or ``owner``'s)."""
        owner = args.text("owner", required=False)
        if owner is not None and not self._visible(caller, owner):
            raise Denied("another user's activity is theirs to export (and the admins')")
        if not caller.admin:
            owner = caller.user
        after = args.raw.get("after")
        if after is not None and (not isinstance(after, list) or len(after) != 2 or isinstance(after[0], bool)
                                  or not isinstance(after[0], (int, float)) or isinstance(after[1], bool)
                                  or not isinstance(after[1], int) or not abs(after[0]) <= LARGEST
                                  or not abs(after[1]) <= LARGEST):
            raise protocol.ProtocolError("'after' must be [time, row] from the previous page's 'next'")
        limit = max(1, min(args.integer("limit", default=2000), 2000))
        events, following = await asyncio.to_thread(
            self.ledger.trace_export, since=args.number("since", default=0.0),
            until=args.number("until", default=math.inf), owner=owner,
            after=(float(after[0]), after[1]) if after else None, limit=limit)
        return {"events": [e.to_dict() for e in events], "next": list(following) if following else None}

    # -- the budget, enforced ---------------------------------------------------------------------------

    async def enforce_budgets(self) -> list[Lease]:
        """End the kernels still active ``budget_grace`` seconds after their owner's GPU-hour budget ran
        out: their server should have acted (the policy warns at 90% and acts at 100%), and did not."""
        book = self.pool.settings.budget_book
        if not book.budgets:
            return []
        now = time.monotonic()
        active = [lease for lease in await asyncio.to_thread(self.ledger.leases, None, (ACTIVE,)) if not lease.phase]
        spent: dict[str, bool] = {}
        ended = []
        for lease in active:
            if lease.owner not in spent:
                standing = await asyncio.to_thread(self.ledger.budget_standing, lease.owner, lease.groups, book)
                spent[lease.owner] = standing is not None and standing.exhausted
            if not spent[lease.owner]:
                self._spent_since.pop(lease.id, None)
                continue
            since = self._spent_since.setdefault(lease.id, now)
            if now - since < self.budget_grace:
                continue
            log.warning("GPU pool service: %s's GPU time is used up and kernel %s still runs %.0fs later; "
                        "ending it", lease.owner, lease.kernel_id, now - since)
            owner = await asyncio.to_thread(self.identities.by_name, lease.owner)
            await asyncio.to_thread(kernels.end_kernel, lease.holder_pid, lease.holder_start,
                                    owner.uid if owner is not None else None)
            released = await self._write(None, self.ledger.release, lease.id,
                                         "budget: GPU time used up (ended by the pool service)")
            if released is not None:
                ended.append(released)
        self._spent_since = {k: v for k, v in self._spent_since.items() if k in {x.id for x in active}}
        return ended


def _error(request_id, reason: str, status: int, message: str, detail: dict | None = None) -> dict:
    error = {"reason": reason, "status": status, "message": message}
    if detail:
        error["detail"] = detail
    return {"id": request_id, "ok": False, "error": error}


def _own_settings(config: dict, caller: Caller, rules: tuple) -> dict:
    """The admin's settings as a user may see them: the pool-wide ones, and of the settings by user or
    group only the caller's own entries and their groups' (no other user's quota, budget or groups); of
    the idle policy, the rules that may match the caller's kernels (in their order: the first that fits
    is the same rule)."""
    members = config.get("group_members") or {}
    mine = {caller.user, *caller.groups, *(k for k, v in members.items() if caller.user in v)}
    written = config.get("policy") or []
    if len(written) == len(rules):
        groups = tuple(sorted(mine - {caller.user}))
        config = {**config, "policy": [w for w, rule in zip(written, rules) if _may_match(rule, caller.user, groups)]}
    return {**config,
            "user_quotas": {k: v for k, v in (config.get("user_quotas") or {}).items() if k == caller.user},
            "group_quotas": {k: v for k, v in (config.get("group_quotas") or {}).items() if k in mine},
            "group_members": {k: [caller.user] for k, v in members.items() if caller.user in v},
            "budgets": {k: v for k, v in (config.get("budgets") or {}).items() if k in mine}}


def _may_match(rule, user: str, groups: tuple[str, ...]) -> bool:
    """Whether a rule of the idle policy may match a kernel of ``user`` (in ``groups``)."""
    match = rule.match
    return (not match.user or any(fnmatch.fnmatchcase(user, p) for p in match.user)) and \
        (not match.group or any(fnmatch.fnmatchcase(g, p) for p in match.group for g in groups))


def _kernel_id(args: Args) -> str:
    kernel_id = args.text("kernel_id")
    if not KERNEL_ID.fullmatch(kernel_id):
        raise protocol.ProtocolError(f"'kernel_id' must be a kernel's id (letters, digits, '-', '_', '.'; at most "
                                     f"128), not {kernel_id[:40]!r}")
    return kernel_id


def _start_of(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def _uid_of(pid: int | None) -> int | None:
    if not pid:
        return None
    try:
        return psutil.Process(pid).uids().real
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _nvml_processes(gpus: set[str]) -> dict[str, dict[int, int | None]] | None:
    """Per GPU, per pid, the memory NVML shows; None where NVML cannot be read."""
    from ..devices.telemetry import NVMLSource

    source = NVMLSource()
    if not source.available()[0]:
        return None
    readings = source.read(gpus)
    if set(readings) != set(gpus):
        return None  # a GPU NVML does not know (gone since discovery): it cannot say
    return {uuid: {pid: r.memory for pid, r in procs.items()} for uuid, procs in readings.items()}
