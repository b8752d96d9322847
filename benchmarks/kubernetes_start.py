"""The provisioner's and operator's own overhead on a kernel start in a cluster, and what encrypting the
kernel's traffic (CurveZMQ, the default) costs against leaving it in plain text.

    .venv/bin/python benchmarks/kubernetes_start.py [--starts 20] [--round-trips 200] [--json]

Runs the in-repo test cluster (tests/kube/testcluster: API server, scheduler, kubelet) and two real
operators on it, one serving a namespace whose kernels are encrypted (GPUPoolOperator.transport_encryption
on, the default) and one serving a namespace whose kernels are not; then starts kernels through the
gpu-pool-kubernetes kernelspec in both, interleaved with a stock local python3 kernel and a local
gpu-pool kernel (so that machine load hits all alike):

- start: from the GPUKernel's creation to the kernel's kernel_info reply (the provisioner's own
  timings), split at the moment the provisioner saw the pod running; the stock kernel's spawn to
  kernel_info is the pod's own start (the same Python starting the same ipykernel), which a cluster
  cannot avoid, so the overhead is the Kubernetes start minus it (medians);
- round trip: an ``execute_request`` of ``pass`` to its ``execute_reply`` over the kernel's channels,
  ``--round-trips`` times on one encrypted and one plain kernel (the cost of CurveZMQ per message);
- ratios: encrypted against plain (start, round trip), and the Kubernetes start against a local
  gpu-pool kernel's, the alternative a user has on one machine.

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
sys.path[:0] = [str(REPO / "tests" / "kube"), str(REPO / "tests")]  # the test cluster and its helpers

from kernel_run import start_to_ready  # noqa: E402  benchmarks/kernel_run.py (the script's own directory)

ENCRYPTED, PLAIN = "jhub", "jhub-plain"  # one operator each


def isolate(root: str, cluster) -> None:
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var], exist_ok=True)
    from kube_helpers import PROFILES

    config = {"GPUPool": {"inventory": [{"name": "Bench GPU", "memory": "80GiB", "count": 2}],
                          "ledger_path": os.path.join(root, "ledger.sqlite"), "profiles": {"small": PROFILES["small"]},
                          "owner": "bench"},
              "GPUPoolKubernetes": {"kubeconfig": cluster.kubeconfig, "namespace": ENCRYPTED, "server_id": "bench"}}
    with open(os.path.join(os.environ["JUPYTER_CONFIG_DIR"], "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump(config, f)


def manager(kernel_name: str, namespace: str | None = None):
    from jupyter_client.manager import AsyncKernelManager
    from traitlets.config import Config

    config = Config({"GPUPoolKubernetes": {"namespace": namespace}}) if namespace else None
    return AsyncKernelManager(kernel_name=kernel_name, config=config)


async def timed_start(kernel_name: str, namespace: str | None = None) -> tuple[float, dict]:
    """Start to ready (kernel_run.start_to_ready), and the provisioner's own timings where it keeps some."""
    km = manager(kernel_name, namespace)
    try:
        elapsed = await start_to_ready(km)
        return elapsed, dict(getattr(km.provisioner, "timings", {}))
    finally:
        await km.shutdown_kernel(now=True)


