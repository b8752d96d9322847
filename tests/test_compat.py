"""Each private jupyter_client / jupyter_server member the pool touches (jupyter_gpu_pool/compat.py),
exercised against the installed packages: an upstream release that renames one fails here."""

from __future__ import annotations

import pytest
from jupyter_client.multikernelmanager import AsyncMultiKernelManager

from jupyter_gpu_pool import compat


def test_the_installed_releases_are_the_ones_compat_was_checked_against():
    assert compat.unchecked_versions() == [], (
        "a newer jupyter_client/jupyter_server is installed: check each member in compat.py against it, "
        "then widen compat.CHECKED")


async def test_a_failed_start_is_forgotten_by_the_multi_kernel_manager(pool_home, tmp_path):
    """A start the pool refuses stays in jupyter_client's pending kernels unless compat forgets it;
    then exit (shutdown_all) goes through.  The provisioner tests cover the refusal itself."""
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path))
    assert isinstance(manager._pending_kernels, dict)  # noqa: SLF001 - the member compat relies on
    pool_home.install_kernelspecs()
    pool_home.configure(default_user_quota={"kernels": 0})  # every start is refused
    with pytest.raises(Exception, match="quota"):
        await manager.start_kernel(kernel_name="gpu-pool-small")
    assert manager._pending_kernels == {}  # noqa: SLF001 - the provisioner forgot it through compat
    await manager.shutdown_all(now=True)


async def test_a_start_that_failed_outside_the_pools_steps_is_forgotten_before_shutdown(tmp_path):
    """A kernelspec whose program is missing: jupyter_client keeps the failed start pending; compat drops it
    (and only it), and shutdown_all goes through."""
    import json

    from jupyter_client.kernelspec import KernelSpecManager

    folder = tmp_path / "kernels" / "missing"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({"argv": ["/nonexistent/python", "{connection_file}"],
                                                    "display_name": "missing", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path), kernel_spec_manager=specs)
    with pytest.raises(FileNotFoundError):
        await manager.start_kernel(kernel_name="missing")
    [left] = manager._pending_kernels  # noqa: SLF001 - what jupyter_client leaves behind
    assert compat.forget_failed_starts(manager) == [left]
    assert manager._pending_kernels == {}  # noqa: SLF001
    await manager.shutdown_all(now=True)


def test_the_sessions_route_is_jupyter_servers_own():
    routes = dict(compat.start_handlers())
    from jupyter_server.services.sessions.handlers import SessionRootHandler, default_handlers

    assert issubclass(routes["/api/sessions"], SessionRootHandler)
    assert ("/api/sessions", SessionRootHandler) in default_handlers  # upstream still serves the path we take over


def test_tornado_still_doubles_percent_in_log_message():
    """Why VerbatimHTTPError exists: if tornado stops doubling '%', the workaround can go."""
    from tornado import web

    assert web.HTTPError(403, "50% SM").log_message == "50%% SM"
    assert web.HTTPError(403, "50% SM").get_message() == "50% SM"


def test_a_verbatim_error_keeps_its_message_where_jupyter_server_and_tornado_read_it():
    e = compat.VerbatimHTTPError(403, "GPU quota exceeded: 50% SM of 100%", reason="quota_exceeded")
    assert e.log_message == e.get_message() == "GPU quota exceeded: 50% SM of 100%"
    assert "50% SM" in str(e) and e.status_code == 403 and e.reason == "quota_exceeded"


async def test_a_running_kernel_can_be_registered_tracked_and_reached_on_its_control_channel(tmp_path):
    """What re-adoption (server_extension/backends/adoption.py) does with a kernel another server started: its
    manager joins jupyter_server's map, its connections are counted, its control channel answers, and a
    kernel that dies is taken out of the map as jupyter_server does for its own."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    mapping = AsyncMappingKernelManager(root_dir=str(tmp_path))
    try:
        compat.register_kernel(mapping, "adopted", km)
        compat.track_connections(mapping, "adopted", km.ports)
        assert "adopted" in mapping and mapping.get_kernel("adopted") is km
        assert mapping._kernel_connections["adopted"] == 0 and mapping.ports_changed("adopted") is False
        socket = compat.control_socket(km)
        km.session.send(socket, km.session.msg("kernel_info_request"))
        assert await socket.poll(30_000)  # the kernel answered on its control channel
        compat.kernel_died_callback(mapping, "adopted")()
        assert "adopted" not in mapping
    finally:
        await km.shutdown_kernel(now=True)
