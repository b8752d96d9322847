"""The ledger: who holds which slice of which GPU, in one SQLite file.

Why SQLite: several Jupyter servers on one machine (one user's, or many users'
under JupyterHub) must share one truth without a daemon.  WAL mode lets readers
go on while one writer allocates; ``BEGIN IMMEDIATE`` takes the write lock
before reading free capacity, so two processes can never both see the same free
slice (invariant 1: the ledger never over-commits a GPU).

Every held lease names its holders (the managing server process and the kernel
process, each as pid + start time).  ``reconcile`` releases leases whose holders
are gone, so no exit path leaves a slice held (invariant 2).  Liveness is
decided by a callable the edge passes in; the core does no process I/O.

All methods are synchronous and short; async callers run them in a thread
(``asyncio.to_thread``) so that the event loop is never blocked.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from .errors import LeaseNotFound, PoolError, PoolExhausted, QuotaExceeded
from .gpus import GPU
from .leases import ACTIVE, HELD, HIBERNATED, RELEASED, STOPPING, Holder, Lease, LeaseRequest
from .profiles import Profile
from .placement import BINPACK, GPUUsage, choose, largest_free
from .quotas import QuotaBook, Usage, first_excess
from .slices import SliceSpec, format_size

IsAlive = Callable[[int, float], bool]

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
]


@dataclass(frozen=True)
class Waiter:
    """A request waiting for room: a kernel start, or a hibernated kernel's resume."""

    id: str
    owner: str
    kernel_id: str
    lease_id: str | None
    profile: str
    slice: SliceSpec
    label: str
    enqueued: float
    heartbeat: float
    position: int = 0

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "owner": self.owner,
            "kernel_id": self.kernel_id,
            "lease_id": self.lease_id,
            "profile": self.profile,
            "slice": self.slice.to_text(),
            "label": self.label,
            "enqueued": self.enqueued,
            "position": self.position,
        }