async def round_trips(namespace: str, count: int) -> list[float]:
    """``execute('pass')`` to its reply, ``count`` times, on one kernel of ``namespace``."""
    km = manager("gpu-pool-kubernetes-small", namespace)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        for _ in range(20):  # warm up
            await kc.execute_interactive("pass", timeout=30)
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            await kc.execute_interactive("pass", timeout=30)
            times.append(time.perf_counter() - t0)
        return times
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def main(starts: int, trips: int, as_json: bool) -> None:
    from conftest import install, operator_ready
    from kube_helpers import FAST, OperatorProcess, TestCluster

    root = tempfile.mkdtemp(prefix="gpu-pool-k8s-bench-")
    cluster = TestCluster(Path(root)).start()
    operators = []
    try:
        await install(cluster)
        api = await cluster.api()
        async with api:
            from kubernetes_asyncio import client

            await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": PLAIN}})
        slow = {**FAST, "GPUPoolOperator.heartbeat_timeout": 120.0, "GPUPoolOperator.reconcile_interval": 30.0}
        for namespace, encrypt in ((ENCRYPTED, True), (PLAIN, False)):
            op_root = Path(root) / namespace
            op_root.mkdir()
            operators.append(OperatorProcess(cluster, op_root, {
                **slow, "GPUPoolOperator.namespaces": [namespace],
                "GPUPoolOperator.transport_encryption": encrypt}).start())
        for namespace in (ENCRYPTED, PLAIN):
            await operator_ready(cluster, namespace)
        isolate(root, cluster)
        from jupyter_gpu_pool.cluster.session import KernelSession
        from jupyter_gpu_pool.config import load_settings
        from jupyter_gpu_pool.kernel_provisioner import kernelspecs

        profiles = [load_settings().profiles["small"]]
        kernelspecs.install(profiles, user=True)
        kernelspecs.install(profiles, prefix_name="gpu-pool-kubernetes", user=True, provisioner="gpu-pool-kubernetes")
        kinds = {"stock": ("python3", None), "local": ("gpu-pool-small", None),
                 "encrypted": ("gpu-pool-kubernetes-small", ENCRYPTED), "plain": ("gpu-pool-kubernetes-small", PLAIN)}
        for name, namespace in kinds.values():  # warm caches (imports, the cluster watches)
            await timed_start(name, namespace)
        times: dict[str, list[float]] = {k: [] for k in kinds}
        created_to_ready: dict[str, list[float]] = {"encrypted": [], "plain": []}
        created_to_running: dict[str, list[float]] = {"encrypted": [], "plain": []}
        for i in range(starts):
            for key, (name, namespace) in kinds.items():
                elapsed, t = await timed_start(name, namespace)
                times[key].append(elapsed)
                if key in created_to_ready:
                    created_to_ready[key].append(t["ready"] - t["created"])
                    created_to_running[key].append(t["running"] - t["created"])
            print(f"  starts {i + 1}/{starts}", file=sys.stderr, end="\r")
        trips_of = {"encrypted": [], "plain": []}
        for _ in range(2):  # interleaved halves
            for key, namespace in (("encrypted", ENCRYPTED), ("plain", PLAIN)):
                trips_of[key] += await round_trips(namespace, trips // 2)
        await KernelSession.close_all()
        med = {k: statistics.median(v) for k, v in times.items()}
        ready = {k: statistics.median(v) for k, v in created_to_ready.items()}
        trip = {k: statistics.median(v) for k, v in trips_of.items()}
        result = {
            "starts_each": starts,
            "round_trips_each": len(trips_of["plain"]),
            "stock_kernel_start_median_s": round(med["stock"], 3),
            "local_gpu_pool_start_median_s": round(med["local"], 3),
            "kubernetes_start_median_s": {"encrypted": round(med["encrypted"], 3), "plain": round(med["plain"], 3)},
            "created_to_ready_median_s": {k: round(v, 3) for k, v in ready.items()},
            "created_to_pod_running_median_s": {k: round(statistics.median(v), 3)
                                               for k, v in created_to_running.items()},
            "overhead_median_s (created_to_ready minus the pod's own start)": {
                k: round(v - med["stock"], 3) for k, v in ready.items()},
            "round_trip_median_ms": {k: round(1000 * v, 3) for k, v in trip.items()},
            "ratio_encrypted_vs_plain_start": round(ready["encrypted"] / ready["plain"], 3),
            "ratio_encrypted_vs_plain_round_trip": round(trip["encrypted"] / trip["plain"], 3),
            "ratio_kubernetes_encrypted_vs_local_gpu_pool_start": round(med["encrypted"] / med["local"], 3),
        }
        print(json.dumps(result, indent=None if as_json else 1))
    finally:
        for op in operators:
            op.stop()
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    args = parser.parse_args()
    asyncio.run(main(args.starts, args.round_trips, args.json))
