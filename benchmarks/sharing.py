"""Sharing one GPU: notebook-sized training loops under each isolation mode, against one loop alone.

    python3 benchmarks/sharing.py [--loops 4] [--seconds 8] [--json sharing.json]
    python3 benchmarks/sharing.py --smoke        # on CPU, seconds: checks that it runs, measures nothing

Needs a GPU and PyTorch (and ``nvidia-cuda-mps-control`` for the MPS modes); it runs on the GPU test
machine (docs/gpu-testing.md, or all at once with ``scripts/gpu-check``).  The workload is what a
notebook trains: an 8-layer, 1024-wide MLP with batch 64 and Adam, on random data.  Each loop warms
up and says so; once all are warm they start together and count their steps for ``--seconds``.  Modes:

- **alone (exclusive)**: one loop in a bare process holding the whole GPU: the reference;
- **time-sliced**: ``--loops`` bare processes on the GPU, no pool (what users do without one: CUDA
  time-slices them);
- **soft**: ``--loops`` real kernels started through the pool's ``gpu-pool`` provisioner on soft
  slices (the slice's environment and PyTorch memory cap; CUDA time-slices them);
- **mps**: ``--loops`` pool kernels on MPS slices with no SM cap, and **mps, SM-capped**: with an equal
  share of the SMs each (the pool starts and stops its own MPS control daemon).

Aggregate steps/s is the sum of the loops' rates; the ratio is against one loop alone.  **Slice
efficiency** is one loop alone in a soft slice, and alone in an SM-capped MPS slice, against the bare
process: measured first, in the first kernel of each mode's set, before the set runs together (the
kernels are started once per mode).  Kernels run on the path users run (provisioner, ledger, slice
environment); the loops run in them through ``execute_request`` as a cell does.  The JSON result is
rewritten after each figure, so a run cut short keeps what it measured.
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
import json, os, time, torch
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
open(os.path.join({folder!r}, f"ready-{{os.getpid()}}-{{time.monotonic_ns()}}"), "w").close()
go = os.path.join({folder!r}, "go")
while not os.path.exists(go):
    time.sleep(0.002)
start_at = float(open(go).read())
late = time.time() - start_at
while time.time() < start_at:
    time.sleep(0.001)
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < {seconds}:
    step()
    n += 1
sync()
print("SHARING " + json.dumps({{"steps": n, "seconds": time.perf_counter() - t0, "late": max(late, 0.0)}}))
"""
# The order rows are shown in, whatever order they are measured in.
MODES = ["alone (exclusive)", "time-sliced", "soft", "mps", "mps, SM-capped"]
READY_TIMEOUT = 180.0  # seconds the loops may take to warm up


def loop_code(device: str, folder: str, seconds: float, smoke: bool) -> str:
    depth, width, batch = (2, 64, 8) if smoke else (8, 1024, 64)
    return LOOP.format(device=device, depth=depth, width=width, batch=batch, folder=folder, seconds=seconds)


async def together(n: int, folder: str, loops) -> list:
    """Run ``loops`` (an awaitable of the loops' outputs), and once ``n`` loops are warm (each leaves
    a file in ``folder``), let them start together; return their outputs."""
    work = asyncio.ensure_future(loops)
    deadline = time.monotonic() + READY_TIMEOUT
    while sum(1 for f in os.listdir(folder) if f.startswith("ready-")) < n:
        if work.done():
            return await work  # a loop ended before it was ready: its error
        if time.monotonic() > deadline:
            work.cancel()
            raise RuntimeError(f"the loops were not warm within {READY_TIMEOUT:.0f} s")
        await asyncio.sleep(0.01)
    with open(os.path.join(folder, "go.tmp"), "w") as f:
        f.write(repr(time.time() + 0.2))
    os.rename(os.path.join(folder, "go.tmp"), os.path.join(folder, "go"))
    return await work


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


async def bare(n: int, device: str, seconds: float, smoke: bool, root: str) -> list[dict]:
    """``n`` loops in bare processes (no pool), started together."""
    folder = tempfile.mkdtemp(dir=root)
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", loop_code(device, folder, seconds, smoke),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) for _ in range(n)]
    outs = await together(n, folder, asyncio.gather(*(p.communicate() for p in procs)))
    for p, (_out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a bare loop failed: {err.decode()[-2000:]}")
    return [parse(out.decode()) for out, _err in outs]


async def in_kernels(manager, kids: list[str], device: str, seconds: float, smoke: bool, root: str) -> list[dict]:
    """A loop in each of the pool kernels ``kids``, run as cells, started together."""
    folder = tempfile.mkdtemp(dir=root)
    outs = await together(len(kids), folder, asyncio.gather(
        *(run(manager.get_kernel(k), loop_code(device, folder, seconds, smoke)) for k in kids)))
    return [parse(out) for out in outs]


async def kernels_of(manager, profile: str, n: int) -> list[str]:
    """``n`` pool kernels on ``profile``, torch imported in each."""
    kids = [await manager.start_kernel(kernel_name=f"gpu-pool-{profile}") for _ in range(n)]
    await asyncio.gather(*(run(manager.get_kernel(k), "import torch") for k in kids))
    return kids


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
        rows.sort(key=lambda r: MODES.index(r["mode"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    def add(measured: dict) -> None:
        rows.append(measured)
        print(f"  {measured}", file=sys.stderr)
        save()

    async def pool_mode(mode: str, profile: str, alone_in: str | None) -> None:
        """One pool mode: its kernels started once; slice efficiency first (one loop alone in the first
        kernel, ``alone_in``), then the set together."""
        kids = await kernels_of(manager, profile, n)
        try:
            if alone_in:
                one = (await in_kernels(manager, kids[:1], device, seconds, smoke, root))[0]["steps_per_s"]
                efficiency.append({"slice": alone_in, "steps_s": round(one, 1), "bare_steps_s": round(alone, 1),
                                   "efficiency": round(one / alone, 3)})
                save()
            add(row(mode, await in_kernels(manager, kids, device, seconds, smoke, root), alone))
        finally:
            await asyncio.gather(*(manager.shutdown_kernel(k, now=True) for k in kids))

    try:
        alone = (await bare(1, device, seconds, smoke, root))[0]["steps_per_s"]  # the reference, first
        add(row("alone (exclusive)", [{"steps_per_s": alone, "late": 0.0}], alone))
        await pool_mode("soft", "soft", "soft slice")
        if not smoke:
            await pool_mode("mps, SM-capped", "mpscap", f"mps slice, {share}% SMs")
            pool.stop_mps()  # no MPS server up while bare processes share the GPU
        add(row("time-sliced", await bare(n, device, seconds, smoke, root), alone))
        if not smoke:
            await pool_mode("mps", "mps", None)
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