@dataclass(frozen=True)
class JournalEntry:
    seq: int
    at: float
    kind: str
    lease_id: str | None
    kernel_id: str | None
    owner: str | None
    reason: str
    detail: dict

    def to_dict(self) -> dict:
        return {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "lease_id": self.lease_id,
            "kernel_id": self.kernel_id,
            "owner": self.owner,
            "reason": self.reason,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of the whole pool."""

    at: float
    gpus: list[GPUUsage]
    leases: list[Lease]
    waiters: list[Waiter]

    def leases_of(self, owner: str) -> list[Lease]:
        return [lease for lease in self.leases if lease.owner == owner]

    def leases_on(self, gpu_uuid: str) -> list[Lease]:
        return [lease for lease in self.leases if gpu_uuid in lease.gpus]


class Ledger:
    """The lease ledger on one SQLite file, shared by every process of the pool."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 30.0,
        holder_grace: float = 30.0,
        launch_grace: float = 120.0,
        waiter_ttl: float = 15.0,
        history_seconds: float = 7 * 86400,
    ):
        self.path = os.fspath(path)
        self.clock = clock
        self.busy_timeout = busy_timeout
        self.holder_grace = holder_grace
        self.launch_grace = launch_grace
        self.waiter_ttl = waiter_ttl
        self.history_seconds = history_seconds
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._migrate()

    # -- connections ---------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN")  # one snapshot for every query inside
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:  # closed from another thread already
                    pass
            self._conns.clear()
        self._local = threading.local()

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(SCHEMA[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={number}")

    # -- inventory -----------------------------------------------------------------------------

    def sync_gpus(self, gpus: list[GPU]) -> None:
        """Make the pool's GPUs these.  GPUs no longer present take no new leases but keep
        the leases they hold (a kernel on a GPU that vanished is the admin's to deal with)."""
        now = self.clock()
        with self._write() as db:
            db.execute("UPDATE gpus SET present=0")
            for g in gpus:
                db.execute(
                    """INSERT INTO gpus(uuid, name, memory, idx, sm_count, node, source, mig, present, seen)
                       VALUES(?,?,?,?,?,?,?,?,1,?)
                       ON CONFLICT(uuid) DO UPDATE SET name=excluded.name, memory=excluded.memory,
                         idx=excluded.idx, sm_count=excluded.sm_count, node=excluded.node,
                         source=excluded.source, mig=excluded.mig, present=1, seen=excluded.seen""",
                    (g.uuid, g.name, g.memory, g.index, g.sm_count, g.node, g.source, int(g.mig), now),
                )

    def gpus(self, present_only: bool = True) -> list[GPU]:
        with self._read() as db:
            return self._gpus(db, present_only)

    @staticmethod
    def _gpus(db: sqlite3.Connection, present_only: bool = True) -> list[GPU]:
        where = "WHERE present=1" if present_only else ""
        rows = db.execute(f"SELECT * FROM gpus {where} ORDER BY node, idx, uuid").fetchall()
        return [
            GPU(uuid=r["uuid"], name=r["name"], memory=r["memory"], index=r["idx"], sm_count=r["sm_count"],
                node=r["node"], source=r["source"], mig=bool(r["mig"]))
            for r in rows
        ]

    def _usage(self, db: sqlite3.Connection) -> list[GPUUsage]:
        totals = {
            r["gpu_uuid"]: r
            for r in db.execute(
                """SELECT gpu_uuid, SUM(memory) AS memory, SUM(sm_percent) AS sm, MAX(exclusive) AS excl,
                          COUNT(*) AS n FROM allocations GROUP BY gpu_uuid"""
            )
        }
        usage = []
        for g in self._gpus(db):
            t = totals.get(g.uuid)
            usage.append(
                GPUUsage(g, t["memory"], t["sm"], bool(t["excl"]), t["n"]) if t else GPUUsage(g)
            )
        return usage

    # -- reading leases ------------------------------------------------------------------------

    _LEASE_SELECT = """SELECT l.*, (SELECT group_concat(gpu_uuid, ' ') FROM
                         (SELECT gpu_uuid FROM allocations a WHERE a.lease_id = l.id ORDER BY gpu_uuid)) AS held
                       FROM leases l"""

    @staticmethod
    def _lease(row: sqlite3.Row) -> Lease:
        split = lambda text: tuple(t for t in (text or "").split(" ") if t)  # noqa: E731
        return Lease(
            id=row["id"], owner=row["owner"], kernel_id=row["kernel_id"], profile=row["profile"],
            isolation=row["isolation"], memory=row["memory"], sm_percent=row["sm_percent"],
            whole=bool(row["whole"]), gpu_count=row["gpu_count"], state=row["state"],
            gpus=split(row["held"]), last_gpus=split(row["last_gpus"]),
            groups=tuple(g for g in row["groups"].split("\n") if g), label=row["label"],
            created=row["created"], updated=row["updated"], state_since=row["state_since"], host=row["host"],
            manager_pid=row["manager_pid"], manager_start=row["manager_start"],
            holder_pid=row["holder_pid"], holder_start=row["holder_start"],
            host_bytes=row["host_bytes"], reason=row["reason"],
            phase=row["phase"], phase_deadline=row["phase_deadline"],
        )

    def get(self, lease_id: str) -> Lease | None:
        with self._read() as db:
            return self._get(db, lease_id)

    def _get(self, db: sqlite3.Connection, lease_id: str) -> Lease | None:
        row = db.execute(f"{self._LEASE_SELECT} WHERE l.id=?", (lease_id,)).fetchone()
        return self._lease(row) if row else None

    def by_kernel(self, kernel_id: str) -> Lease | None:
        """The held lease of a kernel, if any."""
        with self._read() as db:
            row = db.execute(
                f"{self._LEASE_SELECT} WHERE l.kernel_id=? AND l.state IN (?,?) ORDER BY l.created DESC",
                (kernel_id, *HELD),
            ).fetchone()
            return self._lease(row) if row else None

    def leases(self, owner: str | None = None, states: tuple[str, ...] = HELD) -> list[Lease]:
        with self._read() as db:
            return self._leases(db, owner, states)

    def _leases(self, db: sqlite3.Connection, owner: str | None, states: tuple[str, ...]) -> list[Lease]:
        marks = ",".join("?" * len(states))
        sql = f"{self._LEASE_SELECT} WHERE l.state IN ({marks})"
        args: list = list(states)
        if owner is not None:
            sql += " AND l.owner=?"
            args.append(owner)
        return [self._lease(r) for r in db.execute(sql + " ORDER BY l.created", args)]

    def snapshot(self) -> Snapshot:
        now = self.clock()
        with self._read() as db:
            return Snapshot(at=now, gpus=self._usage(db), leases=self._leases(db, None, HELD),
                            waiters=self._waiters(db, now))

    def usage_of(self, owner: str) -> Usage:
        with self._read() as db:
            return self._user_usage(db, owner)

    @staticmethod
    def _user_usage(db: sqlite3.Connection, owner: str) -> Usage:
        mem, sm = db.execute(
            """SELECT COALESCE(SUM(a.memory),0), COALESCE(SUM(a.sm_percent),0) FROM allocations a
               JOIN leases l ON l.id = a.lease_id WHERE l.owner=? AND l.state=?""",
            (owner, ACTIVE),
        ).fetchone()
        (kernels,) = db.execute(
            "SELECT COUNT(*) FROM leases WHERE owner=? AND state IN (?,?)", (owner, *HELD)
        ).fetchone()
        return Usage(mem, sm, kernels)

    @staticmethod
    def _group_usage(db: sqlite3.Connection, group: str) -> Usage:
        mem, sm = db.execute(
            """SELECT COALESCE(SUM(a.memory),0), COALESCE(SUM(a.sm_percent),0) FROM allocations a
               JOIN leases l ON l.id = a.lease_id JOIN lease_groups g ON g.lease_id = l.id
               WHERE g.grp=? AND l.state=?""",
            (group, ACTIVE),
        ).fetchone()
        (kernels,) = db.execute(
            """SELECT COUNT(*) FROM leases l JOIN lease_groups g ON g.lease_id = l.id
               WHERE g.grp=? AND l.state IN (?,?)""",
            (group, *HELD),
        ).fetchone()
        return Usage(mem, sm, kernels)

    # -- allocation ----------------------------------------------------------------------------

    def allocate(
        self,
        request: LeaseRequest,
        quotas: QuotaBook,
        *,
        placement: str = BINPACK,
        is_alive: IsAlive | None = None,
        host: str = "",
        waiter_id: str | None = None,
    ) -> Lease:
        """Take a slice for a kernel, atomically across processes, or raise.

        Raises :class:`QuotaExceeded` (checked first: it is what the user can act on)
        or :class:`PoolExhausted`.  On any refusal nothing is held.  Earlier waiters
        in the queue that fit are served first (``waiter_id`` is this request's own
        place in the queue, if it has one).
        """
        spec = request.profile.slice
        now = self.clock()
        with self._recording_refusals(request), self._write() as db:
            if is_alive is not None:
                self._reconcile(db, is_alive, host, now)
            usage = self._usage(db)
            ahead = self._reserve_for_waiters(db, usage, placement, waiter_id, now)
            chosen = choose(ahead, spec, placement)
            self._check_quota(db, request, quotas, spec, chosen, usage, (ACTIVE, 1), now)
            if chosen is None:
                self._refuse_full(db, request, usage, now)
            lease_id = uuid.uuid4().hex
            manager = request.manager
            db.execute(
                """INSERT INTO leases(id, owner, kernel_id, profile, isolation, memory, sm_percent, whole,
                     gpu_count, state, last_gpus, groups, label, created, updated, state_since, host,
                     manager_pid, manager_start)
                   VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (lease_id, request.owner, request.kernel_id, request.profile.name, request.profile.isolation,
                 spec.memory_on(chosen[0].memory), spec.sm_percent, int(spec.whole), spec.gpu_count, ACTIVE,
                 " ".join(g.uuid for g in chosen), "\n".join(request.groups), request.label, now, now, now,
                 host or (manager.host if manager else ""), manager.pid if manager else None,
                 manager.start if manager else None),
            )
            self._insert_allocations(db, lease_id, spec, chosen)
            for group in request.groups:
                db.execute("INSERT INTO lease_groups(lease_id, grp) VALUES(?,?)", (lease_id, group))
            if waiter_id:
                db.execute("DELETE FROM waiters WHERE id=?", (waiter_id,))
            self._journal(db, now, "allocated", lease_id, request.kernel_id, request.owner, "",
                          {"profile": request.profile.name, "gpus": [g.uuid for g in chosen]})
            return self._get(db, lease_id)  # type: ignore[return-value]

    @staticmethod
    def _insert_allocations(db: sqlite3.Connection, lease_id: str, spec: SliceSpec, gpus: list[GPU]) -> None:
        for g in gpus:
            db.execute(
                "INSERT INTO allocations(lease_id, gpu_uuid, memory, sm_percent, exclusive) VALUES(?,?,?,?,?)",
                (lease_id, g.uuid, spec.memory_on(g.memory), spec.sm_on(), int(spec.whole)),
            )

    def _check_quota(self, db, request: LeaseRequest, quotas: QuotaBook, spec: SliceSpec,
                     chosen: list[GPU] | None, usage: list[GPUUsage], counts: tuple[str, int], now: float) -> None:
        """Raise QuotaExceeded if the request passes the user's or a group's quota.

        ``counts`` says what the request adds to the kernel count (a resume adds none)."""
        if chosen:
            memory = sum(spec.memory_on(g.memory) for g in chosen)
        else:  # refused anyway for room; judge the quota on the GPUs it could get
            sizes = sorted((u.gpu.memory for u in usage), reverse=True)[: spec.gpu_count] or [0]
            memory = sum(spec.memory_on(m) for m in sizes)
        asked = Usage(memory, spec.sm_on() * spec.gpu_count, counts[1])
        scopes: list[tuple[str, Usage, object]] = [
            ("user", self._user_usage(db, request.owner), quotas.user_quota(request.owner))
        ]
        for group in quotas.limited_groups(request.groups):
            scopes.append((group, self._group_usage(db, group), quotas.groups[group]))
        for scope, used, quota in scopes:
            excess = first_excess(quota, used, asked)  # type: ignore[arg-type]
            if excess:
                resource, limit, used_text, asked_text = excess
                holdings = self._leases(db, request.owner, HELD)
                err = QuotaExceeded(owner=request.owner, profile=request.profile.name, scope=scope,
                                    resource=resource, limit=limit, used=used_text, asked=asked_text,
                                    holdings=holdings, now=now)
                raise err

    def _refuse_full(self, db, request: LeaseRequest, usage: list[GPUUsage], now: float) -> None:
        best = largest_free(usage)
        largest = None
        if best and best.free_memory > 0:
            largest = f"{format_size(best.free_memory)} and {best.free_sm}% SM on {best.gpu.label}"
        waiting = len([w for w in self._waiters(db, now) if w.kernel_id != request.kernel_id])
        err = PoolExhausted(profile=request.profile.name, slice_text=str(request.profile.slice),
                            gpu_count=len(usage), largest=largest,
                            holdings=self._leases(db, request.owner, HELD), queued=waiting, now=now)
        raise err

    @contextmanager
    def _recording_refusals(self, request: LeaseRequest) -> Iterator[None]:
        """Put refusals on record.  The refused transaction rolls back, so this writes its own."""
        try:
            yield
        except PoolError as err:
            self.record("refused", kernel_id=request.kernel_id, owner=request.owner, reason=err.reason,
                        detail={"profile": request.profile.name, "message": str(err)})
            raise

    def _reserve_for_waiters(self, db, usage: list[GPUUsage], placement: str, waiter_id: str | None,
                             now: float) -> list[GPUUsage]:
        """Usage as it would be after every earlier live waiter that fits took its slice."""
        waiters = self._waiters(db, now)  # in queue order
        if waiter_id is not None:
            ids = [w.id for w in waiters]
            if waiter_id in ids:
                waiters = waiters[: ids.index(waiter_id)]
        sim = {u.gpu.uuid: u for u in usage}
        for w in waiters:
            picked = choose(list(sim.values()), w.slice, placement)
            for g in picked or []:
                sim[g.uuid] = sim[g.uuid].plus(w.slice)
        return [sim[u.gpu.uuid] for u in usage]

    # -- lifecycle -----------------------------------------------------------------------------

    def set_holder(self, lease_id: str, holder: Holder | None, phase: str | None = None) -> None:
        """Record the kernel process holding the lease (None while it restarts or stops).

        ``phase`` sets the lease's phase too: ``"stopping"`` when a shutdown begins (so reconcile
        names the right reason if the server never finishes it), ``""`` when a process holds it."""
        now = self.clock()
        with self._write() as db:
            sets, args = "holder_pid=?, holder_start=?, updated=?", [holder.pid if holder else None,
                                                                      holder.start if holder else None, now]
            if phase is not None:
                sets += ", phase=?"
                args.append(phase)
            cur = db.execute(f"UPDATE leases SET {sets} WHERE id=? AND state IN (?,?)", (*args, lease_id, *HELD))
            if cur.rowcount == 0:
                raise LeaseNotFound(lease_id)

    def adopt(self, lease_id: str, manager: Holder) -> Lease:
        """A restarted server takes over a running kernel's lease."""
        now = self.clock()
        with self._write() as db:
            cur = db.execute(
                "UPDATE leases SET manager_pid=?, manager_start=?, updated=? WHERE id=? AND state IN (?,?)",
                (manager.pid, manager.start, now, lease_id, *HELD),
            )
            if cur.rowcount == 0:
                raise LeaseNotFound(lease_id)
            return self._get(db, lease_id)  # type: ignore[return-value]

    def release(self, lease_id: str, reason: str = "shutdown") -> Lease | None:
        """Give the slice back.  Idempotent: releasing a released lease returns None."""
        now = self.clock()
        with self._write() as db:
            return self._release(db, lease_id, reason, now)

    def _release(self, db, lease_id: str, reason: str, now: float, kind: str = "released") -> Lease | None:
        lease = self._get(db, lease_id)
        if lease is None or lease.state == RELEASED:
            return None
        db.execute("DELETE FROM allocations WHERE lease_id=?", (lease_id,))
        db.execute("DELETE FROM waiters WHERE lease_id=?", (lease_id,))
        db.execute(
            "UPDATE leases SET state=?, reason=?, updated=?, state_since=?, ended=?, phase='', phase_deadline=NULL "
            "WHERE id=?",
            (RELEASED, reason, now, now, now, lease_id),
        )
        self._journal(db, now, kind, lease_id, lease.kernel_id, lease.owner, reason,
                      {"profile": lease.profile, "gpus": list(lease.gpus), "held_for": now - lease.created})
        return self._get(db, lease_id)

    def hibernate(self, lease_id: str, host_bytes: int, reason: str = "idle",
                  last_gpus: tuple[str, ...] | None = None) -> Lease:
        """The kernel's GPU memory is now in host RAM: its slice goes back to the pool.
        ``last_gpus``: where the memory came from, when not the GPUs held now (a resume given up
        before its restore)."""
        now = self.clock()
        with self._write() as db:
            lease = self._get(db, lease_id)
            if lease is None or lease.state != ACTIVE:
                raise LeaseNotFound(lease_id)
            db.execute("DELETE FROM allocations WHERE lease_id=?", (lease_id,))
            db.execute(
                """UPDATE leases SET state=?, last_gpus=?, host_bytes=?, reason=?, updated=?, state_since=?
                   WHERE id=?""",
                (HIBERNATED, " ".join(last_gpus if last_gpus is not None else lease.gpus), host_bytes, reason, now,
                 now, lease_id),
            )
            self._journal(db, now, "hibernated", lease_id, lease.kernel_id, lease.owner, reason,
                          {"host_bytes": host_bytes, "gpus": list(lease.gpus)})
            return self._get(db, lease_id)  # type: ignore[return-value]

    def resume(
        self,
        lease_id: str,
        quotas: QuotaBook,
        *,
        placement: str = BINPACK,
        same_model: bool = True,
        waiter_id: str | None = None,
        profile: Profile | None = None,
        same_gpu: bool = False,
    ) -> Lease:
        """Take a slice again for a hibernated lease: its last GPU if it fits, else another
        GPU of the same model (when ``same_model``), else raise PoolExhausted/QuotaExceeded.
        ``same_gpu`` allows its last GPUs only (a driver that cannot restore elsewhere)."""
        now = self.clock()
        lease = self.get(lease_id)
        if lease is None or lease.state != HIBERNATED:
            raise LeaseNotFound(lease_id)
        spec = (SliceSpec(whole=True, gpu_count=lease.gpu_count) if lease.whole
                else SliceSpec(memory=lease.memory, sm_percent=lease.sm_percent))
        request = _resume_request(lease, spec, profile)
        with self._recording_refusals(request), self._write() as db:
            lease = self._get(db, lease_id)
            if lease is None or lease.state != HIBERNATED:  # changed since the read above
                raise LeaseNotFound(lease_id)
            usage = self._usage(db)
            if same_gpu and lease.last_gpus:
                usage = [u for u in usage if u.gpu.uuid in lease.last_gpus]
            elif same_model and lease.last_gpus:
                models = {(u.gpu.name, u.gpu.memory) for u in usage if u.gpu.uuid in lease.last_gpus}
                usage = [u for u in usage if (u.gpu.name, u.gpu.memory) in models] if models else usage
            ahead = self._reserve_for_waiters(db, usage, placement, waiter_id, now)
            chosen = choose(ahead, spec, placement, prefer=lease.last_gpus)
            self._check_quota(db, request, quotas, spec, chosen, usage, (ACTIVE, 0), now)
            if chosen is None:
                self._refuse_full(db, request, usage, now)
            self._insert_allocations(db, lease_id, spec, chosen)
            db.execute(
                "UPDATE leases SET state=?, updated=?, state_since=?, last_gpus=?, host_bytes=0 WHERE id=?",
                (ACTIVE, now, now, " ".join(g.uuid for g in chosen), lease_id),
            )
            if waiter_id:
                db.execute("DELETE FROM waiters WHERE id=?", (waiter_id,))
            self._journal(db, now, "resumed", lease_id, lease.kernel_id, lease.owner, "",
                          {"gpus": [g.uuid for g in chosen], "hibernated_for": now - lease.state_since})
            return self._get(db, lease_id)  # type: ignore[return-value]

    def set_phase(self, lease_id: str, phase: str, deadline: float | None = None) -> Lease:
        """Mark a held lease with a transient phase (``""`` clears it); the state stays as it is."""
        with self._write() as db:  # leaves `updated` alone: reconcile's grace counts from the holder's changes
            cur = db.execute("UPDATE leases SET phase=?, phase_deadline=? WHERE id=? AND state IN (?,?)",
                             (phase, deadline, lease_id, *HELD))
            if cur.rowcount == 0:
                raise LeaseNotFound(lease_id)
            return self._get(db, lease_id)  # type: ignore[return-value]

    def reserve_host_bytes(self, lease_id: str, host_bytes: int, cap: int | None, host: str = "") -> tuple[bool, int]:
        """Claim ``host_bytes`` of the host-RAM budget of hibernation on ``host`` for an active lease
        about to hibernate, atomically against every other server.  Returns (granted, bytes already
        claimed by the others); with ``cap`` None there is no limit."""
        with self._write() as db:
            lease = self._get(db, lease_id)
            if lease is None or lease.state != ACTIVE:
                raise LeaseNotFound(lease_id)
            (others,) = db.execute(
                "SELECT COALESCE(SUM(host_bytes),0) FROM leases WHERE state IN (?,?) AND host=? AND id<>?",
                (*HELD, host, lease_id)).fetchone()
            if cap is not None and others + host_bytes > cap:
                return False, others
            db.execute("UPDATE leases SET host_bytes=? WHERE id=?", (host_bytes, lease_id))
            return True, others

    def host_bytes_on(self, host: str = "") -> int:
        """Host RAM held or claimed by hibernation on ``host``."""
        with self._read() as db:
            (total,) = db.execute("SELECT COALESCE(SUM(host_bytes),0) FROM leases WHERE state IN (?,?) AND host=?",
                                  (*HELD, host)).fetchone()
            return total

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self, is_alive: IsAlive, host: str = "") -> list[Lease]:
        """Release every lease on this host whose holders are gone; return what was reclaimed."""
        now = self.clock()
        with self._write() as db:
            reclaimed = self._reconcile(db, is_alive, host, now)
            db.execute("DELETE FROM journal WHERE at < ?", (now - self.history_seconds,))
            old = [r[0] for r in db.execute(
                "SELECT id FROM leases WHERE state=? AND ended < ?", (RELEASED, now - self.history_seconds))]
            for lease_id in old:
                db.execute("DELETE FROM lease_groups WHERE lease_id=?", (lease_id,))
                db.execute("DELETE FROM leases WHERE id=?", (lease_id,))
            return reclaimed

    def _reconcile(self, db, is_alive: IsAlive, host: str, now: float) -> list[Lease]:
        reclaimed = []
        db.execute("DELETE FROM waiters WHERE heartbeat < ?", (now - self.waiter_ttl,))
        for lease in self._leases(db, None, HELD):
            if host and lease.host and lease.host != host:
                continue  # another machine's processes are not ours to judge
            reason = self._dead_reason(lease, is_alive, now)
            if reason:
                released = self._release(db, lease.id, reason, now, kind="reclaimed")
                if released:
                    reclaimed.append(released)
        return reclaimed

    def _dead_reason(self, lease: Lease, is_alive: IsAlive, now: float) -> str | None:
        manager_alive = lease.manager_pid is None or is_alive(lease.manager_pid, lease.manager_start or 0.0)
        if lease.holder_pid is not None:
            if is_alive(lease.holder_pid, lease.holder_start or 0.0):
                return None  # the kernel lives, so the memory is really held
            if not manager_alive:
                return "kernel process and its server are gone"
            if now - lease.updated > self.holder_grace:
                return "kernel process ended and its server did not restart it"
            return None
        if not manager_alive:
            return "server process is gone"
        if lease.phase == STOPPING:
            if now - lease.updated > self.holder_grace:
                return "kernel was shut down but its server did not release the slice"
            return None
        if now - lease.updated > self.launch_grace:
            return "kernel never started"
        return None

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, owner: str, kernel_id: str, profile: str, spec: SliceSpec, *,
                lease_id: str | None = None, label: str = "") -> Waiter:
        now = self.clock()
        waiter_id = uuid.uuid4().hex
        with self._write() as db:
            db.execute(
                """INSERT INTO waiters(id, owner, kernel_id, lease_id, profile, slice, label, enqueued, heartbeat)
                   VALUES(?,?,?,?,?,?,?,?,?)""",
                (waiter_id, owner, kernel_id, lease_id, profile, spec.to_text(), label, now, now),
            )
            return next(w for w in self._waiters(db, now) if w.id == waiter_id)

    def heartbeat(self, waiter_id: str) -> Waiter | None:
        """Keep a waiter alive and return it with its current position (None if gone)."""
        now = self.clock()
        with self._write() as db:
            db.execute("UPDATE waiters SET heartbeat=? WHERE id=?", (now, waiter_id))
            return next((w for w in self._waiters(db, now) if w.id == waiter_id), None)

    def dequeue(self, waiter_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM waiters WHERE id=?", (waiter_id,))

    def waiters(self) -> list[Waiter]:
        now = self.clock()
        with self._read() as db:
            return self._waiters(db, now)

    def _waiters(self, db, now: float) -> list[Waiter]:
        rows = db.execute(
            "SELECT * FROM waiters WHERE heartbeat >= ? ORDER BY enqueued, rowid", (now - self.waiter_ttl,)
        ).fetchall()
        return [
            Waiter(id=r["id"], owner=r["owner"], kernel_id=r["kernel_id"], lease_id=r["lease_id"],
                   profile=r["profile"], slice=SliceSpec.parse(r["slice"]), label=r["label"],
                   enqueued=r["enqueued"], heartbeat=r["heartbeat"], position=i + 1)
            for i, r in enumerate(rows)
        ]

    # -- journal -------------------------------------------------------------------------------

    @staticmethod
    def _journal(db, at: float, kind: str, lease_id, kernel_id, owner, reason: str, detail: dict) -> None:
        db.execute(
            "INSERT INTO journal(at, kind, lease_id, kernel_id, owner, reason, detail) VALUES(?,?,?,?,?,?,?)",
            (at, kind, lease_id, kernel_id, owner, reason, json.dumps(detail)),
        )

    def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
               owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        """Put an event on record (the culler's decisions, for example)."""
        with self._write() as db:
            self._journal(db, self.clock(), kind, lease_id, kernel_id, owner, reason, detail or {})

    def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                limit: int = 200) -> list[JournalEntry]:
        sql, args = "SELECT * FROM journal WHERE at >= ?", [since]
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += list(kinds)
        if owner is not None:
            sql += " AND owner=?"
            args.append(owner)
        sql += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        with self._read() as db:
            return [
                JournalEntry(seq=r["seq"], at=r["at"], kind=r["kind"], lease_id=r["lease_id"],
                             kernel_id=r["kernel_id"], owner=r["owner"], reason=r["reason"],
                             detail=json.loads(r["detail"]))
                for r in db.execute(sql, args)
            ]

    # -- checks --------------------------------------------------------------------------------

    def overcommitted(self) -> list[str]:
        """GPUs whose allocations pass their capacity (must always be empty: invariant 1)."""
        with self._read() as db:
            bad = []
            for u in self._usage(db):
                (n,) = db.execute("SELECT COUNT(*) FROM allocations WHERE gpu_uuid=?", (u.gpu.uuid,)).fetchone()
                if u.memory > u.gpu.memory or u.sm_percent > 100 or (u.exclusive and n > 1):
                    bad.append(f"{u.gpu.uuid}: {u.memory}/{u.gpu.memory} bytes, {u.sm_percent}% SM, {n} leases")
            return bad


def _resume_request(lease: Lease, spec: SliceSpec, profile: Profile | None) -> LeaseRequest:
    prof = profile or Profile(name=lease.profile, slice=spec, isolation=lease.isolation,
                              display_name=lease.profile)
    return LeaseRequest(owner=lease.owner, kernel_id=lease.kernel_id, profile=prof,
                        groups=lease.groups, label=lease.label)
