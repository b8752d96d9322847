"""A burst of kernels against the operator: K GPUKernels created at once on hollow GPU nodes, against the
same K pods created directly (what the cluster allows without the operator).

    .venv/bin/python benchmarks/operator_burst.py [--kernels 100,500,2000] [--nodes-per-kernel 0.1]
        [--time-limit 180] [--rest 60] [--heartbeat-interval 30] [--quotas 10,100] [--json OUT] [--smoke]

For each K, on a fresh in-repo test cluster (tests/kube/testcluster, its own process) with hollow GPU nodes
(testcluster/hollow.py: bound pods are marked Running as a kubelet reports them; nothing runs), K/10 nodes
and at least 50 (8 GPUs each under HAMi), pods spread over them, the deploy/examples quotas and policy:

1. the operator from this checkout, its default settings (it serves the kernels' namespace, with its own
   token so the API server's audit log says what it asked), and nothing else;
2. K GPUKernels created at once, as users' servers do (one per user, the provisioner's body, each renewing
   its heartbeat every ``--heartbeat-interval`` seconds from a phase of its own, through the provisioner's
   own ``KernelSession.beat``), watched as the servers watch them;
3. until every kernel is Running or ``--time-limit`` is reached: create→admitted and create→Running
   (p50/p95/p99 of the kernels that got there by then, from the moment the API server answered the create
   to the watch event that showed it),
   when all were Running; the operator's requests (audit log, by its token) by verb and resource, per
   kernel, its writes per kernel and status patches per kernel;
4. ``--rest`` seconds with K kernels Running (or, where the time limit came first, as many as were) and
   heartbeats going on: the operator's requests per minute and CPU seconds per minute;
5. throughout: the operator's CPU (peak CPU seconds per minute over 10 s windows), its peak RSS (and per
   kernel, over what it held before the burst), the test cluster's CPU (to show it was not the limit), and
   the longest stall of the operator's event loop: its liveness endpoint asked every 50 ms by a prober
   process of its own (benchmarks/loop_probe.py), beside an idle process asked the same way (what the
   machine alone adds);
6. the floor: a fresh cluster with the same nodes, the same K pods (the operator's own pod spec) created at
   once directly, with no operator: create→Running and when all were Running from the pod watch.  The
   ratio of the two is what the operator adds.

Then, once (``--quotas``): for Q in 10, 100, a fresh cluster with the 3 example quotas and Q new ones, the
operator started over them: its ``patch gpuquotas/status`` requests until it is quiet (``--quiet``, 5 s,
without one; at most 60 s); then Q more quotas created at once: the same.  One status write per new quota
is linear.

``--smoke``: 10 kernels on 2 nodes, 3 s at rest, 2 s heartbeats, Q = 3 (2 s quiet): that it runs.
Everything shares this machine's CPUs with whatever else runs on it: see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "kube"), str(REPO / "tests")]  # the test cluster and its helpers

NS = "jhub"
WRITES = ("create", "update", "patch", "delete", "deletecollection")


# -- measuring ------------------------------------------------------------------------------------------

class Sampler:
    """CPU seconds and RSS of some processes, twice a second."""

    def __init__(self, pids: dict[str, int]):
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in pids}

    def sample(self) -> None:
        at = time.time()
        for name, proc in self.procs.items():
            try:
                cpu = proc.cpu_times()
                self.samples[name].append((at, cpu.user + cpu.system, proc.memory_info().rss))
            except psutil.Error:
                pass

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.5)

    def cpu(self, name: str, start: float, end: float) -> float:
        """CPU seconds used between two moments (from the last sample at or before ``start`` to the first at or
        after ``end``: a window up to a sampling interval wider on each side)."""
        s = self.samples[name]
        first = next((x for x in reversed(s) if x[0] <= start), s[0] if s else None)
        last = next((x for x in s if x[0] >= end), s[-1] if s else None)
        return last[1] - first[1] if first and last else 0.0

    def peak_cpu_per_minute(self, name: str, window: float = 10.0) -> float:
        s = self.samples[name]
        best = 0.0
        j = 0
        for i in range(len(s)):
            while s[i][0] - s[j][0] > window:
                j += 1
            if s[i][0] - s[j][0] >= window / 2:
                best = max(best, (s[i][1] - s[j][1]) / (s[i][0] - s[j][0]) * 60)
        return best

    def rss(self, name: str, start: float = 0.0, end: float = float("inf")) -> int:
        return max((s[2] for s in self.samples[name] if start <= s[0] <= end), default=0)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "count": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": round(statistics.median(ordered), 3), "p95": at(0.95), "p99": at(0.99), "count": len(values)}


def requests_summary(entries: list[dict], kernels: int) -> dict:
    by = Counter(f"{e['verb']} {e['resource']}" for e in entries)
    writes = sum(n for what, n in by.items() if what.split()[0] in WRITES)
    started = by.get("create pods", 0)  # kernels whose pod the operator made (all of them, in a run that ends)
    return {"total": len(entries), "per_kernel": round(len(entries) / kernels, 2),
            "writes_per_kernel": round(writes / kernels, 2),
            "writes_per_started_kernel": round(writes / started, 2) if started else None,
            "status_patches_per_kernel": round(by.get("patch gpukernels/status", 0) / kernels, 2),
            "by_verb_and_resource": dict(by.most_common())}


def stalls(samples: dict[str, list], start: float, end: float) -> dict:
    """The probes' waits (ms) between two moments: the operator's liveness endpoint, and the idle process's."""
    out = {}
    for who, series in samples.items():
        waits = [w for at, w in series if start <= at <= end and w is not None]
        lost = sum(1 for at, w in series if start <= at <= end and w is None)
        ordered = sorted(waits)
        out[who] = {"max_ms": round(1000 * ordered[-1], 1) if ordered else None,
                    "p50_ms": round(1000 * ordered[len(ordered) // 2], 1) if ordered else None,
                    "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1) if ordered else None,
                    "over_100ms": sum(1 for w in waits if w > 0.1), "samples": len(waits), "unanswered": lost}
    return out


# -- the users' servers -------------------------------------------------------------------------------

class Servers:
    """K users' servers, as the cluster sees them: each creates its kernel's GPUKernel (the provisioner's
    body) and renews its heartbeat every ``interval`` from a phase of its own; one watch shows the kernels'
    status (the provisioner's KernelSession), and when each was first admitted and Running."""

    def __init__(self, cluster, interval: float):
        self.cluster = cluster
        self.interval = interval
        self.session = None
        self.created: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._beats: list[tuple[float, str]] = []
        self._beating: set[asyncio.Task] = set()

    async def start(self) -> None:
        from jupyter_gpu_pool.cluster.session import KernelSession
        from jupyter_gpu_pool.cluster.settings import GPUPoolKubernetes

        settings = GPUPoolKubernetes(kubeconfig=self.cluster.kubeconfig_for("servers"), namespace=NS,
                                     server_id="bench-servers", heartbeat_interval=3600.0)
        self.session = await KernelSession.get(settings)
        self.session.listeners.append(self._seen)

    def _seen(self, event_type: str, body: dict) -> None:
        name, st, now = body["metadata"]["name"], body.get("status") or {}, time.time()
        if st.get("admitted") and name not in self.admitted:
            self.admitted[name] = now
        if st.get("phase") == "Running" and name not in self.running:
            self.running[name] = now

    @staticmethod
    def body(user: str) -> dict:
        """What the gpu-pool-kubernetes provisioner creates (kernel_provisioner/kubernetes.py ``_body``)."""
        from jupyter_gpu_pool.cluster.resources import (ANNOTATION_HEARTBEAT, API_VERSION, KERNEL_KIND, LABEL_OWNER,
                                                        LABEL_PART_OF, LABEL_SERVER, PART_OF, kernel_name,
                                                        label_value)

        kernel_id = str(uuid.uuid4())
        return {"apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {
            "name": kernel_name(kernel_id), "namespace": NS,
            "labels": {LABEL_SERVER: label_value(f"{user}-server"), LABEL_OWNER: label_value(user),
                       LABEL_PART_OF: PART_OF},
            "annotations": {ANNOTATION_HEARTBEAT: f"{time.time():.3f}"}},
            "spec": {"owner": user, "kernelId": kernel_id, "kernelName": "gpu-pool-kubernetes-small",
                     "profile": "small", "launch": 1, "stopped": False, "label": f"{user}/lab.ipynb",
                     "server": {"id": f"{user}-server", "namespace": NS, "pod": ""}}}

    async def create(self, users: list[str]) -> None:
        from jupyter_gpu_pool.cluster.resources import GROUP, KERNELS, VERSION

        async def one(user: str) -> None:
            made = await self.session.custom.create_namespaced_custom_object(GROUP, VERSION, NS, KERNELS,
                                                                             self.body(user))
            name = made["metadata"]["name"]
            self.created[name] = time.time()
            heapq.heappush(self._beats, (time.monotonic() + random.uniform(0, self.interval), name))

        await asyncio.gather(*(one(u) for u in users))

    async def beat(self) -> None:
        """Renew each kernel's heartbeat every ``interval`` (the provisioner's own patch)."""
        while True:
            if not self._beats or self._beats[0][0] > time.monotonic():
                await asyncio.sleep(min(1.0, self._beats[0][0] - time.monotonic()) if self._beats else 0.5)
                continue
            due, name = heapq.heappop(self._beats)
            heapq.heappush(self._beats, (due + self.interval, name))
            task = asyncio.create_task(self.session.beat(name))
            self._beating.add(task)
            task.add_done_callback(self._beating.discard)

    async def close(self) -> None:
        from jupyter_gpu_pool.cluster.session import KernelSession

        for task in list(self._beating):
            task.cancel()
        await asyncio.gather(*self._beating, return_exceptions=True)
        await KernelSession.close_all()


# -- one run ------------------------------------------------------------------------------------------

async def prepare(root: Path, nodes: int):
    """A fresh test cluster with ``nodes`` hollow GPU nodes, the CRDs, the kernels' namespace and
    deploy/examples' quotas and policy."""
    from kube_helpers import TestCluster, install
    from kubernetes_asyncio import client

    from jupyter_gpu_pool.cluster.resources import GROUP, VERSION

    root.mkdir(parents=True, exist_ok=True)
    cluster = TestCluster(root, hollow_nodes=nodes, spread=True).start()
    await install(cluster)
    api = await cluster.api()
    async with api:
        custom = client.CustomObjectsApi(api)
        for path in ("quotas.yaml", "policy.yaml"):
            for doc in yaml.safe_load_all((REPO / "deploy" / "examples" / path).read_text()):
                plural = {"GPUQuota": "gpuquotas", "GPUPoolPolicy": "gpupoolpolicies"}[doc["kind"]]
                await custom.create_cluster_custom_object(GROUP, VERSION, plural, doc)
    return cluster


def start_operator(cluster, root: Path, liveness_port: int):
    """The operator from this checkout with its default settings, but for what the test cluster needs: the
    kernels' namespace, an image of the hollow nodes, no metrics port (another run may hold 9090), and its
    liveness endpoint on a free port."""
    from kube_helpers import OperatorProcess

    return OperatorProcess(cluster, root, {
        "GPUPoolOperator.namespaces": [NS], "GPUPoolOperator.kernel_image": "quay.io/jupyter/pytorch-notebook:hollow",
        "GPUPoolOperator.metrics_port": 0,
        "OperatorApp.liveness_endpoint": f"http://127.0.0.1:{liveness_port}/healthz"},
        kubeconfig=cluster.kubeconfig_for("operator"), fast=False, log_level=None).start()


class Probe:
    """benchmarks/loop_probe.py on the operator's liveness endpoint and on an idle process; a second prober
    on the test cluster (a discovery request: what any request waits for the cluster's loop to take it up)."""

    def __init__(self, root: Path, liveness_port: int, cluster_url: str):
        from kernel_helpers import free_port

        idle_port = free_port()
        empty = root / "idle"
        empty.mkdir(exist_ok=True)
        self.idle = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(idle_port),
                                      "--directory", str(empty)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.urls = {"operator": f"http://127.0.0.1:{liveness_port}/healthz", "idle": f"http://127.0.0.1:{idle_port}/"}
        self.cluster_url = f"{cluster_url}/healthz"
        self.out, self.cluster_out = root / "probe.json", root / "probe-cluster.json"
        self.procs = [subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "loop_probe.py"), str(out), *urls])
                      for out, urls in ((self.out, self.urls.values()), (self.cluster_out, [self.cluster_url]))]

    def stop(self) -> dict[str, list]:
        for proc in self.procs:
            proc.terminate()
            proc.wait(30)
        self.idle.terminate()
        self.idle.wait(10)
        raw = json.loads(self.out.read_text())
        return {**{who: raw[url] for who, url in self.urls.items()},
                "cluster": json.loads(self.cluster_out.read_text())[self.cluster_url]}


