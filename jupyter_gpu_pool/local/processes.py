"""Process identity for lease holders: a pid plus its start time.

pids are reused; the pair (pid, start time) names one process for the life of
the machine.  This is the edge the ledger's ``reconcile`` calls to judge
whether a holder still lives.  A kernel's process tree is ``devices.processes.process_tree``.
"""

from __future__ import annotations

import os
import socket

import psutil

from ..pool import Holder

__all__ = ["hostname", "identify", "is_alive"]

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


def hostname() -> str:
    return socket.gethostname()
