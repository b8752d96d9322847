"""A first cell on an MPS profile, on the stand-in machine: detected (not declared) GPUs, so taking the slice
starts the GPU's MPS control daemon (the tests' stand-in binary, ``tests/mps_standin``, which binds its
sockets as the real one does), and the kernel's first cell and its subprocesses see the daemon's pipe
folder and the slice's MPS caps.  Nothing is asked of the checkpoint driver: nothing is restored."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from server_hibernation_helpers import Server, body, texts

from jupyter_gpu_pool.pool import ACTIVE

STANDIN_MPS = Path(__file__).parent.parent / "mps_standin"
FIRST_CELL = {"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
              "action": "hibernate", "slice_at": "first-cell"}
REPORT = """
import json, os, subprocess, sys
names = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
         "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
child = subprocess.run([sys.executable, "-c", "import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))", *names],
                       capture_output=True, text=True, check=True)
print("REPORT " + json.dumps({"kernel": {k: os.environ.get(k) for k in names}, "child": json.loads(child.stdout)}))
"""


@pytest.fixture
def server(jp_fetch, ext) -> Server:
    return Server(jp_fetch, ext)


@pytest.mark.pool_settings(policy=[FIRST_CELL])
async def test_an_mps_kernels_first_cell_starts_the_gpus_daemon_and_sees_its_pipes_and_caps(
        jp_fetch, ext, server, channels, standin, monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN_MPS}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("nvidia-cuda-mps-control") == str(STANDIN_MPS / "nvidia-cuda-mps-control")
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "mps.ipynb", "type": "notebook", "kernel": {"name": "gpu-pool-half"}}))
    kid = body(r)["kernel"]["id"]
    pool = ext.backend.pool
    assert server.lease(kid).awaits_first_cell
    assert not any(pool.mps_daemon(g.uuid).running() for g in pool.gpus)  # nothing started for a kernel holding none

    ch = await channels(kid)
    try:
        got = await ch.replies(await ch.execute(REPORT))
        taken = server.lease(kid)
        daemon = pool.mps_daemon(taken.gpus[0])
        assert taken.state == ACTIVE and daemon.running()
        assert stat.S_ISSOCK(os.lstat(os.path.join(daemon.pipe_directory, "control")).st_mode)
        line = next(t for t in texts(got) if t.startswith("REPORT "))
        seen = json.loads(line[len("REPORT "):])
        for where in (seen["kernel"], seen["child"]):
            assert where == {"CUDA_VISIBLE_DEVICES": taken.gpus[0], "CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_directory,
                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
        assert standin.calls == []  # a first slice restores nothing
    finally:
        pool.stop_mps()
        for g in pool.gpus:  # the pool leaves its pipe folders for its next start: not a test's
            shutil.rmtree(pool.mps_daemon(g.uuid).pipe_directory, ignore_errors=True)
