"""The provisioner's tests: those over jupyter_server's REST API run a test server (pytest-jupyter's)."""

from server_teardown import kernel_sockets_closed_at_once  # noqa: F401  (autouse)
