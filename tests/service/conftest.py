"""Fixtures for the pool service: real Unix users (created when the tests run as root, as CI does),
a real service process run by root, and real Jupyter servers run as each user against it.

The users are named as The Littlest JupyterHub names its users (``jupyter-alice``); the service
strips the prefix, so their pool names are ``alice`` and ``bob``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import users_registry
from kernel_helpers import slice_at_start
from service_helpers import USERS, JupyterServer, PoolServiceProcess, as_user

GiB = 2**30


def _interpreter_reachable(name: str) -> bool:
    from service_helpers import identity

    try:
        return subprocess.run([sys.executable, "-c", "import jupyter_gpu_pool"], **identity(name), capture_output=True,
                              cwd="/").returncode == 0
    except PermissionError:
        return False


@pytest.fixture(scope="session")
def unix_users():
    """``jupyter-alice`` and ``jupyter-bob``: real users, made if missing and removed once no pytest process
    runs these tests any more (``users_registry``: several workers and sessions share them)."""
    if os.geteuid() != 0:
        pytest.skip("real Unix users are created only when the tests run as root (CI does)")
    users_registry.hold(USERS, Path(sys.executable).resolve())
    try:
        if not _interpreter_reachable("alice"):
            pytest.skip(f"{sys.executable} cannot be run by another user here")
        yield USERS
    finally:
        users_registry.leave()


@pytest.fixture
def system_homes(unix_users):
    """The users' homes the system names (/tmp/gpupool-home-<name>), where a spawner puts their servers: held
    by one test at a time of every pytest process (the lab's own homes are the lab's alone)."""
    with users_registry.locked("system-homes"):
        yield {name: Path(pwd.getpwnam(user).pw_dir) for name, user in unix_users.items()}


@pytest.fixture
def lab(unix_users, tmp_path_factory):
    """A shared machine: a world-readable area, the users' homes, the pool's kernelspecs, the admin's config."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-lab-", dir="/tmp"))
    os.chmod(root, 0o755)
    conf, share = root / "etc", root / "share" / "jupyter"
    conf.mkdir()
    share.mkdir(parents=True)
    for name, user in unix_users.items():
        # A home of the lab's own (another session's lab must not share it), and the one the system names
        # (where a spawner puts the user), made if missing.
        entry = pwd.getpwnam(user)
        for home in (root / "home" / name, Path(entry.pw_dir)):
            home.mkdir(parents=True, exist_ok=True)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            os.chmod(home, 0o700)
    lab = Lab(root, conf, share)
    lab.configure()
    yield lab
    # users' servers first, while the service can still release their leases
    stuck = [why for why in [proc.stop() for proc in reversed(lab.processes)] if why]
    shutil.rmtree(root, ignore_errors=True)
    assert not stuck, "\n".join(stuck)


class Lab:
    def __init__(self, root: Path, conf: Path, share: Path):
        self.root, self.conf, self.share = root, conf, share
        self.socket = str(root / "run" / "pool.sock")
        self.ledger = str(root / "state" / "ledger.sqlite")
        self.processes: list = []

    def configure(self, service: dict | None = None, **settings) -> None:
        """The admin's config (root-owned, read by the service only), and the kernelspecs for everyone.
        ``settings`` are GPUPool's, ``service`` PoolService's (over the lab's own)."""
        base = {
            "gpu_discovery": "declared",
            "inventory": [{"name": "Lab GPU", "memory": "40GiB", "count": 2}],
            "profiles": {"small": {"slice": "10GiB", "isolation": "soft"},
                         "half": {"slice": "20GiB,50%", "isolation": "mps"}},
            "ledger_path": self.ledger,
            "default_user_quota": {"kernels": 2},
            "unix_groups": True,
            **settings,
        }
        base["policy"] = slice_at_start(base.get("policy", []))
        lines = [f"c.GPUPool.{k} = {v!r}" for k, v in base.items()]
        options = {"socket": self.socket, "user_prefix": "jupyter-", "reconcile_interval": 1, **(service or {})}
        lines += [f"c.PoolService.{k} = {v!r}" for k, v in options.items()]
        (self.conf / "jupyter_gpu_pool_config.py").write_text("\n".join(lines) + "\n")
        os.chmod(self.conf / "jupyter_gpu_pool_config.py", 0o600)
        from jupyter_gpu_pool.kernel_provisioner import kernelspecs
        from jupyter_gpu_pool.pool import parse_profiles

        kernelspecs.install(list(parse_profiles(base["profiles"]).values()), prefix=str(self.root))
        os.chmod(self.root / "share", 0o755)

    def service(self, **kwargs) -> PoolServiceProcess:
        proc = PoolServiceProcess(self, **kwargs)
        self.processes.append(proc)
        return proc.start()

    def server(self, name: str, args: tuple[str, ...] = (), **env) -> JupyterServer:
        proc = JupyterServer(self, name, args, **env)
        self.processes.append(proc)
        return proc.start()

    def home(self, name: str) -> Path:
        return self.root / "home" / name

    def run_as(self, name: str, args: list[str], **env) -> subprocess.CompletedProcess:
        """A command run as the user, in their home, with the pool service's socket in their environment."""
        return as_user(self, name, args, **env)


__all__ = ["GiB", "time"]
