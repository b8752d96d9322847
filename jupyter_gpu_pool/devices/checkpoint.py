"""The CUDA driver's checkpoint API (hibernation's hardware edge), through ctypes on ``libcuda.so.1``.

``cuCheckpointProcessLock / Checkpoint / Restore / Unlock`` move another process's GPU memory
to host RAM and back while the process lives on; an unprivileged parent may do it to its own
child (measured on an H100, driver 580: see docs/architecture.md).  The lifecycle of a process::

    RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED --unlock--> RUNNING

A locked process runs on, but its next CUDA call blocks until it is unlocked.

Struct layouts and enums are those of ``/usr/local/cuda-13.0/include/cuda.h`` (CUDA 13.0,
``CUDA_VERSION 13000``): ``CUprocessState``, ``CUcheckpointLockArgs`` (``timeoutMs`` first, then
``reserved0`` and ``reserved1[7]``), ``CUcheckpointCheckpointArgs``, ``CUcheckpointGpuPair``,
``CUcheckpointRestoreArgs`` (``gpuPairs``, ``gpuPairsCount``, ``reserved[52 - sizeof(void*)]``,
``reserved1``) and ``CUcheckpointUnlockArgs``; every one is 64 bytes, checked at import below.
The error numbers are ``CUresult``'s in the same header.

Nothing is loaded at import: :func:`driver` opens ``libcuda.so.1`` on first use, so this module
imports on a machine without a driver and reports "unavailable: libcuda.so.1 not found".
Every call blocks (a checkpoint of 32 GiB takes ~18 s): async callers use ``asyncio.to_thread``.
"""

from __future__ import annotations

import ctypes
import enum
import os
import threading
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..pool import GPU, MPS
from ..pool.words import (MIG_CANNOT_HIBERNATE, MPS_CANNOT_HIBERNATE, NOTHING_TO_HIBERNATE, ONLY_SHUT_DOWN,
                          cannot_hibernate_sentence, no_checkpoint_driver, old_checkpoint_driver)

LIBRARY = "libcuda.so.1"

# Driver branches (nvidia-smi's "Driver Version") and the CUDA driver API version each reports.
MIN_DRIVER = 570  # cuCheckpointProcess* in the driver API (CUDA 12.8)
MIN_DRIVER_REMAP = 580  # restore onto another GPU through CUcheckpointRestoreArgs.gpuPairs (CUDA 13.0)
_CUDA_VERSION_OF_BRANCH = {570: 12080, 575: 12090, 580: 13000}

# CUresult values (cuda.h) that the checkpoint calls return, with what each means here.
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_TIMEOUT = 909

_ERRORS = {
    CUDA_ERROR_INVALID_VALUE: ("CUDA_ERROR_INVALID_VALUE", "an argument was refused (no such CUDA process, or a "
                               "GPU pair naming a GPU the process cannot use)"),
    CUDA_ERROR_NOT_INITIALIZED: ("CUDA_ERROR_NOT_INITIALIZED", "the CUDA driver is not initialised, in this "
                                 "process or in the target one (a process that has not used CUDA yet)"),
    CUDA_ERROR_NO_DEVICE: ("CUDA_ERROR_NO_DEVICE", "no CUDA device is visible to this process"),
    CUDA_ERROR_ILLEGAL_STATE: ("CUDA_ERROR_ILLEGAL_STATE", "the process is not in the state this step needs"),
    CUDA_ERROR_NOT_FOUND: ("CUDA_ERROR_NOT_FOUND", "the process has no CUDA state"),
    CUDA_ERROR_NOT_READY: ("CUDA_ERROR_NOT_READY", "the process's GPU work did not finish within the lock timeout"),
    CUDA_ERROR_NOT_PERMITTED: ("CUDA_ERROR_NOT_PERMITTED", "this user may not checkpoint that process"),
    CUDA_ERROR_NOT_SUPPORTED: ("CUDA_ERROR_NOT_SUPPORTED", "the driver cannot checkpoint this process (an MPS "
                               "client, MIG, UVM, CUDA IPC or multi-process NCCL)"),
    CUDA_ERROR_TIMEOUT: ("CUDA_ERROR_TIMEOUT", "the process's GPU work did not finish within the lock timeout"),
}


