"""Process identity for lease holders: a pid plus its start time.

pids are reused; the pair (pid, start time) names one process for the life of
the machine.  This is the edge the ledger's ``reconcile`` calls to judge
whether a holder still lives, and where a kernel's process tree is found (telemetry and
hibernation act on every process of it).
"""

from __future__ import annotations

import os
import socket

import psutil

from ..pool import Holder

# psutil derives start times from boot time and clock ticks; allow for rounding.
_START_TOLERANCE = 0.05


def identify(pid: int | None = None) -> Holder:
    pid = os.getpid() if pid is None else pid
    return Holder(pid=pid, start=psutil.Process(pid).create_time(), host=hostname())


def is_alive(pid: int, start: float) -> bool:
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - start) > _START_TOLERANCE:
            return False  # the pid now belongs to another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


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


def hostname() -> str:
    return socket.gethostname()
