"""GPU discovery through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Detected GPUs are identified by UUID.  A machine without a GPU or without the
NVML library is normal (CI, laptops, Binder): :func:`discover` then returns no
GPUs and says why, and the pool falls back to the declared inventory.  Calls
block for tens of milliseconds; async callers run them in a thread.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..pool import DETECTED, GPU

_lock = threading.Lock()
_initialized = False


@dataclass(frozen=True)
class Discovery:
    gpus: list[GPU] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    error: str | None = None  # why nothing was found, in words

    @property
    def summary(self) -> str:
        if self.gpus:
            names = ", ".join(sorted({g.name for g in self.gpus}))
            return f"{len(self.gpus)} GPU(s) detected by NVML ({names}; driver {self.driver_version})"
        return f"no GPU detected by NVML ({self.error or 'none found'})"


def _pynvml():
    import pynvml  # nvidia-ml-py

    return pynvml


def init() -> None:
    """Initialise NVML once per process (raises pynvml.NVMLError when unavailable)."""
    global _initialized
    with _lock:
        if not _initialized:
            _pynvml().nvmlInit()
            _initialized = True


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sm_count(nv, handle) -> int | None:
    try:
        return int(nv.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount) or None
    except Exception:  # not supported on every GPU and driver; SM count is informational
        return None


def _mig_enabled(nv, handle) -> bool:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
        return current == nv.NVML_DEVICE_MIG_ENABLE
    except Exception:  # NotSupported on GPUs without MIG
        return False


def discover(node: str = "local") -> Discovery:
    """The GPUs NVML sees on this machine, or none with the reason."""
    try:
        nv = _pynvml()
    except ImportError as e:
        return Discovery(error=f"nvidia-ml-py is not installed: {e}")
    try:
        init()
        count = nv.nvmlDeviceGetCount()
        gpus = []
        for index in range(count):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                GPU(
                    uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                    name=_text(nv.nvmlDeviceGetName(handle)),
                    memory=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
                    index=index,
                    sm_count=_sm_count(nv, handle),
                    node=node,
                    source=DETECTED,
                    mig=_mig_enabled(nv, handle),
                )
            )
        driver = _text(nv.nvmlSystemGetDriverVersion())
        try:
            cuda = int(nv.nvmlSystemGetCudaDriverVersion())
        except Exception:
            cuda = None
        return Discovery(gpus=gpus, driver_version=driver, cuda_driver_version=cuda,
                         error=None if gpus else "NVML works but lists no GPU")
    except Exception as e:  # pynvml.NVMLError and its many subclasses
        return Discovery(error=f"NVML unavailable: {e}")


NOT_AVAILABLE = 2**63  # NVML_VALUE_NOT_AVAILABLE: some bindings return it as a huge number instead of None


class GPUMemory(ABC):
    """GPU memory as the driver counts it, for hibernation: what each process holds (what a
    checkpoint moves) and what each GPU has free (whether a restore fits).  :class:`NVMLMemory` on a
    real machine; tests give a scripted reading at this seam."""

    @abstractmethod
    def of_processes(self, pids: Iterable[int]) -> dict[int, int] | None:
        """Device memory each of ``pids`` holds, summed over the GPUs (a pid holding none is absent);
        None where the driver cannot say."""

    @abstractmethod
    def free(self, gpu_uuid: str) -> int | None:
        """Free device memory on the GPU ``gpu_uuid``, whoever holds the rest; None where the driver
        cannot say (a declared GPU, no NVML)."""


class NVMLMemory(GPUMemory):
    """Readings from NVML (``nvmlDeviceGetComputeRunningProcesses``, ``nvmlDeviceGetMemoryInfo``)."""

    def of_processes(self, pids: Iterable[int]) -> dict[int, int] | None:
        wanted = set(pids)
        try:
            init()
            nv = _pynvml()
            found: dict[int, int] = {}
            for index in range(nv.nvmlDeviceGetCount()):
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(index)):
                    used = getattr(proc, "usedGpuMemory", None)
                    if proc.pid in wanted and used is not None and used < NOT_AVAILABLE:
                        found[proc.pid] = found.get(proc.pid, 0) + int(used)
            return found
        except Exception:  # pynvml.NVMLError and its subclasses, or no nvidia-ml-py
            return None

    def free(self, gpu_uuid: str) -> int | None:
        try:
            init()
            nv = _pynvml()
            return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByUUID(gpu_uuid)).free)
        except Exception:  # not a GPU NVML knows (declared), or no NVML
            return None


_memory: GPUMemory | None = None


def memory() -> GPUMemory:
    """The process's reader of GPU memory (NVML)."""
    global _memory
    with _lock:
        if _memory is None:
            _memory = NVMLMemory()
        return _memory
