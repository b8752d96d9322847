"""Prometheus metrics, served by jupyter_server's own ``/metrics``.

Pool-wide gauges come from the culler's latest snapshot through a collector
(a scrape does no I/O); the counters and histograms are fed by the recorder
(``recorder.py``), which puts every action on record.  Every server sharing a
ledger reports the same pool-wide gauges: scrape one of them for those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from ..pool import HIBERNATED, Profile, Snapshot
from ..pool.leases import ACTIVE
from ..pool.phases import NO_GPU_YET

ACTIONS = Counter(
    "jupyter_gpu_pool_policy_actions",
    "Idle-policy and user actions on GPU kernels, by action and reason (dry_run: reported only).",
    ["action", "reason", "dry_run"],
)

_SECONDS = (0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
HIBERNATIONS = Counter("jupyter_gpu_pool_hibernations_total",
                       "Hibernation attempts by result (hibernated, refused, failed).", ["result"])
RESUMES = Counter("jupyter_gpu_pool_resumes_total", "Resume attempts by result (resumed, refused, failed).",
                  ["result"])
HIBERNATE_SECONDS = Histogram("jupyter_gpu_pool_hibernate_seconds",
                              "Time from lock to checkpointed, per hibernated kernel.", buckets=_SECONDS)
RESUME_SECONDS = Histogram("jupyter_gpu_pool_resume_seconds",
                           "Time from the resume request to a running kernel, queue wait included.", buckets=_SECONDS)
MOVED_BYTES = Counter("jupyter_gpu_pool_hibernation_moved_bytes_total",
                      "GPU memory moved between GPU and host RAM, by direction (to_host, to_gpu).", ["direction"])


@dataclass
class MetricsView:
    snapshot: Snapshot
    profiles: dict[str, Profile]
    device_utilization: dict[str, float] = field(default_factory=dict)
    # kernel id -> (user, profile, utilization or None, memory used or None)
    kernels: dict[str, tuple[str, str, float | None, int | None]] = field(default_factory=dict)


def slice_capacity(gpu_memory: int, free_memory: int, free_sm: int, profile: Profile, empty: bool) -> int:
    """How many slices of ``profile`` fit in what is free (whole GPUs: 1 on an empty GPU)."""
    spec = profile.slice
    if spec.whole:
        return 1 if empty and spec.gpu_count == 1 else 0
    n = free_memory // spec.memory  # type: ignore[operator]
    if spec.sm_percent:
        n = min(n, free_sm // spec.sm_percent)
    return int(n)


class PoolCollector:
    def __init__(self) -> None:
        self.view: MetricsView | None = None

    def describe(self):
        return []  # names vary with the pool; nothing to check at registration

    def collect(self):
        view = self.view
        if view is None:
            return
        g = {name: GaugeMetricFamily(f"jupyter_gpu_pool_{name}", doc, labels=labels) for name, doc, labels in (
            ("gpu_memory_used_bytes", "GPU memory held by slices, per GPU", ["gpu", "name"]),
            ("gpu_memory_total_bytes", "GPU memory per GPU", ["gpu", "name"]),
            ("gpu_sm_percent_used", "SM share held by slices, per GPU (100: all SMs)", ["gpu"]),
            ("gpu_slices_used", "Slices (leases) held on each GPU", ["gpu"]),
            ("gpu_slices_total", "Slices of each profile an empty GPU holds", ["gpu", "profile"]),
            ("gpu_slices_free", "Slices of each profile that still fit on each GPU", ["gpu", "profile"]),
            ("gpu_utilization_percent", "Device utilization from NVML (detected GPUs only)", ["gpu"]),
            ("leases", "Leases by state (queued: requests waiting for a slice; no_gpu_yet: kernels that take theirs "
                       "at their first cell)", ["state"]),
            ("kernel_gpu_utilization_percent", "Per-kernel GPU utilization from NVML",
             ["kernel_id", "user", "profile"]),
            ("kernel_gpu_memory_used_bytes", "Per-kernel GPU memory from NVML", ["kernel_id", "user", "profile"]),
            ("hibernated_kernels", "Kernels now hibernated (all servers of the pool)", []),
            ("hibernated_host_bytes", "Host RAM held by hibernated kernels, per machine", ["host"]),
            ("resume_queued_kernels", "Hibernated kernels waiting in the queue to resume", []),
        )}
        for u in view.snapshot.gpus:
            gpu = u.gpu
            g["gpu_memory_used_bytes"].add_metric([gpu.uuid, gpu.name], u.memory)
            g["gpu_memory_total_bytes"].add_metric([gpu.uuid, gpu.name], gpu.memory)
            g["gpu_sm_percent_used"].add_metric([gpu.uuid], u.sm_percent)
            g["gpu_slices_used"].add_metric([gpu.uuid], u.leases)
            for name, profile in view.profiles.items():
                g["gpu_slices_total"].add_metric(
                    [gpu.uuid, name], slice_capacity(gpu.memory, gpu.memory, 100, profile, True))
                g["gpu_slices_free"].add_metric(
                    [gpu.uuid, name], slice_capacity(gpu.memory, u.free_memory, u.free_sm, profile, u.leases == 0))
            if gpu.uuid in view.device_utilization:
                g["gpu_utilization_percent"].add_metric([gpu.uuid], view.device_utilization[gpu.uuid])
        states = {ACTIVE: 0, HIBERNATED: 0, NO_GPU_YET: 0}
        for lease in view.snapshot.leases:
            state = NO_GPU_YET if lease.awaits_first_cell else lease.state  # never hibernated: not counted so
            states[state] = states.get(state, 0) + 1
        states["queued"] = len(view.snapshot.waiters)
        for state, n in states.items():
            g["leases"].add_metric([state], n)
        g["hibernated_kernels"].add_metric([], states[HIBERNATED])
        host_bytes: dict[str, int] = {}
        for lease in view.snapshot.leases:
            if lease.host_bytes:
                host_bytes[lease.host] = host_bytes.get(lease.host, 0) + lease.host_bytes
        for host, n in host_bytes.items():
            g["hibernated_host_bytes"].add_metric([host], n)
        g["resume_queued_kernels"].add_metric([], sum(1 for w in view.snapshot.waiters if w.for_resume))
        for kid, (user, profile, util, memory) in view.kernels.items():
            if util is not None:
                g["kernel_gpu_utilization_percent"].add_metric([kid, user, profile], util)
            if memory is not None:
                g["kernel_gpu_memory_used_bytes"].add_metric([kid, user, profile], memory)
        yield from g.values()


COLLECTOR = PoolCollector()
REGISTRY.register(COLLECTOR)


def count(action: str, reason: str, dry_run: bool = False) -> None:
    ACTIONS.labels(action=action, reason=reason or "none", dry_run=str(bool(dry_run)).lower()).inc()


def count_move(kind: str, action: str | None, dry_run: bool, duration: float | None, moved: int | None) -> None:
    """Hibernations and resumes by result, with their durations and the bytes moved."""
    if dry_run:
        return
    if kind == "hibernated":
        HIBERNATIONS.labels("hibernated").inc()
        HIBERNATE_SECONDS.observe(duration or 0.0)
        MOVED_BYTES.labels("to_host").inc(moved or 0)
    elif kind == "resumed":
        RESUMES.labels("resumed").inc()
        RESUME_SECONDS.observe(duration or 0.0)
        MOVED_BYTES.labels("to_gpu").inc(moved or 0)
    elif kind in ("refused", "hibernation_failed") and action in ("hibernate", "resume"):
        counter = HIBERNATIONS if action == "hibernate" else RESUMES
        counter.labels("refused" if kind == "refused" else "failed").inc()
