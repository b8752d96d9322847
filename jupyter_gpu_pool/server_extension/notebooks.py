"""Which notebook each of this server's kernels serves now: jupyter_server's sessions.

A lease's label is the notebook's path when its kernel started (the provisioner takes it from
``JPY_SESSION_NAME``).  JupyterLab renames or moves a notebook by changing its session's path
(``PATCH /api/sessions/{id}``), which reaches neither the kernel nor the ledger; so the views, the
dashboard and the journal's entries name a kernel by its notebook session's path, and by the lease's
label where it has none (a kernel started without a notebook, another server's kernel).

The culler gives the pool the new name at its next pass (``PoolBackend.relabel``: the ledger's, or the
pool service's for the caller's own lease), so that other servers' views and ``jupyter gpu-pool status``
follow too; a cluster's GPUKernel keeps the name at start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..pool import Lease
from ..pool.words import notebook_label

log = logging.getLogger(__name__)


class Notebooks:
    """The notebook paths of this server's kernels, read from jupyter_server's session manager
    (``None`` where there is none: every kernel keeps its lease's label)."""

    def __init__(self, sessions: Any = None):
        self.sessions = sessions

    async def paths(self) -> dict[str, str]:
        """Kernel id -> the path of the notebook it serves now, for kernels with a notebook session."""
        if self.sessions is None:
            return {}
        try:
            models = await self.sessions.list_sessions()
        except Exception:  # a name is not worth a failed view: the labels stand in
            log.exception("could not list jupyter_server's sessions")
            return {}
        found: dict[str, list[str]] = {}
        for model in models:
            kernel = model.get("kernel") or {}
            if model.get("type") == "notebook" and kernel.get("id") and model.get("path"):
                found.setdefault(kernel["id"], []).append(model["path"])
        return {kid: min(paths) for kid, paths in found.items()}  # two notebooks on one kernel: one, always the same

    async def name(self, lease: Lease) -> str:
        """The name of ``lease``'s kernel now."""
        return name_of(lease, await self.paths())


def name_of(lease: Lease, paths: Mapping[str, str]) -> str:
    """The kernel's notebook path now where it has a notebook session, else its lease's label where that
    names a notebook; "" for a kernel without one (started over the REST API: the UI names it by its id)."""
    return notebook_label(paths.get(lease.kernel_id, lease.label))
