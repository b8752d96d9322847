"""The Littlest JupyterHub (TLJH) plugin: a teaching lab's GPU pool in one install command.

    curl -L https://tljh.jupyter.org/bootstrap.py | sudo python3 - --admin <you> --plugin jupyter-gpu-pool

(on a machine where TLJH runs already, the same command adds the plugin).  TLJH loads this module
through the ``tljh`` entry point and calls its hooks:

- ``tljh_extra_user_pip_packages``: the pool goes into the users' environment as well (its
  provisioner and server extension run in each user's server), from where the hub's copy came from
  (a git commit, a wheel, a directory: :func:`user_requirement`), else the same release from PyPI;
- ``tljh_post_install``: writes a starting configuration an admin can edit
  (``/opt/tljh/user/etc/jupyter/jupyter_gpu_pool_config.py``), an API token of the hub for the pool
  service (root only), one kernelspec per profile into the users' environment, and the
  ``jupyter-gpu-pool`` systemd unit, then starts the service and reloads the hub;
- ``tljh_custom_jupyterhub_config``: each user's server gets the service's socket
  (``JUPYTER_GPU_POOL_SOCKET``), and the hub knows the service (its token may read users and
  groups: hub groups count for quotas and budgets, hub admins administer the pool).

TLJH names its Unix users ``jupyter-<name>`` and puts them in ``jupyterhub-users`` (admins also in
``jupyterhub-admins``): the starting configuration strips that prefix, so the pool's user names are
the hub's, and gives ``jupyterhub-users`` a weekly GPU-hour budget.  docs/teaching-lab.md tells the rest.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import secrets
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pluggy  # TLJH brings it (its plugin manager); this module is loaded by TLJH only

from . import __version__
from .config import CONFIG_FILE, DEFAULT_PROFILES
from .service.app import UNIT_NAME, systemd_unit
from .service.protocol import DEFAULT_SOCKET

hookimpl = pluggy.HookimplMarker("tljh")

DISTRIBUTION = "jupyter-gpu-pool"
SERVICE_NAME = "gpu-pool"  # the service's name in the hub
HUB_API_URL = "http://127.0.0.1:15001/hub/api"  # TLJH's hub listens on port 15001 of the machine

STARTING_CONFIG = f'''# The GPU pool of this TLJH machine (written by the jupyter-gpu-pool TLJH plugin).
# Edit, then: sudo systemctl restart {UNIT_NAME}.  See docs/teaching-lab.md.
# Every user's server reads this file too (for the service's socket): keep no secret here.

c.GPUPool.service_socket = {DEFAULT_SOCKET!r}

# GPUs: the ones NVML finds; declare some (c.GPUPool.inventory) on a machine without.
c.GPUPool.gpu_discovery = "auto"
c.GPUPool.profiles = {DEFAULT_PROFILES!r}
c.GPUPool.default_user_quota = {{"kernels": 2}}

# GPU time: a slice costs its share of its GPU per hour while active (hibernated time is free).
c.GPUPool.budgets = {{"jupyterhub-users": {{"gpu_hours": 10, "period": "week"}}}}

# Idle kernels give their slice back: hibernated (variables kept) where the GPU allows, else shut down.
# slice_at: a kernel takes its slice when its first cell runs ("first-cell"), or when it starts ("start").
c.GPUPool.policy = [{{"name": "lab", "idle_timeout": "30m", "warn": "5m", "action": "hibernate",
                     "slice_at": "first-cell"}}]

# The service: TLJH's users are jupyter-<name>; its admins are in jupyterhub-admins.
c.PoolService.socket = {DEFAULT_SOCKET!r}
c.PoolService.user_prefix = "jupyter-"
c.PoolService.admin_groups = ["jupyterhub-admins"]
'''


@dataclass(frozen=True)
class Layout:
    """Where TLJH keeps things (``TLJH_INSTALL_PREFIX``, /opt/tljh by default), and where systemd units go."""

    prefix: Path = field(default_factory=lambda: Path(os.environ.get("TLJH_INSTALL_PREFIX", "/opt/tljh")))
    systemd_dir: Path = Path("/etc/systemd/system")

    @property
    def user_env(self) -> Path:
        return self.prefix / "user"

    @property
    def config_dir(self) -> Path:
        """The users' environment's Jupyter config directory: read by the service and by every user's server."""
        return self.user_env / "etc" / "jupyter"

    @property
    def config_file(self) -> Path:
        return self.config_dir / f"{CONFIG_FILE}.py"

    @property
    def hub_env_file(self) -> Path:
        """The service's hub token and URL (root only)."""
        return self.prefix / "state" / UNIT_NAME / "hub.env"

    @property
    def unit_file(self) -> Path:
        return self.systemd_dir / f"{UNIT_NAME}.service"


def write_config(layout: Layout) -> Path | None:
    """The starting configuration, unless the admin has one already (their edits are kept)."""
    path = layout.config_file
    if path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STARTING_CONFIG)
    path.chmod(0o644)
    return path


