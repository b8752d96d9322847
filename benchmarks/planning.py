"""Benchmarks of the capacity planner (``jupyter gpu-pool simulate``), and the headline plan.

    .venv/bin/python benchmarks/planning.py             # all three
    .venv/bin/python benchmarks/planning.py lab         # the 40-student, 3-hour synthetic lab
    .venv/bin/python benchmarks/planning.py hub         # a synthetic week of a 500-user hub (about a million events)
    .venv/bin/python benchmarks/planning.py headline    # GPUs the lab needs: exclusive, slices + culling, + hibernation
    .venv/bin/python benchmarks/planning.py queue       # replay speed of an M/M/4 trace with a long queue

1. ``lab``: one replay of the lab (slices of 10 GiB on 80 GiB GPUs, a 15-minute idle policy that
   hibernates) on 5 GPUs, in this process (median of 5), and the whole command as an admin runs it
   (``simulate --synthetic lab --students 40 --hours 3 --gpus 1-8 --json``, Python's start included).
   Reported against the lab's real length (how much faster than real time) and against a replay that
   judges every kernel on every pass, as the live culler does (the skip ``policy.quiet_until`` allows).
2. ``hub``: 500 users over 7 days under a 1-hour idle policy that shuts down, on 24 GPUs (enough) and on
   16 (too few: refused users try again every minute, and every try is an allocation decision):
   building the workload and replaying it, against the week's real length.
3. ``headline``: the command of docs/planning.md on GPU counts 1 to 40 under the three example
   configurations (jupyter_gpu_pool/planning/examples), on a declared pool of 80 GiB H100s.
4. ``queue``: an M/M/4 trace (Poisson arrivals, exponential session lengths, each session a whole GPU,
   no culling) of 30,000 sessions, 60,000 events, at loads 0.9, 0.98 and 1.1 (a queue of tens, hundreds
   and thousands of waiting starts): the replay alone (events a second) and the command an admin runs
   (``simulate --trace ... --gpus 4 --queue-timeout 1000d --json``).
   ``queue profile`` also prints the replay's cProfile (top 15 by cumulative time).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traitlets.config import Config

from jupyter_gpu_pool.config import GPUPool
from jupyter_gpu_pool.planning.configuration import Configuration
from jupyter_gpu_pool.planning.simulator import Replay
from jupyter_gpu_pool.planning.synthetic import Hub, Lab
from jupyter_gpu_pool.planning.tracefile import write as write_trace
from jupyter_gpu_pool.pool.trace import TraceEvent

EXAMPLES = Path(__file__).resolve().parents[1] / "jupyter_gpu_pool" / "planning" / "examples"
H100 = [{"name": "NVIDIA H100 80GB HBM3", "memory": "80GiB", "sm_count": 132, "count": 1}]


def configuration(policy: list, profiles: dict) -> Configuration:
    settings = GPUPool(config=Config({"GPUPool": {"gpu_discovery": "declared", "inventory": H100,
                                                  "profiles": profiles, "policy": policy}})).check()
    return Configuration.of("bench", settings, settings.declared)


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def isolated_env() -> dict:
    """A Jupyter config dir declaring one H100 (the examples add their profiles and policies)."""
    home = tempfile.mkdtemp(prefix="plan-bench-")
    (Path(home) / "jupyter_gpu_pool_config.json").write_text(json.dumps(
        {"GPUPool": {"gpu_discovery": "declared", "inventory": H100, "ledger_path": f"{home}/ledger.sqlite"}}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": home, "JUPYTER_CONFIG_PATH": home, "JUPYTER_DATA_DIR": home,
           "JUPYTER_RUNTIME_DIR": home}
    _warn_of_other_config(env, home)
    return env


def _warn_of_other_config(env: dict, home: str) -> None:
    """Jupyter also reads this environment's and the system's config directories, under ours: a pool
    config there (`jupyter gpu-pool lab` leaves one in the venv) changes what "the admin's settings" are
    for a command without --config.  Say so, so that a figure is not taken for the defaults'."""
    from jupyter_gpu_pool.config import config_files

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        others = [str(f) for f in config_files() if not str(f).startswith(home)]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if others:
        print(f"note: the commands also read {', '.join(others)} (under the benchmark's own settings)",
              file=sys.stderr)


