"""The Binder demo's test: builds binder/'s environment in a fresh venv (minutes; deselect with -m "not binder")."""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "binder: builds the Binder demo's environment from binder/ in a fresh venv (slow: minutes)")


@pytest.fixture
def jp_asyncio_loop():
    """No pytest-jupyter event loop: this test drives subprocesses only."""
    yield None


@pytest.fixture
def jp_server_cleanup():
    """No in-process jupyter_server here."""
    yield
