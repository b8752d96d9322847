"""The planner's tests: a real jupyter_server with the GPU pool extension on a declared pool (for the
recording and the agreement of a replay with the live pool), and the pure planner.

Tests pick their policy with ``@pytest.mark.policy(rules=[...])``, extension settings with
``@pytest.mark.extension(...)`` and more pool settings with ``@pytest.mark.pool_settings(...)``.
The server is a personal one (jupyter_server's own token): its user, alice, owns it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_asyncio
from traitlets.config import Config

# server_helpers (kernels over REST and websockets, scripted GPU readings), shared with the server tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

OWNER = "alice"


def pytest_configure(config):
    config.addinivalue_line("markers", "policy(rules): the GPUPool.policy of the test's server")
    config.addinivalue_line("markers", "extension(**traits): GPUPoolExtension settings of the test's server")
    config.addinivalue_line("markers", "pool_settings(**settings): more c.GPUPool settings of the test's server")


@pytest.fixture
def jp_server_config(pool_home, request):
    policy = request.node.get_closest_marker("policy")
    settings = {"owner": OWNER, "unix_groups": False, "group_members": {"students": [OWNER]},
                "policy": policy.kwargs["rules"] if policy else []}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    pool_home.configure(**settings)
    from server_helpers import ScriptedReadings

    ScriptedReadings.reset()
    ext = {"cull_interval": 1.0, "telemetry_interval": 0.5, "telemetry_source_class": ScriptedReadings}
    marker = request.node.get_closest_marker("extension")
    if marker is not None:
        ext.update(marker.kwargs)
    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}}, "GPUPoolExtension": ext})


@pytest_asyncio.fixture
async def ext(jp_serverapp):
    """The GPUPoolExtension with its loops running, as ``jupyter server`` starts it."""
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    yield app
    # Its loops stop before pool_home closes the ledger: a pass reading a closed SQLite connection in a
    # thread crashes the interpreter (the server's own cleanup comes after that teardown).
    await app.stop_extension()