class ProcessState(enum.IntEnum):
    """``CUprocessState`` (cuda.h)."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3

    @property
    def word(self) -> str:
        return self.name.lower()


# -- the structs, exactly as cuda.h lays them out --------------------------------------------


class CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_char * 16)]


class CUcheckpointLockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class CUcheckpointCheckpointArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointGpuPair(ctypes.Structure):
    _fields_ = [("oldUuid", CUuuid), ("newUuid", CUuuid)]


class CUcheckpointRestoreArgs(ctypes.Structure):
    _fields_ = [
        ("gpuPairs", ctypes.POINTER(CUcheckpointGpuPair)),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


class CUcheckpointUnlockArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


for _struct in (CUcheckpointLockArgs, CUcheckpointCheckpointArgs, CUcheckpointRestoreArgs, CUcheckpointUnlockArgs):
    assert ctypes.sizeof(_struct) == 64, f"{_struct.__name__} is {ctypes.sizeof(_struct)} bytes, cuda.h says 64"
assert CUcheckpointLockArgs.timeoutMs.offset == 0 and CUcheckpointLockArgs.reserved1.offset == 8
assert CUcheckpointRestoreArgs.gpuPairsCount.offset == 8 and CUcheckpointRestoreArgs.reserved1.offset == 56
assert ctypes.sizeof(CUcheckpointGpuPair) == 32


def uuid_bytes(gpu_uuid: str) -> bytes:
    """NVML's ``GPU-5f3c…`` text as the 16 bytes of a ``CUuuid``."""
    text = gpu_uuid.strip()
    if not text.startswith("GPU-"):
        raise ValueError(f"{gpu_uuid!r} is not a GPU UUID as NVML writes it (GPU-xxxxxxxx-xxxx-…)")
    try:
        return uuidlib.UUID(text[4:]).bytes
    except ValueError:
        raise ValueError(f"{gpu_uuid!r} is not a GPU UUID as NVML writes it (GPU-xxxxxxxx-xxxx-…)") from None


def gpu_pairs(old: Iterable[str], new: Iterable[str]) -> list[tuple[str, str]]:
    """Old GPU → new GPU, in order; the driver wants every checkpointed GPU named."""
    old, new = list(old), list(new)
    if len(old) != len(new):
        raise ValueError(f"a restore maps every old GPU to a new one: {len(old)} old, {len(new)} new")
    return list(zip(old, new))


# -- errors ----------------------------------------------------------------------------------


class CheckpointError(RuntimeError):
    """A checkpoint call failed.  ``code`` is the CUresult, ``call`` the function, ``pid`` the process."""

    def __init__(self, call: str, code: int, pid: int | None = None, detail: str = ""):
        self.call, self.code, self.pid = call, code, pid
        name, meaning = _ERRORS.get(code, (f"CUresult {code}", detail or "see cuda.h"))
        self.error_name = name
        target = f"(pid {pid})" if pid is not None else "()"
        super().__init__(f"{call}{target} failed: {name} ({code}): {detail or meaning}")


class LockTimeout(CheckpointError):
    """The lock waited for the process's GPU work and gave up: the process runs on, untouched."""


class NotSupported(CheckpointError):
    """801: the driver cannot checkpoint this process (an MPS client, for one)."""


class IllegalState(CheckpointError):
    """401: the process is not in the state the step needs."""


class CheckpointUnavailable(CheckpointError):
    """The checkpoint API cannot be had here at all (no libcuda, too old a driver, no device)."""

    def __init__(self, reason: str):
        self.reason = reason
        RuntimeError.__init__(self, f"unavailable: {reason}")
        self.call, self.code, self.pid, self.error_name = "load", -1, None, "unavailable"


def _error(call: str, code: int, pid: int | None, detail: str = "") -> CheckpointError:
    cls = {CUDA_ERROR_NOT_READY: LockTimeout, CUDA_ERROR_TIMEOUT: LockTimeout,
           CUDA_ERROR_NOT_SUPPORTED: NotSupported, CUDA_ERROR_ILLEGAL_STATE: IllegalState}.get(code, CheckpointError)
    if cls is LockTimeout and call != "cuCheckpointProcessLock":
        cls = CheckpointError
    return cls(call, code, pid, detail)


# -- what a driver is ------------------------------------------------------------------------


