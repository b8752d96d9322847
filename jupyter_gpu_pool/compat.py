"""Every private member of jupyter_client and jupyter_server the pool touches, in one place.

Upstream may rename an underscore name in any release; when it does, it breaks here, where
``tests/test_compat.py`` exercises each function against the installed packages, and nowhere else.
:data:`CHECKED` says which releases these were read against; a newer one is logged once at import,
so that an admin who upgrades knows where to look if something misbehaves.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

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


def forget_failed_start(multi_kernel_manager, kernel_id: str) -> None:
    """Drop a kernel whose start failed from ``MultiKernelManager._pending_kernels``.

    jupyter_client keeps such a kernel there (its ``_add_kernel_when_ready`` logs the error and never
    removes it), so jupyter_server's ``shutdown_all`` at exit fails on it with "Kernel does not
    exist".  For the pool a refused start is an everyday event, so it is forgotten as if it never
    existed.  (jupyter_client 8.6-8.10: a traitlets ``Dict``.)"""
    pending = getattr(multi_kernel_manager, "_pending_kernels", None)
    if isinstance(pending, dict):
        pending.pop(kernel_id, None)


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


class _UnwrapRefusedStarts:
    """jupyter_server's sessions handler wraps every kernel start error in ``HTTPError(500, str(e))``,
    which doubles '%' again and hides the refusal's status: answer with the refusal itself."""

    def write_error(self, status_code: int, **kwargs) -> None:
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        cause = getattr(error, "__cause__", None)
        if isinstance(error, web.HTTPError) and isinstance(cause, VerbatimHTTPError):
            self.set_status(cause.status_code)
            kwargs["exc_info"] = (type(cause), cause, exc_info[2])
        super().write_error(self.get_status(), **kwargs)


class _Sessions(_UnwrapRefusedStarts, SessionRootHandler):
    """``POST /api/sessions`` (JupyterLab's "open a notebook with this kernel") as jupyter_server's."""


def start_handlers() -> list[tuple[str, type]]:
    """jupyter_server's session-starting route, answering a refused kernel start with its own status and
    message; an extension's handlers are matched before the server's own, so this takes its path.
    (``POST /api/kernels`` needs no help: it lets the refusal through as raised.)"""
    return [(r"/api/sessions", _Sessions)]
