"""A real JupyterLab server in a subprocess, on a declared GPU pool, for the browser tests.

Everything lives in one temporary directory: Jupyter's config, data and runtime
dirs, the pool's config file and ledger, the kernelspecs, the notebooks. The
server is this venv's ``jupyter lab`` with the installed jupyter-gpu-pool (its
server extension enabled by the package's jupyter-config, its labextension
prebuilt in the wheel), so the browser sees what a user would.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from kernel_helpers import free_port, slice_at_start

# This checkout's build of the labextension (`jlpm build` in labextension/, or pip install -e .).
CHECKOUT_BUILD = Path(__file__).resolve().parents[2] / "jupyter_gpu_pool" / "labextension"

DEMO_INVENTORY = [{"name": "Demo GPU", "memory": "40GiB", "sm_count": 108, "count": 2}]
DEMO_PROFILES = {
    "gpu-10g": {"slice": "10GiB", "isolation": "soft", "display_name": "GPU 10 GiB",
                "description": "For exploring and small models"},
    "gpu-20g": {"slice": "20GiB", "isolation": "soft", "display_name": "GPU 20 GiB",
                "description": "For training mid-sized models"},
    # An SM share: the launcher explains "50%" (a share of the GPU's compute, enforced by MPS).
    "gpu-20g-50": {"slice": "20GiB,50%", "isolation": "mps", "display_name": "GPU 20 GiB · 50%",
                   "description": "Half a GPU's compute, guaranteed"},
}


class LabServer:
    """``jupyter lab`` on 127.0.0.1 with a token, its pool configured by ``pool`` and ``extension``."""

    def __init__(self, root: Path, pool: dict, extension: dict, server: dict | None = None,
                 kernelspecs: bool = True, env: dict[str, str] | None = None):
        self.root = root
        self.config_dir = root / "config"
        self.data_dir = root / "data"
        self.runtime_dir = root / "runtime"
        self.notebooks = root / "notebooks"
        self.ledger = root / "ledger.sqlite"
        self.log_path = root / "server.log"
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pool_settings = {
            "inventory": DEMO_INVENTORY,
            "gpu_discovery": "declared",
            "profiles": DEMO_PROFILES,
            "ledger_path": str(self.ledger),
            "unix_groups": False,
            "group_quotas": {},
            "user_quotas": {},
            "default_user_quota": {"memory": "40GiB", "kernels": 4},
            "policy": [],  # the built-in default rule, whatever a config of the environment says
            **pool,
        }
        self.pool_settings["policy"] = slice_at_start(self.pool_settings["policy"])
        self.extension_settings = extension
        self.server_config = server or {}
        self.kernelspecs = kernelspecs
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self._log = None

    # -- setup ----------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "JUPYTER_CONFIG_DIR": str(self.config_dir),
            "JUPYTER_DATA_DIR": str(self.data_dir),
            "JUPYTER_RUNTIME_DIR": str(self.runtime_dir),
            # This server's config dir before the environment's: a pool config that `./scripts/lab`
            # (or an admin) put in the venv's etc/jupyter must not change what the tests set up.
            "JUPYTER_PREFER_ENV_PATH": "0",
        })
        env.pop("JUPYTERHUB_USER", None)  # a personal server: its owner is the login user
        env.update(self.extra_env)
        return env

    def write_config(self) -> None:
        for d in (self.config_dir, self.data_dir, self.runtime_dir, self.notebooks):
            d.mkdir(parents=True, exist_ok=True)
        lines = [f"c.GPUPool.{k} = {v!r}" for k, v in self.pool_settings.items()]
        lines += [f"c.GPUPoolExtension.{k} = {v!r}" for k, v in self.extension_settings.items()]
        (self.config_dir / "jupyter_gpu_pool_config.py").write_text("\n".join(lines) + "\n")
        server = json.loads(json.dumps(self.server_config))
        if self.kernelspecs:  # this server's kernels only, none the environment has installed
            server.setdefault("KernelSpecManager", {})["allowed_kernelspecs"] = [
                "python3", *(f"gpu-pool-{name}" for name in self.pool_settings["profiles"])]
        if server:
            (self.config_dir / "jupyter_server_config.json").write_text(json.dumps(server))
        # No "news" or "update" toasts from JupyterLab itself: the notifications are the pool's.
        settings = self.config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        # This checkout's build first (the server's data dir comes before the environment's), so that
        # a worktree's tests load its own bundle, whichever checkout installed the environment's.
        built = CHECKOUT_BUILD
        linked = self.data_dir / "labextensions" / "jupyter-gpu-pool"
        if (built / "package.json").exists() and not linked.exists():
            linked.parent.mkdir(parents=True, exist_ok=True)
            linked.symlink_to(built, target_is_directory=True)

    def install_kernelspecs(self) -> None:
        subprocess.run([sys.executable, "-m", "jupyter_gpu_pool.cli", "kernelspec", "install", "--user"],
                       env=self.env, check=True, capture_output=True, text=True, timeout=120)

    def write_notebook(self, name: str, kernel: str, cells: list[str]) -> str:
        nb = {
            "cells": [{"cell_type": "code", "execution_count": None, "id": f"cell-{i}", "metadata": {},
                       "outputs": [], "source": src} for i, src in enumerate(cells)],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.notebooks / name).write_text(json.dumps(nb, indent=1))
        return name

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        self.write_config()
        if self.kernelspecs:
            self.install_kernelspecs()
        self._log = open(self.log_path, "w")
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.notebooks}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        if os.geteuid() == 0:  # CI containers run as root
            cmd.append("--allow-root")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGINT)  # jupyter_server asks for a second ^C
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def copy_log(self, dest: Path) -> None:
        """Keep the server's log with the test's artifacts."""
        if self.log_path.exists():
            shutil.copy(self.log_path, dest)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- REST -----------------------------------------------------------------------------

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        """A REST call with the token; (status, parsed JSON or None)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, None

    def me(self) -> dict:
        status, body = self.api("GET", "gpu-pool/api/v1/me")
        assert status == 200, (status, body)
        return body  # type: ignore[return-value]

    def kernel_alive(self, kernel_id: str) -> bool:
        status, _ = self.api("GET", f"api/kernels/{kernel_id}")
        return status == 200

    def lab_url(self, path: str = "lab", workspace: str | None = None) -> str:
        """A JupyterLab URL; with ``workspace``, a fresh workspace of that name (no tabs restored)."""
        if workspace:
            rest = "" if path == "lab" else path.removeprefix("lab/")
            return f"{self.url}/lab/workspaces/{workspace}/{rest}?reset&token={self.token}"
        return f"{self.url}/{path}?token={self.token}"
