"""Private members of jupyter_client and jupyter_server, touched here and nowhere else.

Each function reaches one underscore member, and names the upstream version it was checked
against: an upstream release that renames one breaks this module, visibly, and nothing else.
"""

from __future__ import annotations

from typing import Any, Callable


def forget_pending_start(kernel_manager: Any, kernel_id: str) -> None:
    """Drop a kernel whose start failed from its ``MultiKernelManager._pending_kernels``, if it has one.

    jupyter_client 8.10.0 keeps it there (``_add_kernel_when_ready`` logs the error and never
    removes it), so jupyter_server's ``shutdown_all`` at exit fails on it."""
    from jupyter_client.multikernelmanager import MultiKernelManager

    multi = kernel_manager.parent if kernel_manager is not None else None
    if isinstance(multi, MultiKernelManager):
        multi._pending_kernels.pop(kernel_id, None)


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
