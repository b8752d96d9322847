"""The TLJH plugin, through TLJH's own plugin machinery (pluggy, project "tljh", the hook specifications
TLJH declares) on a TLJH-like layout in a temporary directory.

TLJH itself cannot be installed here (its installer wants systemd and the machine's /opt/tljh), so the
systemctl commands the install runs are recorded rather than run; everything else is real: the files
written, the kernelspecs, the starting configuration read by the pool's own loader, the service
started with the unit's own command line, and the hub configuration read by JupyterHub's own traits.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pluggy
import pytest

from jupyter_gpu_pool import __version__
from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.service.client import ServiceClient
from jupyter_gpu_pool.service.protocol import DEFAULT_SOCKET
from jupyter_gpu_pool.tljh import Layout, configure_hub, install, user_requirement

ROOT = Path(__file__).resolve().parents[2]
hookspec = pluggy.HookspecMarker("tljh")


class TLJHHooks:
    """TLJH's hook specifications (tljh/hooks.py), as TLJH declares them."""

    @hookspec
    def tljh_extra_user_conda_packages(self): ...

    @hookspec
    def tljh_extra_user_pip_packages(self): ...

    @hookspec
    def tljh_extra_hub_pip_packages(self): ...

    @hookspec
    def tljh_extra_apt_packages(self): ...

    @hookspec
    def tljh_custom_jupyterhub_config(self, c): ...

    @hookspec
    def tljh_config_post_install(self, config): ...

    @hookspec
    def tljh_post_install(self): ...

    @hookspec
    def tljh_new_user_create(self, username): ...


@pytest.fixture
def plugins():
    """TLJH's plugin manager with this distribution's ``tljh`` entry point registered, as TLJH loads it."""
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["tljh"]
    manager = pluggy.PluginManager("tljh")
    manager.add_hookspecs(TLJHHooks)
    for name, target in entry_points.items():
        manager.register(importlib.import_module(target), name=name)
    return manager


@pytest.fixture
def layout(tmp_path, monkeypatch):
    monkeypatch.setenv("TLJH_INSTALL_PREFIX", str(tmp_path / "tljh"))
    user_env = tmp_path / "tljh" / "user"
    (user_env / "bin").mkdir(parents=True)
    (user_env / "bin" / "python").symlink_to(sys.executable)
    return Layout(systemd_dir=tmp_path / "systemd")


def test_the_plugin_puts_the_pool_into_the_users_environment_from_where_the_hubs_copy_came(plugins):
    packages = [p for found in plugins.hook.tljh_extra_user_pip_packages() for p in found]
    hubs = importlib.metadata.distribution("jupyter-gpu-pool")  # this environment plays the hub's
    direct = json.loads(hubs.read_text("direct_url.json") or "null")
    if direct is None:  # installed from an index: the same release
        assert packages == [f"jupyter-gpu-pool=={__version__}"]
    else:  # this checkout (pip install -e .): the users' environment is built from the same directory
        assert packages == [f"jupyter-gpu-pool @ {direct['url']}"] and "dir_info" in direct


