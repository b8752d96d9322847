"""What the rest of the pool may ask of a GPU pool kernel's provisioner, declared once for the local
and the Kubernetes provisioners (each mixes :class:`PoolKernelProvisioner` in)."""

from __future__ import annotations

from jupyter_core.utils import ensure_async


class PoolKernelProvisioner:
    """A provisioner whose kernel holds a slice of the pool."""

    _release_reason = "shutdown"
    pid: int | None = None  # the kernel's process on this machine (jupyter_client's local provisioner sets it)

    def release(self, reason: str) -> None:
        """The kernel is about to be shut down for ``reason`` (culled, released by its user, evicted
        from host RAM): when it stops, its slice goes back to the pool with that reason on record."""
        self._release_reason = reason

    @property
    def release_reason(self) -> str:
        return self._release_reason


async def shut_down(manager, kernel_id: str, reason: str, *, now: bool = False) -> bool:
    """Shut a kernel of ``manager`` (a multi-kernel manager) down, its slice released with ``reason``;
    ``now`` kills it (a checkpointed kernel cannot finish its CUDA teardown).  False: no such kernel."""
    try:
        kernel = manager.get_kernel(kernel_id)
    except KeyError:
        return False
    provisioner = getattr(kernel, "provisioner", None)  # None until the kernel has started
    if isinstance(provisioner, PoolKernelProvisioner):
        provisioner.release(reason)
    await ensure_async(manager.shutdown_kernel(kernel_id, now=now))
    return True
