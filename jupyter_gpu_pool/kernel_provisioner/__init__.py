"""jupyter_client kernel provisioners: ``gpu-pool`` (local, the embedded default, in ``local``) and
``gpu-pool-kubernetes`` (in ``kubernetes``); what both share is in ``base``."""

from __future__ import annotations

from typing import Any

from .base import KernelStartRefused

__all__ = ["GPUPoolProvisioner", "KernelStartRefused"]


def __getattr__(name: str) -> Any:
    # Loaded when asked for (the ``gpu-pool`` entry point names it here): importing this package, as the
    # Kubernetes provisioner does, must not load the local pool and the checkpoint binding.
    if name == "GPUPoolProvisioner":
        from .local import GPUPoolProvisioner

        return GPUPoolProvisioner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
