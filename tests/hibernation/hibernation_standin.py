"""A stand-in for the GPU machine's hardware edge, for tests only (tests/hibernation, the node agent's in tests/kube).

It replaces exactly what lives in ``jupyter_gpu_pool/devices``: the CUDA checkpoint calls
(``devices.checkpoint.Driver``), NVML's memory readings (``devices.nvml.GPUMemory``: per process,
and each GPU's free memory) and NVML's GPU discovery (``devices.nvml.discover``).  Everything above that edge is real in these tests: real
ipykernel processes, a real SQLite ledger, a real jupyter_server.

The stand-in follows the state machine that cuda.h documents for ``cuCheckpointProcess*``
(RUNNING -lock-> LOCKED -checkpoint-> CHECKPOINTED -restore-> LOCKED -unlock-> RUNNING, each call
refused with CUDA_ERROR_ILLEGAL_STATE from any other state; a lock that times out leaves the
process RUNNING; an MPS client is refused with CUDA_ERROR_NOT_SUPPORTED), and the facts measured
on the H100 (NVML lists no memory for a checkpointed process).  It cannot stop a real process's
CUDA calls, so it says nothing about real timing or real memory: the ``gpu`` tests do.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.devices.nvml import Discovery, GPUMemory
from jupyter_gpu_pool.pool import DETECTED, GPU

GiB = 2**30

STANDIN_GPUS = [
    GPU(uuid="GPU-0a0a0a0a-0000-4000-8000-000000000000", name="Stand-in H100", memory=80 * GiB, index=0,
        sm_count=132, source=DETECTED),
    GPU(uuid="GPU-0b0b0b0b-0000-4000-8000-000000000001", name="Stand-in H100", memory=80 * GiB, index=1,
        sm_count=132, source=DETECTED),
]


@dataclass
class Proc:
    device_bytes: int
    gpus: tuple[str, ...]
    state: cp.ProcessState = cp.ProcessState.RUNNING
    mps: bool = False
    gpu_busy_until: float = 0.0  # submitted GPU work runs until then (monotonic)
    host_bytes: int = 0
    checkpoints: int = 0
    restores: int = 0
    restored_on: tuple[str, ...] = ()


@dataclass
class StandInDriver:
    """The checkpoint calls of one stand-in machine."""

    available: bool = True
    reason: str | None = None
    remap: bool = True
    procs: dict[int, Proc] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)
    fail: dict[tuple[str, int], int] = field(default_factory=dict)  # (call, pid) → CUresult to return once
    refuse_remap: bool = False  # restore with moved GPU pairs → INVALID_VALUE (as in NVIDIA/cuda-checkpoint#35)
    lock_delay: float = 0.0  # every lock waits this long (lets a test act while a hibernation is under way)
    # Every lock waits until the test opens this gate (``gate_locks``): a test acts while a hibernation is under
    # way, then lets it go on, with no time guessed (a minute at most: a test that never opens it fails, not hangs).
    lock_gate: threading.Event | None = None

    def __post_init__(self):
        self._lock = threading.Lock()

    # -- test controls -----------------------------------------------------------------------

    def add(self, pid: int, device_bytes: int, gpus=(STANDIN_GPUS[0].uuid,), mps: bool = False) -> Proc:
        proc = self.procs[pid] = Proc(device_bytes, tuple(gpus), mps=mps)
        return proc

    def busy_for(self, pid: int, seconds: float) -> None:
        """The process has submitted GPU work that runs ``seconds`` more."""
        self.procs[pid].gpu_busy_until = time.monotonic() + seconds

    def fail_next(self, call: str, pid: int, code: int) -> None:
        self.fail[(call, pid)] = code

    def gate_locks(self) -> threading.Event:
        """Every lock from now on waits until the returned gate is set."""
        self.lock_gate = threading.Event()
        return self.lock_gate

    # -- devices.checkpoint.Driver -----------------------------------------------------------

    def info(self) -> cp.DriverInfo:
        if not self.available:
            return cp.DriverInfo(False, self.reason or "libcuda.so.1 not found")
        return cp.DriverInfo(True, None, 13000, remap=self.remap)

    def _proc(self, call: str, pid: int) -> Proc:
        if not self.available:
            raise cp.CheckpointUnavailable(self.reason or "libcuda.so.1 not found")
        self.calls.append((call, pid))
        code = self.fail.pop((call, pid), None)
        if code is not None:
            raise cp._error(call, code, pid)
        proc = self.procs.get(pid)
        if proc is None:
            raise cp._error(call, cp.CUDA_ERROR_INVALID_VALUE, pid)  # no CUDA in that process
        return proc

    @staticmethod
    def _need(call: str, pid: int, proc: Proc, state: cp.ProcessState) -> None:
        if proc.state != state:
            raise cp._error(call, cp.CUDA_ERROR_ILLEGAL_STATE, pid)

    def state(self, pid: int) -> cp.ProcessState:
        return self._proc("cuCheckpointProcessGetState", pid).state

    def restore_thread_id(self, pid: int) -> int:
        self._proc("cuCheckpointProcessGetRestoreThreadId", pid)
        return pid + 1

    def lock(self, pid: int, timeout: float) -> None:
        call = "cuCheckpointProcessLock"
        proc = self._proc(call, pid)
        if proc.mps:
            raise cp._error(call, cp.CUDA_ERROR_NOT_SUPPORTED, pid)
        self._need(call, pid, proc, cp.ProcessState.RUNNING)
        time.sleep(self.lock_delay)
        if self.lock_gate is not None and not self.lock_gate.wait(60):
            raise cp._error(call, cp.CUDA_ERROR_TIMEOUT, pid)  # the test never opened it
        remaining = proc.gpu_busy_until - time.monotonic()
        if remaining > timeout:
            time.sleep(timeout)
            raise cp._error(call, cp.CUDA_ERROR_TIMEOUT, pid)  # left RUNNING, untouched
        time.sleep(max(remaining, 0))
        proc.state = cp.ProcessState.LOCKED

    def checkpoint(self, pid: int) -> None:
        call = "cuCheckpointProcessCheckpoint"
        proc = self._proc(call, pid)
        self._need(call, pid, proc, cp.ProcessState.LOCKED)
        proc.host_bytes, proc.state = proc.device_bytes, cp.ProcessState.CHECKPOINTED
        proc.checkpoints += 1

    def restore(self, pid: int, pairs=None) -> None:
        call = "cuCheckpointProcessRestore"
        proc = self._proc(call, pid)
        self._need(call, pid, proc, cp.ProcessState.CHECKPOINTED)
        moved = [(old, new) for old, new in pairs or [] if old != new]
        if moved:
            if self.refuse_remap or not self.remap:
                raise cp._error(call, cp.CUDA_ERROR_INVALID_VALUE, pid)
            mapping = dict(pairs)
            if set(mapping) != set(proc.gpus):  # cuda.h: the pairs must name every checkpointed GPU
                raise cp._error(call, cp.CUDA_ERROR_INVALID_VALUE, pid)
            proc.gpus = tuple(mapping[g] for g in proc.gpus)
        proc.host_bytes, proc.state = 0, cp.ProcessState.LOCKED
        proc.restores += 1
        proc.restored_on = proc.gpus

    def unlock(self, pid: int) -> None:
        call = "cuCheckpointProcessUnlock"
        proc = self._proc(call, pid)
        self._need(call, pid, proc, cp.ProcessState.LOCKED)
        proc.state = cp.ProcessState.RUNNING

    def restored(self, pid: int) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and proc.restores > 0

    # -- NVML's view -------------------------------------------------------------------------

    def memory_of(self, pids) -> dict[int, int]:
        """Like NVML's compute-process list: a checkpointed process holds nothing on the GPU."""
        return {pid: p.device_bytes for pid, p in self.procs.items()
                if pid in set(pids) and p.state != cp.ProcessState.CHECKPOINTED}

    def gpu_used(self, uuid: str) -> int:
        return sum(p.device_bytes for p in self.procs.values()
                   if uuid in p.gpus and p.state != cp.ProcessState.CHECKPOINTED)


class StandInMemory(GPUMemory):
    """NVML's memory readings on the stand-in machine: the kernels' processes as the driver holds them,
    plus what a test says other processes hold (``held_elsewhere``: a GPU filled from outside the pool)."""

    def __init__(self, driver: StandInDriver):
        self.driver = driver
        self.held_elsewhere: dict[str, int] = {}
        self.reads: list[str] = []  # the GPUs whose free memory was read, in order

    def of_processes(self, pids) -> dict[int, int]:
        return self.driver.memory_of(pids)

    def free(self, gpu_uuid: str) -> int | None:
        self.reads.append(gpu_uuid)
        gpu = next((g for g in STANDIN_GPUS if g.uuid == gpu_uuid), None)
        if gpu is None:
            return None
        return gpu.memory - self.driver.gpu_used(gpu_uuid) - self.held_elsewhere.get(gpu_uuid, 0)


def standin_discovery(node: str = "local") -> Discovery:
    return Discovery(gpus=list(STANDIN_GPUS), driver_version="580.159.03 (stand-in)", cuda_driver_version=13000)
