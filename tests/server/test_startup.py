"""Start-up: a bad setting stops a real ``jupyter server`` with a message naming the setting (and, for
the policy, the rule and field)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from server_helpers import body

BAD_POLICY = 'c.GPUPool.policy = [{"name": "ok", "idle_timeout": "1h"}, {"name": "students", "max_age": "3 weeks"}]\n'


def start_server(tmp_path, settings: str) -> subprocess.CompletedProcess:
    """A real ``jupyter server`` with the pool's config file ending in ``settings``, run to its exit."""
    config, data, runtime = (tmp_path / d for d in ("config", "data", "runtime"))
    for d in (config, data, runtime):
        d.mkdir(exist_ok=True)
    (config / "jupyter_gpu_pool_config.py").write_text(
        'c.GPUPool.gpu_discovery = "declared"\n'
        'c.GPUPool.inventory = [{"name": "Test GPU", "memory": "40GiB"}]\n'
        f'c.GPUPool.ledger_path = {str(tmp_path / "ledger.sqlite")!r}\n' + settings)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(data),
           "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_PLATFORM_DIRS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--port=0",
         f"--ServerApp.root_dir={tmp_path}",
         "--ServerApp.jpserver_extensions={'jupyter_gpu_pool': True}"],
        env=env, capture_output=True, text=True, timeout=120)


def test_bad_policy_stops_the_server_at_start(tmp_path):
    proc = start_server(tmp_path, BAD_POLICY)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "GPUPool.policy[1] ('students').max_age: '3 weeks' is not a duration" in proc.stderr
    assert "is running at" not in proc.stderr + proc.stdout


# Settings that were accepted once and must be refused at start, each naming the setting.
BAD_SETTINGS = [
    ('c.GPUPool.policy = [{"name": "nan", "idle_timeout": float("nan")}]',
     "GPUPool.policy[0] ('nan').idle_timeout: nan is not a duration"),
    ('c.GPUPool.policy = [{"name": "neg", "idle_timeout": -5}]', "GPUPool.policy[0] ('neg').idle_timeout"),
    ('c.GPUPool.policy = [{"name": "w", "warn": float("nan")}]', "GPUPool.policy[0] ('w').warn: nan is not a"),
    ('c.GPUPool.policy = [{"name": "w", "warn": -1}]', "GPUPool.policy[0] ('w').warn: -1 must be more than zero"),
    ('c.GPUPool.policy = [{"name": "late", "idle_timeout": "10m", "warn": "20m"}]',
     "GPUPool.policy[0] ('late').warn (20m) is longer than its idle_timeout (10m)"),
    ('c.GPUPool.holder_grace = float("nan")', "GPUPool.holder_grace must be a number of seconds, 0 or more"),
    ("c.GPUPool.holder_grace = -1", "GPUPool.holder_grace must be a number of seconds, 0 or more"),
    ('c.GPUPool.start_queue_timeout = float("nan")', "GPUPool.start_queue_timeout must be a number of seconds"),
    ("c.GPUPool.start_queue_timeout = -30", "GPUPool.start_queue_timeout must be a number of seconds"),
    ('c.GPUPool.default_user_quota = {"sm_percent": 250, "kernels": 2}',
     "GPUPool.default_user_quota.sm_percent: 250% can never be reached by 2 kernel(s)"),
    ('c.GPUPool.ledger_path = ""', "GPUPool.ledger_path: the ledger path is empty"),
    ('c.GPUPool.ledger_path = ":memory:"', "GPUPool.ledger_path: ':memory:' is an in-memory database"),
    ("c.GPUPoolExtension.cull_interval = 0", "GPUPoolExtension.cull_interval must be a number of seconds above 0"),
    ("c.GPUPoolExtension.cull_interval = -5", "GPUPoolExtension.cull_interval must be a number of seconds above 0"),
    ("c.GPUPoolExtension.telemetry_interval = 0", "GPUPoolExtension.telemetry_interval must be a number of seconds"),
    ("c.GPUPoolExtension.telemetry_interval = -1", "GPUPoolExtension.telemetry_interval must be a number of"),
    ("c.GPUPoolExtension.telemetry_history = -1", "GPUPoolExtension.telemetry_history must be a whole number"),
    ("c.GPUPoolExtension.cull_concurrency = 0", "GPUPoolExtension.cull_concurrency must be a whole number of at least"),
    ('c.GPUPoolExtension.admin_users = "alice,bob"', "GPUPoolExtension.admin_users must be a list of names"),
]


@pytest.mark.parametrize("setting, words", BAD_SETTINGS, ids=[s.split(" = ")[0] + " = " + s.split(" = ")[1][:20]
                                                              for s, _ in BAD_SETTINGS])
@pytest.mark.slow
def test_a_bad_setting_stops_the_server_at_start_naming_it(tmp_path, setting, words):
    proc = start_server(tmp_path, setting + "\n")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert words in proc.stderr, proc.stderr[-3000:]
    assert "is running at" not in proc.stderr + proc.stdout


@pytest.mark.pool_settings(policy=[{"idle_timeout": "1h"}, {"name": "students", "max_age": "3 weeks"}])
@pytest.mark.extension(exit_on_config_error=False)
async def test_an_admin_may_choose_to_run_on_without_a_pool(jp_fetch):
    me = body(await jp_fetch("gpu-pool", "api", "v1", "me"))
    assert me["pool"]["enabled"] is False and me["kernels"] == []
    assert "GPUPool.policy[1] ('students').max_age" in me["pool"]["note"]