def simulate(*args: str, env: dict) -> tuple[float, dict]:
    exe = os.path.join(os.path.dirname(sys.executable), "jupyter")
    t = time.perf_counter()
    done = subprocess.run([exe, "gpu-pool", "simulate", *args, "--json", "--no-progress"], capture_output=True,
                          text=True, env=env, check=True)
    return time.perf_counter() - t, json.loads(done.stdout)


def lab() -> None:
    config = configuration([{"name": "lab", "idle_timeout": "15m", "gpu_idle_timeout": None, "warn": "3m",
                             "action": "hibernate"}], {"gpu-10g": {"slice": "10GiB", "isolation": "soft"}})
    workload = Lab(students=40, hours=3, profile="gpu-10g").workload()
    fast, tally = timed(lambda: Replay(workload, config, config.pool_of(5)).run(), 5)
    slow, naive = timed(lambda: Replay(workload, config, config.pool_of(5), every_pass=True).run(), 3)
    assert tally.to_dict() == naive.to_dict()
    command, result = simulate("--synthetic", "lab", "--students", "40", "--hours", "3", "--gpus", "1-8",
                               env=isolated_env())
    print(f"lab: 40 students, 3 h, on 5 GPUs: {fast:.3f} s a replay (median of 5), "
          f"{workload.hours * 3600 / fast:,.0f}x real time; judging every pass: {slow:.3f} s "
          f"({slow / fast:.1f}x slower, the same result)")
    print(f"lab: the whole command on 1-8 GPUs (8 replays, Python's start included): {command:.2f} s; "
          f"fewest GPUs meeting p95 <= 30 s: {result['fewest_gpus']}")


def hub() -> None:
    config = configuration([{"name": "hub", "idle_timeout": "1h", "gpu_idle_timeout": "1h", "warn": "5m",
                             "action": "shutdown"}], {"gpu-10g": {"slice": "10GiB", "isolation": "soft"}})
    t = time.perf_counter()
    workload = Hub(users=500, days=7, profile="gpu-10g").workload()
    built = time.perf_counter() - t
    events = sum(sum(1 for _ in s.activity()) for s in workload.sessions)
    print(f"hub: 500 users, 7 days: {len(workload.sessions):,} sessions, {events:,} events (workload {built:.1f} s)")
    for gpus, what in ((24, "enough for its load"), (16, "too few: refused users retry every minute")):
        t = time.perf_counter()
        tally = Replay(workload, config, config.pool_of(gpus)).run()
        replayed = time.perf_counter() - t
        d = tally.to_dict()
        print(f"  on {gpus} GPUs ({what}): replay {replayed:.1f} s ({7 * 86400 / replayed:,.0f}x real time); "
              f"{d['refusals']['total']:,} refused asks, p95 wait {d['wait_seconds']['p95']} s, "
              f"GPU-hours held {d['gpu_hours']['held']}, busy {d['gpu_hours']['busy']}")


def headline() -> None:
    configs = [str(EXAMPLES / f"lab-{name}.json") for name in ("exclusive", "slices-cull", "slices-hibernate")]
    args = ["--synthetic", "lab", "--students", "40", "--hours", "3", "--gpus", "1-40", "--slo-wait", "30s"]
    elapsed, result = simulate(*args, *(x for c in configs for x in ("--config", c)), env=isolated_env())
    print(f"headline: jupyter gpu-pool simulate {' '.join(args)} --config ... (3 configurations x 40 GPU counts: "
          f"{elapsed:.1f} s)")
    for c in result["configurations"]:
        n = c["fewest_gpus"]
        row = next((r for r in c["results"] if r["gpus"] == n), None)
        if row is None:
            print(f"  {c['name']}: no GPU count up to 40 meets the goal")
            continue
        print(f"  {c['name']}: {n} GPUs; GPU-hours held {row['gpu_hours']['held']}, busy {row['gpu_hours']['busy']}; "
              f"shut down {row['shut_down']}, hibernated {row['hibernated']}, restarts {row['restarts']}; "
              f"wait p95 {row['wait_seconds']['p95']} s, max {row['wait_seconds']['max']} s")


