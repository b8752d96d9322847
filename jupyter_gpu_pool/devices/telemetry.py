"""Per-kernel GPU telemetry: memory held and SM utilization of a kernel's process tree.

NVML reports per process (``nvmlDeviceGetComputeRunningProcesses`` for memory,
``nvmlDeviceGetProcessUtilization`` for SM use since the last read).  A kernel
is a process tree (ipykernel plus whatever it spawned: dataloader workers,
``subprocess`` calls), so a reading sums the tree's processes on each of the
kernel's GPUs; utilization is the busiest of its GPUs, capped at 100.

Where NVML is unavailable, or a GPU is declared (not real), a reading is
``None``: never invented.  NVML and psutil block, so :class:`Sampler` does its
work in a thread (``asyncio.to_thread``) and keeps, per kernel, a bounded
history for sparklines and the last time the kernel's GPU use was above each
GPU-idle threshold the policy uses.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from ..periodic import every
from ..pool.gpu_use import GPUUse
from .processes import process_tree

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One process on one GPU."""

    memory: int | None  # bytes (None: NVML would not say)
    utilization: float  # SM percent over the last interval (0 when NVML had no sample for it)


class ProcessSource(Protocol):
    """Where per-process GPU readings come from (NVML on a real machine)."""

    def available(self) -> tuple[bool, str]:
        """Whether readings can be had at all, and why not."""

    def read(self, gpu_uuids: set[str]) -> dict[str, dict[int, ProcessReading]]:
        """Per GPU uuid (only those this source can read), per pid, the process's reading."""

    def device_utilization(self, gpu_uuids: set[str]) -> dict[str, float]:
        """Per GPU uuid, the whole device's SM utilization."""


