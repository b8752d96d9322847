"""``jupyter gpu-pool serve``: run the pool service (docs/teaching-lab.md).

Run by the admin (a systemd unit, or a JupyterHub managed service), as root or a user of its own.
It reads the pool's settings from system locations only (``{sys.prefix}/etc/jupyter`` and
``/etc/jupyter``, or ``--config-dir``), never from a user's home or environment, keeps the ledger in
a file only it can read and write, and listens on ``--socket``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from jupyter_core.application import JupyterApp
from jupyter_core.paths import ENV_CONFIG_PATH, SYSTEM_CONFIG_PATH
from traitlets import Bool, Unicode
from traitlets.config import Config, Configurable

from .. import __version__
from ..config import MPS_PIPE_DIRECTORY_MAX, ConfigError, GPUPool, read_config
from ..traits import Names, Seconds
from .protocol import DEFAULT_SOCKET

DEFAULT_LEDGER = "/var/lib/jupyter-gpu-pool/ledger.sqlite"
UNIT_NAME = "jupyter-gpu-pool"


class PoolService(Configurable):
    """The pool service's own settings (``c.PoolService.*`` in the pool's config file)."""

    socket = Unicode(DEFAULT_SOCKET, help="""The Unix socket users' Jupyter servers connect to (give the same path
        to them in GPUPool.service_socket or JUPYTER_GPU_POOL_SOCKET).""").tag(config=True)

    socket_group = Unicode("", help="""Only members of this Unix group may connect (empty: every user of the
        machine; each caller still acts on their own kernels only).""").tag(config=True)

    user_prefix = Unicode("", help="""Stripped from Unix user names to make pool user names: TLJH names its users
        'jupyter-<name>', so with 'jupyter-' their pool names (quotas, budgets, the UI) are the hub's names.  With a
        prefix, Unix users without it may not use the pool (but for unprefixed_users): 'alice' and 'jupyter-alice'
        would otherwise be one pool user.""").tag(config=True)

    unprefixed_users = Names(["root"], help="""With user_prefix, the Unix users who use the pool under their own
        name (root, by default, to administer it); a prefixed user whose pool name would be one of these is
        refused.""").tag(config=True)

    admin_groups = Names(["jupyterhub-admins"], help="""Unix or JupyterHub groups whose members administer the pool
        (see every lease, act on any kernel).  TLJH puts its admins in 'jupyterhub-admins'.  Root always
        administers where it is a pool user (by default it is: PoolService.unprefixed_users); so do
        JupyterHub admins when the service runs as a hub service.""").tag(config=True)

    reconcile_interval = Seconds(15.0, help="""Seconds between two passes of the service's upkeep: the leases of
        kernels that are gone are released, and the budget is enforced (see budget_grace).""").tag(config=True)

    budget_grace = Seconds(300.0, help="""Seconds a kernel may stay active after its owner's GPU-hour budget
        (GPUPool.budgets) ran out before the service ends it (its process tree is terminated and its slice
        released).  The user's own server warns at 90% and acts at 100% under the idle policy; this is the
        backstop for a server that does not (its user turned the policy off).""").tag(config=True)


class ServeApp(JupyterApp):
    name = "jupyter-gpu-pool-serve"
    version = __version__
    description = """Run the GPU pool service: the one process that keeps the machine's ledger, reads the admin's
    settings and knows each caller from the socket (docs/teaching-lab.md)."""

    config_dir = Unicode("", help="""Read the pool's settings (jupyter_gpu_pool_config.py/.json) from this directory
        only.  Default: this environment's etc/jupyter and /etc/jupyter (never a user's home).""").tag(config=True)
    systemd_unit = Bool(False, help="Print a systemd unit that runs this service, and exit.").tag(config=True)
    unit_python = Unicode("", help="""With --systemd-unit: the Python the unit runs the service with (default: this
        one, sys.executable).  The unit shipped in the package (jupyter_gpu_pool/service/jupyter-gpu-pool.service)
        is the one printed for /usr/bin/python3.""").tag(config=True)
    classes = [PoolService]
    aliases = {"socket": "PoolService.socket", "socket-group": "PoolService.socket_group",
               "config-dir": "ServeApp.config_dir", "log-level": "Application.log_level",
               "unit-python": "ServeApp.unit_python"}
    flags = {"systemd-unit": ({"ServeApp": {"systemd_unit": True}}, "Print a systemd unit for this service.")}

    def load_config_file(self, *args, **kwargs):
        """Settings come from system locations only (see ``start``), never a user's Jupyter config path."""

    def start(self):
        if self.systemd_unit:
            # (print adds the newline the unit's text ends without)
            print(systemd_unit(self.config_dir, python=self.unit_python or sys.executable,
                               socket=PoolService(config=self.config).socket), end="")
            return
        logging.basicConfig(level=self.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        paths = [self.config_dir] if self.config_dir else system_config_paths()
        try:
            config, files = read_config(paths)
            config.merge(self.config)  # the command line wins
            config.merge(Config({"GPUPool": service_defaults(config, PoolService(config=config).socket)}))
            settings = GPUPool(config=config).check()
        except ConfigError as e:
            sys.exit(f"Bad GPU pool configuration: {e}")
        except Exception as e:  # a TraitError names the setting
            sys.exit(f"Bad GPU pool configuration: {e}")
        settings.config_files = tuple(str(f) for f in files)
        from .server import StartError

        try:
            asyncio.run(serve(settings, PoolService(config=config)))
        except StartError as e:
            sys.exit(f"The GPU pool service cannot start: {e}")


def service_defaults(config: Config, socket_path: str) -> dict:
    """Where a service keeps its state unless the admin said: the ledger under /var/lib, the MPS
    daemons' pipes beside the socket (every user's kernels must reach them), their logs under /var/log.
    A user's own defaults (their home's data and runtime directories) are never the service's."""
    given = config.get("GPUPool", {})
    pipes = os.path.join(os.path.dirname(socket_path) or "/run", "mps-pipe")
    if len(pipes.encode()) > MPS_PIPE_DIRECTORY_MAX:  # a socket in a deep folder: the daemons' sockets would not fit
        pipes = f"/run/{UNIT_NAME}/mps-pipe"
    defaults = {"ledger_path": DEFAULT_LEDGER,
                "mps_pipe_directory": pipes,
                "mps_log_directory": f"/var/log/{UNIT_NAME}/mps"}
    return {k: v for k, v in defaults.items() if k not in given}


def system_config_paths() -> list[str]:
    """Where the admin's settings are: this environment's etc/jupyter and the machine's (/etc/jupyter),
    whatever JUPYTER_CONFIG_DIR or JUPYTER_CONFIG_PATH say (a user may set those; the admin's file may
    not be replaced by theirs)."""
    return [*ENV_CONFIG_PATH, *SYSTEM_CONFIG_PATH]


async def serve(settings: GPUPool, options: PoolService) -> None:
    from ..local.pool import LocalPool
    from .identity import Identities
    from .server import PoolService as Service

    log = logging.getLogger("jupyter_gpu_pool.service")
    directory = os.path.dirname(settings.ledger_path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)  # the ledger is the service's alone
    pool = LocalPool(settings, ledger_mode=0o600)
    os.chmod(settings.ledger_path, 0o600)  # (SQLite gives its -wal and -shm files the database's mode)
    identities = Identities(user_prefix=options.user_prefix, unprefixed=tuple(options.unprefixed_users),
                            admin_groups=tuple(options.admin_groups),
                            unix_groups=settings.unix_groups, group_members=settings.group_members,
                            hub_api_url=os.environ.get("JUPYTERHUB_API_URL", ""),
                            hub_api_token=os.environ.get("JUPYTERHUB_API_TOKEN", ""))
    service = Service(pool, identities, reconcile_interval=options.reconcile_interval,
                      budget_grace=options.budget_grace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start(options.socket, group=options.socket_group or None)
    log.info("GPU pool service %s: %s; settings from %s", __version__, pool.inventory.note,
             ", ".join(settings.config_files) or "defaults")
    print(f"GPU pool service listening on {options.socket}", flush=True)
    upkeep = asyncio.create_task(service.upkeep_forever(stop))
    await stop.wait()
    await service.close()
    await upkeep
    await asyncio.to_thread(pool.stop_mps)
    pool.ledger.close()


def systemd_unit(config_dir: str = "", *, python: str = sys.executable, environment_file: str = "",
                 socket: str = DEFAULT_SOCKET) -> str:
    """A unit that runs the service with ``python`` (this environment's), after the machine's GPUs are up
    and before the hub; ``environment_file``: where a hub token for the service is kept (optional).  The
    unit for /usr/bin/python3 and the default socket is shipped beside this module (jupyter-gpu-pool.service)."""
    command = f"{python} -m jupyter_gpu_pool.cli serve" + (f" --config-dir={config_dir}" if config_dir else "") + (
        f" --socket={socket}" if socket != DEFAULT_SOCKET else "")
    environment = f"EnvironmentFile=-{environment_file}\n" if environment_file else ""
    return f"""# The GPU pool service of a shared machine (docs/teaching-lab.md): `jupyter gpu-pool serve --systemd-unit`
# prints this unit for the Python it runs with; ExecStart must name a Python where jupyter-gpu-pool is installed.
[Unit]
Description=GPU pool service for Jupyter (jupyter-gpu-pool)
After=network.target nvidia-persistenced.service
Before=jupyterhub.service

[Service]
ExecStart={command}
{environment}Restart=always
RestartSec=2
RuntimeDirectory={UNIT_NAME}
RuntimeDirectoryPreserve=yes
StateDirectory={UNIT_NAME}
StateDirectoryMode=0700
LogsDirectory={UNIT_NAME}

[Install]
WantedBy=multi-user.target
"""
