"""Whose turn it is in the pool service: one user's requests wait among themselves, never on another's.

Writes to the ledger take turns: the caller's own turn first (one user's queued writes wait among
themselves), then the service's one write lock, so one user's flood of writes delays another's by one
write, and the event loop never sleeps on SQLite's write lock.  Reads take their user's own turn (one of a
user's at a time, in a thread, where large replies are encoded too), so one user's flood of large reads
occupies one thread and delays that user only.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable

from ..local.ledger import Ledger


class Turns:
    """The service's turns on one ledger (made on the loop that uses them; a new loop gets new ones)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._writes: tuple[asyncio.AbstractEventLoop, asyncio.Lock, dict] | None = None
        self._reads: tuple[asyncio.AbstractEventLoop, dict] | None = None
        self._impatient = None  # the loop's ledger connection, which never waits on SQLite's lock

    @contextlib.asynccontextmanager
    async def writing(self, uid: int | None):
        """A turn to write to the ledger.  Every write to the ledger, on the loop or in a thread, holds
        one: the loop never finds SQLite's lock taken by a thread of the service."""
        loop = asyncio.get_running_loop()
        if self._writes is None or self._writes[0] is not loop:
            self._writes = (loop, asyncio.Lock(), {})
        _, lock, per_uid = self._writes
        mine = per_uid.get(uid) or per_uid.setdefault(uid, asyncio.Lock())  # one per user of the machine
        async with mine, lock:
            yield

    @contextlib.asynccontextmanager
    async def reading(self, uid: int):
        """A turn to read: one of the user's reads at a time."""
        loop = asyncio.get_running_loop()
        if self._reads is None or self._reads[0] is not loop:
            self._reads = (loop, {})
        per_uid = self._reads[1]
        async with per_uid.get(uid) or per_uid.setdefault(uid, asyncio.Lock()):
            yield

    async def write(self, uid: int | None, fn: Callable, *args, **kwargs):
        """``fn`` (a write to the ledger) in a thread, in its turn."""
        async with self.writing(uid):
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def write_here(self, uid: int | None, fn: Callable):
        """``fn`` on the loop, in its turn: an allocation costs less than a trip to a thread and back.
        Should SQLite's lock be held all the same (by a process other than the service, or a thread of a
        request whose client hung up), ``fn`` runs again in a thread instead of the loop waiting on it:
        the loop's connection does not wait (its busy timeout is 0), and asking again is safe (each of
        ``fn``'s transactions happened wholly or not at all; an allocation asked again finds its lease)."""
        async with self.writing(uid):
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
