"""Ledger throughput: allocations per second from many processes on one SQLite file.

    .venv/bin/python benchmarks/ledger_throughput.py [--processes 16] [--seconds 10]

Each process allocates a slice and releases it, as fast as it can, against a pool
of 4 declared 80 GiB GPUs; after every grant it checks that no GPU is
over-committed. Reported: allocations per second with 1 process and with N
(the ratio is how well the ledger scales under contention), refusals, and the
over-commit count, which must be zero.
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import tempfile
import time


def worker(path: str, seed: int, seconds: float, out) -> None:
    from jupyter_gpu_pool.pool import Holder, LeaseRequest, Ledger, PoolError, build_quota_book, parse_profile

    ledger = Ledger(path, busy_timeout=60)
    quotas = build_quota_book({}, {}, {}, {})
    profiles = [parse_profile(f"p{i}", s) for i, s in enumerate(["5GiB", "10GiB", "20GiB,25%", "40GiB"])]
    rng = random.Random(seed)
    held: list[str] = []
    granted = refused = overcommits = 0
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        if held and (len(held) > 3 or rng.random() < 0.5):
            ledger.release(held.pop(0))
            continue
        request = LeaseRequest(owner=f"user{seed}", kernel_id=f"{seed}-{n}", profile=rng.choice(profiles),
                               manager=Holder(os.getpid(), 0.0))
        try:
            held.append(ledger.allocate(request, quotas).id)
            granted += 1
            overcommits += len(ledger.overcommitted())
        except PoolError:
            refused += 1
    for lease_id in held:
        ledger.release(lease_id)
    out.put((granted, refused, overcommits))


def run(processes: int, seconds: float) -> dict:
    from jupyter_gpu_pool.pool import GPU, Ledger

    path = os.path.join(tempfile.mkdtemp(prefix="ledger-bench-"), "ledger.sqlite")
    ledger = Ledger(path)
    ledger.sync_gpus([GPU(uuid=f"B-{i}", name="Bench", memory=80 * 2**30, index=i, source="declared")
                      for i in range(4)])
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(path, seed, seconds, out)) for seed in range(processes)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    granted = sum(r[0] for r in results)
    return {"processes": processes, "allocations_per_s": round(granted / seconds, 1),
            "refusals": sum(r[1] for r in results), "overcommits": sum(r[2] for r in results)
            + len(ledger.overcommitted())}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    single = run(1, args.seconds)
    many = run(args.processes, args.seconds)
    print(json.dumps({"one_process": single, "many_processes": many, "cpu_cores": os.cpu_count(),
                      "ratio_many_to_one": round(many["allocations_per_s"] / single["allocations_per_s"], 2)},
                     indent=1))