def mmc_trace(path: Path, *, sessions: int, servers: int, load: float, mean: float = 600.0, seed: int = 0) -> int:
    """An M/M/c trace: arrivals at rate ``load * servers / mean``, sessions of mean ``mean`` seconds (in
    user time: the replay adds the wait), each on one whole GPU; the number of events."""
    rng = random.Random(seed)
    rate = load * servers / mean
    t, events = 1_700_000_000.0, []
    for i in range(sessions):
        t += rng.expovariate(rate)
        kernel = f"k{i}"
        events.append(TraceEvent(t, "start", kernel, f"u{i % 97}", {"p": "gpu"}))
        events.append(TraceEvent(t + rng.expovariate(1 / mean), "end", kernel, f"u{i % 97}", {}))
    events.sort(key=lambda e: e.at)
    with open(path, "w") as out:
        return write_trace(out, events, since=events[0].at, until=events[-1].at, exported=events[-1].at, users="all")


QUEUE_CONFIG = {"GPUPool": {"profiles": {"gpu": {"slice": "whole"}},
                            "default_profile": "gpu",
                            "policy": [{"name": "keep", "idle_timeout": None, "gpu_idle_timeout": None,
                                        "max_hibernated": None}]}}


def queue(profile: bool = False) -> None:
    home = Path(tempfile.mkdtemp(prefix="plan-queue-"))
    config_file = home / "mmc.json"
    config_file.write_text(json.dumps(QUEUE_CONFIG))
    env = isolated_env()
    config = _queue_configuration()
    for load in (0.9, 0.98, 1.1):
        trace = home / f"mmc-{load}.jsonl"
        events = mmc_trace(trace, sessions=30_000, servers=4, load=load)
        elapsed, result = simulate("--trace", str(trace), "--config", str(config_file), "--gpus", "4",
                                   "--queue-timeout", "1000d", env=env)
        row = result["configurations"][0]["results"][0]
        workload = _trace_workload(trace)
        replay, tally = timed(lambda: Replay(workload, config, config.pool_of(4)).run(), 1)
        longest = max(point[3] for point in tally.timeline)
        print(f"queue: M/M/4 at load {load}, {events:,} events, up to {longest:,} waiting: the replay {replay:.2f} s "
              f"({events / replay:,.0f} events/s), the command {elapsed:.1f} s (Python's start and reading "
              f"included); wait p50 {row['wait_seconds']['p50']} s, p95 {row['wait_seconds']['p95']} s")
        if profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(lambda: Replay(workload, config, config.pool_of(4)).run())
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


def _queue_configuration() -> Configuration:
    settings = GPUPool(config=Config({"GPUPool": {"gpu_discovery": "declared", "inventory": H100,
                                                  **QUEUE_CONFIG["GPUPool"], "start_queue_timeout": "1000d"}})).check()
    return Configuration.of("queue", settings, settings.declared)


def _trace_workload(trace: Path):
    from jupyter_gpu_pool.planning import tracefile

    return tracefile.to_workload(tracefile.read(tracefile.lines_of(str(trace)), name=str(trace)))


if __name__ == "__main__":
    wanted = sys.argv[1:] or ["lab", "hub", "headline"]
    if wanted[0] == "queue":
        queue(profile="profile" in wanted[1:])
    else:
        for name in wanted:
            {"lab": lab, "hub": hub, "headline": headline}[name]()
