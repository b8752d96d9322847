"""Benchmarks of the server extension: one culling pass, and the ``me`` endpoint.

    .venv/bin/python benchmarks/culling.py            # both
    .venv/bin/python benchmarks/culling.py pass       # one culling pass over 10,000 kernels' facts
    .venv/bin/python benchmarks/culling.py me         # GET me with 200 kernels, on a real jupyter server

1. The pass: rule matching plus the pure ``decide`` for 10,000 kernels in mixed states (idle, busy,
   GPU-idle, warned, snoozed, hibernated) under a three-rule policy.  Reported against the
   default pass interval (30 s): the fraction of the event loop one pass takes.
2. ``me``: a real ``jupyter server`` with the extension on a declared pool, 200 leases of the user
   in the SQLite ledger, sequential authenticated requests.  Reported against ``GET /api/status``
   on the same server (the cheapest authenticated request, the floor any endpoint pays) as a ratio.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from jupyter_gpu_pool.pool import policy as P
from jupyter_gpu_pool.pool.rules import parse_policy

N_KERNELS = 10_000
N_ME_KERNELS = 200
DEFAULT_INTERVAL = 30.0


def make_kernels(n: int, now: float, rng: random.Random) -> list[tuple[str, tuple, str, str, P.Facts, P.KernelState]]:
    users = [f"user{i}" for i in range(400)]
    out = []
    for i in range(n):
        user = rng.choice(users)
        groups = ("students",) if user < "user2" else ("staff",)
        profile = rng.choice(["gpu-10g", "gpu-20g-50", "gpu-whole"])
        kind = rng.random()
        facts = P.Facts(
            kernel_id=f"k{i}",
            state="hibernated" if kind < 0.1 else "active",
            execution_state="busy" if 0.1 <= kind < 0.3 else "idle",
            last_activity=now - rng.uniform(0, 7200),
            started=now - rng.uniform(0, 86400 * 2),
            state_since=now - rng.uniform(0, 86400 * 2),
            busy_since=now - rng.uniform(0, 7200) if 0.1 <= kind < 0.3 else None,
            isolation="mps" if profile == "gpu-20g-50" else "soft",
            memory_used=rng.randint(0, 12 * 2**30),
            memory_limit=10 * 2**30,
            gpu_idle_since=now - rng.uniform(0, 7200) if kind > 0.5 else None,
            can_hibernate=profile != "gpu-20g-50",
        )
        state = P.FRESH
        if kind > 0.9:
            state = P.KernelState(snoozes_used=1, snoozed_until=now + 600)
        elif kind > 0.8:
            state = P.KernelState(warning=P.Warning("idle", "hibernate", now - 100, now + 200, "..."))
        out.append((user, groups, profile, f"gpu-pool-{profile}", facts, state))
    return out


def bench_pass() -> dict:
    policy = parse_policy([
        {"name": "students", "match": {"group": "students"}, "idle_timeout": "30m", "gpu_idle_timeout": "20m",
         "max_age": "12h"},
        {"name": "whole GPUs", "match": {"profile": "gpu-whole"}, "idle_timeout": "1h", "max_busy": "24h"},
        {"name": "everyone", "idle_timeout": "2h"},
    ])
    rng = random.Random(7)
    now = time.time()
    kernels = make_kernels(N_KERNELS, now, rng)
    times = []
    verbs: dict[str, int] = {}
    for _ in range(7):
        start = time.perf_counter()
        for user, groups, profile, spec, facts, state in kernels:
            rule = policy.rule_for(user, groups, profile, spec)
            d = P.decide(facts, rule, now, state, dry_run=False)
            verbs[d.verb] = verbs.get(d.verb, 0) + 1
        times.append(time.perf_counter() - start)
    best, median = min(times), statistics.median(times)
    return {"kernels": N_KERNELS, "pass_median_ms": median * 1000, "pass_best_ms": best * 1000,
            "per_kernel_us": median / N_KERNELS * 1e6,
            "fraction_of_default_interval": median / DEFAULT_INTERVAL,
            "verbs_per_pass": {k: v // 7 for k, v in verbs.items()}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> float:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
    return time.perf_counter() - start


def bench_me() -> dict:
    from jupyter_gpu_pool.local import Ledger
    from jupyter_gpu_pool.pool import LeaseRequest, build_quota_book, parse_inventory
    from jupyter_gpu_pool.pool.profiles import parse_profile

    tmp = tempfile.mkdtemp(prefix="gpu-pool-bench-")
    config, data, runtime = (os.path.join(tmp, d) for d in ("config", "data", "runtime"))
    for d in (config, data, runtime):
        os.makedirs(d)
    ledger_path = os.path.join(tmp, "ledger.sqlite")
    inventory = [{"name": "Bench GPU", "memory": "80GiB", "count": 8}]
    with open(os.path.join(config, "jupyter_gpu_pool_config.py"), "w") as f:
        f.write(f"c.GPUPool.gpu_discovery = 'declared'\nc.GPUPool.inventory = {inventory!r}\n"
                f"c.GPUPool.profiles = {{'small': {{'slice': '2GiB'}}}}\nc.GPUPool.ledger_path = {ledger_path!r}\n"
                "c.GPUPool.owner = 'bench'\nc.GPUPool.unix_groups = False\n")
    ledger = Ledger(ledger_path)
    ledger.sync_gpus(parse_inventory(inventory))
    profile = parse_profile("small", {"slice": "2GiB"})
    for i in range(N_ME_KERNELS):  # the user's kernels (as from their other servers: ledger-backed)
        ledger.allocate(LeaseRequest(owner="bench", kernel_id=f"kernel-{i}", profile=profile, label=f"nb{i}.ipynb"),
                        build_quota_book({}, {}, {}, {}))
    port, token = _free_port(), "bench-token"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": config, "JUPYTER_DATA_DIR": data, "JUPYTER_RUNTIME_DIR": runtime}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", f"--port={port}",
         f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp}", "--ServerApp.jpserver_extensions={'jupyter_gpu_pool': True}",
         "--GPUPoolExtension.cull_interval=30"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"{base}/api/status", token)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"the server did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        with urllib.request.urlopen(urllib.request.Request(
                f"{base}/gpu-pool/api/v1/me", headers={"Authorization": f"token {token}"})) as r:
            me = json.loads(r.read())
        assert len(me["kernels"]) == N_ME_KERNELS, len(me["kernels"])
        results = {}
        for name, path in (("status", "/api/status"), ("me", "/gpu-pool/api/v1/me")):
            for _ in range(10):
                _get(base + path, token)
            samples = sorted(_get(base + path, token) for _ in range(200))
            results[name] = {"p50_ms": samples[100] * 1000, "p95_ms": samples[190] * 1000}
        return {"kernels": N_ME_KERNELS, "me": results["me"], "status": results["status"],
                "me_over_status_p50": results["me"]["p50_ms"] / results["status"]["p50_ms"],
                "me_bytes": len(json.dumps(me))}
    finally:
        server.terminate()
        server.wait(timeout=30)


def main(argv: list[str]) -> None:
    which = argv[1:] or ["pass", "me"]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU(s)")
    if "pass" in which:
        r = bench_pass()
        print(f"culling pass over {r['kernels']} kernels' facts: median {r['pass_median_ms']:.1f} ms "
              f"(best {r['pass_best_ms']:.1f} ms), {r['per_kernel_us']:.2f} us per kernel; "
              f"{r['fraction_of_default_interval']:.4f} of the default {DEFAULT_INTERVAL:g} s interval; "
              f"decisions per pass {r['verbs_per_pass']}")
    if "me" in which:
        r = bench_me()
        print(f"GET me with {r['kernels']} kernels ({r['me_bytes'] // 1024} KiB): p50 {r['me']['p50_ms']:.1f} ms, "
              f"p95 {r['me']['p95_ms']:.1f} ms; GET /api/status p50 {r['status']['p50_ms']:.2f} ms; "
              f"me / status = {r['me_over_status_p50']:.1f}x")


if __name__ == "__main__":
    main(sys.argv)