def write_hub_env(layout: Layout) -> Path:
    """The hub's API token for the service, made once and kept (the hub reads it at each start)."""
    path = layout.hub_env_file
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"JUPYTERHUB_API_TOKEN={secrets.token_hex(32)}\nJUPYTERHUB_API_URL={HUB_API_URL}\n")
    return path


def hub_token(layout: Layout) -> str | None:
    try:
        lines = layout.hub_env_file.read_text().splitlines()
    except OSError:
        return None
    return next((line.split("=", 1)[1] for line in lines if line.startswith("JUPYTERHUB_API_TOKEN=")), None)


def write_unit(layout: Layout, python: str = sys.executable) -> Path:
    """The systemd unit that runs the service on the users' environment's configuration."""
    layout.unit_file.parent.mkdir(parents=True, exist_ok=True)
    layout.unit_file.write_text(systemd_unit(str(layout.config_dir), python=python,
                                             environment_file=str(layout.hub_env_file)))
    return layout.unit_file


def install_kernelspecs(layout: Layout) -> list[tuple[str, str]]:
    """One kernelspec per profile in the users' environment, run by its Python."""
    from .config import load_settings
    from .kernel_provisioner import kernelspecs

    settings = load_settings(paths=[str(layout.config_dir)])
    return kernelspecs.install(list(settings.profiles.values()), prefix=str(layout.user_env),
                               python=str(layout.user_env / "bin" / "python"))


SYSTEMCTL = (["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", UNIT_NAME],
             ["systemctl", "restart", UNIT_NAME], ["systemctl", "restart", "jupyterhub"])


def install(layout: Layout | None = None, run: Callable[[list[str]], object] | None = None) -> list[Path]:
    """Everything ``tljh_post_install`` does; the files written.  ``run`` runs each systemctl command
    (by default for real; systemd then starts the service and reloads the hub with its new settings)."""
    layout = layout or Layout()
    run = run or (lambda command: subprocess.run(command, check=True))
    written = [p for p in (write_config(layout), write_hub_env(layout), write_unit(layout)) if p is not None]
    for _name, directory in install_kernelspecs(layout):
        written.append(Path(directory))
    for command in SYSTEMCTL:
        run(list(command))
    return written


def configure_hub(c, layout: Layout | None = None) -> None:
    """What the hub needs: the socket in every user's server's environment, and the service registered
    with a token that may read users and their groups."""
    layout = layout or Layout()
    c.Spawner.environment.update({"JUPYTER_GPU_POOL_SOCKET": DEFAULT_SOCKET})
    token = hub_token(layout)
    if token is None:
        print(f"jupyter-gpu-pool: no hub token at {layout.hub_env_file} (the plugin's install did not run): "
              "hub groups and admins do not count for the GPU pool", file=sys.stderr)
        return
    c.JupyterHub.services.append({"name": SERVICE_NAME, "api_token": token, "display": False})
    c.JupyterHub.load_roles.append({"name": f"{SERVICE_NAME}-service", "description": "The GPU pool reads users "
                                    "and groups", "scopes": ["read:users", "read:groups"], "services": [SERVICE_NAME]})


def user_requirement(dist: importlib.metadata.Distribution | None = None) -> str:
    """What pip installs into the users' environment: the hub's copy's own source where pip recorded one
    (PEP 610's ``direct_url.json``: TLJH's ``--plugin git+https://…`` or a wheel's path), so that both
    environments run the same code; else (installed from an index) the same release from the index."""
    if dist is None:
        try:
            dist = importlib.metadata.distribution(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return f"{DISTRIBUTION}=={__version__}"
    pin = f"{DISTRIBUTION}=={dist.version}"
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
        url = direct["url"]
    except (ValueError, KeyError, TypeError):
        return pin  # no record (an index), or one pip would not have written
    if url.startswith("file://") and not os.path.exists(urllib.parse.unquote(urllib.parse.urlsplit(url).path)):
        return pin  # the wheel or directory it came from is gone since (a later run of the installer)
    fragment = []
    if "vcs_info" in direct:
        vcs = direct["vcs_info"]
        url = f"{vcs['vcs']}+{url}@{vcs['commit_id']}"  # the commit the hub got, not a branch that moved on since
    elif "archive_info" in direct:
        info = direct["archive_info"]
        digest = (info.get("hashes") or {}).get("sha256")
        fragment.append(f"sha256={digest}" if digest else info.get("hash", ""))
    # dir_info (a local directory, editable or not): pip builds the directory again (not editable: the
    # users' environment gets a copy of its code as it is now)
    if direct.get("subdirectory"):
        fragment.append(f"subdirectory={direct['subdirectory']}")
    fragment = [f for f in fragment if f]
    return f"{DISTRIBUTION} @ {url}" + (f"#{'&'.join(fragment)}" if fragment else "")


@hookimpl
def tljh_extra_user_pip_packages():
    return [user_requirement()]


@hookimpl
def tljh_custom_jupyterhub_config(c):
    configure_hub(c)


@hookimpl
def tljh_post_install():
    for path in install():
        print(f"jupyter-gpu-pool: wrote {path}")
