"""Hibernate and resume of a kernel through the cluster's whole path, against the same on one machine:
what the cluster path (request -> operator -> node agent -> status) adds, as a ratio.

    .venv/bin/python benchmarks/cluster_hibernation.py [--rounds 10] [--bytes-mib 512] [--json]
    .venv/bin/python benchmarks/cluster_hibernation.py --smoke    # one round: checks that it runs

No GPU is needed: both paths move the memory with the checkpoint driver stand-in
(tests/hibernation/hibernation_standin.py: cuda.h's state machine, NVML's readings following it), so the
checkpoint itself costs next to nothing and what is compared is the path around it.  Both start from
the call the Jupyter server's culler and handlers make, and both release the framework's cache over
the kernel's own channel first:

- **one machine**: ``Hibernator.hibernate`` / ``Hibernator.resume`` (hibernation/hibernator.py) over a
  real ipykernel started by the ``gpu-pool`` provisioner on the stand-in machine's pool (a real SQLite
  ledger: claim, lock, checkpoint, ledger write; slice, restore, unlock);
- **the cluster**: ``ClusterHibernation.hibernate`` / ``start_resume`` (the server's hook for kernel pods)
  over a real ipykernel in a pod of the in-repo test cluster (tests/kube/testcluster: its API server,
  scheduler and process kubelet), started by the ``gpu-pool-kubernetes`` provisioner: the hook writes
  ``spec.desiredState`` (compare-and-set), the real operator (a process) admits the move, the real node
  agent (in this process, on the stand-in driver, finding the pod's process through a /proc stand-in of
  its cgroup) checkpoints or restores it and settles the phase, and the hook sees the phase through its
  watch.  A resume is admitted against the agent's own free-memory reading on its Node.

Rounds alternate between the two paths (so the machine's load hits both alike), each round one
hibernate and one resume of the same kernel; medians, and the ratios cluster / one machine.  Neither
path records its outcome here (the server's journal, events and metrics are the same on both).  The
operator logs at DEBUG to a file, as in the tests; everything shares this machine's CPUs, where a real
cluster puts the API server, the operator and the agent on other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "kube"), str(REPO / "tests" / "hibernation"), str(REPO / "tests")]

MiB = 2**20
NAMESPACE = "jhub"
NODE = "gpu-node-1"
PROFILE = {"small": {"slice": "10GiB", "isolation": "soft"}}


def isolate(root: str, cluster) -> None:
    """Fresh Jupyter directories and the pool's config: the stand-in machine's pool (its GPUs are
    'detected' through the stand-in discovery) and the cluster's namespace, for both provisioners."""
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        os.environ[var] = os.path.join(root, var.split("_")[1].lower())
        os.makedirs(os.environ[var], exist_ok=True)
    config = {"GPUPool": {"gpu_discovery": "nvml", "inventory": [], "profiles": PROFILE, "owner": "bench",
                          "ledger_path": os.path.join(root, "ledger.sqlite"), "unix_groups": False},
              "GPUPoolKubernetes": {"kubeconfig": cluster.kubeconfig, "namespace": NAMESPACE, "server_id": "bench",
                                    "launch_timeout": 120.0}}
    with open(os.path.join(os.environ["JUPYTER_CONFIG_DIR"], "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump(config, f)


class Unrecorded:
    """The server's recorder (journal, event, metric), left out of both paths alike."""

    async def record(self, *args, **kwargs) -> None:
        return None


async def timed(coro) -> tuple[float, object]:
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


async def main(rounds: int, device_bytes: int, as_json: bool) -> None:
    from hibernation_standin import STANDIN_GPUS, StandInDriver, StandInMemory, standin_discovery
    from kube_helpers import FAST, OperatorProcess, TestCluster, fake_proc, install, operator_ready, pod_processes
    from test_kube_agent_hibernation import DriverNVML

    root = tempfile.mkdtemp(prefix="gpu-pool-cluster-hibernation-bench-")
    cluster = TestCluster(Path(root)).start()
    operator = None
    stop = asyncio.Event()
    agent_task = None
    api = None
    try:
        await install(cluster)
        operator = OperatorProcess(cluster, Path(root), {
            **FAST, "GPUPoolOperator.hami_memory_scaling": 2.0,  # HAMi oversubscribed: memory is handed back
            "GPUPoolOperator.heartbeat_timeout": 120.0, "GPUPoolOperator.reconcile_interval": 30.0}).start()
        await operator_ready(cluster)
        isolate(root, cluster)

        import jupyter_gpu_pool.local.pool as local_pool
        from jupyter_client.multikernelmanager import AsyncMultiKernelManager

        from jupyter_gpu_pool.cluster.resources import kernel_name
        from jupyter_gpu_pool.cluster.session import KernelSession
        from jupyter_gpu_pool.config import load_settings
        from jupyter_gpu_pool.hibernation import Hibernator, Kernels
        from jupyter_gpu_pool.kernel_provisioner import kernelspecs
        from jupyter_gpu_pool.operator.agent import Agent
        from jupyter_gpu_pool.pools import pool_for
        from jupyter_gpu_pool.server_extension.sleep.cluster import ClusterHibernation
        from jupyter_gpu_pool.server_extension.backends.kubernetes import KubernetesBackend
        from kernel_helpers import start_answering

        local_pool.discover = standin_discovery  # the stand-in machine's GPUs, as the hibernation tests have them
        profiles = list(load_settings().profiles.values())
        kernelspecs.install(profiles, user=True)
        kernelspecs.install(profiles, prefix_name="gpu-pool-kubernetes", user=True, provisioner="gpu-pool-kubernetes")
        manager = AsyncMultiKernelManager(connection_dir=os.environ["JUPYTER_RUNTIME_DIR"])

        # one machine: the hibernator over a real kernel of the local pool, on its own stand-in driver
        local_driver = StandInDriver()
        pool = pool_for()
        hibernator = Hibernator(pool, Kernels(manager), driver=local_driver, memory=StandInMemory(local_driver))
        local_id, local_pid = await start_answering(manager, "gpu-pool-small")
        local_driver.add(local_pid, device_bytes, gpus=pool.ledger.by_kernel(local_id).gpus)

        # the cluster: the node agent on the node's stand-in driver, and the server's hook
        driver = StandInDriver()
        api = await cluster.api()
        gpus = [g.uuid for g in STANDIN_GPUS]
        agent = Agent(NODE, api, DriverNVML(driver), gpus, proc_root=os.path.join(root, "proc"), min_report=5.0,
                      driver=driver, memory=StandInMemory(driver), namespaces=(NAMESPACE,))
        agent_task = asyncio.create_task(agent.run(1.0, stop))
        cluster_id = await manager.start_kernel(kernel_name="gpu-pool-kubernetes-small")
        name = kernel_name(cluster_id)
        from kube_helpers import Kube

        kube = Kube(api, NAMESPACE)
        [pod] = [p for p in await kube.pods() if p["metadata"]["labels"].get(
            "jupyter-gpu-pool.readthedocs.io/kernel") == name]
        [proc] = pod_processes(pod["metadata"]["name"])
        driver.add(proc.pid, device_bytes, (gpus[0],))
        fake_proc(Path(root) / "proc", {proc.pid: pod["metadata"]["uid"]})
        backend = KubernetesBackend(None)
        backend.session = await KernelSession.get(backend.kube)
        hook = ClusterHibernation(SimpleNamespace(backend=backend, recorder=Unrecorded(), hint_sleep_after=60.0,
                                                  serverapp=SimpleNamespace(kernel_manager=manager)))  # no hints here

        async def settled_usage() -> None:  # the agent's first reading of the pod, as before any idle hibernation
            for _ in range(200):
                obj = backend.session.kernels.get(name) or {}
                if ((obj.get("status") or {}).get("usage") or {}).get("memoryUsed") == device_bytes:
                    return
                await asyncio.sleep(0.1)
            raise RuntimeError("the node agent did not report the kernel pod's GPU memory")

        await settled_usage()
        paths = {
            "one_machine": (lambda: hibernator.hibernate(local_id, "benchmark"),
                            lambda: hibernator.resume(local_id, "benchmark")),
            "cluster": (lambda: hook.hibernate(cluster_id, "benchmark"),
                        lambda: hook.start_resume(cluster_id, "benchmark")),
        }
        for hibernate, resume in paths.values():  # warm up: imports, first channels, the watches
            await hibernate()
            await resume()
        times = {path: {"hibernate": [], "resume": []} for path in paths}
        moved = {}
        kernels = Kernels(manager)
        release = {"one_machine": [], "cluster": []}  # the part both paths share: the cache release, alone
        for i in range(rounds):
            for path, (hibernate, resume) in paths.items():
                took, outcome = await timed(hibernate())
                moved[path] = outcome.bytes
                times[path]["hibernate"].append(took)
                took, _ = await timed(resume())
                times[path]["resume"].append(took)
            for path, kid in (("one_machine", local_id), ("cluster", cluster_id)):
                took, _ = await timed(kernels.release_cache(kid, 30.0))
                release[path].append(took)
            print(f"  round {i + 1}/{rounds}", file=sys.stderr, end="\r")
        print(file=sys.stderr)
        assert driver.procs[proc.pid].checkpoints == rounds + 1 and driver.procs[proc.pid].restores == rounds + 1, \
            "the node agent did not move the kernel pod's process each round"
        assert local_driver.procs[local_pid].checkpoints == rounds + 1

        med = {path: {move: statistics.median(v) for move, v in by.items()} for path, by in times.items()}
        result = {
            "rounds": rounds,
            "device_bytes_moved": moved,
            "median_s": {path: {move: round(v, 4) for move, v in by.items()} for path, by in med.items()},
            "ratio_cluster_to_one_machine": {move: round(med["cluster"][move] / med["one_machine"][move], 2)
                                             for move in ("hibernate", "resume")},
            "cluster_added_median_s": {move: round(med["cluster"][move] - med["one_machine"][move], 4)
                                       for move in ("hibernate", "resume")},
            "cache_release_alone_median_s": {path: round(statistics.median(v), 4) for path, v in release.items()},
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
            "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        await hook.stop()
        await manager.shutdown_all(now=True)
        await KernelSession.close_all()
        print(json.dumps(result, indent=None if as_json else 1))
    finally:
        stop.set()
        if agent_task is not None:
            agent_task.cancel()
            await asyncio.gather(agent_task, return_exceptions=True)
        if api is not None:
            await api.close()
        if operator is not None:
            operator.stop()
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="hibernate + resume rounds on each path")
    parser.add_argument("--bytes-mib", type=int, default=512, help="GPU memory the kernel holds (stand-in), MiB")
    parser.add_argument("--smoke", action="store_true", help="one round: checks that it runs, measures little")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    args = parser.parse_args()
    if args.rounds < 1 or args.bytes_mib < 1:
        parser.error("--rounds and --bytes-mib must be positive")
    asyncio.run(main(1 if args.smoke else args.rounds, args.bytes_mib * MiB, args.json))
