"""Helpers for the planner's tests: configurations, workloads and a replay's answers at a glance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kernel_helpers import wait_until
from traitlets.config import Config

from jupyter_gpu_pool.config import GPUPool
from jupyter_gpu_pool.planning.configuration import Configuration
from jupyter_gpu_pool.planning.workload import Session, Workload

GiB = 2**30
T0 = 1_700_000_000.0
# Each kernel takes its slice at start (these rules keep the replay's behaviour from before slice_at).
NEVER_CULL = [{"name": "never", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
               "slice_at": "start"}]


def configuration(name: str = "test", *, gpus: int = 2, memory: str = "80GiB", **settings) -> Configuration:
    """A configuration from GPUPool settings as an admin writes them, on ``gpus`` declared GPUs."""
    settings.setdefault("profiles", {"slice": {"slice": "10GiB"}, "whole": {"slice": "whole"}})
    settings.setdefault("inventory", [{"name": "Planned GPU", "memory": memory, "count": gpus}])
    pool = GPUPool(config=Config({"GPUPool": {"gpu_discovery": "declared", **settings}})).check()
    return Configuration.of(name, pool, pool.declared)


def session(sid: str, arrival: float, events=(), *, user: str | None = None, profile: str = "slice",
            groups=("students",), **kw) -> Session:
    """A session whose activity is ``events``: (seconds after arrival, code, value)."""
    timeline = [(arrival + dt, code, value) for dt, code, value in events]
    return Session(id=sid, user=user or sid, groups=tuple(groups), profile=profile, arrival=arrival,
                   activity=lambda: iter(timeline), **kw)


def workload(sessions, hours: float = 1.0, *, interval: float = 30.0) -> Workload:
    return Workload(list(sessions), T0, T0 + hours * 3600, interval=interval)


def jupyter(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``jupyter gpu-pool ARGS`` as a user runs it (this environment's jupyter, the test's Jupyter paths).
    The test's config directory comes before this environment's etc/jupyter (jupyter_core puts a
    virtualenv's first), where a developer's `jupyter gpu-pool lab` may have left a pool config."""
    exe = os.path.join(os.path.dirname(sys.executable), "jupyter")
    return subprocess.run([exe, "gpu-pool", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "JUPYTER_PREFER_ENV_PATH": "0"})


def simulate_json(*args) -> dict:
    done = jupyter("simulate", *args, "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def passes(ext, n: int = 2) -> None:
    """Wait for ``n`` more culling passes of the server's extension ``ext`` to end: the last of them began after
    now, so what the pool did before now is on the trace (a pass writes what it saw and the journal's news
    since the one before)."""
    start = ext.culler.passes
    await wait_until(lambda: ext.culler.passes >= start + n, 30 * n, interval=0.05, what=f"{n} culling passes")
