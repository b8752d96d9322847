"""Prometheus metrics, served by jupyter_server's own ``/metrics``.

Pool-wide gauges come from the culler's latest snapshot through a collector
(a scrape does no I/O); the action counter counts every policy decision that
acts, warns or is snoozed, by reason.  Every server sharing a ledger reports
the same pool-wide gauges: scrape one of them for those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily

from ..pool import HIBERNATED, Profile, Snapshot
from ..pool.leases import ACTIVE

ACTIONS = Counter(
    "jupyter_gpu_pool_policy_actions",
    "Idle-policy and user actions on GPU kernels, by action and reason (dry_run: reported only).",
    ["action", "reason", "dry_run"],
)


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
            ("leases", "Leases by state (queued: requests waiting for a slice)", ["state"]),
            ("kernel_gpu_utilization_percent", "Per-kernel GPU utilization from NVML",
             ["kernel_id", "user", "profile"]),
            ("kernel_gpu_memory_used_bytes", "Per-kernel GPU memory from NVML", ["kernel_id", "user", "profile"]),
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
        states = {ACTIVE: 0, HIBERNATED: 0}
        for lease in view.snapshot.leases:
            states[lease.state] = states.get(lease.state, 0) + 1
        states["queued"] = len(view.snapshot.waiters)
        for state, n in states.items():
            g["leases"].add_metric([state], n)
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
