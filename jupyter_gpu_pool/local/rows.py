"""SQLite rows of the local ledger as the pool core's types."""

from __future__ import annotations

import json
import sqlite3

from ..pool import GPU, JournalEntry, Lease, SliceSpec, Waiter

# A lease with the GPUs it holds now (from its allocations), in uuid order.
LEASE_SELECT = """SELECT l.*, (SELECT group_concat(gpu_uuid, ' ') FROM
                    (SELECT gpu_uuid FROM allocations a WHERE a.lease_id = l.id ORDER BY gpu_uuid)) AS held
                  FROM leases l"""


def _words(text: str | None) -> tuple[str, ...]:
    return tuple(t for t in (text or "").split(" ") if t)


# Decoded leases by their rows' values (a Lease is a pure function of its LEASE_SELECT row, and frozen):
# every allocation reads the asker's held leases, mostly unchanged since the last read, and building
# a Lease costs several times hashing its row. Bounded; cleared when full.
_DECODED: dict[tuple, Lease] = {}
_DECODED_MAX = 8192


def lease(row: sqlite3.Row) -> Lease:
    key = tuple(row)
    found = _DECODED.get(key)
    if found is None:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        found = _DECODED[key] = _lease(row)
    return found


def _lease(row: sqlite3.Row) -> Lease:
    return Lease(
        id=row["id"], owner=row["owner"], kernel_id=row["kernel_id"], profile=row["profile"],
        isolation=row["isolation"], memory=row["memory"], sm_percent=row["sm_percent"],
        whole=bool(row["whole"]), gpu_count=row["gpu_count"], state=row["state"],
        gpus=_words(row["held"]), last_gpus=_words(row["last_gpus"]),
        groups=tuple(g for g in row["groups"].split("\n") if g), label=row["label"],
        created=row["created"], updated=row["updated"], state_since=row["state_since"], host=row["host"],
        manager_pid=row["manager_pid"], manager_start=row["manager_start"],
        holder_pid=row["holder_pid"], holder_start=row["holder_start"],
        host_bytes=row["host_bytes"], reason=row["reason"],
        phase=row["phase"], phase_deadline=row["phase_deadline"], borrowed=_lines(row["borrowed"]),
    )


def _lines(text: str | None) -> tuple[str, ...]:
    return tuple(t for t in (text or "").split("\n") if t)


def gpu(row: sqlite3.Row) -> GPU:
    return GPU(uuid=row["uuid"], name=row["name"], memory=row["memory"], index=row["idx"], sm_count=row["sm_count"],
               node=row["node"], source=row["source"], mig=bool(row["mig"]))


def waiter(row: sqlite3.Row, position: int) -> Waiter:
    return Waiter(id=row["id"], owner=row["owner"], kernel_id=row["kernel_id"], lease_id=row["lease_id"],
                  profile=row["profile"], slice=SliceSpec.parse(row["slice"]), label=row["label"],
                  enqueued=row["enqueued"], heartbeat=row["heartbeat"], position=position,
                  groups=_lines(row["groups"]))


def journal_entry(row: sqlite3.Row) -> JournalEntry:
    return JournalEntry(seq=row["seq"], at=row["at"], kind=row["kind"], lease_id=row["lease_id"],
                        kernel_id=row["kernel_id"], owner=row["owner"], reason=row["reason"],
                        detail=json.loads(row["detail"]))
