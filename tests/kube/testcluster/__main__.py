"""Run the test cluster: ``python -m testcluster --state-dir DIR [--nodes FILE] [--image PATTERN]...
[--feature-gates DRAConsumableCapacity=true] [--hollow-nodes N] [--pid1] [--gc-delay SECONDS] [--spread]
[--log-file FILE] [--reusable]``.

Starts the API server on 127.0.0.1 (a free port unless ``--port``), the
scheduler, the kubelet (and the hollow nodes' kubelet) and the garbage collector in one process; writes
``DIR/kubeconfig`` and then prints ``testcluster ready <url>`` on stdout.
SIGTERM or SIGINT (or, ``--reusable``, the end of stdin) stops every pod's process, then the cluster.

``--reusable``: a test suite runs one cluster after another in the same process, sparing each the interpreter's
start and imports.  The line ``park`` on stdin ends the run (every pod's process killed and waited for, every
connection and watch closed, nothing listening) and answers ``testcluster parked``; the line ``run ARGS``
(a JSON list of these options) starts a new run: a new, empty state on a new port (a client of the last run
finds nothing listening there), logging to its own ``--log-file``, answered with ``testcluster ready <url>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from .apiserver import ApiServer
from .dra import ClaimController, nvidia_device_classes, resource_slice
from .hollow import HollowKubelet, hollow_nodes
from .kubelet import Kubelet, cancel
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


class Run:
    """One run of the cluster: a state built from the command line's options, and the controllers acting on it."""

    def __init__(self, args) -> None:
        self.args = args
        self.store = store = Store(_gates(args.feature_gates), gc_delay=args.gc_delay)
        nodes = json.loads(Path(args.nodes).read_text()) if args.nodes else DEFAULT_NODES
        nodes = nodes + hollow_nodes(args.hollow_nodes) if args.hollow_nodes else nodes
        _populate(store, nodes)
        self.state = Path(args.state_dir)
        self.state.mkdir(parents=True, exist_ok=True)
        slow = {p: float(s) for p, _, s in (x.rpartition("=") for x in args.slow_image or [])}
        dead = {n["name"] for n in nodes if not n.get("kubelet", True)}
        self.hollow = HollowKubelet(store, [n for n in nodes if n.get("hollow") and n.get("kubelet", True)],
                                    pid1=args.pid1)
        self.kubelet = Kubelet(store, self.state, args.image or ["*"], slow_images=slow, dead_nodes=dead,
                               hollow_nodes={n["name"] for n in nodes if n.get("hollow")}, pid1=args.pid1)
        self.tasks: list[asyncio.Task] = []

    def start(self, port: int) -> str:
        """The controllers started and the kubeconfig written for the API server on ``port``; its URL."""
        url = f"http://127.0.0.1:{port}"
        (self.state / "kubeconfig").write_text(json.dumps(kubeconfig(url), indent=1))

        async def collect() -> None:
            while True:
                self.store.collect_garbage()
                await asyncio.sleep(0.25)

        self.tasks = [asyncio.create_task(t) for t in (Scheduler(self.store, spread=self.args.spread).run(),
                                                       self.kubelet.run(), self.hollow.run(),
                                                       ClaimController(self.store).run(), collect())]
        return url

    async def stop(self) -> None:
        """Every pod's process killed and waited for, the controllers stopped, every watch stream ended."""
        for t in self.tasks:
            if t.done() and not t.cancelled() and t.exception():
                logging.error("a test cluster component failed", exc_info=t.exception())
        await self.kubelet.stop()
        await cancel(self.tasks)
        self.store.close_watches()


def _log_to(path: str | None) -> None:
    """The process's stderr (its log, and whatever a library prints there) goes to ``path`` from now on."""
    if path:
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)


async def _commands() -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _next(stop: asyncio.Event, commands: asyncio.StreamReader | None, *tasks: asyncio.Task) -> bytes:
    """Until SIGTERM, one of ``tasks`` ends (a component's failure) or, reusable, a command comes on stdin: its
    line (b"" for the others, and at stdin's end)."""
    waits = [asyncio.ensure_future(stop.wait()), *tasks]
    line = asyncio.ensure_future(commands.readline()) if commands is not None else None
    try:
        await asyncio.wait(waits + ([line] if line else []), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waits[0].cancel()
    if line is not None and line.done():
        return line.result()
    if line is not None:
        line.cancel()
    return b""


async def main(args) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    commands = await _commands() if args.reusable else None
    server: ApiServer | None = None
    while True:
        _log_to(args.log_file)
        logging.getLogger().setLevel(args.log_level)
        run = Run(args)
        if server is None:
            server = ApiServer(run.store)
        else:
            server.use(run.store)
        print(f"testcluster ready {run.start(await server.start(args.port))}", flush=True)
        command = await _next(stop, commands, *run.tasks)
        await run.stop()
        await server.stop()
        if command.strip() != b"park":
            return
        print("testcluster parked", flush=True)
        command = await _next(stop, commands)
        if not command.startswith(b"run "):
            return
        args = parser().parse_args(json.loads(command[4:]))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="testcluster", description=__doc__)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--nodes", help="a JSON file: a list of {name, labels, allocatable, taints, kubelet, dra, "
                                   "hollow, startSeconds}")
    p.add_argument("--image", action="append", help="image patterns that pull (default: all)")
    p.add_argument("--slow-image", action="append", help="PATTERN=SECONDS: images whose pull takes that long")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--feature-gates", help="NAME=true|false,... (store.FEATURE_GATES: 1.34's defaults)")
    p.add_argument("--hollow-nodes", type=int, default=0,
                   help="add this many hollow GPU nodes (hollow.py: pods marked Running, nothing run)")
    p.add_argument("--pid1", action="store_true",
                   help="a container's process ignores a SIGTERM it has no handler for, as a PID 1 does")
    p.add_argument("--gc-delay", type=float, default=0.0,
                   help="seconds the garbage collector waits after an owner went before it acts on its dependents")
    p.add_argument("--spread", action="store_true", help="schedule each pod on the fitting node with the fewest pods")
    p.add_argument("--log-file", help="where this run logs (default: stderr)")
    p.add_argument("--reusable", action="store_true", help="run after run in this process: see above")
    p.add_argument("--log-level", default="WARNING")
    return p


if __name__ == "__main__":
    a = parser().parse_args()
    logging.basicConfig(level=a.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(a))
