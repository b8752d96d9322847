"""What the admins' dashboard reads beyond ``GET pool``: readings over time (``GET pool/telemetry``)
and everyone's GPU time.

Readings are the sampler's (this server's kernels; on a GPU machine NVML's, elsewhere none): each
kernel's memory and utilization over the window, and each GPU's utilization.  A kernel without
readings (a declared GPU) still shows what its slice holds, and since when, so that the dashboard
can draw how the slices shared a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ..pool import ACTIVE, Snapshot
from .backend import PoolBackend
from .context import ServerContext
from .notebooks import name_of

WINDOW_MAX = 24 * 3600.0  # seconds of readings one request may ask for


def telemetry(*, backend: PoolBackend, context: ServerContext, snapshot: Snapshot, window: float,
              notebooks: Mapping[str, str]) -> dict:
    """``notebooks``: the notebook each kernel of this server serves now (``ServerContext.notebooks``)."""
    now = time.time()
    start = now - window
    gpus = []
    for u in snapshot.gpus:
        g = u.gpu
        gpus.append({"uuid": g.uuid, "label": g.label, "memory": g.memory,
                     "utilization": [[t, v] for t, v in context.sampler.device_history(g.uuid) if t >= start]})
    kernels = []
    for lease in snapshot.leases:
        if lease.state != ACTIVE or not lease.gpus:
            continue
        readings = [r for r in context.sampler.history(lease.kernel_id) if r.at >= start]
        kernels.append({
            "kernel_id": lease.kernel_id, "owner": lease.owner, "name": name_of(lease, notebooks),
            "profile": lease.profile,
            "gpus": list(lease.gpus), "slice_memory": lease.memory if not lease.whole else None,
            "held_since": lease.state_since,
            "samples": [[r.at, r.memory_used, r.utilization] for r in readings],
        })
    return {"now": now, "window": window, "gpus": gpus, "kernels": kernels}


async def budgets(*, backend: PoolBackend, snapshot: Snapshot) -> list[dict]:
    """Where every user with a budget or a lease stands against their tightest GPU-hour budget."""
    users = sorted({lease.owner for lease in snapshot.leases} | set(backend.budget_users()))
    rows = []
    for user in users:
        standing = await backend.budget(user, backend.groups_of(user))
        if standing is not None:
            rows.append({"user": user, **standing.to_dict()})
    return rows
