"""The SQLite file behind the local ledger: schema, migrations, connections, transactions.

Why SQLite: several Jupyter servers on one machine (or the pool service alone, where one runs)
must share one truth.  WAL mode lets readers go on while one writer works; ``BEGIN IMMEDIATE``
takes the write lock before anything is read, so two processes can never both see the same free
slice (invariant 1).  Connections are per thread and per process (a forked child opens its own).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from typing import Iterator

from ..config import check_ledger_path

SCHEMA = [
    # version 1
    """
    CREATE TABLE gpus(
        uuid TEXT PRIMARY KEY, name TEXT NOT NULL, memory INTEGER NOT NULL, idx INTEGER NOT NULL,
        sm_count INTEGER, node TEXT NOT NULL, source TEXT NOT NULL, mig INTEGER NOT NULL DEFAULT 0,
        present INTEGER NOT NULL DEFAULT 1, seen REAL NOT NULL);
    CREATE TABLE leases(
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, kernel_id TEXT NOT NULL, profile TEXT NOT NULL,
        isolation TEXT NOT NULL, memory INTEGER NOT NULL, sm_percent INTEGER, whole INTEGER NOT NULL,
        gpu_count INTEGER NOT NULL, state TEXT NOT NULL, last_gpus TEXT NOT NULL DEFAULT '',
        groups TEXT NOT NULL DEFAULT '', label TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL, updated REAL NOT NULL, state_since REAL NOT NULL, ended REAL,
        host TEXT NOT NULL DEFAULT '', manager_pid INTEGER, manager_start REAL,
        holder_pid INTEGER, holder_start REAL, host_bytes INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '');
    CREATE INDEX leases_state ON leases(state);
    CREATE INDEX leases_owner ON leases(owner, state);
    CREATE INDEX leases_kernel ON leases(kernel_id);
    CREATE TABLE allocations(
        lease_id TEXT NOT NULL REFERENCES leases(id), gpu_uuid TEXT NOT NULL REFERENCES gpus(uuid),
        memory INTEGER NOT NULL, sm_percent INTEGER NOT NULL, exclusive INTEGER NOT NULL,
        PRIMARY KEY(lease_id, gpu_uuid));
    CREATE INDEX allocations_gpu ON allocations(gpu_uuid);
    CREATE TABLE lease_groups(lease_id TEXT NOT NULL REFERENCES leases(id), grp TEXT NOT NULL,
        PRIMARY KEY(lease_id, grp));
    CREATE INDEX lease_groups_grp ON lease_groups(grp);
    CREATE TABLE waiters(
        id TEXT PRIMARY KEY, owner TEXT NOT NULL, kernel_id TEXT NOT NULL, lease_id TEXT,
        profile TEXT NOT NULL, slice TEXT NOT NULL, label TEXT NOT NULL DEFAULT '',
        enqueued REAL NOT NULL, heartbeat REAL NOT NULL);
    CREATE TABLE journal(
        seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
        lease_id TEXT, kernel_id TEXT, owner TEXT, reason TEXT NOT NULL DEFAULT '',
        detail TEXT NOT NULL DEFAULT '{}');
    CREATE INDEX journal_at ON journal(at);
    """,
    # version 2: a lease's transient phase (hibernating, resuming, queued, evicting, failed) and its
    # deadline, so that every server and `jupyter gpu-pool status` see a hibernation in progress
    """
    ALTER TABLE leases ADD COLUMN phase TEXT NOT NULL DEFAULT '';
    ALTER TABLE leases ADD COLUMN phase_deadline REAL;
    """,
    # version 3: GPU time spent, for budgets: one row per active interval of a lease (share of its GPU)
    """
    CREATE TABLE usage(
        lease_id TEXT NOT NULL, owner TEXT NOT NULL, share REAL NOT NULL, start REAL NOT NULL, stop REAL);
    CREATE INDEX usage_owner ON usage(owner, start);
    CREATE INDEX usage_lease ON usage(lease_id, stop);
    """,
    # version 4: the activity trace the planner replays (local/trace.py), kept for GPUPool.trace_retention
    """
    CREATE TABLE trace(
        seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL, kernel_id TEXT,
        owner TEXT, data TEXT NOT NULL DEFAULT '{}');
    CREATE INDEX trace_at ON trace(at, seq);
    CREATE INDEX trace_owner ON trace(owner, at, seq);
    """,
    # version 5: one user's journal, found without reading everyone's (the service caps what each keeps)
    """
    CREATE INDEX journal_owner ON journal(owner, seq);
    """,
    # version 6: sharing (pool.sharing): a waiter's groups (reservations' members, fair share's groups), and
    # the reservations whose unused room a lease borrows
    """
    ALTER TABLE waiters ADD COLUMN groups TEXT NOT NULL DEFAULT '';
    ALTER TABLE leases ADD COLUMN borrowed TEXT NOT NULL DEFAULT '';
    """,
]


class Database:
    """One SQLite file: per-thread connections, read and write transactions, migrations."""

    def __init__(self, path: str | os.PathLike, *, busy_timeout: float = 30.0, mode: int | None = None):
        self.path = check_ledger_path(os.fspath(path))
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if mode is not None and not os.path.exists(self.path):
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, mode))  # created private, before SQLite opens it
        with self.write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(SCHEMA[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={number}")

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding the file's write lock from its first statement."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One snapshot for every query inside."""
        conn = self.connection()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:  # closed from another thread already
                    pass
            self._conns.clear()
        self._local = threading.local()
