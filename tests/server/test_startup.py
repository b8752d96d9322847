"""Start-up: a bad policy stops a real ``jupyter server`` with a message naming the rule and field."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from server_helpers import body

BAD_POLICY = 'c.GPUPool.policy = [{"name": "ok", "idle_timeout": "1h"}, {"name": "students", "max_age": "3 weeks"}]\n'


def test_bad_policy_stops_the_server_at_start(tmp_path):
    config, data, runtime = (tmp_path / d for d in ("config", "data", "runtime"))
    for d in (config, data, runtime):
        d.mkdir()
    (config / "jupyter_gpu_pool_config.py").write_text(
        'c.GPUPool.gpu_discovery = "declared"\n'
        'c.GPUPool.inventory = [{"name": "Test GPU", "memory": "40GiB"}]\n'
        f'c.GPUPool.ledger_path = {str(tmp_path / "ledger.sqlite")!r}\n' + BAD_POLICY)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(data),
           "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_PLATFORM_DIRS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--port=0",
         f"--ServerApp.root_dir={tmp_path}",
         "--ServerApp.jpserver_extensions={'jupyter_gpu_pool': True}"],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "GPUPool.policy[1] ('students').max_age: '3 weeks' is not a duration" in proc.stderr
    assert "is running at" not in proc.stderr + proc.stdout


@pytest.mark.pool_settings(policy=[{"idle_timeout": "1h"}, {"name": "students", "max_age": "3 weeks"}])
@pytest.mark.extension(exit_on_config_error=False)
async def test_an_admin_may_choose_to_run_on_without_a_pool(jp_fetch):
    me = body(await jp_fetch("gpu-pool", "api", "v1", "me"))
    assert me["pool"]["enabled"] is False and me["kernels"] == []
    assert "GPUPool.policy[1] ('students').max_age" in me["pool"]["note"]
