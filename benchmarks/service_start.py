"""Start-to-ready time of a gpu-pool kernel whose slice comes through the pool service, against a stock
python3 kernel.

    .venv/bin/python benchmarks/service_start.py [--starts 20]

The path a teaching lab's users run: the service (``jupyter gpu-pool serve``, its own process, on a
declared inventory unless this machine has GPUs) keeps the ledger; this process is a user's server
(jupyter_client's ``AsyncKernelManager``), whose ``gpu-pool`` provisioner takes the slice over the
service's socket (settings fetched once, then the allocation, the holder and, at shutdown, the
release).  Interleaved (service, stock, service, stock, ...) so that machine load hits both alike;
"ready" is the kernel's reply to kernel_info, as a frontend waits for it.  Medians and their ratio.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile

from service_process import serve
from start_time import interleaved

CONFIG = {"GPUPool": {"inventory": [{"name": "Bench GPU", "memory": "80GiB", "count": 1}],
                      "profiles": {"bench": {"slice": "10GiB", "isolation": "soft"}}}}


def isolate() -> None:
    """Fresh Jupyter directories for this process, a user's: it knows where the service is, nothing more."""
    root = tempfile.mkdtemp(prefix="gpu-pool-service-bench-")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var])
    CONFIG["GPUPool"]["ledger_path"] = os.path.join(root, "state", "ledger.sqlite")


async def main(starts: int) -> None:
    isolate()
    service, sock = serve(CONFIG)
    os.environ["JUPYTER_GPU_POOL_SOCKET"] = sock
    try:
        from jupyter_gpu_pool.kernel_provisioner import kernelspecs
        from jupyter_gpu_pool.pools import pool_for

        pool = pool_for()
        kernelspecs.install(list(pool.settings.profiles.values()), user=True)
        print(f"pool: {pool.inventory.note}, through the {pool.ledger.where}", file=sys.stderr)
        times = await interleaved(["python3", "gpu-pool-bench"], starts)
        left = pool.ledger.leases()
    finally:
        service.terminate()
        service.wait(timeout=30)
    stock = statistics.median(times["python3"])
    pooled = statistics.median(times["gpu-pool-bench"])
    print(json.dumps({
        "starts_each": starts,
        "stock_python3_median_s": round(stock, 3),
        "through_service_median_s": round(pooled, 3),
        "ratio": round(pooled / stock, 3),
        "leases_left_held": len(left),  # every kernel shut down gave its slice back through the service
        "inventory": pool.inventory.note,
        "cpu_cores": os.cpu_count(),
    }, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    asyncio.run(main(parser.parse_args().starts))
