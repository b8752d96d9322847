"""Start-to-ready time of a gpu-pool kernel against a stock python3 kernel.

    .venv/bin/python benchmarks/start_time.py [--starts 20]

Interleaved (pool, stock, pool, stock, ...) so that machine load hits both alike.
"Ready" is the kernel's reply to kernel_info, as a frontend waits for it. The pool
runs on this machine's detected GPUs, or on a declared inventory where there are
none (the pool's own work, the lease and the environment, is the same either way).
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile

from kernel_run import start_to_ready  # benchmarks/kernel_run.py (the script's own directory is on sys.path)


def isolate() -> str:
    """Point Jupyter at fresh directories and write a pool config there."""
    root = tempfile.mkdtemp(prefix="gpu-pool-bench-")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var])
    config = {"GPUPool": {"inventory": [{"name": "Bench GPU", "memory": "80GiB", "count": 1}],
                          "ledger_path": os.path.join(root, "ledger.sqlite"),
                          "profiles": {"bench": {"slice": "10GiB", "isolation": "soft"}}}}
    with open(os.path.join(os.environ["JUPYTER_CONFIG_DIR"], "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump(config, f)
    return root


async def timed_start(kernel_name: str) -> float:
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=kernel_name)
    try:
        return await start_to_ready(km)
    finally:
        await km.shutdown_kernel(now=True)


async def interleaved(names: list[str], starts: int) -> dict[str, list[float]]:
    """Each kernel's start-to-ready times, ``starts`` of each, taking turns (after one start each to warm caches)."""
    for name in names:
        await timed_start(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(starts):
        for name in names:
            times[name].append(await timed_start(name))
        print(f"  {i + 1}/{starts}", file=sys.stderr, end="\r")
    return times


async def main(starts: int) -> None:
    isolate()
    from jupyter_gpu_pool.config import load_settings
    from jupyter_gpu_pool.kernel_provisioner import kernelspecs
    from jupyter_gpu_pool.pools import pool_for

    kernelspecs.install(list(load_settings().profiles.values()), user=True)
    pool = pool_for()
    print(f"pool: {pool.inventory.note}", file=sys.stderr)
    times = await interleaved(["python3", "gpu-pool-bench"], starts)
    stock = statistics.median(times["python3"])
    pooled = statistics.median(times["gpu-pool-bench"])
    print(json.dumps({
        "starts_each": starts,
        "stock_python3_median_s": round(stock, 3),
        "gpu_pool_median_s": round(pooled, 3),
        "ratio": round(pooled / stock, 3),
        "pool_overhead_percent": round((pooled / stock - 1) * 100, 1),
        "inventory": pool.inventory.note,
    }, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    asyncio.run(main(parser.parse_args().starts))
