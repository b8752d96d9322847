"""A real jupyter_server (pytest-jupyter) with the GPU pool extension on a declared pool.

Tests pick their policy with ``@pytest.mark.policy(rules=[...], dry_run=False)`` and extension
settings with ``@pytest.mark.extension(...)``.  Requests carry a token; ``TokenUsers`` maps tokens to
users: the default token is alice (the pool owner of this server), ``bob-token`` is another user,
``root-token`` an admin.
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from jupyter_server.auth.identity import IdentityProvider, User
from server_helpers import ScriptedReadings

OWNER = "alice"
TOKENS = {"bob-token": "bob", "root-token": "root"}


class TokenUsers(IdentityProvider):
    """Maps tokens to users: the server's own token is alice, the others come from TOKENS."""

    def get_user(self, handler):
        auth = handler.request.headers.get("Authorization", "")
        token = auth[len("token "):].strip() if auth.lower().startswith("token ") else handler.get_argument("token", "")
        name = OWNER if token and token == self.token else TOKENS.get(token)
        if not name:
            return None
        handler._token_authenticated = True  # token requests need no XSRF cookie, as in jupyter_server
        return User(username=name)


def pytest_configure(config):
    config.addinivalue_line("markers", "policy(rules, dry_run): the GPUPool.policy of the test's server")
    config.addinivalue_line("markers", "extension(**traits): GPUPoolExtension settings of the test's server")
    config.addinivalue_line("markers", "pool_settings(**settings): more c.GPUPool settings of the test's server")
    config.addinivalue_line("markers", "server(**config): extra server config, {'Section': {'trait': value}}")


@pytest.fixture
def policy_rules(request) -> tuple[list, bool]:
    marker = request.node.get_closest_marker("policy")
    if marker is None:
        return [{"idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None}], False
    return marker.kwargs.get("rules", []), marker.kwargs.get("dry_run", False)


@pytest.fixture
def jp_server_config(pool_home, policy_rules, request):
    rules, dry_run = policy_rules
    settings = {"owner": OWNER, "policy": rules, "policy_dry_run": dry_run, "unix_groups": False,
                "group_members": {"students": [OWNER, "bob"]}}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    pool_home.configure(**settings)
    ScriptedReadings.reset()
    ext = {"cull_interval": 0.3, "telemetry_interval": 0.2, "admin_users": ["root"],
           "telemetry_source_class": ScriptedReadings}
    marker = request.node.get_closest_marker("extension")
    if marker is not None:
        ext.update(marker.kwargs)
    config = {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True}, "identity_provider_class": TokenUsers},
        "GPUPoolExtension": ext,
    }
    extra = request.node.get_closest_marker("server")
    if extra is not None:
        for section, values in extra.kwargs.items():
            config.setdefault(section, {}).update(values)
    from traitlets.config import Config

    return Config(config)


@pytest_asyncio.fixture
async def ext(jp_serverapp):
    """The GPUPoolExtension, started as ``jupyter server`` starts it once its loop runs (pytest-jupyter
    does not run extensions' start hooks): the sampler and the culler loop are live."""
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    yield app
    # Stop the loops before pool_home closes the ledger: a culling pass's read in a thread on a closed
    # SQLite connection crashes the interpreter (the server's own cleanup comes after that teardown).
    await app.stop_extension()
