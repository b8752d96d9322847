"""Fixtures for the hibernation tests: the stand-in machine (see hibernation_standin.py) under a
real pool, real ipykernel processes started through the gpu-pool provisioner, a real ledger."""

from __future__ import annotations

import pytest
from hibernation_standin import StandInDriver, StandInMemory, standin_discovery
from jupyter_client.multikernelmanager import AsyncMultiKernelManager

GiB = 2**30

STANDIN_PROFILES = {
    "small": {"slice": "10GiB", "isolation": "soft"},
    "big": {"slice": "80GiB", "isolation": "soft"},  # fills one stand-in GPU
    "half": {"slice": "20GiB,50%", "isolation": "mps"},
    "whole": {"slice": "whole"},
}


@pytest.fixture
def standin() -> StandInDriver:
    return StandInDriver()


@pytest.fixture
def standin_memory(standin) -> StandInMemory:
    return StandInMemory(standin)


@pytest.fixture
def standin_machine(pool_home, monkeypatch, standin, standin_memory):
    """The pool of this test on the stand-in machine: two 'detected' stand-in H100s (driver 580).
    Only jupyter_gpu_pool.devices is replaced: NVML discovery, NVML's memory readings and the
    checkpoint driver."""
    monkeypatch.setattr("jupyter_gpu_pool.local.pool.discover", standin_discovery)
    monkeypatch.setattr("jupyter_gpu_pool.devices.checkpoint._driver", standin)
    monkeypatch.setattr("jupyter_gpu_pool.devices.nvml._memory", standin_memory)
    pool_home.configure(gpu_discovery="nvml", inventory=[], profiles=STANDIN_PROFILES)
    pool_home.install_kernelspecs()
    return pool_home


@pytest.fixture
async def kernels_manager(standin_machine, tmp_path):
    """A multi-kernel manager of real ipykernels, shut down at the end."""
    manager = AsyncMultiKernelManager(connection_dir=str(tmp_path))
    yield manager
    await manager.shutdown_all(now=True)


@pytest.fixture
def jp_server_config(standin_machine, request):
    """A real jupyter_server with the GPU pool extension and the hibernation hook, on the stand-in
    machine.  The policy hibernates on request (release) and never on its own."""
    settings = {"policy": [{"name": "hibernate-on-release", "idle_timeout": None, "gpu_idle_timeout": None,
                            "max_hibernated": None, "action": "hibernate"}], "unix_groups": False}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    standin_machine.configure(gpu_discovery="nvml", inventory=[], profiles=STANDIN_PROFILES, **settings)
    from server_hibernation_helpers import extension_config

    return extension_config()


def pytest_configure(config):
    config.addinivalue_line("markers", "pool_settings(**settings): more c.GPUPool settings of the test's server")
    config.addinivalue_line("markers", "extension(**traits): GPUPoolExtension settings of the test's server")


@pytest.fixture
async def ext(jp_serverapp):
    """The extension, started as ``jupyter server`` starts it (pytest-jupyter runs no start hooks):
    the culler, the sampler and the hibernation upkeep run."""
    app = jp_serverapp.extension_manager.extension_points["jupyter_gpu_pool"].app
    await app._start_jupyter_server_extension(jp_serverapp)
    yield app
    await app.stop_extension()


@pytest.fixture
async def events(jp_ws_fetch):
    """The server's events as JupyterLab subscribes to them."""
    from server_hibernation_helpers import Events

    ws = await jp_ws_fetch("api", "events", "subscribe")
    yield Events(ws)
    ws.close()


@pytest.fixture
def channels(jp_ws_fetch):
    """Opens kernel websockets (``await channels(kid, v1=False)``), closed at the end."""
    from server_hibernation_helpers import V1, Channels

    opened = []

    async def open_(kid: str, v1: bool = False) -> Channels:
        ws = await jp_ws_fetch("api", "kernels", kid, "channels", subprotocols=[V1] if v1 else None)
        opened.append(ws)
        return Channels(ws, v1)

    yield open_
    for ws in opened:
        ws.close()


@pytest.fixture
def rig(kernels_manager, standin, standin_memory):
    def make(**settings):
        from rig_helpers import Rig

        return Rig(kernels_manager, standin, standin_memory, **settings)

    return make