class NVMLSource:
    """Readings from NVML.  Only GPUs NVML knows are read: declared GPUs never are."""

    def __init__(self) -> None:
        self._last_seen: dict[str, int] = {}  # per GPU, the newest utilization sample already read
        self._handles: dict[str, object] = {}
        self._lock = threading.Lock()
        self._error: str | None = None
        try:
            from . import nvml

            nvml.init()
            self._nv = nvml._pynvml()
        except Exception as e:  # ImportError, pynvml.NVMLError: a machine without a GPU
            self._nv = None
            self._error = f"NVML unavailable: {e}"

    def available(self) -> tuple[bool, str]:
        return (self._nv is not None, self._error or "")

    def _handle(self, uuid: str):
        if uuid not in self._handles:
            try:
                self._handles[uuid] = self._nv.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:  # not a GPU NVML knows (declared), or gone
                self._handles[uuid] = None
        return self._handles[uuid]

    def read(self, gpu_uuids: set[str]) -> dict[str, dict[int, ProcessReading]]:
        if self._nv is None:
            return {}
        nv = self._nv
        out: dict[str, dict[int, ProcessReading]] = {}
        with self._lock:
            for uuid in gpu_uuids:
                handle = self._handle(uuid)
                if handle is None:
                    continue
                memory: dict[int, int | None] = {}
                for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
                    try:
                        for p in getattr(nv, getter)(handle):
                            used = getattr(p, "usedGpuMemory", None)
                            # NVML_VALUE_NOT_AVAILABLE comes back as None or as a huge sentinel
                            if used is not None and used >= 2**63:
                                used = None
                            if used is not None or p.pid not in memory:
                                memory[p.pid] = used
                    except Exception:  # NotSupported (MPS getter on older drivers), NoPermission
                        continue
                util: dict[int, list[float]] = {}
                try:
                    samples = nv.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(uuid, 0))
                except Exception:  # NVMLError_NotFound: no process used the GPU since the last read
                    samples = []
                for s in samples:
                    util.setdefault(s.pid, []).append(float(s.smUtil))
                    self._last_seen[uuid] = max(self._last_seen.get(uuid, 0), int(s.timeStamp))
                out[uuid] = {
                    pid: ProcessReading(memory.get(pid), sum(util[pid]) / len(util[pid]) if pid in util else 0.0)
                    for pid in set(memory) | set(util)
                }
        return out

    def device_utilization(self, gpu_uuids: set[str]) -> dict[str, float]:
        if self._nv is None:
            return {}
        out = {}
        with self._lock:
            for uuid in gpu_uuids:
                handle = self._handle(uuid)
                if handle is None:
                    continue
                try:
                    out[uuid] = float(self._nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception:
                    continue
        return out


@dataclass(frozen=True, slots=True)
class Reading:
    at: float
    memory_used: int | None  # bytes held by the kernel's processes on its GPUs
    utilization: float | None  # percent, the busiest of its GPUs


ENDED_KEPT = 100  # ended kernels whose readings the dashboard may still draw


@dataclass
class KernelTelemetry:
    pid: int
    gpus: frozenset[str]
    history: deque = field(default_factory=lambda: deque(maxlen=120))  # Readings, oldest first
    latest: Reading | None = None
    use: GPUUse = field(default_factory=GPUUse)  # what the idle policy reads of it (pool.gpu_use)


class Sampler:
    """Samples tracked kernels' GPU use; thread-safe reads for the event loop."""

    def __init__(self, source: ProcessSource | None, thresholds: tuple[float, ...] = (5.0,),
                 history: int = 120, clock=time.time):
        self.source = source
        self.thresholds = tuple(thresholds)
        self.history_len = history
        self.clock = clock
        self._kernels: dict[str, KernelTelemetry] = {}
        self._devices: dict[str, float] = {}
        self._device_history: dict[str, deque] = {}  # GPU uuid -> (at, utilization), oldest first
        self._ended: dict[str, deque] = {}  # kernel id -> the readings of a kernel no longer tracked
        self._lock = threading.Lock()

    @property
    def available(self) -> tuple[bool, str]:
        if self.source is None:
            return False, "no telemetry source"
        return self.source.available()

    def track(self, kernels: dict[str, tuple[int, frozenset[str]]]) -> None:
        """Sample exactly these kernels from now on: kernel id -> (kernel pid, its GPU uuids).

        A kernel's readings outlive a change of its GPUs (a hibernation, a resume elsewhere) and its
        end (the last ``ENDED_KEPT`` kernels): the dashboard's plots keep their earlier points."""
        with self._lock:
            for kid in set(self._kernels) - set(kernels):
                self._ended[kid] = self._kernels.pop(kid).history
                while len(self._ended) > ENDED_KEPT:
                    del self._ended[next(iter(self._ended))]  # the longest ended
            for kid, (pid, gpus) in kernels.items():
                known = self._kernels.get(kid)
                if known is None or known.pid != pid or known.gpus != gpus:
                    history = known.history if known else self._ended.pop(kid, None)
                    self._kernels[kid] = KernelTelemetry(pid, frozenset(gpus),
                                                         history if history is not None
                                                         else deque(maxlen=self.history_len))

    def sample_once(self) -> None:
        """One round of readings (blocking: run it in a thread)."""
        if self.source is None:
            return
        with self._lock:
            tracked = {kid: (k.pid, k.gpus) for kid, k in self._kernels.items()}
        gpus = set().union(*(g for _, g in tracked.values())) if tracked else set()
        per_gpu = self.source.read(gpus) if gpus else {}
        devices = self.source.device_utilization(gpus) if gpus else {}
        now = self.clock()
        trees = {kid: set(process_tree(pid)) for kid, (pid, _) in tracked.items()}
        with self._lock:
            self._devices.update(devices)
            for uuid, utilization in devices.items():
                self._device_history.setdefault(uuid, deque(maxlen=self.history_len)).append((now, utilization))
            for kid, (pid, kgpus) in tracked.items():
                k = self._kernels.get(kid)
                if k is None:
                    continue
                readable = [g for g in kgpus if g in per_gpu]
                if not readable:
                    continue  # declared GPUs or no NVML: no reading, never an invented one
                memory: int | None = 0
                util = 0.0
                for g in readable:
                    procs = [per_gpu[g][p] for p in trees[kid] if p in per_gpu[g]]
                    if any(p.memory is None for p in procs):
                        memory = None
                    elif memory is not None:
                        memory += sum(p.memory for p in procs)  # type: ignore[misc]
                    util = max(util, min(sum(p.utilization for p in procs), 100.0))
                self._record(k, Reading(now, memory, util))

    def _record(self, k: KernelTelemetry, reading: Reading) -> None:
        k.latest = reading
        k.history.append(reading)
        k.use.record(reading.at, reading.memory_used, reading.utilization, self.thresholds)

    # -- reads (from the event loop) ----------------------------------------------------------

    def reading(self, kernel_id: str) -> Reading | None:
        with self._lock:
            k = self._kernels.get(kernel_id)
            return k.latest if k else None

    def samples(self, kernel_id: str) -> list[tuple[float, float | None]]:
        """(time, utilization) of the kept readings, oldest first: the UI's sparkline."""
        return [(r.at, r.utilization) for r in self.history(kernel_id)]

    def history(self, kernel_id: str) -> list[Reading]:
        """The kept readings (memory and utilization), oldest first: the admin dashboard's plots (an
        ended kernel's too)."""
        with self._lock:
            k = self._kernels.get(kernel_id)
            return list(k.history) if k else list(self._ended.get(kernel_id, ()))

    def device_history(self, gpu_uuid: str) -> list[tuple[float, float]]:
        """(time, utilization) of the GPU as a whole, oldest first."""
        with self._lock:
            return list(self._device_history.get(gpu_uuid, ()))

    def gpu_idle_since(self, kernel_id: str, threshold: float) -> float | None:
        """Since when the kernel has held GPU memory with utilization under ``threshold``
        (None: no reading, holds no memory, or used the GPU in its latest reading)."""
        with self._lock:
            k = self._kernels.get(kernel_id)
            return k.use.idle_since(threshold) if k else None

    def last_gpu_activity(self, kernel_id: str, threshold: float) -> float | None:
        """The last time the kernel's GPU utilization reached ``threshold``."""
        with self._lock:
            k = self._kernels.get(kernel_id)
            return k.use.last_active(threshold) if k else None

    def device_utilization(self, gpu_uuid: str) -> float | None:
        with self._lock:
            return self._devices.get(gpu_uuid)

    async def run(self, interval: float, stop: asyncio.Event | None = None) -> None:
        """Sample every ``interval`` seconds until ``stop`` is set; NVML runs in a thread."""
        ok, why = self.available
        if not ok:
            log.info("GPU telemetry off: %s (per-kernel GPU readings will be null)", why)
            return
        await every(interval, lambda: asyncio.to_thread(self.sample_once), stop or asyncio.Event(),
                    what="GPU telemetry sample")
