"""The ctypes binding to the CUDA checkpoint API: layouts against cuda.h, lazy loading, errors, capability.

The layout test compiles a small C program against the CUDA toolkit's cuda.h with the system C
compiler and compares every size and offset with the ctypes structs (skipped where either is
missing).  No driver call is made here: this machine has no driver, which the loading test uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from jupyter_gpu_pool.devices import checkpoint as cp
from jupyter_gpu_pool.pool import DECLARED, DETECTED, GPU, MPS, SOFT

GiB = 2**30


def _cuda_h() -> str | None:
    for root in [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(
            (f"/usr/local/{d}" for d in os.listdir("/usr/local") if d.startswith("cuda-")), reverse=True)]:
        path = os.path.join(root, "include", "cuda.h") if root else ""
        if path and os.path.exists(path):
            return path
    return None


LAYOUT_C = r"""
#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
#define V(k, v) printf("\"%s\": [%lld, 0],\n", k, (long long)(v))
#define F(s, f) printf("\"%s.%s\": [%zu, %zu],\n", #s, #f, offsetof(s, f), sizeof(((s*)0)->f))
int main(void) {
  printf("{\n");
  F(CUcheckpointLockArgs, timeoutMs); F(CUcheckpointLockArgs, reserved0); F(CUcheckpointLockArgs, reserved1);
  F(CUcheckpointCheckpointArgs, reserved);
  F(CUcheckpointGpuPair, oldUuid); F(CUcheckpointGpuPair, newUuid);
  F(CUcheckpointRestoreArgs, gpuPairs); F(CUcheckpointRestoreArgs, gpuPairsCount);
  F(CUcheckpointRestoreArgs, reserved); F(CUcheckpointRestoreArgs, reserved1);
  F(CUcheckpointUnlockArgs, reserved);
  V("sizeof.CUcheckpointLockArgs", sizeof(CUcheckpointLockArgs));
  V("sizeof.CUcheckpointCheckpointArgs", sizeof(CUcheckpointCheckpointArgs));
  V("sizeof.CUcheckpointGpuPair", sizeof(CUcheckpointGpuPair));
  V("sizeof.CUcheckpointRestoreArgs", sizeof(CUcheckpointRestoreArgs));
  V("sizeof.CUcheckpointUnlockArgs", sizeof(CUcheckpointUnlockArgs));
  V("enum.RUNNING", CU_PROCESS_STATE_RUNNING); V("enum.LOCKED", CU_PROCESS_STATE_LOCKED);
  V("enum.CHECKPOINTED", CU_PROCESS_STATE_CHECKPOINTED); V("enum.FAILED", CU_PROCESS_STATE_FAILED);
  V("err.NOT_READY", CUDA_ERROR_NOT_READY); V("err.ILLEGAL_STATE", CUDA_ERROR_ILLEGAL_STATE);
  V("err.NOT_SUPPORTED", CUDA_ERROR_NOT_SUPPORTED); V("err.TIMEOUT", CUDA_ERROR_TIMEOUT);
  printf("\"end\": [0, 0]\n");
  printf("}\n");
  return 0;
}
"""


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict:
    header, cc = _cuda_h(), shutil.which("cc") or shutil.which("gcc")
    if not header or not cc:
        pytest.skip(f"needs cuda.h (found: {header}) and a C compiler (found: {cc}) to compare layouts")
    tmp = tmp_path_factory.mktemp("layout")
    (tmp / "layout.c").write_text(LAYOUT_C)
    subprocess.run([cc, "-I", os.path.dirname(header), "-o", str(tmp / "layout"), str(tmp / "layout.c")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(tmp / "layout")], check=True, capture_output=True, text=True).stdout
    return {k: tuple(v) for k, v in json.loads(out).items()}


@pytest.mark.parametrize("struct,field", [
    ("CUcheckpointLockArgs", "timeoutMs"), ("CUcheckpointLockArgs", "reserved0"),
    ("CUcheckpointLockArgs", "reserved1"), ("CUcheckpointCheckpointArgs", "reserved"),
    ("CUcheckpointGpuPair", "oldUuid"), ("CUcheckpointGpuPair", "newUuid"),
    ("CUcheckpointRestoreArgs", "gpuPairs"), ("CUcheckpointRestoreArgs", "gpuPairsCount"),
    ("CUcheckpointRestoreArgs", "reserved"), ("CUcheckpointRestoreArgs", "reserved1"),
    ("CUcheckpointUnlockArgs", "reserved"),
])
def test_every_field_sits_where_cuda_h_puts_it(c_layout, struct, field):
    ours = getattr(getattr(cp, struct), field)
    assert (ours.offset, ours.size) == c_layout[f"{struct}.{field}"]


def test_struct_sizes_enums_and_error_codes_match_cuda_h(c_layout):
    for name in ("CUcheckpointLockArgs", "CUcheckpointCheckpointArgs", "CUcheckpointGpuPair",
                 "CUcheckpointRestoreArgs", "CUcheckpointUnlockArgs"):
        assert ctypes.sizeof(getattr(cp, name)) == c_layout[f"sizeof.{name}"][0], name
    for state in cp.ProcessState:
        assert state.value == c_layout[f"enum.{state.name}"][0]
    assert cp.CUDA_ERROR_NOT_READY == c_layout["err.NOT_READY"][0]
    assert cp.CUDA_ERROR_ILLEGAL_STATE == c_layout["err.ILLEGAL_STATE"][0]
    assert cp.CUDA_ERROR_NOT_SUPPORTED == c_layout["err.NOT_SUPPORTED"][0]
    assert cp.CUDA_ERROR_TIMEOUT == c_layout["err.TIMEOUT"][0]


def test_the_lock_timeout_is_the_first_four_bytes_of_its_struct():
    raw = bytes(cp.CUcheckpointLockArgs(timeoutMs=1500))
    assert len(raw) == 64 and raw[:4] == (1500).to_bytes(4, sys.byteorder) and raw[4:] == bytes(60)


def test_importing_without_a_driver_works_and_reports_unavailable():
    code = ("from jupyter_gpu_pool.devices import checkpoint as cp; import json; "
            "i = cp.CudaCheckpoint('libcuda-that-is-not-here.so.1').info(); "
            "print(json.dumps([i.available, i.reason]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    available, reason = json.loads(out)
    assert available is False and reason.startswith("libcuda-that-is-not-here.so.1 not found")


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is installed here")
def test_the_default_driver_here_says_libcuda_is_not_found_and_every_call_refuses():
    drv = cp.CudaCheckpoint()
    info = drv.info()
    assert not info.available and info.reason.startswith("libcuda.so.1 not found")
    with pytest.raises(cp.CheckpointUnavailable) as err:
        drv.lock(os.getpid(), 1.0)
    assert str(err.value) == f"unavailable: {info.reason}"


def test_a_lock_timeout_out_of_range_is_refused_before_any_call():
    with pytest.raises(ValueError, match="between 1 ms and 49 days"):
        cp.CudaCheckpoint().lock(1, 0)


@pytest.mark.parametrize("call,code,cls,words", [
    ("cuCheckpointProcessLock", cp.CUDA_ERROR_TIMEOUT, cp.LockTimeout, "did not finish within the lock timeout"),
    ("cuCheckpointProcessLock", cp.CUDA_ERROR_NOT_READY, cp.LockTimeout, "did not finish"),
    ("cuCheckpointProcessLock", cp.CUDA_ERROR_NOT_SUPPORTED, cp.NotSupported, "MPS client"),
    ("cuCheckpointProcessCheckpoint", cp.CUDA_ERROR_ILLEGAL_STATE, cp.IllegalState, "not in the state"),
    ("cuCheckpointProcessRestore", cp.CUDA_ERROR_INVALID_VALUE, cp.CheckpointError, "argument was refused"),
    ("cuCheckpointProcessUnlock", 4242, cp.CheckpointError, "CUresult 4242"),
])
def test_every_return_code_becomes_a_clear_exception(call, code, cls, words):
    err = cp._error(call, code, 1234)
    assert type(err) is cls and isinstance(err, cp.CheckpointError)
    assert (err.call, err.code, err.pid) == (call, code, 1234)
    assert str(err).startswith(f"{call}(pid 1234) failed:") and words in str(err)


def test_not_ready_outside_the_lock_is_not_called_a_timeout():
    assert type(cp._error("cuCheckpointProcessCheckpoint", cp.CUDA_ERROR_NOT_READY, 1)) is cp.CheckpointError


def test_gpu_uuids_become_the_16_bytes_of_a_cuuuid():
    assert cp.uuid_bytes("GPU-5f3c0e4e-9d1b-2c3a-8e7f-0123456789ab").hex() == "5f3c0e4e9d1b2c3a8e7f0123456789ab"
    for bad in ("MIG-5f3c0e4e-9d1b-2c3a-8e7f-0123456789ab", "GPU-xyz", "DECLARED-local-0"):
        with pytest.raises(ValueError, match="not a GPU UUID"):
            cp.uuid_bytes(bad)
    assert cp.gpu_pairs(["GPU-a"], ["GPU-b"]) == [("GPU-a", "GPU-b")]
    with pytest.raises(ValueError, match="every old GPU"):
        cp.gpu_pairs(["GPU-a", "GPU-b"], ["GPU-c"])


def test_a_restore_onto_another_gpu_needs_a_580_driver():
    class Old(cp.CudaCheckpoint):
        def info(self):
            return cp.DriverInfo(True, None, 12080, remap=False)

    with pytest.raises(cp.CheckpointError, match="needs driver 580"):
        Old().restore(1, [("GPU-5f3c0e4e-9d1b-2c3a-8e7f-0123456789ab", "GPU-6f3c0e4e-9d1b-2c3a-8e7f-0123456789ab")])


# -- capability --------------------------------------------------------------------------------

REAL = GPU(uuid="GPU-5f3c0e4e-9d1b-2c3a-8e7f-0123456789ab", name="H100", memory=80 * GiB, source=DETECTED)
OK = cp.DriverInfo(True, None, 13000, remap=True)


@pytest.mark.parametrize("isolation,gpus,info,driver,reason,words", [
    (MPS, [REAL], OK, "580.159", "mps", "cannot checkpoint an MPS kernel"),
    (SOFT, [GPU(uuid=REAL.uuid, name="A100", memory=40 * GiB, mig=True)], OK, "580.1", "mig", "MIG"),
    (SOFT, [REAL], cp.DriverInfo(False, "libcuda.so.1 not found (no NVIDIA driver on this machine)"), None,
     "driver", "libcuda.so.1 not found"),
    (SOFT, [REAL], OK, "550.54.15", "driver", "needs NVIDIA driver 570 or newer; this machine has 550.54.15"),
    (SOFT, [], OK, "580.1", "no_gpu", "holds no GPU"),
])
def test_capability_says_why_not_in_a_sentence(isolation, gpus, info, driver, reason, words):
    cap = cp.capability(isolation, gpus, info, driver)
    assert not cap.available and cap.reason == reason and words in cap.message
    assert cap.message.endswith(".")


DEMO = GPU(uuid="DECLARED-local-0", name="Demo", memory=GiB, source=DECLARED)


@pytest.mark.parametrize("info", [OK, cp.DriverInfo(False, "libcuda.so.1 not found (no NVIDIA driver on this machine)")])
def test_declared_gpus_can_hibernate_with_nothing_to_move_whatever_the_driver(info):
    cap = cp.capability(SOFT, [DEMO], info, None)
    assert cap.available and cap.declared and cap.message == "declared: no GPU memory to move"
    assert cap.to_dict()["declared"] is True and not cap.remap
    assert not cp.capability(MPS, [DEMO], info, None).available  # an MPS profile cannot, as on a real GPU


def test_capability_allows_soft_and_whole_gpus_and_restore_elsewhere_only_from_580():
    assert cp.capability(SOFT, [REAL], OK, "580.159.03") == cp.Capability(True, remap=True)
    assert cp.capability("exclusive", [REAL], OK, "575.57.08").remap is False
    assert cp.capability(SOFT, [REAL], cp.DriverInfo(True, None, 12080, remap=False), "570.86").available


# -- the driver initialised before each entry point's first call ------------------------------------------

# A stand-in libcuda.so.1: the functions the binding loads, each checkpoint call answering
# CUDA_ERROR_NOT_INITIALIZED (3) until cuInit ran in the calling process, as the real driver did on the
# H100 (cuCheckpointProcessGetState in a process that had not called cuInit).  cuDriverGetVersion needs
# no cuInit, as in the real driver.  It counts its cuInit calls per process; with STANDIN_CUINIT_FAILS
# set, cuInit answers CUDA_ERROR_NO_DEVICE (100), as in a process that sees no GPU.
LIBCUDA_STANDIN_C = r"""
#include <stdlib.h>
#include <unistd.h>
static pid_t initialised = 0;
static int inits = 0;
int cuInit(unsigned flags) {
    (void)flags;
    if (getenv("STANDIN_CUINIT_FAILS")) return 100;
    initialised = getpid(); inits++; return 0;
}
int standin_inits(void) { return inits; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuGetErrorName(int code, const char **s) { (void)code; (void)s; return 1; }
int cuGetErrorString(int code, const char **s) { (void)code; (void)s; return 1; }
#define READY if (initialised != getpid()) return 3
int cuCheckpointProcessGetState(int pid, int *state) { (void)pid; READY; *state = 0; return 0; }
int cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) { READY; *tid = pid; return 0; }
int cuCheckpointProcessLock(int pid, void *args) { (void)pid; (void)args; READY; return 0; }
int cuCheckpointProcessCheckpoint(int pid, void *args) { (void)pid; (void)args; READY; return 0; }
int cuCheckpointProcessRestore(int pid, void *args) { (void)pid; (void)args; READY; return 0; }
int cuCheckpointProcessUnlock(int pid, void *args) { (void)pid; (void)args; READY; return 0; }
"""

ENTRY_POINTS = {"state": "drv.state(1)", "restore_thread_id": "drv.restore_thread_id(1)", "lock": "drv.lock(1, 1.0)",
                "checkpoint": "drv.checkpoint(1)", "restore": "drv.restore(1)", "unlock": "drv.unlock(1)"}

# Each entry point as the first call of a fresh binding, then in a process forked after the binding had
# loaded (and initialised) in its parent: the child's first call must initialise again.
FIRST_CALLS = """
import ctypes, json, os, sys
from jupyter_gpu_pool.devices import checkpoint as cp
path, call = sys.argv[1], sys.argv[2]
lib = ctypes.CDLL(path)
def attempt(drv):
    try:
        eval(call)
        return "ok"
    except cp.CheckpointError as e:
        return str(e)
