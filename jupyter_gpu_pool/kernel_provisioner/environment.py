"""The environment a kernel gets for its slice, per isolation mode.

- every mode: ``CUDA_VISIBLE_DEVICES`` names the leased GPU(s) by UUID, and
  ``JUPYTER_GPU_POOL_*`` tells code in the kernel what it holds;
- ``mps``: the MPS pipe directory plus the memory and SM caps MPS enforces;
- ``soft``: framework caps.  JAX and CuPy read their caps from the environment
  themselves; PyTorch has none, so a ``sitecustomize`` on the kernel's
  ``PYTHONPATH`` caps it when (and only when) the kernel imports ``torch``.

JAX's default of pre-allocating 75% of the GPU is turned off in every mode: it
would defeat sharing and make every hibernation checkpoint huge.

A kernel that starts without a slice (its rule's ``slice_at: first-cell``) gets
:func:`no_slice_environment`: no GPU is visible, so nothing it runs before its first
cell can take a device.  Its first cell takes the slice and puts :func:`slice_environment`
into the running kernel (``hibernation.kernels.SET_ENVIRONMENT_CODE``) before the cell
runs: CUDA reads these variables when a process first initialises it, and the kernel's
subprocesses inherit them.
"""

from __future__ import annotations

import os

from ..pool import EXCLUSIVE, GPU, MPS, SOFT, Lease, Profile

SOFTCAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "softcap")


def slice_environment(lease: Lease, profile: Profile, gpus: list[GPU], mps_env: dict[str, str] | None = None,
                      base_pythonpath: str = "") -> dict[str, str]:
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        "JUPYTER_GPU_POOL_LEASE": lease.id,
        "JUPYTER_GPU_POOL_PROFILE": profile.name,
        "JUPYTER_GPU_POOL_SLICE": profile.slice.to_text(),
        "JUPYTER_GPU_POOL_ISOLATION": profile.isolation,
        "JUPYTER_GPU_POOL_MEMORY_BYTES": str(lease.memory),
        "JUPYTER_GPU_POOL_GPUS": ",".join(g.uuid for g in gpus),
        "JUPYTER_GPU_POOL_GPU_SOURCE": ",".join(g.source for g in gpus),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    if lease.sm_percent is not None:
        env["JUPYTER_GPU_POOL_SM_PERCENT"] = str(lease.sm_percent)
    if profile.isolation == MPS:
        env.update(mps_env or {})
        # Device ordinals here are the client's own: CUDA_VISIBLE_DEVICES makes the slice's GPU 0.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={lease.memory // 2**20}M"
        if lease.sm_percent is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(lease.sm_percent)
    elif profile.isolation == SOFT:
        gpu_memory = gpus[0].memory
        fraction = min(lease.memory / gpu_memory, 1.0)
        env["JUPYTER_GPU_POOL_MEMORY_FRACTION"] = f"{fraction:.6f}"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
        env["CUPY_GPU_MEMORY_LIMIT"] = str(lease.memory)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SOFTCAP_DIR, base_pythonpath) if p)
    elif profile.isolation != EXCLUSIVE:
        raise ValueError(f"unknown isolation mode {profile.isolation!r}")
    return env


NO_GPU = ""  # CUDA_VISIBLE_DEVICES that shows no device: CUDA finds none, a framework finds CUDA unavailable


def no_slice_environment(lease: Lease, profile: Profile) -> dict[str, str]:
    """The environment of a kernel holding no slice yet: no GPU visible, and what it will take named."""
    return {
        "CUDA_VISIBLE_DEVICES": NO_GPU,
        "JUPYTER_GPU_POOL_LEASE": lease.id,
        "JUPYTER_GPU_POOL_PROFILE": profile.name,
        "JUPYTER_GPU_POOL_SLICE": profile.slice.to_text(),
        "JUPYTER_GPU_POOL_ISOLATION": profile.isolation,
        "JUPYTER_GPU_POOL_GPUS": "",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }


# Run silently in a kernel that took its slice at its first cell, before that cell: the slice's environment
# in os.environ (CUDA reads it when the process first initialises CUDA; subprocesses inherit it) and, on a
# soft slice, PyTorch's cap (the softcap hook that a kernel started with its slice gets from sitecustomize).
_SET_ENVIRONMENT_CODE = """\
def _jupyter_gpu_pool_set_environment(env, softcap):
    import os
    os.environ.update(env)
    if env.get("JUPYTER_GPU_POOL_MEMORY_FRACTION"):
        import importlib.util
        spec = importlib.util.spec_from_file_location("_jupyter_gpu_pool_softcap", softcap)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.install()
try:
    _jupyter_gpu_pool_set_environment(%r, %r)
finally:
    del _jupyter_gpu_pool_set_environment
"""


def set_environment_code(env: dict[str, str]) -> str:
    """Python code that puts ``env`` into the running kernel (and, for a soft slice, caps PyTorch)."""
    return _SET_ENVIRONMENT_CODE % (dict(env), os.path.join(SOFTCAP_DIR, "sitecustomize.py"))
