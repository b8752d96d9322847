"""The real Unix users of the service tests, shared by every pytest process that runs them (the workers of
one session, two sessions at once).

Each process holds the users while it runs.  The users are created by whichever process finds them missing
and remembered as the tests' own; the last process to leave (holders that died are not counted) ends their
processes, deletes them and their homes, and gives back the modes the tests opened on the way to the
project's Python.  Users that were there before the tests are left alone.

The registry is a directory of root's under /tmp: ``lock`` (fcntl.flock'd around every change), one
``pid-<pid>`` file per holder (its process's start time inside, so that a pid the system gave again to
another process after a holder died is not taken for that holder), and ``state.json`` (the users the tests
created, the modes they changed).
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REGISTRY = Path("/tmp/gpupool-test-users")


@contextmanager
def locked(name: str = "lock") -> Iterator[None]:
    """The registry's lock ``name``, held by this process (other processes wait for it)."""
    try:
        REGISTRY.mkdir(mode=0o700)
    except FileExistsError:
        pass
    found = os.lstat(REGISTRY)  # /tmp is everybody's: a directory somebody else made is not ours to trust
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0 or found.st_mode & 0o022:
        raise RuntimeError(f"{REGISTRY} is not a directory that root alone may write: remove it")
    with open(REGISTRY / name, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot: /proc's field 22), or None where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19]


def _live_holders() -> list[int]:
    """The holders still running; the files of those that died are removed."""
    live = []
    for entry in REGISTRY.glob("pid-*"):
        pid = int(entry.name.removeprefix("pid-"))
        started = _started(pid)
        if started is not None and started == entry.read_text():
            live.append(pid)
        else:
            entry.unlink()
    return live


def _state() -> dict:
    path = REGISTRY / "state.json"
    return json.loads(path.read_text()) if path.exists() else {"created": [], "opened": {}}


def _save(state: dict) -> None:
    (REGISTRY / "state.json").write_text(json.dumps(state))


def hold(users: dict[str, str], python: Path) -> None:
    """This process holds ``users`` (pool name → Unix name) from now on: made if missing, with a home the
    system names (/tmp/gpupool-home-<pool name>), and ``python``'s parent directories open to them."""
    with locked():
        _live_holders()  # (forgets the dead)
        state = _state()
        (REGISTRY / f"pid-{os.getpid()}").write_text(_started(os.getpid()) or "")
        for parent in python.parents:  # the project's Python may live under root's home (pyenv): traverse only
            mode = parent.stat().st_mode
            if str(parent) != "/" and not mode & 0o001:
                state["opened"].setdefault(str(parent), stat.S_IMODE(mode))
                os.chmod(parent, mode | 0o001)
        for name, user in users.items():
            try:
                pwd.getpwnam(user)
            except KeyError:
                subprocess.run(["useradd", "--home-dir", f"/tmp/gpupool-home-{name}", "--shell", "/usr/sbin/nologin",
                                user], check=True)
                state["created"].append(user)
        _save(state)


def leave() -> None:
    """This process holds the users no more; the last holder removes what the tests made and opened."""
    with locked():
        (REGISTRY / f"pid-{os.getpid()}").unlink(missing_ok=True)
        if _live_holders():
            return
        state = _state()
        for user in state["created"]:
            _remove(user)
        for parent, mode in state["opened"].items():
            os.chmod(parent, mode)
        (REGISTRY / "state.json").unlink(missing_ok=True)


def _remove(user: str) -> None:
    try:
        home = pwd.getpwnam(user).pw_dir
    except KeyError:  # gone already: nothing of it to remove
        return
    # userdel refuses a user with processes left (a server still stopping): end them first
    subprocess.run(["pkill", "-KILL", "-u", user], check=False)
    for _ in range(50):
        if subprocess.run(["pgrep", "-u", user], capture_output=True).returncode != 0:
            break
        time.sleep(0.1)
    subprocess.run(["userdel", user], check=False)
    shutil.rmtree(home, ignore_errors=True)
