"""Hibernation: an idle kernel gives its GPU back and keeps every variable.

The kernel process lives on; only its GPU memory moves to host RAM (the CUDA driver's checkpoint
API, :mod:`jupyter_gpu_pool.devices.checkpoint`) and back when the kernel is used again.
See docs/hibernation.md.
"""

from .errors import GPUMemoryShort, HibernationError, HibernationFailed, HibernationRefused
from .hibernator import Hibernator, Outcome
from .kernels import Kernels
from ..pool.phases import EVICTING, FAILED, HIBERNATING, QUEUED, RESUMING, display_state
from ..pool.hibernation import EVICT_OLDEST, KEEP_RUNNING, OVER_CAP, SHUTDOWN, HibernationSettings, parse_host_memory

__all__ = [
    "EVICTING",
    "EVICT_OLDEST",
    "FAILED",
    "GPUMemoryShort",
    "HIBERNATING",
    "KEEP_RUNNING",
    "OVER_CAP",
    "QUEUED",
    "RESUMING",
    "SHUTDOWN",
    "HibernationError",
    "HibernationFailed",
    "HibernationRefused",
    "HibernationSettings",
    "Hibernator",
    "Kernels",
    "Outcome",
    "display_state",
    "parse_host_memory",
]
