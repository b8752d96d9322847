"""Ledger throughput: allocations per second from many processes on one SQLite file, on the path
the provisioner runs (``LocalPool.allocate``: the write transaction, the pure allocation decision,
and on a refusal a reconcile that judges every held lease's processes with psutil).

    .venv/bin/python benchmarks/ledger_throughput.py --processes 16 --held 300 --json
    .venv/bin/python benchmarks/ledger_throughput.py --processes 16 --held 300 --service --rounds 3 --json

``--service``: the same workers as clients of the pool service (``jupyter gpu-pool serve``, its own
process, keeping the ledger), each over its own connection to the socket, against the same workers on
the in-process ledger, in alternating rounds; printed: both rates (medians over the rounds) and their
ratio.  In that comparison every worker allocates as one user (the service knows a caller by its Unix
user: all workers are this one) and the per-grant over-commit check is left out on both sides (it is
not on a user's path; the over-commit count is checked once after each run).

Before timing starts, ``--held`` leases are taken for that many live processes (sleepers, one per
lease, started for the run), so that every reconcile has real processes to judge.  Then each of
``--processes`` worker processes (a user each; the held leases belong to 60 others) takes a random profile's slice and gives it back, as fast as it
can, for ``--seconds``, on 8 declared 80 GiB GPUs; after every grant it checks that no GPU is
over-committed.  Printed: allocations per second (grants), refusals, the over-commit count, which
must be zero, and the held leases still held after the run (all of them: their processes live).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from service_process import serve

PROFILES = {"p5": "5GiB", "p10": "10GiB", "p20": "20GiB,25%", "p40": "40GiB", "held": "256MiB"}


def settings_config(ledger_path: str) -> dict:
    return {"GPUPool": {
        "profiles": {name: {"slice": text, "isolation": "mps" if "%" in text else "soft"}
                     for name, text in PROFILES.items()},
        "inventory": [{"name": "Bench GPU", "memory": "80GiB", "count": 8}],
        "gpu_discovery": "declared", "ledger_path": ledger_path, "unix_groups": False, "owner": "bench"}}


def make_pool(ledger_path: str):
    from traitlets.config import Config

    from jupyter_gpu_pool.config import load_settings
    from jupyter_gpu_pool.local.pool import LocalPool

    return LocalPool(load_settings(Config(settings_config(ledger_path)), paths=[]))


def client_pool(sock: str):
    from jupyter_gpu_pool.service.client import ServiceClient, ServicePool

    return ServicePool(ServiceClient(sock))


def worker(where: str, seed: int, seconds: float, start_at: float, out, via: str = "ledger") -> None:
    """Allocate and release until ``seconds`` are up; ``via`` "ledger" (``where`` is the ledger file),
    "service" (``where`` is the service's socket), or "ledger-as-one" (the ledger, as one user, with
    no per-grant over-commit check: what the service's clients do)."""
    from jupyter_gpu_pool.pool import PoolError

    pool = client_pool(where) if via == "service" else make_pool(where)
    check_each = via == "ledger"
    profiles = [pool.settings.profiles[name] for name in ("p5", "p10", "p20", "p40")]
    rng = random.Random(seed)
    held: list[str] = []
    granted = refused = overcommits = 0
    while time.time() < start_at:
        time.sleep(0.001)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        if held and (len(held) > 3 or rng.random() < 0.5):
            pool.ledger.release(held.pop(0), "shutdown")
            continue
        try:
            request = pool.request(f"k{seed}-{n}", rng.choice(profiles))
            held.append(pool.allocate(replace(request, owner=f"user{seed}") if check_each else request).id)
            granted += 1
            if check_each:
                overcommits += len(pool.ledger.overcommitted())
        except PoolError:
            refused += 1
    for lease_id in held:
        pool.ledger.release(lease_id, "shutdown")
    out.put((granted, refused, overcommits))


def hold(pool, count: int) -> list[subprocess.Popen]:
    """``count`` leases, each held by a live sleeping process (as a kernel holds its lease)."""
    from jupyter_gpu_pool.local import processes

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(count)]
    profile = pool.settings.profiles["held"]
    for i, proc in enumerate(sleepers):
        lease = pool.allocate(replace(pool.request(f"held-{i}", profile), owner=f"student{i % 60}"))
        pool.ledger.set_holder(lease.id, processes.identify(proc.pid), "")
    return sleepers


def run(processes: int, seconds: float, held: int, via: str = "ledger") -> dict:
    path = os.path.join(tempfile.mkdtemp(prefix="ledger-bench-"), "ledger.sqlite")
    pool = make_pool(path)
    sleepers = hold(pool, held)
    service = None
    try:
        where = path
        if via == "service":
            pool.ledger.close()  # from here on the service alone keeps the ledger
            service, where = serve(settings_config(path))
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        start_at = time.time() + 1.0 + processes * 0.05  # every worker imported and ready before timing
        procs = [ctx.Process(target=worker, args=(where, seed, seconds, start_at, out, via))
                 for seed in range(processes)]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
            pool = make_pool(path)
        still_held = len(pool.ledger.leases())
        overcommits = sum(r[2] for r in results) + len(pool.ledger.overcommitted())
    finally:
        if service is not None and service.poll() is None:
            service.kill()
        for proc in sleepers:
            proc.kill()
            proc.wait()
    granted = sum(r[0] for r in results)
    return {"processes": processes, "held": held, "seconds": seconds, "via": via,
            "allocations_per_s": round(granted / seconds, 1), "refusals": sum(r[1] for r in results),
            "overcommits": overcommits, "held_after": still_held, "cpu_cores": os.cpu_count()}


def compare(processes: int, seconds: float, held: int, rounds: int) -> dict:
    """The service against the in-process ledger, in alternating rounds; medians and their ratio."""
    runs: dict[str, list[dict]] = {"ledger-as-one": [], "service": []}
    for _ in range(rounds):
        for via in runs:
            runs[via].append(run(processes, seconds, held, via))
    ledger = statistics.median(r["allocations_per_s"] for r in runs["ledger-as-one"])
    service = statistics.median(r["allocations_per_s"] for r in runs["service"])
    return {"processes": processes, "held": held, "seconds": seconds, "rounds": rounds,
            "in_process_ledger_per_s": ledger, "through_service_per_s": service, "ratio": round(service / ledger, 3),
            "overcommits": sum(r["overcommits"] for rs in runs.values() for r in rs),
            "held_after": [r["held_after"] for rs in runs.values() for r in rs], "cpu_cores": os.cpu_count()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16, help="worker processes allocating at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the workers allocate")
    parser.add_argument("--held", type=int, default=300, help="leases held by live processes before timing")
    parser.add_argument("--service", action="store_true", help="through the pool service against the ledger")
    parser.add_argument("--rounds", type=int, default=1, help="with --service: alternating rounds of each")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.service:
        result = compare(args.processes, args.seconds, args.held, args.rounds)
        print(json.dumps(result) if args.json else
              f"{result['through_service_per_s']} allocations/s through the service against "
              f"{result['in_process_ledger_per_s']} on the in-process ledger: {result['ratio']}x "
              f"({result['processes']} processes, {result['held']} held leases, {result['overcommits']} over-commits, "
              f"{result['cpu_cores']} cores)")
        sys.exit(0)
    result = run(args.processes, args.seconds, args.held)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['allocations_per_s']} allocations/s from {result['processes']} processes with "
              f"{result['held']} held leases ({result['refusals']} refusals, {result['overcommits']} over-commits, "
              f"{result['cpu_cores']} cores)")
