"""A kernel's process tree: the processes telemetry sums and the hibernator checkpoints.

Here, at the hardware edge, because NVML reports per process and a kernel is a tree of them
(ipykernel plus whatever it spawned); ``local/processes.py`` (a lease holder's identity) builds on it.
"""

from __future__ import annotations

import psutil


def process_tree(pid: int | None) -> list[int]:
    """The process and all its descendants, root first (a kernel may start CUDA workers of its own);
    empty when the process is gone."""
    if not pid:
        return []
    try:
        root = psutil.Process(pid)
        return [root.pid, *(p.pid for p in root.children(recursive=True))]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
