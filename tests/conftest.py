"""Shared test setup: pytest-jupyter's fixtures, marker skips, and an isolated GPU pool.

Every test runs with Jupyter's config, data and runtime directories in a tmp
dir (pytest-jupyter's ``jp_environ``), so nothing reads or writes the
developer's own Jupyter setup or ledger.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import asyncio

import pytest
import pytest_asyncio
from jupyter_client.manager import AsyncKernelManager
from kernel_helpers import slice_at_start

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    """pytest-jupyter's server fixtures on pytest-asyncio's loop, the one async tests run in
    (asyncio_mode=auto): one loop per test, shared by the server and the test's requests."""
    yield asyncio.get_running_loop()

# The tests' own Jupyter directories come first: in a virtual environment jupyter_core puts the
# environment's etc/jupyter before JUPYTER_CONFIG_DIR unless told otherwise (servers and kernels the
# tests start inherit this).
os.environ["JUPYTER_PREFER_ENV_PATH"] = "0"


def pytest_sessionstart(session):
    """A pool config in this environment's or this machine's config directories would be read by every
    test underneath the test's own (a key the test leaves out, such as the policy, comes from it): say so
    and stop, rather than fail in a hundred puzzling ways."""
    from jupyter_core.paths import ENV_CONFIG_PATH, SYSTEM_CONFIG_PATH

    from jupyter_gpu_pool.config import config_files

    found = config_files(list(ENV_CONFIG_PATH) + list(SYSTEM_CONFIG_PATH))
    if found:
        pytest.exit("the tests would read the GPU pool config in " + ", ".join(map(str, found)) + ": move it "
                    "away while the tests run (./scripts/lab keeps its own in .lab/, never in the environment)",
                    returncode=2)


# A pool of declared GPUs, the same shape as a small real box: tests know what fits where.
TEST_INVENTORY = [{"name": "Test GPU", "memory": "40GiB", "sm_count": 108, "count": 2}]
TEST_PROFILES = {
    "small": {"slice": "10GiB", "isolation": "soft"},
    "half": {"slice": "20GiB,50%", "isolation": "mps"},
    "whole": {"slice": "whole"},
}


def _gpu_present() -> tuple[bool, str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False, "no GPU here: nvidia-smi is not installed (gpu tests run on the GPU test machine)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"no GPU here: nvidia-smi failed ({e})"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return False, f"no GPU here: nvidia-smi -L found none ({(out.stderr or out.stdout).strip()[:200]})"
    return True, ""


def pytest_collection_modifyitems(config, items):
    gpu_ok, gpu_why = _gpu_present() if any("gpu" in i.keywords for i in items) else (True, "")
    for item in items:
        if "gpu" in item.keywords and not gpu_ok:
            item.add_marker(pytest.mark.skip(reason=gpu_why))
        if "k8s" in item.keywords and not os.environ.get("KUBECONFIG"):
            item.add_marker(pytest.mark.skip(reason="no real cluster: KUBECONFIG is not set"))
        if "browser" in item.keywords and not Path("/usr/bin/chromium").exists():
            item.add_marker(pytest.mark.skip(reason="no /usr/bin/chromium (apt-get install chromium)"))
        # Under pytest-xdist (scripts/test runs with --dist loadgroup): a file's tests run in one worker, so
        # its module fixtures (a lab server, a built environment) are made once; the service tests share
        # the real Unix users their session creates, so they all run in one worker (and the GPU tests share a GPU).
        item.add_marker(pytest.mark.xdist_group(_group_of(item)))


def _group_of(item) -> str:
    if "gpu" in item.keywords:
        return "gpu"  # one at a time: some fill the GPU's memory on purpose
    path = Path(str(item.fspath))
    return "unix-users" if "service" in path.parts else str(path)


class PoolHome:
    """An isolated pool: its config file in the test's Jupyter config dir, its ledger in tmp."""

    def __init__(self, config_dir: Path, tmp: Path):
        self.config_dir = config_dir
        self.config_file = config_dir / "jupyter_gpu_pool_config.py"
        self.ledger_path = tmp / "gpu_pool" / "ledger.sqlite"
        self.settings: dict = {}

    def configure(self, **settings) -> PoolHome:
        """Write the pool's config file: test defaults, overridden by ``settings``."""
        from jupyter_gpu_pool.pools import forget_pools

        merged = {
            "inventory": TEST_INVENTORY,
            "gpu_discovery": "declared",
            "profiles": TEST_PROFILES,
            "ledger_path": str(self.ledger_path),
            "holder_grace": 2.0,
            **settings,
        }
        merged["policy"] = slice_at_start(merged.get("policy", []))
        self.settings = merged
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("".join(f"c.GPUPool.{k} = {v!r}\n" for k, v in merged.items()))
        forget_pools()
        return self

    def install_kernelspecs(self) -> list[str]:
        from jupyter_gpu_pool.config import load_settings
        from jupyter_gpu_pool.kernel_provisioner import kernelspecs

        installed = kernelspecs.install(list(load_settings().profiles.values()), user=True)
        return [name for name, _ in installed]

    def pool(self):
        from jupyter_gpu_pool.pools import pool_for

        return pool_for()

    def ledger(self):
        from jupyter_gpu_pool.local import Ledger

        return Ledger(self.ledger_path)


@pytest.fixture
def pool_home(jp_environ, jp_config_dir, tmp_path) -> PoolHome:
    """A configured, isolated pool of two declared 40 GiB GPUs with kernelspecs installed."""
    home = PoolHome(Path(jp_config_dir), Path(tmp_path)).configure()
    home.install_kernelspecs()
    yield home
    from jupyter_gpu_pool.pools import forget_pools

    forget_pools(close=True)


@pytest.fixture
async def managers():
    """Kernel managers a test starts; shut down whatever is left at the end."""
    started: list[AsyncKernelManager] = []

    def make(kernel_name: str, **kwargs) -> AsyncKernelManager:
        km = AsyncKernelManager(kernel_name=kernel_name, **kwargs)
        started.append(km)
        return km

    yield make
    for km in started:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