class Profiler:
    """``--profile DIR``: py-spy (``pip install py-spy``) records the operator and the test cluster, one phase
    at a time (``DIR/k500-burst-operator.txt``: py-spy's raw format, collapsed stacks and their counts)."""

    def __init__(self, out: str | None, pids: dict[str, int]):
        self.out, self.pids = Path(out) if out else None, pids
        self.procs: list[subprocess.Popen] = []

    def start(self, phase: str) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        self.procs = [subprocess.Popen([spy or "py-spy", "record", "-p", str(pid), "-r", "100",
                                        "-f", "raw", "-o", str(self.out / f"{phase}-{who}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for who, pid in self.pids.items()]

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes what it recorded, and ends
        for proc in self.procs:
            proc.wait(60)
        self.procs = []


async def wait_for_liveness(url: str, timeout: float = 60) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the operator's liveness endpoint {url} did not answer")


async def until_all_running(servers: Servers, kernels: int, deadline: float) -> float | None:
    """When the last kernel was seen Running (None: not all by the deadline)."""
    while time.time() < deadline:
        if len(servers.running) >= kernels:
            return max(servers.running.values())
        await asyncio.sleep(0.25)
    return None


async def run_burst(kernels: int, nodes: int, root: Path, args) -> tuple[dict, dict]:
    """The operator's run (results, and one of its kernel pods as the direct run's template)."""
    from kernel_helpers import free_port
    from kube_helpers import operator_ready

    cluster = await prepare(root, nodes)
    operator = probe = profiler = None
    servers = Servers(cluster, args.heartbeat_interval)
    tasks: list[asyncio.Task] = []
    try:
        port = free_port()
        operator = start_operator(cluster, root, port)
        await operator_ready(cluster)
        await wait_for_liveness(f"http://127.0.0.1:{port}/healthz")
        sampler = Sampler({"operator": operator.proc.pid, "cluster": cluster.proc.pid, "benchmark": os.getpid()})
        probe = Probe(root, port, cluster.url)
        profiler = Profiler(args.profile, {"operator": operator.proc.pid, "cluster": cluster.proc.pid})
        await servers.start()
        tasks = [asyncio.create_task(sampler.run()), asyncio.create_task(servers.beat())]
        await asyncio.sleep(2.0)  # a baseline: the operator's RSS and probes before the burst
        mark, before = len(await cluster.audit()), time.time()
        profiler.start(f"k{kernels}-burst")
        await servers.create([f"student-{i:05d}" for i in range(kernels)])
        created_all = time.time()
        done = await until_all_running(servers, kernels, before + args.time_limit)
        burst_end = done or time.time()
        profiler.stop()
        everyone = await cluster.audit(since=mark)
        burst = [e for e in everyone if e["user"] == "operator"]
        profiler.start(f"k{kernels}-rest")
        rest_start = time.time()
        await asyncio.sleep(args.rest)
        rest_end = time.time()
        profiler.stop()
        resting = [e for e in await cluster.audit(user="operator", since=mark) if rest_start <= e["at"] <= rest_end]
        template = await kernel_pod(cluster)
        probes = probe.stop()
        probe = None
        result = burst_result(kernels, nodes, servers, sampler, before, created_all, done, burst_end)
        result["operator_requests"] = requests_summary([e for e in burst if e["at"] <= burst_end], kernels)
        started = result["operator_requests"]["by_verb_and_resource"].get("create pods", 0)
        result["operator_cpu_ms_per_started_kernel"] = (round(1000 * result["operator_cpu_s_burst"] / started, 1)
                                                        if started else None)
        result["at_rest"] = rest_result(kernels, sampler, resting, rest_start, rest_end, servers)
        result["event_loop_stalls"] = {"burst": stalls(probes, before, burst_end),
                                       "at_rest": stalls(probes, rest_start, rest_end)}
        result["where_the_time_goes"] = time_on_path([e for e in everyone if e["at"] <= burst_end], servers)
        return result, template
    finally:
        for task in tasks:
            task.cancel()
        await servers.close()
        if probe is not None:
            probe.stop()
        if profiler is not None:
            profiler.stop()
        if operator is not None:
            operator.stop()
        cluster.stop()


def burst_result(kernels: int, nodes: int, servers: Servers, sampler: Sampler, before: float, created_all: float,
                 done: float | None, burst_end: float) -> dict:
    admitted = [max(0.0, servers.admitted[n] - servers.created[n]) for n in servers.created
                if servers.admitted.get(n, burst_end + 1) <= burst_end]
    running = [max(0.0, servers.running[n] - servers.created[n]) for n in servers.created
               if servers.running.get(n, burst_end + 1) <= burst_end]
    baseline_rss = sampler.rss("operator", 0, before)
    peak_rss = sampler.rss("operator")
    wall = burst_end - before
    return {
        "kernels": kernels, "nodes": nodes, "created_all_s": round(created_all - before, 2),
        "all_running_s": round(done - before, 2) if done else None,
        "running_at_end": len(running), "admitted_at_end": len(admitted),
        "burst_s": round(wall, 2),
        "create_to_admitted_s": percentiles(admitted), "create_to_running_s": percentiles(running),
        "operator_cpu_s_burst": round(sampler.cpu("operator", before, burst_end), 2),
        "operator_peak_cpu_s_per_min": round(sampler.peak_cpu_per_minute("operator"), 1),
        "operator_rss_mib": {"before": round(baseline_rss / 2**20, 1), "peak": round(peak_rss / 2**20, 1),
                             "per_kernel_kib": round((peak_rss - baseline_rss) / kernels / 1024, 1)},
        "cluster_cpu_share_burst": round(sampler.cpu("cluster", before, burst_end) / wall, 2) if wall else None,
        "benchmark_cpu_share_burst": round(sampler.cpu("benchmark", before, burst_end) / wall, 2) if wall else None,
    }


def time_on_path(entries: list[dict], servers: Servers) -> dict:
    """Where each kernel's create→Running went, from the audit log (``at``: when a request came, ``took``: how
    long the cluster served it) and the servers' watch: (1) created → the operator's first request for it
    (kopf's watch event, then the work queue); (2) that request → its pod's create answered (the admission's
    status write, Secret, NetworkPolicy, pod), of which the cluster's serving (``took``); (3) the pod made →
    the operator's Running write (the scheduler and the hollow kubelet, the pod watch, then the work queue);
    (4) that write → the servers' watch shows Running.  Each as p50 / p95 over the kernels, and as the mean of
    the slowest 5% (what the p95 is made of); beside, the cluster's serving time of each kind of request."""
    mine: dict[str, list[dict]] = {}
    for e in entries:
        if e["user"] == "operator" and e.get("name") and e.get("took") is not None:
            mine.setdefault(e["name"][:38], []).append(e)  # k-<uuid>: the kernel's name starts every name
    segments: dict[str, list[float]] = {k: [] for k in ("to_first_request", "start_requests",
                                                         "start_requests_cluster", "pod_to_running_write",
                                                         "running_write_to_seen", "total")}
    slowest = sorted(((servers.running[n] - servers.created[n], n) for n in servers.running if n in servers.created
                      and n in mine), reverse=True)[:max(1, len(servers.running) // 20)]
    worst = {n for _, n in slowest}
    worst_sums: dict[str, float] = {k: 0.0 for k in segments}
    for name, requests in mine.items():
        patches = [e for e in requests if e["resource"] == "gpukernels/status"]
        pods = [e for e in requests if e["verb"] == "create" and e["resource"] == "pods"]
        if name not in servers.running or len(patches) < 2 or not pods:
            continue
        first, pod, last = min(e["at"] for e in requests), pods[0], patches[-1]
        starting = [e for e in requests if first <= e["at"] <= pod["at"]]
        parts = {"to_first_request": first - servers.created[name],
                 "start_requests": pod["at"] + pod["took"] - first,
                 "start_requests_cluster": sum(e["took"] for e in starting),
                 "pod_to_running_write": last["at"] - (pod["at"] + pod["took"]),
                 "running_write_to_seen": servers.running[name] - last["at"],
                 "total": servers.running[name] - servers.created[name]}
        for k, v in parts.items():
            segments[k].append(v)
            if name in worst:
                worst_sums[k] += v / len(worst)
    served: dict[str, list[float]] = {}
    for e in entries:
        if e.get("took") is not None:
            served.setdefault(f"{e['verb']} {e['resource']}", []).append(e["took"])
    return {"kernels": len(segments["total"]),
            "segments_s": {k: {"p50": percentiles(v)["p50"], "p95": percentiles(v)["p95"]} for k, v in segments.items()},
            "slowest_5pct_mean_s": {k: round(v, 3) for k, v in worst_sums.items()},
            "cluster_serving_ms": {what: {"count": len(v), "p50": round(1000 * statistics.median(v), 2),
                                          "p95": round(1000 * sorted(v)[int(0.95 * (len(v) - 1))], 2)}
                                   for what, v in sorted(served.items(), key=lambda kv: -len(kv[1]))[:12]}}


def rest_result(kernels: int, sampler: Sampler, entries: list[dict], start: float, end: float,
                servers: Servers) -> dict:
    minutes = (end - start) / 60
    return {"seconds": round(end - start, 1), "running": len(servers.running),
            "operator_requests_per_min": round(len(entries) / minutes, 1),
            "operator_requests_by_verb_and_resource": dict(Counter(f"{e['verb']} {e['resource']}"
                                                                   for e in entries).most_common()),
            "operator_cpu_s_per_min": round(sampler.cpu("operator", start, end) / minutes, 3),
            "operator_cpu_ms_per_min_per_kernel": round(1000 * sampler.cpu("operator", start, end) / minutes
                                                        / kernels, 3),
            "cluster_cpu_share": round(sampler.cpu("cluster", start, end) / (end - start), 2)}


async def kernel_pod(cluster) -> dict:
    """One of the operator's kernel pods, as the direct run's template (its spec, its labels)."""
    from kube_helpers import Kube

    kube = Kube(await cluster.api(), NS)
    try:
        pods = await kube.pods()
    finally:
        await kube.close()
    if not pods:
        raise RuntimeError("the operator made no pod")
    pod = pods[0]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": pod["metadata"].get("labels") or {}},
            "spec": {k: v for k, v in pod["spec"].items() if k != "nodeName"}}


async def run_direct(kernels: int, nodes: int, root: Path, template: dict, limit: float) -> dict:
    """The floor: the same K pods created at once, no operator; when each was Running (pod watch)."""
    from kube_helpers import Kube

    cluster = await prepare(root, nodes)
    kube = Kube(await cluster.api(), NS)
    running: dict[str, float] = {}
    created: dict[str, float] = {}
    watching = asyncio.create_task(watch_pods(cluster, running))
    try:
        await asyncio.sleep(1.0)  # the watch is open
        before = time.time()

        async def one(i: int) -> None:
            body = json.loads(json.dumps(template))
            body["metadata"]["name"] = f"direct-{i:05d}"
            await kube.core.create_namespaced_pod(NS, body)
            created[body["metadata"]["name"]] = time.time()

        await asyncio.gather(*(one(i) for i in range(kernels)))
        while len(running) < kernels and time.time() < before + limit:
            await asyncio.sleep(0.25)
        times = [running[n] - created[n] for n in created if n in running]
        return {"kernels": kernels, "all_running_s": round(max(running.values()) - before, 2)
                if len(running) >= kernels else None, "running_at_end": len(running),
                "create_to_running_s": percentiles(times)}
    finally:
        watching.cancel()
        await kube.close()
        cluster.stop()


async def watch_pods(cluster, running: dict[str, float]) -> None:
    import aiohttp

    url = f"{cluster.url}/api/v1/namespaces/{NS}/pods"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        async with http.get(url, params={"watch": "1", "timeoutSeconds": "3600"}) as r:
            async for line in r.content:
                pod = json.loads(line)["object"]
                if (pod.get("status") or {}).get("phase") == "Running":
                    running.setdefault(pod["metadata"]["name"], time.time())


# -- quotas -------------------------------------------------------------------------------------------

async def run_quotas(new: int, root: Path, quiet: float) -> dict:
    """The operator's quota status writes: started over the example quotas and ``new`` more, then ``new``
    more created at once."""
    from kernel_helpers import free_port
    from kube_helpers import operator_ready
    from kubernetes_asyncio import client

    from jupyter_gpu_pool.cluster.resources import GROUP, QUOTAS, VERSION

    cluster = await prepare(root, 1)
    operator = None
    api = await cluster.api()
    try:
        custom = client.CustomObjectsApi(api)

        async def make(names: list[str]) -> None:
            await asyncio.gather(*(custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUQuota", "metadata": {"name": f"user-{n}"},
                "spec": {"scope": "user", "name": n, "memory": "40GiB", "kernels": 4}}) for n in names))

        await make([f"first-{i:04d}" for i in range(new)])
        operator = start_operator(cluster, root, free_port())
        await operator_ready(cluster)
        at_start = await quiet_count(cluster, 0, quiet)
        mark = len(await cluster.audit())
        await make([f"later-{i:04d}" for i in range(new)])
        later = await quiet_count(cluster, mark, quiet)
        return {"new_quotas": new, "existing_quotas": 3,
                "status_patches_at_start": at_start, "status_patches_for_new_at_once": later,
                "per_new_quota": {"at_start": round(at_start / new, 2), "at_once": round(later / new, 2)}}
    finally:
        await api.close()
        if operator is not None:
            operator.stop()
        cluster.stop()


async def quiet_count(cluster, since: int, quiet: float = 5.0, limit: float = 60.0) -> int:
    """The operator's ``patch gpuquotas/status`` from the ``since``-th request on, once none came for ``quiet``
    seconds (or after ``limit``)."""
    started = last_change = time.time()
    count = -1
    while time.time() - started < limit:
        now = sum(1 for e in await cluster.audit(user="operator", since=since)
                  if e["verb"] == "patch" and e["resource"] == "gpuquotas/status")
        if now != count:
            count, last_change = now, time.time()
        elif time.time() - last_change >= quiet:
            break
        await asyncio.sleep(0.5)
    return count


# -- the whole --------------------------------------------------------------------------------------------

def table(results: list[dict]) -> str:
    rows = [("kernels (nodes)", lambda r: f"{r['kernels']} ({r['nodes']})"),
            ("all created after", lambda r: f"{r['created_all_s']} s"),
            ("all Running after", lambda r: f"{r['all_running_s']} s" if r["all_running_s"] else
             f"not by {r['burst_s']} s: {r['running_at_end']} Running, {r['admitted_at_end']} admitted"),
            ("create→admitted p50/p95/p99 s", lambda r: "{p50}/{p95}/{p99}".format(**r["create_to_admitted_s"])),
            ("create→Running p50/p95/p99 s", lambda r: "{p50}/{p95}/{p99}".format(**r["create_to_running_s"])),
            ("direct pods: all Running after", lambda r: f"{r['direct']['all_running_s']} s"),
            ("direct pods: create→Running p95 s", lambda r: f"{r['direct']['create_to_running_s']['p95']}"),
            ("ratio all-Running: operator / direct", lambda r: f"{r.get('ratio_all_running')}"),
            ("operator requests (per kernel)", lambda r: "{total} ({per_kernel})".format(**r["operator_requests"])),
            ("writes per kernel", lambda r: f"{r['operator_requests']['writes_per_kernel']}"),
            ("operator CPU ms per kernel started", lambda r: f"{r['operator_cpu_ms_per_started_kernel']}"),
            ("status patches per kernel", lambda r: f"{r['operator_requests']['status_patches_per_kernel']}"),
            ("at rest: requests/min", lambda r: f"{r['at_rest']['operator_requests_per_min']}"),
            ("at rest: CPU s/min (ms/min per kernel)", lambda r: "{operator_cpu_s_per_min} "
             "({operator_cpu_ms_per_min_per_kernel})".format(**r["at_rest"])),
            ("peak CPU s/min", lambda r: f"{r['operator_peak_cpu_s_per_min']}"),
            ("peak RSS MiB (KiB per kernel)", lambda r: "{peak} ({per_kernel_kib})".format(**r["operator_rss_mib"])),
            ("longest stall ms: burst / rest (idle process)", lambda r: "{} / {} ({} / {})".format(
                *(r["event_loop_stalls"][phase][who]["max_ms"] for who in ("operator", "idle")
                  for phase in ("burst", "at_rest")))),
            ("test cluster CPU share in the burst", lambda r: f"{r['cluster_cpu_share_burst']}"),
            ("test cluster's wait to answer, burst p50/max ms", lambda r: "{p50_ms} / {max_ms}".format(
                **r["event_loop_stalls"]["burst"]["cluster"])),
            ("slowest 5%: to 1st request / start", lambda r: "{to_first_request} / {start_requests}".format(
                **r["where_the_time_goes"]["slowest_5pct_mean_s"])),
            ("  (cluster serving) / pod→Running write", lambda r: "({start_requests_cluster}) / "
             "{pod_to_running_write}".format(**r["where_the_time_goes"]["slowest_5pct_mean_s"])),
            ("  Running write → seen, s", lambda r: "{running_write_to_seen}".format(
                **r["where_the_time_goes"]["slowest_5pct_mean_s"]))]
    lines = [f"{'':44}" + "".join(f"{'K=' + str(r['kernels']):>34}" for r in results)]
    for label, cell in rows:
        lines.append(f"{label:44}" + "".join(f"{cell(r):>34}" for r in results))
    return "\n".join(lines)


async def main(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="gpu-pool-operator-burst-"))
    try:
        return await measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def measure(args, root: Path) -> dict:
    results = []
    for kernels in args.kernels:
        nodes = args.nodes or max(50, kernels // 10)
        print(f"K={kernels} on {nodes} hollow nodes: the operator ...", file=sys.stderr, flush=True)
        result, template = await run_burst(kernels, nodes, root / f"k{kernels}", args)
        print(f"K={kernels}: the same pods directly ...", file=sys.stderr, flush=True)
        result["direct"] = await run_direct(kernels, nodes, root / f"k{kernels}-direct", template, args.time_limit)
        if result["all_running_s"] and result["direct"]["all_running_s"]:
            result["ratio_all_running"] = round(result["all_running_s"] / result["direct"]["all_running_s"], 2)
        results.append(result)
    quotas = []
    for new in args.quotas:
        print(f"{new} new quotas ...", file=sys.stderr, flush=True)
        quotas.append(await run_quotas(new, root / f"q{new}", args.quiet))
    return {"runs": results, "quota_status_writes": quotas, "machine": machine(), "settings": {
        "time_limit_s": args.time_limit, "rest_s": args.rest, "heartbeat_interval_s": args.heartbeat_interval}}


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "at": time.strftime("%Y-%m-%d %H:%M:%S")}


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=numbers, default=[100, 500, 2000], help="K values, comma-separated")
    parser.add_argument("--nodes", type=int, default=0, help="hollow nodes (default: K/10, at least 50)")
    parser.add_argument("--time-limit", type=float, default=180.0, help="seconds a burst may take")
    parser.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest, all Running")
    parser.add_argument("--heartbeat-interval", type=float, default=30.0, help="seconds between a server's beats")
    parser.add_argument("--quotas", type=numbers, default=[10, 100], help="new GPUQuotas, comma-separated")
    parser.add_argument("--quiet", type=float, default=5.0, help="seconds without a quota status write: done")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--profile", help="a folder for py-spy profiles of the operator and the test cluster, "
                        "burst and rest apart (py-spy must be installed)")
    parser.add_argument("--smoke", action="store_true", help="10 kernels on 2 nodes, briefly: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.kernels, args.nodes, args.rest, args.heartbeat_interval, args.quotas = [10], 2, 3.0, 2.0, [3]
        args.quiet = 2.0
        args.time_limit = min(args.time_limit, 60.0)
    if not args.kernels or min(args.kernels) < 1 or args.time_limit <= 0 or args.rest <= 0 or \
            args.heartbeat_interval <= 0 or any(q < 1 for q in args.quotas) or args.quiet <= 0:
        parser.error("--kernels, --quotas, --time-limit, --rest, --quiet and --heartbeat-interval must be positive")
    out = asyncio.run(main(args))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(table(out["runs"]))
    for q in out["quota_status_writes"]:
        print(f"quota status writes: {q['new_quotas']} new quotas at the operator's start: "
              f"{q['status_patches_at_start']}; {q['new_quotas']} created at once: "
              f"{q['status_patches_for_new_at_once']}")
    print(json.dumps(out))
