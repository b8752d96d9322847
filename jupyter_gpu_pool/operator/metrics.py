"""The operator's Prometheus metrics (served on ``GPUPoolOperator.metrics_port`` at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.kernels = Gauge("gpu_pool_operator_kernels", "GPUKernels by phase.", ["phase"], registry=r)
        self.admissions = Counter("gpu_pool_operator_admissions", "Admission decisions, by result.", ["result"],
                                  registry=r)
        self.launch_failures = Counter("gpu_pool_operator_launch_failures",
                                       "Kernel pods that could never start, by reason.", ["reason"], registry=r)
        self.pods_created = Counter("gpu_pool_operator_pods_created", "Kernel pods created.", registry=r)
        self.orphans = Counter("gpu_pool_operator_orphans_deleted",
                               "Kernels deleted because their server stopped its heartbeat.", registry=r)
        self.errors = Counter("gpu_pool_operator_reconcile_errors", "Reconciles that raised.", registry=r)
        self.start_seconds = Histogram("gpu_pool_operator_start_seconds",
                                       "From a kernel's pod created to its container running.",
                                       buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300), registry=r)
