"""benchmarks/cluster_hibernation.py keeps running: its smoke path (one round of each path, about 15 s)
moves the kernel's memory through the cluster (the real operator and node agent) and on one machine, and
reports the ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_cluster_hibernation_benchmark_runs_both_paths_and_reports_the_ratio():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cluster_hibernation.py"), "--smoke", "--json"],
                          capture_output=True, text=True, timeout=180, cwd=str(REPO),
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rounds"] == 1
    assert result["device_bytes_moved"] == {"one_machine": 512 * 2**20, "cluster": 512 * 2**20}
    for path in ("one_machine", "cluster"):
        assert all(result["median_s"][path][move] > 0 for move in ("hibernate", "resume"))
    ratio = result["ratio_cluster_to_one_machine"]
    for move in ("hibernate", "resume"):  # the medians are rounded to 0.1 ms, the ratio from the exact ones
        assert ratio[move] == pytest.approx(result["median_s"]["cluster"][move] /
                                            result["median_s"]["one_machine"][move], rel=0.05)