@dataclass(frozen=True)
class DriverInfo:
    """What the checkpoint API can do on this machine."""

    available: bool
    reason: str | None = None  # why not, in words, when unavailable
    cuda_version: int | None = None  # cuDriverGetVersion: 13000 for CUDA 13.0
    remap: bool = False  # restore onto another GPU (CUcheckpointRestoreArgs.gpuPairs)

    @property
    def cuda_version_text(self) -> str:
        if not self.cuda_version:
            return "unknown"
        return f"{self.cuda_version // 1000}.{(self.cuda_version % 1000) // 10}"


class Driver(Protocol):
    """The checkpoint calls hibernation uses; :class:`CudaCheckpoint` is the real one."""

    def info(self) -> DriverInfo: ...
    def state(self, pid: int) -> ProcessState: ...
    def lock(self, pid: int, timeout: float) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int, pairs: list[tuple[str, str]] | None = None) -> None: ...
    def unlock(self, pid: int) -> None: ...
    def restore_thread_id(self, pid: int) -> int: ...
    def restored(self, pid: int) -> bool:
        """Whether this driver restored ``pid`` (see :func:`prepare_kill`); no driver call."""
        ...


class CudaCheckpoint:
    """The checkpoint API of the CUDA driver, loaded from ``libcuda.so.1`` on first use."""

    _FUNCTIONS = {
        "cuInit": [ctypes.c_uint],
        "cuDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
        "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "cuCheckpointProcessGetState": [ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        "cuCheckpointProcessGetRestoreThreadId": [ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
        "cuCheckpointProcessLock": [ctypes.c_int, ctypes.POINTER(CUcheckpointLockArgs)],
        "cuCheckpointProcessCheckpoint": [ctypes.c_int, ctypes.POINTER(CUcheckpointCheckpointArgs)],
        "cuCheckpointProcessRestore": [ctypes.c_int, ctypes.POINTER(CUcheckpointRestoreArgs)],
        "cuCheckpointProcessUnlock": [ctypes.c_int, ctypes.POINTER(CUcheckpointUnlockArgs)],
    }

    def __init__(self, library: str = LIBRARY):
        self.library = library
        self._lib: ctypes.CDLL | None = None
        self._info: DriverInfo | None = None
        self._lock = threading.Lock()
        self._restored: set[int] = set()
        self._initialised_in: int | None = None  # the process (pid) whose cuInit(0) succeeded

    def _load(self) -> DriverInfo:
        try:
            lib = ctypes.CDLL(self.library)
        except OSError:
            return DriverInfo(False, f"{self.library} not found (no NVIDIA driver on this machine)")
        missing = [name for name in self._FUNCTIONS if not hasattr(lib, name)]
        if "cuDriverGetVersion" in missing or "cuInit" in missing:
            return DriverInfo(False, f"{self.library} is not a CUDA driver library (no cuInit)")
        for name, argtypes in self._FUNCTIONS.items():
            if name not in missing:
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
        version = ctypes.c_int(0)
        lib.cuDriverGetVersion(ctypes.byref(version))
        if any(name.startswith("cuCheckpoint") for name in missing):
            return DriverInfo(False, f"the NVIDIA driver (CUDA {version.value // 1000}.{version.value % 1000 // 10}) "
                                     f"has no checkpoint API; it needs driver {MIN_DRIVER} or newer",
                              cuda_version=version.value)
        self._lib = lib
        code = self._cu_init()
        if code != CUDA_SUCCESS:
            return DriverInfo(False, f"cuInit failed in the Jupyter server process: {self._name(code)} ({code}); "
                                     "is a GPU visible to it (CUDA_VISIBLE_DEVICES)?", cuda_version=version.value)
        return DriverInfo(True, None, version.value, remap=version.value >= _CUDA_VERSION_OF_BRANCH[MIN_DRIVER_REMAP])

    def _cu_init(self) -> int:
        """``cuInit(0)`` in this process, once: every checkpoint call needs it in the calling process
        (the driver answers CUDA_ERROR_NOT_INITIALIZED otherwise), and a process forked after it
        must call it again.  Returns the CUresult."""
        pid = os.getpid()
        if self._initialised_in == pid:
            return CUDA_SUCCESS
        code = self._lib.cuInit(0)  # type: ignore[union-attr]
        if code == CUDA_SUCCESS:
            self._initialised_in = pid
        return code

    def info(self) -> DriverInfo:
        with self._lock:
            if self._info is None:
                self._info = self._load()
            return self._info

    def _name(self, code: int) -> str:
        if self._lib is not None and hasattr(self._lib, "cuGetErrorName"):
            text = ctypes.c_char_p()
            if self._lib.cuGetErrorName(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
                return text.value.decode()
        return _ERRORS.get(code, (f"CUresult {code}",))[0]

    def _call(self, name: str, pid: int, *args) -> None:
        """Every entry point's call: the library loaded, the driver initialised in this process."""
        info = self.info()
        if not info.available or self._lib is None:
            raise CheckpointUnavailable(info.reason or "the checkpoint API did not load")
        with self._lock:
            init = self._cu_init()
        if init != CUDA_SUCCESS:
            raise CheckpointUnavailable(f"cuInit failed in process {os.getpid()} (each process that checkpoints "
                                        f"initialises the CUDA driver itself): {self._name(init)} ({init}); is a GPU "
                                        "visible to it (CUDA_VISIBLE_DEVICES)?")
        code = getattr(self._lib, name)(pid, *args)
        if code != CUDA_SUCCESS:
            detail = ""
            if code not in _ERRORS:
                text = ctypes.c_char_p()
                if self._lib.cuGetErrorString(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
                    detail = text.value.decode()
            raise _error(name, code, pid, detail)

    def state(self, pid: int) -> ProcessState:
        out = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", pid, ctypes.byref(out))
        return ProcessState(out.value)

    def restore_thread_id(self, pid: int) -> int:
        out = ctypes.c_int(0)
        self._call("cuCheckpointProcessGetRestoreThreadId", pid, ctypes.byref(out))
        return out.value

    def lock(self, pid: int, timeout: float) -> None:
        """Lock within ``timeout`` seconds, or raise :class:`LockTimeout` with the process left running.
        The driver waits for the process's submitted GPU work to finish; a timeout of 0 would wait
        for ever, so it is refused."""
        timeout_ms = int(round(timeout * 1000))
        if not 0 < timeout_ms < 2**32:
            raise ValueError(f"lock timeout must be between 1 ms and 49 days, not {timeout!r} s")
        args = CUcheckpointLockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid, ctypes.byref(CUcheckpointCheckpointArgs()))

    def restore(self, pid: int, pairs: list[tuple[str, str]] | None = None) -> None:
        """Bring the memory back; ``pairs`` (old GPU UUID, new GPU UUID) restore onto other GPUs of
        the same model (driver ≥ 580).  Pairs that map every GPU onto itself are left out."""
        args = CUcheckpointRestoreArgs()
        moved = [(old, new) for old, new in pairs or [] if old != new]
        if moved:
            if not self.info().remap:
                raise CheckpointError("cuCheckpointProcessRestore", CUDA_ERROR_NOT_SUPPORTED, pid,
                                      f"restoring onto another GPU needs driver {MIN_DRIVER_REMAP} or newer "
                                      f"(this one speaks CUDA {self.info().cuda_version_text})")
            array = (CUcheckpointGpuPair * len(pairs))()  # type: ignore[operator, arg-type]
            for i, (old, new) in enumerate(pairs):  # type: ignore[arg-type]
                array[i].oldUuid.bytes, array[i].newUuid.bytes = uuid_bytes(old), uuid_bytes(new)
            args.gpuPairs = ctypes.cast(array, ctypes.POINTER(CUcheckpointGpuPair))
            args.gpuPairsCount = len(pairs)  # type: ignore[arg-type]
        self._call("cuCheckpointProcessRestore", pid, ctypes.byref(args))
        self._restored.add(pid)

    def restored(self, pid: int) -> bool:
        return pid in self._restored

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid, ctypes.byref(CUcheckpointUnlockArgs()))


