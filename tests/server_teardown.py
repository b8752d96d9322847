"""A fixture for the tests that run a jupyter_server (pytest-jupyter's): tests/conftest.py imports it for all.
A module of its own, apart from kernel_helpers (which the benchmarks import, without pytest)."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def kernel_sockets_closed_at_once():
    """A test server's sockets to a kernel that is gone closed without jupyter_client's 1 s linger: its
    activity socket (IOPub: a subscription is all it sends), the channels of a closed websocket kept to buffer
    the kernel's output for a reconnect (as the kernel shuts down), and a websocket's channels once its kernel
    is gone (as the websocket closes).  Closed with the linger, such a socket keeps its pipe to the dead
    kernel for that second, and pytest-jupyter's teardown (``jp_server_cleanup``, terminating the server's
    ZMQ context) waited it out after nearly every test that started a kernel.  Nothing is lost: there is no
    one left to send to.  For the session: that teardown comes after a test's own fixtures are gone."""
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection as Connection
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager as Kernels

    watch, buffer, disconnect = Kernels.stop_watching_activity, Kernels.stop_buffering, Connection.disconnect

    def at_once(streams):
        for stream in streams:
            if stream is not None and not stream.closed():
                stream.socket.linger = 0

    def stop_watching_activity(self, kernel_id):
        at_once([getattr(self._kernels.get(kernel_id), "_activity_stream", None)])
        watch(self, kernel_id)

    def stop_buffering(self, kernel_id):
        at_once(self._kernel_buffers.get(kernel_id, {}).get("channels", {}).values())
        buffer(self, kernel_id)

    def disconnected(self):
        if self.kernel_id not in self.multi_kernel_manager:
            at_once(self.channels.values())
        disconnect(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Kernels, "stop_watching_activity", stop_watching_activity)
        patch.setattr(Kernels, "stop_buffering", stop_buffering)
        patch.setattr(Connection, "disconnect", disconnected)
        yield
