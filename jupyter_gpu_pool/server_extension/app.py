"""The jupyter_server extension: idle policy (culler), REST API, events, metrics, activity.

Enabled by default once installed (``etc/jupyter/jupyter_server_config.d/jupyter_gpu_pool.json``).
Its settings live with the pool's: ``c.GPUPoolExtension.*`` may be written in
``jupyter_gpu_pool_config.py`` (read as this extension's config file) or in
``jupyter_server_config.py``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Enum, Instance, TraitError, Type, default

from ..compat import forget_failed_starts, quiet_refusals, start_handlers
from ..config import CONFIG_FILE, ConfigError
from ..devices.telemetry import NVMLSource, Sampler
from ..pool import PoolError
from ..pool.errors import SERVICE_UNAVAILABLE
from ..pools import pool_for
from ..traits import Count, Names, Seconds
from . import events
from .context import ServerContext
from .activity import ActivityRecorder
from .backends.base import NoPool, PoolBackend
from .backends.local import LocalBackend
from .culler import SERVER_CULLER_EXEMPT, Culler
from .rest.handlers import handlers
from .rest.resume import resume_handlers
from .sleep.hook import HibernationHook
from .sleep.websocket import install_transparent_resume
from .rest.hints import HintLimiter
from .rest.identity import is_personal_server
from .notebooks import Notebooks
from .recorder import Recorder
from .starting import StartingKernels


# The package's logger: every module of the pool logs under it (``logging.getLogger(__name__)``), the
# hibernator and the provisioners included when they run in this server.
PACKAGE_LOG = "jupyter_gpu_pool"


def join_server_log(extension_log: logging.Logger, level: int | str) -> None:
    """Send the pool's module loggers' lines where jupyter_server writes this extension's own (its
    ``self.log``'s handlers: the server's stream and format, or an admin's ``logging_config``), at its
    level: without a handler of their own they went to Python's last-resort handler, warnings bare (no
    time, level or name) and INFO lines dropped.  A later server in the same process (tests) replaces the
    handlers an earlier one lent; records still propagate, so a host that logs the root logger sees them."""
    package = logging.getLogger(PACKAGE_LOG)
    for handler in [h for h in package.handlers if getattr(h, "_lent_by_gpu_pool", False)]:
        package.removeHandler(handler)
    for handler in extension_log.handlers:
        if handler not in package.handlers:
            handler._lent_by_gpu_pool = True  # type: ignore[attr-defined]
            package.addHandler(handler)
    wanted = logging.getLevelName(level) if isinstance(level, str) else level
    if isinstance(wanted, int) and package.getEffectiveLevel() > wanted:
        package.setLevel(wanted)  # never quieter than it was made (a test may have asked for DEBUG)


class GPUPoolExtension(ExtensionApp):
    """GPU pool: gives idle kernels' GPU slices back and shows users their quota and usage."""

    name = "jupyter_gpu_pool"
    description = "Elastic GPU kernels: idle policy, quota and utilization API"
    load_other_extensions = True

    cull_interval = Seconds(
        30.0, help="""Seconds between two passes of the idle policy over this server's GPU kernels: how soon a
        kernel is warned once a limit comes within its rule's warn time.  A warned kernel is acted on at
        its warning's deadline, whatever the interval."""
    ).tag(config=True)

    telemetry_interval = Seconds(
        5.0, help="Seconds between two NVML readings of each GPU kernel's memory and utilization."
    ).tag(config=True)

    telemetry_history = Count(
        120, help="GPU utilization samples kept per kernel for the UI's sparkline (at telemetry_interval)."
    ).tag(config=True)

    admin_users = Names(
        default_value=[],
        help="""User names that may see the whole pool (GET gpu-pool/api/v1/pool) and act on other users'
        kernels in this server.  Under JupyterHub, hub admins are admins too.  On a personal server
        (no JupyterHub, jupyter_server's own token login) the owner is an admin.""",
    ).tag(config=True)

    personal_server = Bool(
        help="""Treat every authenticated user of this server as its owner (GPUPool.owner) and an admin
        of the pool view.  Default: true when jupyter_server's own IdentityProvider runs outside
        JupyterHub (whoever holds the token owns the server), false otherwise.""",
    ).tag(config=True)

    @default("personal_server")
    def _default_personal_server(self) -> bool:
        return is_personal_server(self.serverapp.identity_provider) if self.serverapp else False

    exempt_from_server_culler = Bool(
        True,
        help="""When jupyter_server's own culler is on (MappingKernelManager.cull_idle_timeout > 0), exempt
        GPU pool kernels from it: the pool's policy, which warns first and records why, governs them,
        and jupyter_server's culler keeps culling the other kernels.  False: both act on pool kernels
        and the shorter timeout wins, without warning.""",
    ).tag(config=True)

    exit_on_config_error = Bool(
        True,
        help="""Stop the server at start when the pool's configuration (profiles, quotas, policy) is bad,
        with a message naming the bad setting.  False: run on without a pool; the API then reports
        pool.enabled = false and why.""",
    ).tag(config=True)

    telemetry_source_class = Type(
        default_value=NVMLSource, klass=object,
        help="Where per-process GPU readings come from (NVML). Readings are null where it has none.",
    ).tag(config=True)

    hibernator_class = Type(
        allow_none=True, klass=HibernationHook,
        help="""The hibernation hook: a subclass of jupyter_gpu_pool.server_extension.sleep.hook.HibernationHook,
        built as ``hibernator_class(parent=extension)``.  The default moves idle kernels' GPU memory to host RAM:
        on this machine (PoolHibernation, docs/hibernation.md), or, with pool_backend 'kubernetes', through the
        kernels' GPUKernels, the cluster's operator and node agent (ClusterHibernation, docs/kubernetes.md).
        None: no hibernation; rules whose action is 'hibernate' shut kernels down instead, and say why.""",
    ).tag(config=True)

    @default("hibernator_class")
    def _default_hibernator_class(self):
        if self.pool_backend == "kubernetes":
            return "jupyter_gpu_pool.server_extension.sleep.cluster.ClusterHibernation"
        return "jupyter_gpu_pool.server_extension.sleep.hook.PoolHibernation"

    cull_concurrency = Count(
        10, minimum=1,
        help="""The most hibernations and shutdowns the idle policy carries out at once (like
        jupyterhub-idle-culler's --concurrency).  More kernels due in one pass wait their turn; each
        shows as under way meanwhile, so no later pass decides it again.  Users' and admins' own
        requests are not held back.""",
    ).tag(config=True)

    hint_sleep_after = Seconds(
        60.0,
        help="""Seconds a kernel woken on a hint (its user opened its notebook or started typing in it:
        POST kernels/{id}/hint) stays on its GPU slice waiting for a cell.  If none runs by then (or
        someone starts waiting for a slice first), it goes back to sleep with no warning: nothing was
        used.  A hint wakes a kernel only where a slice is free and nobody waits (docs/hibernation.md).""",
    ).tag(config=True)

    service_wait = Seconds(
        15.0, zero_allowed=True,
        help="""Seconds a server that starts while the pool service is not answering (a machine booting,
        the service restarting, JupyterHub spawning first) waits for it, asking once a second, before it
        runs without the pool's API and idle policy until it is restarted.  The server answers no request
        meanwhile, so keep it under JupyterHub's Spawner.http_timeout (30 s by default).  0: do not wait.""",
    ).tag(config=True)

    hint_rate_limit = Count(
        20, minimum=1,
        help="""The most hints (POST kernels/{id}/hint) one user may send in any minute; more are answered
        429 with Retry-After.  JupyterLab sends one when a hibernated kernel's notebook is opened or
        focused, or a cell in it is edited, at most one per notebook every few seconds.""",
    ).tag(config=True)

    hibernator = Instance(HibernationHook, allow_none=True,
                          help="The hibernation hook in use (see hibernator_class).")

    pool_backend = Enum(["local", "kubernetes"], default_value="local", help="""Where the pool is: 'local' (this
        machine's GPUs and ledger) or 'kubernetes' (kernels in pods of a cluster, started through the
        gpu-pool-kubernetes kernelspecs; see docs/kubernetes.md).""").tag(config=True)

    backend: PoolBackend
    culler: Culler
    server_context: ServerContext  # what the REST views read (the culler's, read-only)
    _config_error: ConfigError | None = None
    # Set once initialize_settings is done.  jupyter_server stops an extension that failed to load too, and a
    # stop that raises ends its shutdown there: the server then runs on after SIGTERM until it is killed.
    _ready = False
    _unready_because = "its setup failed"
    sampler: Sampler

    def _config_file_name_default(self) -> str:
        return CONFIG_FILE  # one file for the pool and this extension: jupyter_gpu_pool_config.py

    # -- setup ------------------------------------------------------------------------------

    def initialize_settings(self) -> None:
        join_server_log(self.log, self.log_level)
        quiet_refusals(self.settings, self.serverapp.log)  # a refused start is an expected answer: one warning line
        self.backend = self._make_backend()
        self.hint_limiter = HintLimiter(self.hint_rate_limit)
        event_logger = self.serverapp.event_logger
        events.register(event_logger)
        notebooks = Notebooks(self.serverapp.session_manager)
        self.recorder = Recorder(self.backend, event_logger, notebooks)
        source = self.telemetry_source_class() if self.telemetry_source_class else None
        self.sampler = self.backend.make_sampler(source, self.backend.policy.thresholds, self.telemetry_history)
        if self.hibernator is None:
            wanted = self.hibernator_class if self.backend.hibernation and self.hibernator_class else HibernationHook
            if wanted.pool_backend not in (None, self.pool_backend):
                self._refuse(ConfigError(f"GPUPoolExtension.hibernator_class: {wanted.__name__} hibernates kernels of "
                                         f"the {wanted.pool_backend!r} pool, not of pool_backend "
                                         f"{self.pool_backend!r}; leave hibernator_class unset for the default"),
                             self.exit_on_config_error)
                wanted = HibernationHook
            self.hibernator = wanted(parent=self)
        km = self.serverapp.kernel_manager
        sampling = self.backend.trace_sampling
        activity = None if sampling is None else ActivityRecorder(self.backend, sample_interval=sampling,
                                                                  thresholds=self.backend.policy.thresholds)
        self.culler = Culler(kernel_manager=km, backend=self.backend, sampler=self.sampler, recorder=self.recorder,
                             web_settings=self.serverapp.web_app.settings, hibernator_getter=lambda: self.hibernator,
                             exempt_server_culler=self.exempt_from_server_culler, activity=activity,
                             concurrency=self.cull_concurrency, notebooks=notebooks)
        self.hibernator.when_user_resumes(self.culler.user_resumed)  # a resume asked for restarts the idle clock
        self.server_context = self.culler.context
        self.starting = StartingKernels(km)
        self._tasks: list[asyncio.Task] = []
        self._stop: asyncio.Event | None = None  # set once the loops run
        self._check_server_culler(km)
        policy = self.backend.policy
        self.log.info("GPU pool: %s; policy: %d rule(s)%s, pass every %gs; hibernation %s", self.backend.note,
                      len(policy.rules), " (DRY RUN: decisions are reported, nothing is done)" if policy.dry_run
                      else "", self.cull_interval, "on" if self.hibernator.enabled else "off (hibernate rules shut down)")
        self._ready = True

    def update_config(self, config) -> None:
        """Load settings, refusing a bad one the way a bad pool setting is refused: the server stops
        (jupyter_server would otherwise log the error and run the extension on its defaults)."""
        try:
            super().update_config(config)
        except TraitError as e:
            self._config_error = ConfigError(str(e))
            stop = config.get("GPUPoolExtension", {}).get("exit_on_config_error", self.exit_on_config_error)
            self._refuse(self._config_error, stop)

    def _refuse(self, error: ConfigError, stop: bool) -> None:
        if stop:
            self.log.critical("GPU pool: bad configuration, the server stops: %s", error)
            print(f"jupyter_gpu_pool: bad configuration: {error}", file=sys.stderr)
            raise SystemExit(1) from error
        self.log.error("GPU pool disabled, bad configuration: %s", error)

    def _make_backend(self) -> PoolBackend:
        try:
            if self._config_error is not None:
                raise self._config_error
            if self.pool_backend == "kubernetes":
                from .backends.kubernetes import KubernetesBackend

                return KubernetesBackend(self.serverapp.config)
            return LocalBackend(self._pool_once_it_answers())
        except ConfigError as e:
            self._refuse(e, self.exit_on_config_error)
            return NoPool(f"The GPU pool is misconfigured, tell your admin: {e}")
        except PoolError as e:  # the pool service is not answering: jupyter_server runs on without this extension
            self._unready_because = "the pool service was not answering when this server started"
            self.log.error("GPU pool: %s This server runs without the pool's API and idle policy until it is "
                           "restarted; its kernels start through the service once it answers.", e)
            raise

    def _pool_once_it_answers(self):
        """The pool; where its service is not answering yet, asked again once a second for ``service_wait``
        seconds (the server is starting: nothing else runs to be held up)."""
        deadline = time.monotonic() + self.service_wait
        waited = False
        while True:
            try:
                pool = pool_for(self.serverapp.config)
            except PoolError as e:
                if e.reason != SERVICE_UNAVAILABLE or time.monotonic() + 1 > deadline:
                    raise
                if not waited:
                    self.log.warning("GPU pool: %s This server waits up to %g s for it "
                                     "(GPUPoolExtension.service_wait).", e, self.service_wait)
                    waited = True
                time.sleep(1)
                continue
            if waited:
                self.log.info("GPU pool: the pool service answered; this server runs with its API and idle policy.")
            return pool

    def _check_server_culler(self, km) -> None:
        timeout = km.cull_idle_timeout
        if not timeout:
            return
        if self.exempt_from_server_culler:
            self.log.warning(
                "jupyter_server's own culler is on (MappingKernelManager.cull_idle_timeout=%s): it keeps culling "
                "kernels outside the GPU pool; GPU pool kernels follow the pool's policy instead (their "
                "kernelspec's cull_idle_timeout is set to %s). Set GPUPoolExtension.exempt_from_server_culler="
                "False to let both act.", timeout, SERVER_CULLER_EXEMPT)
        else:
            self.log.warning(
                "jupyter_server's own culler is on (MappingKernelManager.cull_idle_timeout=%s) and GPU pool "
                "kernels are not exempt from it: it may shut one down without warning before the pool's "
                "policy acts (the lease is then released with reason 'shutdown').", timeout)

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())
        self.handlers.extend(start_handlers())
        if self.hibernator.resumes:
            self.handlers.extend(resume_handlers())
            if install_transparent_resume(self.serverapp, self.hibernator, self.settings) is not None:
                # The kernel websockets hold a first cell until its kernel has a slice: kernels may start
                # without one where their rule says slice_at: first-cell.  The provisioners read the kernel
                # manager's config (the server's own may be a copy by now).
                self.serverapp.kernel_manager.config.GPUPoolProvisioner.first_cell_served = True

    async def _start_jupyter_server_extension(self, serverapp) -> None:
        loop = asyncio.get_running_loop()
        await self.backend.start(serverapp.kernel_manager)
        self.hibernator.start()
        self._stop = asyncio.Event()
        self._tasks = [loop.create_task(self.sampler.run(self.telemetry_interval, self._stop)),
                       loop.create_task(self.culler.run(self.cull_interval, self._stop))]

    async def stop_extension(self) -> None:
        """Let the loops finish what they are doing (threads cannot be cancelled), then stop.  jupyter_server
        shuts the kernels down next: first drop the starts that failed without a kernel, on which its
        shutdown would fail and leave the server running after SIGTERM (``compat.forget_failed_starts``)."""
        failed = forget_failed_starts(self.serverapp.kernel_manager)
        if failed:
            self.log.info("GPU pool: %d kernel start(s) that failed left no kernel to shut down: %s", len(failed),
                          ", ".join(failed))
        if not self._ready:
            self.log.warning("GPU pool: the extension has nothing to stop (%s); the server's kernels are shut down "
                             "as usual", self._unready_because)
            return
        if self._stop is not None:
            self._stop.set()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=30)
            for task in pending:
                task.cancel()
        self._tasks = []
        await self.starting.stop()
        await self.culler.stop()
        await self.culler.server_stopping()  # before jupyter_server shuts the kernels down
        await self.backend.stop()
        await self.hibernator.stop()