fresh = attempt(cp.CudaCheckpoint(path))
fresh_inits = lib.standin_inits()
drv = cp.CudaCheckpoint(path)
assert drv.info().available
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, json.dumps([attempt(drv), lib.standin_inits()]).encode())
    os._exit(0)
os.waitpid(child, 0)
forked, forked_inits = json.loads(os.read(read, 4096))
print(json.dumps({"fresh": fresh, "fresh_inits": fresh_inits, "forked": forked, "forked_inits": forked_inits,
                  "parent_inits": lib.standin_inits(), "again": attempt(drv), "after": lib.standin_inits()}))
"""


@pytest.fixture(scope="module")
def libcuda_standin(tmp_path_factory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("needs a C compiler to build the stand-in libcuda")
    tmp = tmp_path_factory.mktemp("libcuda")
    (tmp / "standin.c").write_text(LIBCUDA_STANDIN_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp / "libcuda.so.1"), str(tmp / "standin.c")],
                   check=True, capture_output=True, text=True)
    return str(tmp / "libcuda.so.1")


def test_the_standin_library_refuses_a_checkpoint_call_before_cuinit_as_the_real_driver_did(libcuda_standin):
    lib = ctypes.CDLL(libcuda_standin)
    state = ctypes.c_int(-1)
    assert lib.cuCheckpointProcessGetState(1, ctypes.byref(state)) == cp.CUDA_ERROR_NOT_INITIALIZED
    assert str(cp._error("cuCheckpointProcessGetState", 3, 1)).endswith(
        "CUDA_ERROR_NOT_INITIALIZED (3): the CUDA driver is not initialised, in this process or in the target one "
        "(a process that has not used CUDA yet)")


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_each_entry_point_initialises_the_driver_in_its_process_before_its_first_call(libcuda_standin, entry):
    done = subprocess.run([sys.executable, "-c", FIRST_CALLS, libcuda_standin, ENTRY_POINTS[entry]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["fresh"] == "ok" and got["fresh_inits"] == 1  # a fresh binding's first call: cuInit, once
    assert got["forked"] == "ok"  # a child forked after the parent initialised: its first call initialises again
    assert got["forked_inits"] == got["parent_inits"] + 1
    assert got["again"] == "ok" and got["after"] == got["parent_inits"]  # and once per process, not per call


# A process forked after the binding loaded whose own cuInit fails (it sees no GPU): its call is refused
# naming the process, the driver's answer and what to check.
CUINIT_FAILS_IN_CHILD = """
import json, os, sys
from jupyter_gpu_pool.devices import checkpoint as cp
drv = cp.CudaCheckpoint(sys.argv[1])
assert drv.info().available
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.environ["STANDIN_CUINIT_FAILS"] = "1"
    try:
        drv.state(1)
        said = "ok"
    except cp.CheckpointUnavailable as e:
        said = str(e)
    os.write(write, json.dumps([os.getpid(), said]).encode())
    os._exit(0)
os.waitpid(child, 0)
print(os.read(read, 65536).decode())
"""


def test_a_process_whose_cuinit_fails_is_refused_saying_which_and_what_to_check(libcuda_standin):
    done = subprocess.run([sys.executable, "-c", CUINIT_FAILS_IN_CHILD, libcuda_standin],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pid, said = json.loads(done.stdout)
    assert said == (f"unavailable: cuInit failed in process {pid} (each process that checkpoints initialises the "
                    "CUDA driver itself): CUDA_ERROR_NO_DEVICE (100); is a GPU visible to it (CUDA_VISIBLE_DEVICES)?")
