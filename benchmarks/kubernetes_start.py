"""The provisioner's and operator's own overhead on a kernel start in a cluster.

    .venv/bin/python benchmarks/kubernetes_start.py [--starts 20]

Runs the in-repo test cluster (tests/kube/testcluster: API server, scheduler, kubelet) and the real
operator, then starts kernels through the gpu-pool-kubernetes kernelspec, interleaved with a stock
local python3 kernel and a local gpu-pool kernel (so that machine load hits all alike):

- kubernetes: from the GPUKernel's creation to the kernel's kernel_info reply (the provisioner's
  own timings), split at the moment the provisioner saw the pod running;
- stock: a local ipykernel from its spawn to its kernel_info reply: the pod's own start (the same
  Python starting the same ipykernel), which a cluster cannot avoid;
- the overhead is kubernetes minus stock (medians), and the ratio against the local gpu-pool
  kernel, the alternative a user has on one machine.

Everything shares this machine's CPUs; on a real cluster the pod starts on another node, its image
may have to be pulled, and the API server is farther away: those are the cluster's, not ours.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "kube"))


def isolate(root: str, cluster) -> None:
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var], exist_ok=True)
    from kube_helpers import PROFILES

    config = {"GPUPool": {"inventory": [{"name": "Bench GPU", "memory": "80GiB", "count": 2}],
                          "ledger_path": os.path.join(root, "ledger.sqlite"), "profiles": {"small": PROFILES["small"]},
                          "owner": "bench"},
              "GPUPoolKubernetes": {"kubeconfig": cluster.kubeconfig, "namespace": "jhub", "server_id": "bench"}}
    with open(os.path.join(os.environ["JUPYTER_CONFIG_DIR"], "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump(config, f)


async def start_to_ready(kernel_name: str) -> tuple[float, dict]:
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=kernel_name)
    started = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    elapsed = time.perf_counter() - started
    kc.stop_channels()
    timings = dict(getattr(km.provisioner, "timings", {}))
    await km.shutdown_kernel(now=True)
    return elapsed, timings


async def main(starts: int) -> None:
    from conftest import install, operator_ready
    from kube_helpers import FAST, OperatorProcess, TestCluster

    root = tempfile.mkdtemp(prefix="gpu-pool-k8s-bench-")
    cluster = TestCluster(Path(root)).start()
    operator = None
    try:
        await install(cluster)
        operator = OperatorProcess(cluster, Path(root), {**FAST, "GPUPoolOperator.heartbeat_timeout": 120.0,
                                                         "GPUPoolOperator.reconcile_interval": 30.0}).start()
        await operator_ready(cluster)
        isolate(root, cluster)
        from jupyter_gpu_pool.config import load_settings
        from jupyter_gpu_pool.kernel_provisioner import kernelspecs
        from jupyter_gpu_pool.cluster.session import KernelSession

        profiles = [load_settings().profiles["small"]]
        kernelspecs.install(profiles, user=True)
        kernelspecs.install(profiles, prefix_name="gpu-pool-kubernetes", user=True, provisioner="gpu-pool-kubernetes")
        names = {"stock": "python3", "local": "gpu-pool-small", "kubernetes": "gpu-pool-kubernetes-small"}
        for name in names.values():  # warm caches (imports, the cluster watch)
            await start_to_ready(name)
        times: dict[str, list[float]] = {k: [] for k in names}
        created_to_running, running_to_ready, created_to_ready = [], [], []
        for i in range(starts):
            for key, name in names.items():
                elapsed, t = await start_to_ready(name)
                times[key].append(elapsed)
                if key == "kubernetes":
                    created_to_running.append(t["running"] - t["created"])
                    running_to_ready.append(t["ready"] - t["running"])
                    created_to_ready.append(t["ready"] - t["created"])
            print(f"  {i + 1}/{starts}", file=sys.stderr, end="\r")
        await KernelSession.close_all()
        med = {k: statistics.median(v) for k, v in times.items()}
        pod_own = med["stock"]
        cr_to_ready = statistics.median(created_to_ready)
        print(json.dumps({
            "starts_each": starts,
            "stock_kernel_start_median_s (the pod's own start)": round(pod_own, 3),
            "local_gpu_pool_start_median_s": round(med["local"], 3),
            "kubernetes_start_median_s (start_kernel to kernel_info)": round(med["kubernetes"], 3),
            "kubernetes_created_to_ready_median_s": round(cr_to_ready, 3),
            "  created_to_pod_running_median_s": round(statistics.median(created_to_running), 3),
            "  pod_running_to_kernel_info_median_s": round(statistics.median(running_to_ready), 3),
            "overhead_median_s (created_to_ready minus the pod's own start)": round(cr_to_ready - pod_own, 3),
            "ratio_kubernetes_vs_local_gpu_pool": round(med["kubernetes"] / med["local"], 3),
        }, indent=1))
    finally:
        if operator is not None:
            operator.stop()
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    asyncio.run(main(parser.parse_args().starts))
