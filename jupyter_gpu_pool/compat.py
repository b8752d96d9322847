"""Every private member of jupyter_client and jupyter_server the pool touches, in one place.

Upstream may rename an underscore name in any release; when it does, it breaks here, where
``tests/test_compat.py`` exercises each function against the installed packages, and nowhere else.
:data:`CHECKED` says which releases these were read against; a newer one is logged once at import,
so that an admin who upgrades knows where to look if something misbehaves.
"""

from __future__ import annotations

import json
import logging
import posixpath
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

log = logging.getLogger(__name__)

# package -> (oldest, newest) release whose private members below were checked (major.minor)
CHECKED = {"jupyter_client": ((8, 6), (8, 10)), "jupyter_server": ((2, 10), (2, 21))}


def _release(package: str) -> tuple[int, int] | None:
    try:
        parts = version(package).split(".")
        return int(parts[0]), int(parts[1])
    except (PackageNotFoundError, ValueError, IndexError):
        return None


def unchecked_versions() -> list[str]:
    """The installed packages newer or older than the releases this module was checked against."""
    found = []
    for package, (oldest, newest) in CHECKED.items():
        release = _release(package)
        if release is not None and not oldest <= release <= newest:
            found.append(f"{package} {version(package)} (checked: {oldest[0]}.{oldest[1]} to {newest[0]}.{newest[1]})")
    return found


_unchecked = unchecked_versions()
if _unchecked:
    log.warning("jupyter-gpu-pool touches private members of %s, which it was not checked against; if kernels "
                "misbehave, look at jupyter_gpu_pool/compat.py first", ", ".join(_unchecked))


# -- kernels: jupyter_client's and jupyter_server's managers ------------------------------------

def forget_pending_start(kernel_manager: Any, kernel_id: str) -> None:
    """Drop a kernel whose start failed from its ``MultiKernelManager._pending_kernels``, if it has one.

    jupyter_client 8.10.0 keeps it there (``_add_kernel_when_ready`` logs the error and never
    removes it), so jupyter_server's ``shutdown_all`` at exit fails on it."""
    from jupyter_client.multikernelmanager import MultiKernelManager

    multi = kernel_manager.parent if kernel_manager is not None else None
    if isinstance(multi, MultiKernelManager):
        multi._pending_kernels.pop(kernel_id, None)


def forget_failed_starts(multi_kernel_manager: Any) -> list[str]:
    """Drop from ``MultiKernelManager._pending_kernels`` every start that ended without a kernel (its task
    done, its id not among ``_kernels``); the ids dropped.

    jupyter_client 8.10.0 leaves a failed start there wherever nobody removes it (a provisioner refusing
    as it is made, another kernelspec's program missing), and jupyter_server's ``shutdown_all`` then fails
    on it with "Kernel does not exist: <id>": ``ServerApp._stop`` stops before the event loop does, and the
    server runs on after SIGTERM."""
    pending = multi_kernel_manager._pending_kernels
    gone = [kid for kid, task in list(pending.items())
            if task.done() and kid not in multi_kernel_manager._kernels]
    for kid in gone:
        pending.pop(kid, None)
    return gone


def control_socket(kernel_manager: Any) -> Any:
    """The kernel manager's control channel socket, connected if it was not
    (``KernelManager._connect_control_socket`` / ``_control_socket``, jupyter_client 8.10.0)."""
    kernel_manager._connect_control_socket()
    return kernel_manager._control_socket


def register_kernel(multi_kernel_manager: Any, kernel_id: str, kernel_manager: Any) -> None:
    """Add a running kernel's manager to ``MultiKernelManager._kernels`` (jupyter_client 8.10.0),
    where ``start_kernel`` puts the kernels it started."""
    multi_kernel_manager._kernels[kernel_id] = kernel_manager


def track_connections(mapping_kernel_manager: Any, kernel_id: str, ports: list[int]) -> None:
    """Start counting websocket connections and remember the ports of a kernel, as
    ``MappingKernelManager.start_kernel`` / ``_finish_kernel_start`` do (``_kernel_connections``,
    ``_kernel_ports``, jupyter_server 2.21.1)."""
    mapping_kernel_manager._kernel_connections[kernel_id] = 0
    mapping_kernel_manager._kernel_ports[kernel_id] = ports


def kernel_died_callback(mapping_kernel_manager: Any, kernel_id: str) -> Callable[[], None]:
    """What jupyter_server registers for a kernel whose auto-restart failed
    (``MappingKernelManager._handle_kernel_died``, jupyter_server 2.21.1)."""
    return lambda: mapping_kernel_manager._handle_kernel_died(kernel_id)


# -- error messages over jupyter_server's REST API ------------------------------------------------

from jupyter_server.services.kernels.handlers import MainKernelHandler  # noqa: E402
from jupyter_server.services.sessions.handlers import SessionRootHandler  # noqa: E402
from tornado import web  # noqa: E402


