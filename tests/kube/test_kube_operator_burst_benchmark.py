"""benchmarks/operator_burst.py keeps running: its smoke path (10 kernels on 2 hollow nodes, the same pods
directly, 3 new quotas) reports every figure of the burst, at rest, and the ratio to the direct pods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_operator_burst_benchmark_reports_the_burst_the_rest_the_floor_and_the_quotas():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "operator_burst.py"), "--smoke"],
                          capture_output=True, text=True, timeout=280, cwd=str(REPO),
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    [run] = out["runs"]
    assert (run["kernels"], run["nodes"], run["running_at_end"], run["admitted_at_end"]) == (10, 2, 10, 10)
    assert run["all_running_s"] > 0 and run["create_to_running_s"]["count"] == 10
    assert run["create_to_admitted_s"]["p95"] <= run["create_to_running_s"]["p99"]
    requests = run["operator_requests"]
    for made in ("create pods", "create secrets", "create networkpolicies"):
        assert requests["by_verb_and_resource"][made] == 10  # one each per kernel
    assert requests["total"] == sum(requests["by_verb_and_resource"].values())
    assert requests["status_patches_per_kernel"] > 0
    assert run["operator_cpu_ms_per_started_kernel"] == pytest.approx(100 * run["operator_cpu_s_burst"], abs=0.1)
    assert run["at_rest"]["running"] == 10 and run["at_rest"]["seconds"] >= 3
    assert run["operator_rss_mib"]["peak"] >= run["operator_rss_mib"]["before"] > 0
    for phase in ("burst", "at_rest"):
        for who in ("operator", "idle"):
            assert run["event_loop_stalls"][phase][who]["samples"] > 0
    direct = run["direct"]
    assert direct["running_at_end"] == 10 and direct["all_running_s"] > 0
    assert run["ratio_all_running"] == pytest.approx(run["all_running_s"] / direct["all_running_s"], abs=0.01)
    [quotas] = out["quota_status_writes"]
    assert quotas["new_quotas"] == 3
    assert quotas["status_patches_at_start"] >= 3 and quotas["status_patches_for_new_at_once"] >= 3
    assert out["machine"]["cpus"] == os.cpu_count()
    assert "create→Running p50/p95/p99 s" in done.stdout  # the table