_driver: Driver | None = None
_driver_lock = threading.Lock()


def driver() -> Driver:
    """The process's checkpoint driver (the real one, loaded lazily)."""
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = CudaCheckpoint()
        return _driver


def cuda_processes(drv: Driver, pids: Iterable[int]) -> dict[int, ProcessState]:
    """Which of ``pids`` have CUDA state, and in which state (the others raise and are left out)."""
    found = {}
    for pid in pids:
        try:
            found[pid] = drv.state(pid)
        except CheckpointUnavailable:
            raise
        except CheckpointError:
            continue  # no CUDA in that process
    return found


def prepare_kill(drv: Driver, pids: Iterable[int], lock_timeout: float) -> dict[int, str]:
    """Make a kernel's CUDA processes safe to kill; return what was done to each (pid → words).

    Killing a process just restored by the checkpoint API hung a host on one driver (595, open
    kernel module; docs/gpu-testing.md), and its reporter's workaround was to lock and checkpoint it
    again first.  So a process this driver restored that runs on its GPU is locked (waiting up to
    ``lock_timeout`` for its GPU work) and checkpointed; one whose lock times out is left running.
    A checkpointed or locked process (hibernated, or mid-move) and one never restored are left as
    they are: a kill frees them.  Blocks for as long as the checkpoint takes: callers bound it."""
    done: dict[int, str] = {}
    for pid in pids:
        if not drv.restored(pid):
            continue
        try:
            if drv.state(pid) != ProcessState.RUNNING:
                continue
            drv.lock(pid, lock_timeout)
            drv.checkpoint(pid)
            done[pid] = "checkpointed"
        except LockTimeout:
            done[pid] = "left running (its GPU work outlasted the lock timeout)"
        except CheckpointError as e:
            done[pid] = f"left as it was ({e})"
    return done


