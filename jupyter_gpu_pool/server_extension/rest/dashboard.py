"""What the admins' dashboard reads beyond ``GET pool``: readings over time (``GET pool/telemetry``)
and everyone's GPU time.

Readings are the sampler's (this server's kernels; on a GPU machine NVML's, elsewhere none): each
kernel's memory and utilization over the window, and each GPU's utilization.  A kernel without
readings (a declared GPU) still shows what its slice holds, and when it held it: the holds come from
the pool's journal (grants, resumes, hibernations, releases), so that a kernel hibernated or ended
within the window stays in the plots for the time it held its slice, and the plots agree with the
table of what is held now.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from ...pool import ACTIVE, JournalEntry, Snapshot
from ..backends.base import PoolBackend
from ..context import ServerContext
from ..notebooks import name_of

WINDOW_MAX = 24 * 3600.0  # seconds of readings one request may ask for
JOURNAL_LIMIT = 10_000  # journal entries one request reads for the window's holds


# The ledger's own journal entries that start or end a lease's hold on its GPUs.
HOLD_KINDS = ("allocated", "resumed", "hibernated", "released", "reclaimed")
_TAKES = ("allocated", "resumed")


def held_intervals(entries: Sequence[JournalEntry], held_now: Mapping[str, float], start: float
                   ) -> dict[str, list[list]]:
    """Lease id -> when it held its GPUs within the window (``[from, until or None, gpus]``, oldest first),
    from the ledger's journal entries since ``start`` (any order) and ``held_now``: the leases active now
    (id -> since when).  A hibernated or ended kernel keeps what it held before; an entry that ends a
    hold with no GPUs (a hibernated kernel shut down) ended none."""
    found: dict[str, list[list]] = {}
    taken: dict[str, tuple[float, list[str]]] = {}
    seen: set[str] = set()
    for e in sorted(entries, key=lambda e: (e.at, e.seq)):
        if not e.lease_id or e.kind not in HOLD_KINDS or e.detail.get("source") == "policy":
            continue
        gpus = list(e.detail.get("gpus") or [])
        first = e.lease_id not in seen
        seen.add(e.lease_id)
        if e.kind in _TAKES:
            taken[e.lease_id] = (e.at, gpus)
        elif gpus and (e.lease_id in taken or first):
            since, _ = taken.pop(e.lease_id, (start, gpus))  # held from before the window
            found.setdefault(e.lease_id, []).append([since, e.at, gpus])
    for lease_id, (since, gpus) in taken.items():
        if lease_id in held_now:
            found.setdefault(lease_id, []).append([since, None, gpus])
    for lease_id, since in held_now.items():
        if lease_id not in seen:  # held since before the window, nothing since
            found[lease_id] = [[max(start, since), None, None]]
    return found


def telemetry(*, backend: PoolBackend, context: ServerContext, snapshot: Snapshot, window: float,
              notebooks: Mapping[str, str], entries: Sequence[JournalEntry] = ()) -> dict:
    """``notebooks``: the notebook each kernel of this server serves now (``ServerContext.notebooks``);
    ``entries``: the journal since the window's start (``HOLD_KINDS``), so that a kernel hibernated or
    ended within the window is drawn for the time it held its slice."""
    now = time.time()
    start = now - window
    gpus = []
    for u in snapshot.gpus:
        g = u.gpu
        gpus.append({"uuid": g.uuid, "label": g.label, "memory": g.memory,
                     "utilization": [[t, v] for t, v in context.sampler.device_history(g.uuid) if t >= start]})
    leases = {lease.id: lease for lease in snapshot.leases}
    active = {lease.id: lease.state_since for lease in snapshot.leases if lease.state == ACTIVE and lease.gpus}
    about: dict[str, JournalEntry] = {}  # lease id -> an entry naming its kernel, owner and profile
    names: dict[str, str] = {}  # kernel id -> its notebook, as the journal names it
    for e in entries:
        if e.lease_id and (e.lease_id not in about or e.detail.get("profile")):
            about[e.lease_id] = e
        name = e.detail.get("name") or e.detail.get("label")  # the server's own entries, the grant's label
        if e.kernel_id and name:
            names.setdefault(e.kernel_id, name)
    kernels = []
    for lease_id, held in held_intervals(entries, active, start).items():
        lease = leases.get(lease_id)
        entry = about.get(lease_id)
        kernel_id = lease.kernel_id if lease else entry.kernel_id if entry else None
        if not kernel_id:
            continue
        profile_name = lease.profile if lease else (entry.detail.get("profile") if entry else None)
        profile = backend.profile(profile_name) if profile_name else None
        whole = lease.whole if lease else bool(profile and profile.slice.whole)
        slice_memory = None if whole else (lease.memory if lease else profile.slice.memory if profile else None)
        for interval in held:
            if interval[2] is None:  # held since before the window: where it is now
                interval[2] = list(lease.gpus) if lease else []
        readings = [r for r in context.sampler.history(kernel_id) if r.at >= start]
        state = lease.state if lease else "ended"
        kernels.append({
            "kernel_id": kernel_id, "owner": lease.owner if lease else entry.owner,
            "name": name_of(lease, notebooks) if lease else notebooks.get(kernel_id) or names.get(kernel_id, ""),
            "profile": profile_name, "state": state,
            "gpus": sorted({g for interval in held for g in interval[2]}),
            # what the kernel holds on each GPU: its slice's memory, or (whole GPUs) the GPU's own
            "slice_memory": slice_memory, "whole": whole,
            "held_since": held[0][0], "held": held,
            "samples": [[r.at, r.memory_used, r.utilization] for r in readings],
        })
    return {"now": now, "window": window, "start": start, "gpus": gpus, "kernels": kernels}


async def budgets(*, backend: PoolBackend, snapshot: Snapshot) -> list[dict]:
    """Where every user with a budget or a lease stands against their tightest GPU-hour budget."""
    users = sorted({lease.owner for lease in snapshot.leases} | set(backend.budget_users()))
    rows = []
    for user in users:
        standing = await backend.budget(user, backend.groups_of(user))
        if standing is not None:
            rows.append({"user": user, **standing.to_dict()})
    return rows
