"""Soft-isolation caps for a gpu-pool kernel, applied lazily.

This file is on the kernel's PYTHONPATH only for ``soft`` slices (for a kernel that takes its
slice at its first cell, it is loaded then, under another name, and :func:`install` called).  It costs a
kernel that never imports PyTorch nothing but installing one import hook: when
``torch`` is imported, the hook queues ``set_per_process_memory_fraction`` to
run when PyTorch initialises CUDA (``torch.cuda._lazy_call``), so even the
import itself stays free of a CUDA context.  JAX and CuPy read their caps from
the environment and need no hook.  Any ``sitecustomize`` that this one shadows
is still run.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _cap_torch(torch):
    fraction = float(os.environ["JUPYTER_GPU_POOL_MEMORY_FRACTION"])

    def apply():
        torch.cuda.set_per_process_memory_fraction(fraction, 0)

    torch.cuda._lazy_call(apply)
    torch._jupyter_gpu_pool_memory_fraction = fraction  # so a user (and a test) can see the cap is set


class _TorchCapFinder:
    """A meta path finder (duck-typed: importing importlib.abc would cost every kernel start)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util  # only now: a kernel that never imports torch never pays for it

        sys.meta_path.remove(self)  # one-shot: find the real spec without finding ourselves again
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                _cap_torch(module)
            except Exception as e:  # never break the user's import over a cap
                sys.stderr.write(f"jupyter-gpu-pool: could not cap PyTorch's GPU memory: {e}\n")

        loader.exec_module = exec_module
        return spec


def _chain_shadowed_sitecustomize():
    """Run the sitecustomize this file shadows, if there is one further down sys.path."""
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            with open(candidate) as f:
                code = compile(f.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


def install():
    """Cap PyTorch in this process: at once where it is imported already, else when it is imported.  Run
    at the interpreter's start, and by a kernel that took its slice at its first cell (loaded under
    another name, so that it chains nothing)."""
    if not os.environ.get("JUPYTER_GPU_POOL_MEMORY_FRACTION"):
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        _cap_torch(torch)
    elif not any(type(f).__name__ == "_TorchCapFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchCapFinder())


if __name__ == "sitecustomize":
    install()
    _chain_shadowed_sitecustomize()
