"""Hibernate and resume time against GPU memory held, beside what a user does today: restart the
kernel and rebuild the same state.

    python3 benchmarks/hibernation.py [--sizes 1,4,16,32] [--json hibernation.json]

Needs a GPU, its driver (570 or newer) and PyTorch: it runs on the GPU test machine (see
docs/gpu-testing.md for bringing the Jupyter wheels there; ``scripts/gpu-check`` runs it in its
step).  One real kernel on a whole-GPU slice of the pool holds, in turn, N GiB of tensors
(``torch.randn``, seeded) for each size N, and for each:

- **hibernate**: ``Hibernator.hibernate`` (release of the allocator cache, lock, checkpoint, ledger);
- **resume**: ``Hibernator.resume`` until the kernel runs on its GPU again, checksum verified;
- **restart + load from disk**: the alternative: restart the kernel (``import torch``, first CUDA call),
  then load the same tensors from a ``.pt`` file saved beforehand (on tmpfs where there is room, so
  in RAM: the most favourable case for the alternative), with ``torch.load(..., mmap=True)``, the
  fastest load torch offers; checksum verified;
- **restart + regenerate**: the same restart, then recompute the tensors from their seed on the GPU.
  Random tensors cost almost nothing to make, and a notebook's real state is the result of work (a
  loaded dataset, a trained model): this is a **lower bound** for the alternative, not its cost.

The ratio that matters is (restart + load from disk) / resume: how much longer a user waits to get
their state back without hibernation; it comes first in the table.  The restart is measured once per
size, in the kernel that held the state; the load and the regeneration after it in the same, warm
kernel (torch imported, CUDA up), each added to it.  Times are wall-clock seconds as the user waits
for them.  The restarts are plain ones (``hibernation_checkpoint_before_kill`` is off here: the
alternative involves no hibernation).  The JSON result is rewritten after each size, so a run cut
short keeps what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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


TABLE_HEADER = ("| GPU memory held | hibernate | resume | (restart + load from disk) / resume | "
                "restart + load from disk | restart + regenerate (a lower bound) |")
CHECKSUM = "print(repr(sum(float(c.sum()) for c in x.split(2**27))))"
FORGET = "del x\nimport gc\ngc.collect()\ntorch.cuda.empty_cache()"
# The save is setup, not a figure: no CRC (torch.load reads such a file all the same), where it is fast.
SAVE = ("if hasattr(torch.serialization, 'set_crc32_options'):\n    torch.serialization.set_crc32_options(False)\n"
        "torch.save(x, {path!r})")
WARM = "import torch\ntorch.zeros(1, device='cuda')\ntorch.cuda.synchronize()"


def scratch_for(n: int, fallback: str) -> str:
    """Where the saved state goes: tmpfs (RAM) where it has room for it, else ``fallback``."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and shutil.disk_usage(shm).free > (n + 2) * GiB:
        return tempfile.mkdtemp(prefix="gpu-pool-bench-", dir=shm)
    return fallback


async def timed(coro) -> tuple[float, object]:
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


async def bench_size(n: int, manager, kid: str, hibernator, root: str) -> dict:
    km = manager.get_kernel(kid)
    folder = scratch_for(n, root)
    path = os.path.join(folder, f"state-{n}gib.pt")
    try:
        await run(km, make(n))
        checksum = (await run(km, CHECKSUM)).strip()
        await run(km, SAVE.format(path=path))  # the user's saved state, for the alternative

        hibernate_s, hibernated = await timed(hibernator.hibernate(kid, "benchmark"))
        resume_s, _resumed = await timed(hibernator.resume(kid, "benchmark"))
        assert (await run(km, CHECKSUM)).strip() == checksum, "state changed across hibernation"

        started = time.perf_counter()
        await manager.restart_kernel(kid, now=True)
        await run(km, WARM)
        restart_s = time.perf_counter() - started
        load_s, _ = await timed(run(km, f"x = torch.load({path!r}, map_location='cuda', mmap=True)\n"
                                        "torch.cuda.synchronize()"))
        assert (await run(km, CHECKSUM)).strip() == checksum, "the loaded state differs"
        await run(km, FORGET)
        regenerate_s, _ = await timed(run(km, make(n)))
        assert (await run(km, CHECKSUM)).strip() == checksum, "the regenerated state differs"
        await run(km, FORGET)  # the kernel holds nothing for the next size
        load_total, regenerate_total = restart_s + load_s, restart_s + regenerate_s
        return {"gib": n, "moved_bytes": hibernated.bytes, "hibernate_s": round(hibernate_s, 2),
                "checkpoint_s": round(hibernated.duration, 2), "resume_s": round(resume_s, 2),
                "ratio_load_to_resume": round(load_total / resume_s, 2),
                "restart_load_s": round(load_total, 2), "restart_regenerate_s": round(regenerate_total, 2),
                "restart_s": round(restart_s, 2), "load_s": round(load_s, 2), "regenerate_s": round(regenerate_s, 2),
                "ratio_regenerate_to_resume": round(regenerate_total / resume_s, 2)}
    finally:
        if os.path.exists(path):
            os.remove(path)
        if folder != root:
            shutil.rmtree(folder, ignore_errors=True)


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

    kid = await manager.start_kernel(kernel_name="gpu-pool-bench")  # one kernel for every size
    try:
        for n in sizes:
            if n * GiB > gpu.memory * 0.9:
                print(f"  {n} GiB: skipped, more than 90% of {gpu.label}", file=sys.stderr)
                continue
            row = await bench_size(n, manager, kid, hibernator, root)
            print(f"  {n} GiB: {row}", file=sys.stderr)
            rows.append(row)
            save()
    finally:
        await manager.shutdown_all(now=True)
    print(TABLE_HEADER)
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gib']} GiB | {r['hibernate_s']} s | {r['resume_s']} s | **{r['ratio_load_to_resume']}x** | "
              f"{r['restart_load_s']} s | {r['restart_regenerate_s']} s |")
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
