"""Ending a lease's kernel on the service's own authority (its owner's budget ran out), root as it is:
only the process the lease registered, and only its own descendants, each proven before it is signalled.

A pid alone names nothing: it is reused, and a user can steer which process gets a pid next.  So each
process is taken by a pidfd (which names one process for good: a signal through it never reaches a
later process on the same pid), and only then checked: the kernel's own by its start time (as the lease
recorded it) and its owner's uid; a descendant by its parent (held by a pidfd, so that pid is still that
parent) and the same uid.  What fails a check is left alone, and so is anything of another uid, ever.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time

import psutil

log = logging.getLogger(__name__)

_START_TOLERANCE = 0.05  # psutil derives start times from boot time and clock ticks


class _Proven:
    """One process, held by a pidfd and checked while held."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    def signal(self, sig: int) -> bool:
        try:
            signal.pidfd_send_signal(self.fd, sig)
            return True
        except ProcessLookupError:
            return False

    def ended(self) -> bool:
        return bool(select.select([self.fd], [], [], 0)[0])  # a pidfd reads ready once its process exits

    def close(self) -> None:
        os.close(self.fd)


def _take(pid: int, uid: int, *, start: float | None = None, parent: _Proven | None = None) -> _Proven | None:
    """``pid`` held by a pidfd, if it is the process asked for: of ``uid`` (real and effective) and started
    at ``start``, or a child of ``parent`` (still alive, so its pid is still its own)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    proven = _Proven(pid, fd)
    try:
        proc = psutil.Process(pid)  # what /proc says of the pid now: the fd's process, or (gone) nothing of it
        uids = proc.uids()
        ok = uids.real == uid and uids.effective == uid
        if start is not None:
            ok = ok and abs(proc.create_time() - start) <= _START_TOLERANCE
        if parent is not None:
            ok = ok and proc.ppid() == parent.pid and not parent.ended()
        ok = ok and not proven.ended()  # checked while the fd's process lived: /proc spoke of it
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        ok = False
    if not ok:
        proven.close()
        return None
    return proven


def end_kernel(pid: int | None, start: float | None, uid: int | None, grace: float = 5.0) -> list[int]:
    """SIGTERM the lease's kernel (``pid`` started at ``start``, of ``uid``) and its descendants of the same
    uid, SIGKILL what is left after ``grace`` seconds; the pids signalled (none where the kernel is not
    provably that process)."""
    if not pid or start is None or uid is None or uid == 0:
        return []  # nothing registered, or root's: the service ends no process of its own uid
    root = _take(pid, uid, start=start)
    if root is None:
        if psutil.pid_exists(pid):
            log.warning("GPU pool service: process %d is no longer the kernel its lease registered (pid reused, "
                        "or another user's): left alone", pid)
        return []
    tree, i = [root], 0
    try:
        while i < len(tree):  # parents before their children: each child is proven by its held parent
            try:
                children = psutil.Process(tree[i].pid).children()
            except psutil.Error:
                children = []
            for child in children:
                taken = _take(child.pid, uid, parent=tree[i])
                if taken is not None:
                    tree.append(taken)
            i += 1
        signalled = [p.pid for p in tree if p.signal(signal.SIGTERM)]
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not all(p.ended() for p in tree):
            time.sleep(0.05)
        for p in tree:
            if not p.ended():
                p.signal(signal.SIGKILL)
        return signalled
    finally:
        for p in tree:
            p.close()
