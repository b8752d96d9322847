"""Prometheus metrics of hibernation (served by jupyter_server's ``/metrics`` with the rest)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
HIBERNATED_KERNELS = Gauge("jupyter_gpu_pool_hibernated_kernels", "Kernels of this server now hibernated.")
HIBERNATED_HOST_BYTES = Gauge("jupyter_gpu_pool_hibernated_host_bytes",
                              "Host RAM held by this machine's hibernated kernels (all servers).")
RESUME_QUEUE = Gauge("jupyter_gpu_pool_resume_queued_kernels", "Kernels of this server waiting in the queue to resume.")