def _distribution(where: Path, direct: dict | None) -> importlib.metadata.Distribution:
    """An installed jupyter-gpu-pool's metadata as pip leaves it, with PEP 610's record of its source."""
    info = where / f"jupyter_gpu_pool-{__version__}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: jupyter-gpu-pool\nVersion: {__version__}\n")
    if direct is not None:
        (info / "direct_url.json").write_text(json.dumps(direct))
    return importlib.metadata.PathDistribution(info)


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("direct, expected", [
    (None, f"jupyter-gpu-pool=={__version__}"),  # from PyPI
    ({"url": "https://github.com/example/jupyter-gpu-pool.git",
      "vcs_info": {"vcs": "git", "requested_revision": "main", "commit_id": COMMIT}},
     f"jupyter-gpu-pool @ git+https://github.com/example/jupyter-gpu-pool.git@{COMMIT}"),  # the commit, not 'main'
    ({"url": "https://github.com/example/mono.git", "subdirectory": "py/pool",
      "vcs_info": {"vcs": "git", "commit_id": COMMIT}},
     f"jupyter-gpu-pool @ git+https://github.com/example/mono.git@{COMMIT}#subdirectory=py/pool"),
    ({"url": "file://{tmp}/src/jupyter-gpu-pool", "dir_info": {"editable": True}},
     "jupyter-gpu-pool @ file://{tmp}/src/jupyter-gpu-pool"),
    ({"url": "file://{tmp}/src/jupyter_gpu_pool-0.1.0-py3-none-any.whl", "archive_info": {"hash": "sha256=" + "ab" * 32}},
     "jupyter-gpu-pool @ file://{tmp}/src/jupyter_gpu_pool-0.1.0-py3-none-any.whl#sha256=" + "ab" * 32),
    # the wheel it came from was removed since (the installer run again later): the same release instead
    ({"url": "file://{tmp}/gone/jupyter_gpu_pool-0.1.0-py3-none-any.whl", "archive_info": {"hash": "sha256=" + "ab" * 32}},
     f"jupyter-gpu-pool=={__version__}"),
])
def test_the_users_requirement_names_the_hubs_source(tmp_path, direct, expected):
    from packaging.requirements import Requirement

    (tmp_path / "src" / "jupyter-gpu-pool").mkdir(parents=True)
    (tmp_path / "src" / "jupyter_gpu_pool-0.1.0-py3-none-any.whl").write_bytes(b"")
    if direct is not None:
        direct = {**direct, "url": direct["url"].replace("{tmp}", str(tmp_path))}
    expected = expected.replace("{tmp}", str(tmp_path))
    requirement = user_requirement(_distribution(tmp_path, direct))
    assert requirement == expected
    parsed = Requirement(requirement)  # as pip reads it
    assert parsed.name == "jupyter-gpu-pool" and (parsed.url or None) == (expected.split(" @ ")[1] if " @ " in expected
                                                                          else None)


def test_pip_installs_the_users_copy_from_the_wheel_the_hubs_came_from(tmp_path):
    """A plugin installed from a local wheel: pip, asked for the requirement, takes that very wheel (not PyPI)."""
    wheel = tmp_path / f"jupyter_gpu_pool-{__version__}-py3-none-any.whl"
    info = f"jupyter_gpu_pool-{__version__}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: jupyter-gpu-pool\nVersion: {__version__}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    hubs = _distribution(tmp_path / "hub", {"url": wheel.as_uri(), "archive_info": {"hashes": {"sha256": digest}}})
    requirement = user_requirement(hubs)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
                           "--ignore-installed", "--quiet", "--report", "-", requirement],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [item] = json.loads(done.stdout)["install"]
    assert item["download_info"]["url"] == wheel.as_uri() and item["metadata"]["version"] == __version__


def test_the_install_writes_a_starting_config_a_token_a_unit_and_kernelspecs(layout):
    commands: list[list[str]] = []
    written = install(layout, run=commands.append)
    assert layout.config_file in written and layout.unit_file in written and layout.hub_env_file in written
    settings = load_settings(paths=[str(layout.config_dir)])  # the pool's own loader reads it
    assert settings.service_socket == DEFAULT_SOCKET
    assert settings.budgets["jupyterhub-users"].gpu_hours == 10 and settings.budgets["jupyterhub-users"].period == "week"
    assert [(rule.name, rule.slice_at) for rule in settings.policy] == [("lab", "first-cell")]
    text = layout.config_file.read_text()
    assert '"slice_at": "first-cell"' in text  # written out, so that an admin sees the choice
    assert "c.PoolService.user_prefix = \"jupyter-\"" in text and "jupyterhub-admins" in text
    env_mode = stat.S_IMODE(layout.hub_env_file.stat().st_mode)
    assert env_mode == 0o600 and stat.S_IMODE(layout.hub_env_file.parent.stat().st_mode) == 0o700
    assert layout.hub_env_file.read_text().startswith("JUPYTERHUB_API_TOKEN=")
    unit = layout.unit_file.read_text()
    assert f"--config-dir={layout.config_dir}" in unit and f"EnvironmentFile=-{layout.hub_env_file}" in unit
    kernels = sorted(p.name for p in (layout.user_env / "share" / "jupyter" / "kernels").iterdir())
    assert kernels == sorted(f"gpu-pool-{name}" for name in settings.profiles)
    spec = (layout.user_env / "share" / "jupyter" / "kernels" / kernels[0] / "kernel.json").read_text()
    assert str(layout.user_env / "bin" / "python") in spec  # kernels run in the users' environment
    assert commands == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "jupyter-gpu-pool"],
                        ["systemctl", "restart", "jupyter-gpu-pool"], ["systemctl", "restart", "jupyterhub"]]


