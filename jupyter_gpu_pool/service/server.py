"""The pool service: the one process that owns the ledger on a shared machine.

Users' Jupyter servers (their provisioners, server extensions) and the CLI talk to it over a Unix
socket; it learns who each caller is from the kernel (``identity.py``), reads the admin's settings
from system locations only, keeps the ledger in a file no user can read or write, runs the MPS
control daemons (one per GPU: an MPS server serves one Unix user at a time), and lets every caller
act on their own leases only (admins on any: ``operations.py``).

This module is the transport: the socket's life, one task per connection (a slow or stuck client holds
up nobody but itself; one user holds at most :data:`MAX_CONNECTIONS` connections at once), a request's
dispatch to its operation in its turn (``turns.py``: one user's reads and writes wait among themselves,
never on another user's), and a refusal's reply.

The idle policy runs in each user's own Jupyter server, which its user controls.  The GPU-hour budget
is the rule the service also enforces itself (``enforcement.py``): a kernel still active
``budget_grace`` seconds after its owner's budget ran out (its server did not act on it) is ended by
the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import stat
import tempfile

from ..local.pool import LocalPool
from ..pool import Lease, PoolError
from ..pool.phases import PhaseConflict, PhaseError
from . import protocol
from .arguments import Args
from .enforcement import GPUMemoryHeld, GPUProcesses, GPUUnreadable, Enforcement
from .identity import Caller, Identities, NoSuchUser, Peer, peer_of
from .operations import MAX_ROWS, Busy, Denied, Operations, TooLarge
from .turns import Turns

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 128  # per user at once: a server uses one per thread (up to 32 each); more is a client gone wrong
__all__ = ["MAX_CONNECTIONS", "PoolService", "StartError"]


class StartError(RuntimeError):
    """The service cannot listen where it was told to (the message says why and what to do)."""


class PoolService:
    """Serves the pool's operations to the machine's users over one Unix socket."""

    def __init__(self, pool: LocalPool, identities: Identities, *, reconcile_interval: float = 15.0,
                 frame_timeout: float = 30.0, idle_timeout: float = 3600.0, budget_grace: float = 300.0,
                 gpu_processes: GPUProcesses | None = None, gpu_settle: float = 3.0,
                 max_reply: int = protocol.MAX_REPLY, max_rows: int = MAX_ROWS):
        self.pool = pool
        self.ledger = pool.ledger
        self.identities = identities
        self.reconcile_interval = reconcile_interval
        self.frame_timeout, self.idle_timeout = frame_timeout, idle_timeout
        self.max_reply = max_reply
        self.turns = Turns(pool.ledger)
        self.enforcement = Enforcement(pool, identities, self.turns, budget_grace=budget_grace,
                                       gpu_processes=gpu_processes, gpu_settle=gpu_settle)
        self.operations = Operations(pool, identities, self.turns, self.enforcement, max_rows=max_rows)
        self._server: asyncio.AbstractServer | None = None
        self._socket: tuple[str, int] | None = None  # where it listens, and that socket file's inode
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._per_uid: dict[int, int] = {}
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
            await self.turns.write(None, self.pool.reconcile)
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

    async def enforce_budgets(self) -> list[Lease]:
        """End the kernels still active ``budget_grace`` seconds after their owner's budget ran out."""
        return await self.enforcement.budgets()

    # -- serving requests ---------------------------------------------------------------------------

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
            message = protocol.loads(line, strict=True)
            request_id = message.get("id")
            if not isinstance(request_id, (int, str, type(None))) or isinstance(request_id, bool) or \
                    isinstance(request_id, str) and len(request_id) > 64:
                request_id = None
                raise protocol.ProtocolError("'id' must be a number or a short text")
            op = message.get("op")
            operation = protocol.OPERATIONS.get(op) if isinstance(op, str) else None
            if operation is None:
                raise protocol.ProtocolError(f"unknown operation {op!r}"[:300])
            handler, args = self.operations.handlers[op], Args(message.get("args", {}), operation)
            if operation.reads:  # in the caller's own turn: one user's reads wait among themselves, not others'
                async with self.turns.reading(caller.uid):
                    result = await handler(caller, peer, args)
                    if encode and operation.bulky:
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
        except (Denied, Busy, TooLarge, GPUMemoryHeld, GPUUnreadable) as e:
            return _error(request_id, e.reason, e.status, str(e))
        except Exception as e:  # a bug must not take the service down: the request fails, others go on
            log.exception("GPU pool service: %s failed", line[:200])
            return _error(request_id, "internal", 500, f"the pool service failed on this request ({e})")


def _error(request_id, reason: str, status: int, message: str, detail: dict | None = None) -> dict:
    error = {"reason": reason, "status": status, "message": message}
    if detail:
        error["detail"] = detail
    return {"id": request_id, "ok": False, "error": error}
