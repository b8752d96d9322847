"""Shared test setup: pytest-jupyter's fixtures, marker skips, and an isolated GPU pool.

Every test runs with Jupyter's config, data and runtime directories in a tmp
dir (pytest-jupyter's ``jp_environ``), so nothing reads or writes the
developer's own Jupyter setup or ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import pytest_asyncio
from jupyter_client.manager import AsyncKernelManager
from kernel_helpers import slice_at_start
from server_teardown import kernel_sockets_closed_at_once  # noqa: F401  (autouse: every test server's teardown)

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
        out = subprocess.run([smi, "-L"], check=False, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"no GPU here: nvidia-smi failed ({e})"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return False, f"no GPU here: nvidia-smi -L found none ({(out.stderr or out.stdout).strip()[:200]})"
    return True, ""


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="leave out the slow runs (marked slow; the browser and Binder tests are): ./scripts/test --fast")
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test file's measured seconds into tests/{DURATIONS.name} (after a full run), which orders "
                     "the next runs")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long run (over 10 s on the 2-CPU machine: a soak, a real-time window, a build, "
                            "a real browser): left out by --fast")
    # Groups go to the workers in the order pytest_collection_modifyitems puts them (the longest first),
    # not sorted by their number of tests as pytest-xdist would.
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


# Under pytest-xdist's loadgroup, xdist names each test's group from the xdist_group marker in its own
# pytest_collection_modifyitems: this one must run first, or no test has a group and a file's tests (and their
# module fixtures: a lab server, a built environment) are spread over every worker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    gpu_ok, gpu_why = _gpu_present() if any("gpu" in i.keywords for i in items) else (True, "")
    for item in items:
        if "gpu" in item.keywords and not gpu_ok:
            item.add_marker(pytest.mark.skip(reason=gpu_why))
        if "k8s" in item.keywords and not os.environ.get("KUBECONFIG"):
            item.add_marker(pytest.mark.skip(reason="no real cluster: KUBECONFIG is not set"))
        if "browser" in item.keywords and not Path("/usr/bin/chromium").exists():
            item.add_marker(pytest.mark.skip(reason="no /usr/bin/chromium (apt-get install chromium)"))
        if "browser" in item.keywords or "binder" in item.keywords:
            item.add_marker(pytest.mark.slow)
    if config.getoption("fast"):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "slow" not in item.keywords]
    # A file's tests run in one worker, so its module fixtures are made once (the GPU tests share a GPU, and
    # the service tests that spawn users' servers into the system's homes share those: _group_of).
    groups: dict[str, list] = {}
    for item in items:
        group = _group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    # The longest groups first (DURATIONS), so that none starts last and keeps one worker busy after the others.
    measured = _measured()
    items[:] = [item for group in sorted(groups.values(), key=lambda g: _estimated_seconds(g, measured), reverse=True)
                for item in group]


def pytest_xdist_node_collection_finished(node, ids):
    """Tests that come from a worker without their group stop the run (pytest-xdist appends ``@group`` to each
    test's id; pytest 9.2 ignores how it does so: pytest-dev/pytest-xdist#1386), rather than let every file's
    tests be spread over the workers, each building the same servers and environments again."""
    ungrouped = [nodeid for nodeid in ids if nodeid.rfind("@") <= nodeid.rfind("]")]
    if node.config.getvalue("dist") == "loadgroup" and ungrouped:
        pytest.exit(f"pytest-xdist put no group on {len(ungrouped)} tests (e.g. {ungrouped[0]}): this pytest "
                    "and pytest-xdist do not work together (see the pytest pin in pyproject.toml)", returncode=3)


# Service tests whose users' servers are spawned through a real JupyterHub into the homes the system names
# (/tmp/gpupool-home-<name>, one per user for every process): one worker for them all (and the system_homes
# fixture keeps other pytest sessions out meanwhile).  Every other service test works in a lab of its own
# (its own homes, socket and ledger under /tmp/gpupool-lab-*), and the real Unix users they share are
# held by each process that runs them (tests/service/users_registry.py).
SYSTEM_HOMES = {"test_service_hub.py"}


def _group_of(item) -> str:
    if "gpu" in item.keywords:
        return "gpu"  # one at a time: some fill the GPU's memory on purpose
    path = Path(str(item.fspath))
    return "system-homes" if "service" in path.parts and path.name in SYSTEM_HOMES else str(path)


# Each test file's seconds (its tests' setups, calls and teardowns) in a full run on the 2-CPU machine under
# ./scripts/test, written by --store-durations: the groups start longest first, so that a long one does not start
# last and keep one worker busy after the others are done.
DURATIONS = Path(__file__).with_name("durations.json")


def _measured() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def _estimated_seconds(group: list, measured: dict[str, float]) -> float:
    """A group's cost, for ordering only: its files' measured seconds, or for a file not measured yet a rough
    guess (what its tests start costs more than what they run: a lab server and Chromium per browser test, a
    test API server and an operator per Kubernetes test, a user's Jupyter server per service test)."""
    if "binder" in group[0].keywords:
        return 1e6  # builds a whole environment before its first test: always first
    guessed: dict[str, float] = {}
    for item in group:
        per_test = 30 if "browser" in item.keywords else 8 if ("kube" in item.keywords or "service" in item.keywords) else 1
        guessed[_file_of(item.nodeid)] = guessed.get(_file_of(item.nodeid), 0.0) + per_test
    return sum(measured.get(path, guess) for path, guess in guessed.items())


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        path = _file_of(report.nodeid)
        _durations[path] = _durations.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    if session.config.getoption("store_durations") and not hasattr(session.config, "workerinput") and _durations:
        stored = {**_measured(), **{k: round(v, 1) for k, v in _durations.items()}}
        DURATIONS.write_text(json.dumps(dict(sorted(stored.items())), indent=0) + "\n")


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