# -- capability: can this kernel hibernate at all? -------------------------------------------


DECLARED_NOTE = "declared: no GPU memory to move"


@dataclass(frozen=True)
class Capability:
    """Whether a kernel can hibernate; when not, ``reason`` (a word), ``why`` (a clause, as the pool's words
    embed it: ``pool.words.cannot_hibernate``) and ``message`` (the sentence a refusal says).

    ``declared``: the kernel's GPUs are declared in the inventory, not real, so it holds no GPU
    memory: it hibernates through the same moves with nothing to checkpoint (``message`` says so)."""

    available: bool
    reason: str | None = None
    message: str | None = None
    remap: bool = False  # may resume on another GPU of the same model
    declared: bool = False
    why: str | None = None

    def to_dict(self) -> dict:
        return {"available": self.available, "reason": self.reason, "message": self.message, "remap": self.remap,
                "declared": self.declared}


def cannot(reason: str, why: str, then: str = ONLY_SHUT_DOWN) -> Capability:
    """A kernel that cannot hibernate: ``why`` as a clause, its sentence with ``then`` (what it can do)."""
    return Capability(False, reason, cannot_hibernate_sentence(why, then), why=why)


def driver_branch(driver_version: str | None) -> int | None:
    """``"580.159.03"`` → 580 (NVML's driver version)."""
    try:
        return int(str(driver_version).split(".")[0])
    except (TypeError, ValueError):
        return None


def capability(isolation: str, gpus: list[GPU], info: DriverInfo, driver_version: str | None = None) -> Capability:
    """Say, before anything is touched, whether a kernel on these GPUs in this isolation mode can
    hibernate, and why not.  ``driver_version`` is NVML's (``"580.159"``) where known.  Declared
    GPUs can, whatever the driver: their kernels hold no GPU memory (MPS profiles still cannot, as
    on real GPUs)."""
    if isolation == MPS:
        return cannot("mps", MPS_CANNOT_HIBERNATE, "It can only be shut down to free its slice, and its variables are "
                      "then lost. Pick a 'soft' or whole-GPU profile to be able to hibernate.")
    if not gpus:
        return cannot("no_gpu", NOTHING_TO_HIBERNATE, "")
    if all(g.declared for g in gpus):  # no driver needed: nothing to move
        return Capability(True, message=DECLARED_NOTE, declared=True)
    if any(g.mig for g in gpus):
        return cannot("mig", MIG_CANNOT_HIBERNATE)
    if not info.available:
        return cannot("driver", no_checkpoint_driver(info.reason or "no reason given"))
    branch = driver_branch(driver_version)
    if branch is not None and branch < MIN_DRIVER:
        return cannot("driver", old_checkpoint_driver(MIN_DRIVER, str(driver_version)))
    remap = info.remap and (branch is None or branch >= MIN_DRIVER_REMAP)
    return Capability(True, remap=remap)
