"""Sharing one GPU: notebook-sized training loops under each isolation mode, against one loop alone.

    python3 benchmarks/sharing.py [--loops 4] [--seconds 8] [--json sharing.json]
    python3 benchmarks/sharing.py --smoke        # on CPU, seconds: checks that it runs, measures nothing

Needs a GPU and PyTorch (and ``nvidia-cuda-mps-control`` for the MPS modes); it runs on the GPU test
machine (docs/gpu-testing.md, or all at once with ``scripts/gpu-check``).  The workload is what a
notebook trains: an 8-layer, 1024-wide MLP with batch 64 and Adam, on random data.  Each loop warms
up, waits for a common start time, then counts its steps for ``--seconds``.  Modes:

- **alone (exclusive)**: one loop in a bare process holding the whole GPU: the reference;
- **time-sliced**: ``--loops`` bare processes on the GPU, no pool (what users do without one: CUDA
  time-slices them);
- **soft**: ``--loops`` real kernels started through the pool's ``gpu-pool`` provisioner on soft
  slices (the slice's environment and PyTorch memory cap; CUDA time-slices them);
- **mps**: ``--loops`` pool kernels on MPS slices with no SM cap, and **mps, SM-capped**: with an equal
  share of the SMs each (the pool starts and stops its own MPS control daemon).

Aggregate steps/s is the sum of the loops' rates; the ratio is against one loop alone.  **Slice
efficiency** is one loop alone in a soft slice, and alone in an SM-capped MPS slice, against the bare
process.  Kernels run on the path users run (provisioner, ledger, slice environment); the loops run
in them through ``execute_request`` as a cell does.
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

LOOP = """
import json, time, torch
device = {device!r}
torch.manual_seed(0)
layers = []
for _ in range({depth}):
    layers += [torch.nn.Linear({width}, {width}), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn({batch}, {width}, device=device)
y = torch.randn({batch}, {width}, device=device)

def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()

def sync():
    if device == "cuda":
        torch.cuda.synchronize()

for _ in range(20):
    step()
sync()
late = time.time() - {start_at}
while time.time() < {start_at}:
    time.sleep(0.005)
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < {seconds}:
    step()
    n += 1
sync()
print("SHARING " + json.dumps({{"steps": n, "seconds": time.perf_counter() - t0, "late": max(late, 0.0)}}))
"""


def loop_code(device: str, start_at: float, seconds: float, smoke: bool) -> str:
    depth, width, batch = (2, 64, 8) if smoke else (8, 1024, 64)
    return LOOP.format(device=device, depth=depth, width=width, batch=batch, start_at=start_at, seconds=seconds)


def parse(text: str) -> dict:
    line = next(ln for ln in text.splitlines() if ln.startswith("SHARING "))
    result = json.loads(line[len("SHARING "):])
    result["steps_per_s"] = result["steps"] / result["seconds"]
    return result


def isolate(profiles: dict, declared: bool) -> str:
    """Point Jupyter at fresh directories and write a pool config there (detected GPUs, or a declared
    one for --smoke); returns the root."""
    root = tempfile.mkdtemp(prefix="gpu-pool-sharing-bench-")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var])
    config = {"GPUPool": {"gpu_discovery": "declared" if declared else "nvml",
                          "ledger_path": os.path.join(root, "ledger.sqlite"), "profiles": profiles,
                          "unix_groups": False, "policy": [{"idle_timeout": None, "gpu_idle_timeout": None}],
                          "mps_log_directory": os.path.join(root, "mps-log")}}
    if declared:
        config["GPUPool"]["inventory"] = [{"name": "Smoke GPU", "memory": "40GiB", "count": 1}]
    with open(os.path.join(os.environ["JUPYTER_CONFIG_DIR"], "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump(config, f)
    return root


async def bare(n: int, device: str, seconds: float, smoke: bool) -> list[dict]:
    """``n`` loops in bare processes (no pool), started together."""
    start_at = time.time() + (3 if smoke else 15)
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", loop_code(device, start_at, seconds, smoke),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) for _ in range(n)]
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    for p, (_out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a bare loop failed: {err.decode()[-2000:]}")
    return [parse(out.decode()) for out, _err in outs]


async def in_kernels(manager, profile: str, n: int, device: str, seconds: float, smoke: bool) -> list[dict]:
    """``n`` loops in pool kernels on ``profile``, run as cells, started together."""
    kids = [await manager.start_kernel(kernel_name=f"gpu-pool-{profile}") for _ in range(n)]
    try:
        await asyncio.gather(*(run(manager.get_kernel(k), "import torch") for k in kids))
        start_at = time.time() + (3 if smoke else 10)
        outs = await asyncio.gather(*(run(manager.get_kernel(k), loop_code(device, start_at, seconds, smoke))
                                      for k in kids))
        return [parse(out) for out in outs]
    finally:
        await asyncio.gather(*(manager.shutdown_kernel(k, now=True) for k in kids))


def row(mode: str, results: list[dict], alone: float) -> dict:
    total = sum(r["steps_per_s"] for r in results)
    return {"mode": mode, "loops": len(results), "aggregate_steps_s": round(total, 1),
            "per_loop_steps_s": [round(r["steps_per_s"], 1) for r in results],
            "ratio_to_alone": round(total / alone, 3), "late_s": round(max(r["late"] for r in results), 2)}


async def main(args) -> dict:
    smoke = args.smoke
    n = 2 if smoke else args.loops
    seconds = 0.5 if smoke else args.seconds
    share = max(100 // n, 1)
    profiles = {"soft": {"slice": "4GiB" if smoke else "10GiB", "isolation": "soft"}}
    if not smoke:
        profiles["mps"] = {"slice": "10GiB", "isolation": "mps"}
        profiles["mpscap"] = {"slice": f"10GiB,{share}%", "isolation": "mps"}
    root = isolate(profiles, declared=smoke)
    from jupyter_client.multikernelmanager import AsyncMultiKernelManager

    from jupyter_gpu_pool.config import load_settings
    from jupyter_gpu_pool.kernel_provisioner import kernelspecs
    from jupyter_gpu_pool.pools import pool_for

    pool = pool_for()
    device = "cpu" if smoke else "cuda"
    if not smoke and (not pool.gpus or pool.inventory.declared):
        sys.exit(f"needs a GPU: {pool.inventory.note} (or run --smoke on CPU)")
    kernelspecs.install(list(load_settings().profiles.values()), user=True)
    gpu = pool.gpus[0]
    print(f"{gpu.label}; {n} loops, {seconds:g} s each; {'SMOKE (CPU, figures mean nothing)' if smoke else ''}",
          file=sys.stderr)
    manager = AsyncMultiKernelManager(connection_dir=os.environ["JUPYTER_RUNTIME_DIR"])  # not the cwd
    rows, efficiency = [], []
    result = {"gpu": gpu.name, "driver": pool.inventory.discovery.driver_version, "smoke": smoke,
              "workload": "8-layer 1024-wide MLP, batch 64, Adam" if not smoke else "2-layer 64-wide MLP on CPU",
              "seconds": seconds, "at": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows, "efficiency": efficiency}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    try:
        alone = (await bare(1, device, seconds, smoke))[0]["steps_per_s"]
        rows.append(row("alone (exclusive)", [{"steps_per_s": alone, "late": 0.0}], alone))
        save()
        modes = [("time-sliced", None), ("soft", "soft")]
        if not smoke:
            modes += [("mps", "mps"), ("mps, SM-capped", "mpscap")]
        for mode, profile in modes:
            results = (await bare(n, device, seconds, smoke) if profile is None
                       else await in_kernels(manager, profile, n, device, seconds, smoke))
            rows.append(row(mode, results, alone))
            print(f"  {rows[-1]}", file=sys.stderr)
            save()
        for mode, profile in [("soft slice", "soft")] + ([] if smoke else [(f"mps slice, {share}% SMs", "mpscap")]):
            one = (await in_kernels(manager, profile, 1, device, seconds, smoke))[0]["steps_per_s"]
            efficiency.append({"slice": mode, "steps_s": round(one, 1), "bare_steps_s": round(alone, 1),
                               "efficiency": round(one / alone, 3)})
            save()
    finally:
        await manager.shutdown_all(now=True)
        pool.stop_mps()  # the pool's own daemons: leave the card as we found it
    print("| mode | loops | aggregate steps/s | against one alone |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['loops']} | {r['aggregate_steps_s']} | **{r['ratio_to_alone']}x** |")
    print("\n| one loop alone in | steps/s | bare process | slice efficiency |")
    print("|---|---|---|---|")
    for e in efficiency:
        print(f"| {e['slice']} | {e['steps_s']} | {e['bare_steps_s']} | **{e['efficiency']}x** |")
    print(json.dumps(result, indent=1))
    save()
    shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=4, help="training loops sharing the GPU (default 4)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds each loop is measured (default 8)")
    parser.add_argument("--json", default=None, help="also write the JSON result to this file (after each mode)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run on CPU that checks the script works")
    args = parser.parse_args()
    if not 1 <= args.loops <= 16:
        parser.error(f"--loops must be between 1 and 16, not {args.loops}")
    if not 0 < args.seconds <= 600:
        parser.error(f"--seconds must be above 0 and at most 600, not {args.seconds}")
    asyncio.run(main(args))
