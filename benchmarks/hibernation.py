"""Hibernate and resume time against GPU memory held, beside what a user does today: restart the
kernel and rebuild the same state.

    python3 benchmarks/hibernation.py [--sizes 1,4,16,32] [--json hibernation.json]

Needs a GPU, its driver (570 or newer) and PyTorch: it runs on the GPU test machine (see
docs/gpu-testing.md for bringing the Jupyter wheels there).  For each size N GiB, one real
kernel on a whole-GPU slice of the pool holds N GiB of tensors (``torch.randn``, seeded), then:

- **hibernate**: ``Hibernator.hibernate`` (release of the allocator cache, lock, checkpoint, ledger);
- **resume**: ``Hibernator.resume`` until the kernel runs on its GPU again, checksum verified;
- **restart + load**: the alternative: restart the kernel, ``import torch``, and load the same tensors
  from a ``.pt`` file on local disk (saved beforehand, so the file is in the page cache: the most
  favourable case for the alternative), checksum verified;
- **restart + regenerate**: a lower bound for the alternative: restart, ``import torch``, and
  recompute the tensors from their seed on the GPU (real state is rarely this cheap to rebuild).

The ratio is (restart + load) / resume: how much longer a user waits to get their state back
without hibernation.  Times are wall-clock seconds as the user waits for them.  The restarts are
plain ones (``hibernation_checkpoint_before_kill`` is off here: the alternative involves no
hibernation).  The JSON result is rewritten after each size, so a run cut short keeps what it
measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

from kernel_run import run  # benchmarks/kernel_run.py (the script's own directory is on sys.path)

GiB = 2**30


def isolate() -> str:
    """Point Jupyter at fresh directories and write a pool config of the detected GPUs there."""
    root = tempfile.mkdtemp(prefix="gpu-pool-hibernation-bench-")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var])
    config = {"GPUPool": {"gpu_discovery": "nvml", "ledger_path": os.path.join(root, "ledger.sqlite"),
                          "profiles": {"bench": {"slice": "whole"}}, "unix_groups": False,
                          "hibernation_host_memory": "none", "hibernation_lock_timeout": 30.0,
                          "hibernation_checkpoint_before_kill": False}}
    with open(os.path.join(os.environ["JUPYTER_CONFIG_DIR"], "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump(config, f)
    return root


def make(n: int) -> str:
    return (f"import torch\ntorch.manual_seed(0)\nx = torch.randn({n} * 2**30 // 4, device='cuda')\n"
            "torch.cuda.synchronize()")


CHECKSUM = "print(repr(sum(float(c.sum()) for c in x.split(2**27))))"


async def timed(coro) -> tuple[float, object]:
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


async def bench_size(n: int, manager, hibernator, scratch: str) -> dict:
    kid = await manager.start_kernel(kernel_name="gpu-pool-bench")
    km = manager.get_kernel(kid)
    path = os.path.join(scratch, f"state-{n}gib.pt")
    try:
        await run(km, make(n))
        checksum = (await run(km, CHECKSUM)).strip()
        await run(km, f"torch.save(x, {path!r})")  # the user's saved state, for the alternative

        hibernate_s, hibernated = await timed(hibernator.hibernate(kid, "benchmark"))
        resume_s, _resumed = await timed(hibernator.resume(kid, "benchmark"))
        assert (await run(km, CHECKSUM)).strip() == checksum, "state changed across hibernation"

        async def restart_then(code: str) -> float:
            started = time.perf_counter()
            await manager.restart_kernel(kid, now=True)
            await run(km, code)
            elapsed = time.perf_counter() - started
            assert (await run(km, CHECKSUM)).strip() == checksum, "the rebuilt state differs"
            return elapsed

        load_s = await restart_then(f"import torch\nx = torch.load({path!r}, map_location='cuda')\n"
                                    "torch.cuda.synchronize()")
        regenerate_s = await restart_then(make(n))
        return {"gib": n, "moved_bytes": hibernated.bytes, "hibernate_s": round(hibernate_s, 2),
                "checkpoint_s": round(hibernated.duration, 2), "resume_s": round(resume_s, 2),
                "restart_load_s": round(load_s, 2), "restart_regenerate_s": round(regenerate_s, 2),
                "ratio_load_to_resume": round(load_s / resume_s, 2),
                "ratio_regenerate_to_resume": round(regenerate_s / resume_s, 2)}
    finally:
        await manager.shutdown_kernel(kid, now=True)
        if os.path.exists(path):
            os.remove(path)


async def main(sizes: list[int], out: str | None) -> None:
    root = isolate()
    from jupyter_client.multikernelmanager import AsyncMultiKernelManager

    from jupyter_gpu_pool.config import load_settings
    from jupyter_gpu_pool.devices import checkpoint as cp
    from jupyter_gpu_pool.hibernation import Hibernator, Kernels
    from jupyter_gpu_pool.kernel_provisioner import kernelspecs
    from jupyter_gpu_pool.pools import pool_for

    pool = pool_for()
    if not pool.gpus or pool.inventory.declared:
        sys.exit(f"needs a GPU: {pool.inventory.note}")
    info = cp.driver().info()
    if not info.available:
        sys.exit(f"hibernation is unavailable here: {info.reason}")
    kernelspecs.install(list(load_settings().profiles.values()), user=True)
    manager = AsyncMultiKernelManager(connection_dir=os.environ["JUPYTER_RUNTIME_DIR"])  # not the cwd
    hibernator = Hibernator(pool, Kernels(manager))
    gpu = pool.gpus[0]
    print(f"{gpu.label}, driver {pool.inventory.discovery.driver_version} (CUDA {info.cuda_version_text})",
          file=sys.stderr)
    rows: list[dict] = []
    result = {"gpu": gpu.name, "driver": pool.inventory.discovery.driver_version, "cuda": info.cuda_version_text,
              "at": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}

    def save() -> None:
        if out:
            with open(out, "w") as f:
                json.dump(result, f, indent=1)

    for n in sizes:
        if n * GiB > gpu.memory * 0.9:
            print(f"  {n} GiB: skipped, more than 90% of {gpu.label}", file=sys.stderr)
            continue
        row = await bench_size(n, manager, hibernator, root)
        print(f"  {n} GiB: {row}", file=sys.stderr)
        rows.append(row)
        save()
    await manager.shutdown_all(now=True)
    print("| GPU memory held | hibernate | resume | restart + load from disk | restart + regenerate | "
          "(restart + load) / resume |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gib']} GiB | {r['hibernate_s']} s | {r['resume_s']} s | {r['restart_load_s']} s | "
              f"{r['restart_regenerate_s']} s | **{r['ratio_load_to_resume']}x** |")
    print(json.dumps(result, indent=1))
    save()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,32", help="GiB of GPU memory the kernel holds, comma-separated")
    parser.add_argument("--json", "--out", dest="out", default=None,
                        help="also write the JSON result to this file (after each size)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be whole GiB numbers separated by commas, not {args.sizes!r}")
    if not sizes or any(s <= 0 for s in sizes):
        parser.error(f"--sizes must list positive sizes, not {args.sizes!r}")
    asyncio.run(main(sizes, args.out))