class VerbatimHTTPError(web.HTTPError):
    """An HTTP error whose message reaches the API client as written: every error the pool raises.

    jupyter_server's ``APIHandler.write_error`` sends ``HTTPError.log_message``, which tornado returns
    with every ``%`` doubled (it is meant for a log format), so a profile "20GiB,50%" reached users as
    "50%%" (jupyter_server 2.10-2.21, tornado 6.2-6.5).  Tornado's own logging reads ``get_message()``."""

    def __init__(self, status_code: int, message: str, reason: str | None = None):
        self._verbatim = message
        super().__init__(status_code, None, reason=reason)

    @property
    def log_message(self) -> str:
        return self._verbatim

    @log_message.setter
    def log_message(self, value) -> None:
        """Tornado before 6.5 assigns an escaped copy in ``__init__``: ours stays as written."""

    def get_message(self) -> str:
        return self._verbatim


def refusal_of(error: BaseException | None) -> VerbatimHTTPError | None:
    """The pool's refusal that ``error`` is or wraps (jupyter_server's sessions handler wraps every kernel
    start error in ``HTTPError(500, str(e))``), or None."""
    if isinstance(error, VerbatimHTTPError):
        return error
    if isinstance(error, web.HTTPError) and isinstance(error.__cause__, VerbatimHTTPError):
        return error.__cause__
    return None


class _AnswerRefusedStarts:
    """A refused kernel start is an expected answer, not a server error: the client gets the refusal's own
    status and message (the sessions handler's wrapper would make it a 500, '%' doubled), and the server's
    log gets one warning line (:func:`log_request`), not tornado's exception line, jupyter_server's
    "wrote error" and, for a 503, its request-header dump."""

    refused: VerbatimHTTPError | None = None  # set once this request's answer is a refusal

    def starting(self) -> str:
        """What the request started, for the log line."""
        return "a kernel"

    def log_exception(self, typ, value, tb) -> None:
        if refusal_of(value) is None:
            super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs) -> None:
        exc_info = kwargs.get("exc_info")
        refusal = refusal_of(exc_info[1] if exc_info else None)
        if refusal is None:
            super().write_error(status_code, **kwargs)
            return
        self.refused = refusal
        self.set_status(refusal.status_code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": refusal.log_message, "reason": refusal.reason}))


class _Sessions(_AnswerRefusedStarts, SessionRootHandler):
    """``POST /api/sessions`` (JupyterLab's "open a notebook with this kernel") as jupyter_server's."""

    def starting(self) -> str:
        """The notebook, as jupyter_server names it to the kernel (``JPY_SESSION_NAME``): the session's
        ``name`` in its ``path``'s folder (JupyterLab 4 sends a path that ends in an id, the name of the file)."""
        try:
            model = json.loads(self.request.body or b"{}")
            path, name = model.get("path"), model.get("name")
        except (ValueError, AttributeError):
            return "a kernel"
        if isinstance(name, str) and name and isinstance(path, str):
            path = posixpath.join(posixpath.dirname(path), name)
        return f"a kernel for {path!r}" if isinstance(path, str) and path else "a kernel"


class _Kernels(_AnswerRefusedStarts, MainKernelHandler):
    """``POST /api/kernels`` (a kernel without a notebook, a restart of a tab's kernel) as jupyter_server's."""


def start_handlers() -> list[tuple[str, type]]:
    """jupyter_server's kernel-starting routes, answering a refused kernel start with its own status and
    message; an extension's handlers are matched before the server's own, so these take their paths."""
    return [(r"/api/sessions", _Sessions), (r"/api/kernels", _Kernels)]


class _QuietRefusals(logging.Filter):
    """Leaves out the records that log a pool refusal's traceback: jupyter_client's ``KernelManager``
    (``in_pending_state``) and ``MultiKernelManager`` (``_add_kernel_when_ready``) each log a failed
    start with ``log.exception`` (jupyter_client 8.6-8.10), on the server's logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and refusal_of(record.exc_info[1]) is not None)


def quiet_refusals(settings: dict, log: logging.Logger) -> None:
    """Log each refused kernel start as one warning line: the request log (tornado's ``log_function``
    setting, jupyter_server's ``log_request``, in ``settings``: an extension's settings, which the server's
    web application takes over) writes that line for a refusal, and ``log`` (the server's logger) drops
    jupyter_client's tracebacks of it."""
    upstream = settings.get("log_function")
    if not isinstance(upstream, _RefusalLog):
        settings["log_function"] = _RefusalLog(upstream)
    if not any(isinstance(f, _QuietRefusals) for f in log.filters):
        log.addFilter(_QuietRefusals())


class _RefusalLog:
    """The request log: a refused start as one warning line; every other request as jupyter_server logs it."""

    def __init__(self, upstream: Callable[[Any], None] | None):
        self.upstream = upstream

    def __call__(self, handler: Any) -> None:
        refusal = handler.refused if isinstance(handler, _AnswerRefusedStarts) else None
        if refusal is None:
            if self.upstream is not None:
                self.upstream(handler)
            return
        from jupyter_server.auth import User

        request, user = handler.request, handler.current_user
        handler.log.warning("%d %s %s (%s): the GPU pool refused to start %s: %s", refusal.status_code,
                            request.method, request.path, user.username if isinstance(user, User) else "unknown",
                            handler.starting(), refusal.log_message)
