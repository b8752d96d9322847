"""jupyter_client kernel provisioners: ``gpu-pool`` (local, the embedded default)."""

from .local import GPUPoolProvisioner, KernelStartRefused

__all__ = ["GPUPoolProvisioner", "KernelStartRefused"]
