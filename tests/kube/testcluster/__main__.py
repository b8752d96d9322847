"""Run the test cluster: ``python -m testcluster --state-dir DIR [--nodes FILE] [--image PATTERN]...
[--feature-gates DRAConsumableCapacity=true] [--hollow-nodes N] [--pid1] [--gc-delay SECONDS] [--spread]``.

Starts the API server on 127.0.0.1 (a free port unless ``--port``), the
scheduler, the kubelet (and the hollow nodes' kubelet) and the garbage collector in one process; writes
``DIR/kubeconfig`` and then prints ``testcluster ready <url>`` on stdout.
SIGTERM or SIGINT stops every pod's process, then the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from .apiserver import ApiServer
from .dra import ClaimController, nvidia_device_classes, resource_slice
from .hollow import HollowKubelet, hollow_nodes
from .kubelet import Kubelet
from .scheduler import Scheduler
from .store import Store, now_rfc3339

DEFAULT_NODES = [{
    "name": "gpu-node-1",
    "labels": {"nvidia.com/gpu.product": "Test-GPU-40GB", "nvidia.com/gpu.memory": "40960",
               "nvidia.com/gpu.count": "2"},
    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"},
}]


def node_object(spec: dict) -> dict:
    labels = {"kubernetes.io/hostname": spec["name"], "kubernetes.io/os": "linux", **spec.get("labels", {})}
    who = "hollow kubelet" if spec.get("hollow") else "test kubelet"
    ready = ({"type": "Ready", "status": "True", "reason": "KubeletReady",
              "message": f"{who} is posting ready status"} if spec.get("kubelet", True) else
             {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
              "message": "Kubelet stopped posting node status.", "lastTransitionTime": now_rfc3339()})
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": spec["name"], "labels": labels},
            "spec": {}, "status": {
                "capacity": spec["allocatable"], "allocatable": spec["allocatable"],
                "conditions": [ready],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": spec["name"]}]}}
    if spec.get("taints"):
        node["spec"]["taints"] = spec["taints"]
    return node


def kubeconfig(url: str) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "testcluster",
            "clusters": [{"name": "testcluster", "cluster": {"server": url}}],
            "users": [{"name": "tester", "user": {}}],
            "contexts": [{"name": "testcluster", "context": {"cluster": "testcluster", "user": "tester",
                                                              "namespace": "default"}}]}


def _gates(text: str | None) -> dict[str, bool]:
    gates = {}
    for item in (text or "").split(","):
        if item.strip():
            name, _, value = item.partition("=")
            gates[name.strip()] = value.strip().lower() == "true"
    return gates


def _populate(store: Store, nodes: list[dict]) -> None:
    for spec in nodes:
        store.create(store.kind("", "v1", "nodes"), None, node_object(spec))
    if any(spec.get("dra") for spec in nodes):  # what NVIDIA's DRA driver (chart and kubelet plugin) publishes
        for device_class in nvidia_device_classes():
            store.create(store.kind("resource.k8s.io", "v1", "deviceclasses"), None, device_class)
        for spec in nodes:
            if spec.get("dra"):
                store.create(store.kind("resource.k8s.io", "v1", "resourceslices"), None, resource_slice(spec))


async def main(args) -> None:
    store = Store(_gates(args.feature_gates), gc_delay=args.gc_delay)
    nodes = json.loads(Path(args.nodes).read_text()) if args.nodes else DEFAULT_NODES
    nodes = nodes + hollow_nodes(args.hollow_nodes) if args.hollow_nodes else nodes
    _populate(store, nodes)
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    slow = {p: float(s) for p, _, s in (x.rpartition("=") for x in args.slow_image or [])}
    dead = {n["name"] for n in nodes if not n.get("kubelet", True)}
    hollow = HollowKubelet(store, [n for n in nodes if n.get("hollow") and n.get("kubelet", True)], pid1=args.pid1)
    kubelet = Kubelet(store, state, args.image or ["*"], slow_images=slow, dead_nodes=dead,
                      hollow_nodes={n["name"] for n in nodes if n.get("hollow")}, pid1=args.pid1)
    server = ApiServer(store)
    port = await server.start(args.port)
    url = f"http://127.0.0.1:{port}"
    (state / "kubeconfig").write_text(json.dumps(kubeconfig(url), indent=1))

    async def collect() -> None:
        while True:
            store.collect_garbage()
            await asyncio.sleep(0.25)

    tasks = [asyncio.create_task(t) for t in (Scheduler(store, spread=args.spread).run(), kubelet.run(),
                                              hollow.run(), ClaimController(store).run(), collect())]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"testcluster ready {url}", flush=True)
    done = asyncio.ensure_future(stop.wait())
    await asyncio.wait([done, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        if t.done() and t.exception():
            logging.error("a test cluster component failed", exc_info=t.exception())
    kubelet.kill_all()
    for t in tasks:
        t.cancel()
    await server.stop()
    store.close_watches()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="testcluster", description=__doc__)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--nodes", help="a JSON file: a list of {name, labels, allocatable, taints, kubelet, dra, "
                                        "hollow, startSeconds}")
    parser.add_argument("--image", action="append", help="image patterns that pull (default: all)")
    parser.add_argument("--slow-image", action="append", help="PATTERN=SECONDS: images whose pull takes that long")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--feature-gates", help="NAME=true|false,... (store.FEATURE_GATES: 1.34's defaults)")
    parser.add_argument("--hollow-nodes", type=int, default=0,
                        help="add this many hollow GPU nodes (hollow.py: pods marked Running, nothing run)")
    parser.add_argument("--pid1", action="store_true",
                        help="a container's process ignores a SIGTERM it has no handler for, as a PID 1 does")
    parser.add_argument("--gc-delay", type=float, default=0.0,
                        help="seconds the garbage collector waits after an owner went before it acts on its dependents")
    parser.add_argument("--spread", action="store_true",
                        help="schedule each pod on the fitting node with the fewest pods")
    parser.add_argument("--log-level", default="WARNING")
    a = parser.parse_args()
    logging.basicConfig(level=a.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(a))