def test_installing_again_keeps_the_admins_edits_and_the_hubs_token(layout):
    install(layout, run=lambda command: None)
    edited = layout.config_file.read_text() + "c.GPUPool.default_user_quota = {'kernels': 5}\n"
    layout.config_file.write_text(edited)
    token = layout.hub_env_file.read_text()
    written = install(layout, run=lambda command: None)
    assert layout.config_file not in written and layout.config_file.read_text() == edited
    assert layout.hub_env_file.read_text() == token


def test_the_units_command_runs_the_service_on_the_written_config(layout, tmp_path):
    install(layout, run=lambda command: None)
    [exec_start] = [line for line in layout.unit_file.read_text().splitlines() if line.startswith("ExecStart=")]
    path = str(tmp_path / "run" / "pool.sock")  # this machine's /run and /var/lib are not the test's
    command = shlex.split(exec_start.removeprefix("ExecStart=")) + [
        f"--socket={path}", f"--GPUPool.ledger_path={tmp_path / 'state' / 'ledger.sqlite'}"]
    service = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert service.poll() is None, service.stdout.read().decode()
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                break
            except OSError:
                assert time.monotonic() < deadline, "the service did not listen"
                time.sleep(0.2)
        settings = ServiceClient(path).call("settings")
        assert settings["config"]["budgets"] == {"jupyterhub-users": {"gpu_hours": 10, "period": "week"}}
        assert settings["user"] == "root" and settings["admin"]
    finally:
        service.terminate()
        service.wait(timeout=30)


def _printed_unit(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu_pool.cli", "serve", "--systemd-unit", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_shipped_unit_is_the_one_serve_prints(tmp_path):
    from importlib.resources import files

    shipped = (files("jupyter_gpu_pool.service") / "jupyter-gpu-pool.service").read_text()
    assert _printed_unit("--unit-python=/usr/bin/python3") == shipped  # the default socket, the machine's Python
    here = _printed_unit()  # this environment's Python, unless told
    assert here == shipped.replace("ExecStart=/usr/bin/python3 ", f"ExecStart={sys.executable} ")
    elsewhere = _printed_unit("--socket=/srv/gpu/pool.sock")  # another socket is the unit's to pass on
    assert f"ExecStart={sys.executable} -m jupyter_gpu_pool.cli serve --socket=/srv/gpu/pool.sock\n" in elsewhere
    if shutil.which("systemd-analyze"):  # and systemd reads it without complaint
        unit = tmp_path / "jupyter-gpu-pool.service"
        unit.write_text(shipped)
        done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_the_hub_gives_every_server_the_socket_and_knows_the_service(plugins, layout):
    jupyterhub = pytest.importorskip("jupyterhub.app", reason="JupyterHub comes with the 'hub' extra")
    from jupyterhub.spawner import LocalProcessSpawner
    from traitlets.config import Config

    install(layout, run=lambda command: None)
    c = Config()
    c.Spawner.environment = {"TZ": "Europe/Paris"}  # an admin's own setting stays
    plugins.hook.tljh_custom_jupyterhub_config(c=c)
    hub = jupyterhub.JupyterHub(config=c)  # read by the hub's own traits
    token = layout.hub_env_file.read_text().splitlines()[0].split("=", 1)[1]
    assert hub.services == [{"name": "gpu-pool", "api_token": token, "display": False}]
    [role] = hub.load_roles
    assert role["services"] == ["gpu-pool"] and set(role["scopes"]) == {"read:users", "read:groups"}
    assert LocalProcessSpawner(config=c).environment == {"TZ": "Europe/Paris",
                                                         "JUPYTER_GPU_POOL_SOCKET": DEFAULT_SOCKET}


def test_without_the_install_the_hub_still_starts_and_says_what_is_missing(layout, capsys):
    jupyterhub = pytest.importorskip("jupyterhub.app", reason="JupyterHub comes with the 'hub' extra")
    from jupyterhub.spawner import LocalProcessSpawner
    from traitlets.config import Config

    c = Config()
    configure_hub(c, layout)  # no token: the install never ran
    assert "no hub token" in capsys.readouterr().err
    assert jupyterhub.JupyterHub(config=c).services == []
    assert LocalProcessSpawner(config=c).environment == {"JUPYTER_GPU_POOL_SOCKET": DEFAULT_SOCKET}
