"""What hibernation needs to know and do about a running kernel, over a multi-kernel manager.

Works with jupyter_server's ``MappingKernelManager`` (which tracks each kernel's execution state
and last activity) and with jupyter_client's ``AsyncMultiKernelManager`` (which does not: the
execution state is then unknown and only the lock's timeout guards a kernel's GPU work).
"""

from __future__ import annotations

import asyncio
import logging

import psutil

from ..devices.processes import process_tree
from ..kernel_provisioner.base import PoolKernelProvisioner, shut_down

log = logging.getLogger(__name__)

# How long a kernel still starting (jupyter_server's execution state ``starting``: its process up, maybe
# not answering yet) gets to answer before silent code is sent to it.  A Release can come in the seconds
# after a start; the caller's timeout is for the code (a busy GPU), not for the kernel's start.
READY_TIMEOUT = 60.0

# Run silently in a Python kernel before its checkpoint: what a process has *reserved* on the GPU
# is what moves (docs/architecture.md), and frameworks keep freed memory cached.  It touches only
# frameworks the kernel has already imported and leaves no name behind in the user's namespace.
RELEASE_CACHE_CODE = """\
def _jupyter_gpu_pool_release_cache():
    import gc, sys
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
try:
    _jupyter_gpu_pool_release_cache()
finally:
    del _jupyter_gpu_pool_release_cache
"""


class Kernels:
    """The hibernator's view of the server's kernels."""

    def __init__(self, manager):
        self.manager = manager

    def has(self, kernel_id: str) -> bool:
        return kernel_id in self.manager

    def _km(self, kernel_id: str):
        return self.manager.get_kernel(kernel_id)

    def pid(self, kernel_id: str) -> int | None:
        try:
            provisioner = self._km(kernel_id).provisioner
        except KeyError:
            return None
        return provisioner.pid if isinstance(provisioner, PoolKernelProvisioner) else None

    def pids(self, kernel_id: str, fallback: int | None = None) -> list[int]:
        return process_tree(self.pid(kernel_id) or fallback)

    def execution_state(self, kernel_id: str) -> str | None:
        """jupyter_server's record of the kernel (idle, busy, starting, dead…); None where untracked."""
        try:
            # jupyter_server's kernel managers track it; a bare jupyter_client one (a test rig, a benchmark) does not
            return getattr(self._km(kernel_id), "execution_state", None)
        except KeyError:
            return None

    def is_python(self, kernel_id: str) -> bool:
        try:
            spec = self._km(kernel_id).kernel_spec
        except Exception:  # no spec to read: do not run Python code in a kernel we cannot name
            return False
        return spec is not None and (spec.language or "").lower() == "python"

    async def release_cache(self, kernel_id: str, timeout: float) -> str:
        """Run :data:`RELEASE_CACHE_CODE` silently; return ``released``, ``skipped`` (not a Python
        kernel), ``failed`` (the code raised) or ``timeout`` (no answer within ``timeout``: freeing
        GPU memory waits for the GPU work in flight, so the kernel's GPU is busy).

        A silent execute still counts as activity for jupyter_server (it watches IOPub), so the
        kernel's ``last_activity`` is put back as it was: the culler's clock is the user's, not ours.
        """
        if not self.is_python(kernel_id):
            return "skipped"
        result = await self.run_silently(kernel_id, RELEASE_CACHE_CODE, timeout)
        if result.startswith("failed"):
            log.warning("kernel %s: releasing cached GPU memory %s", kernel_id, result)
            return "failed"
        return "released" if result == "ran" else result

    async def environment_code(self, kernel_id: str, lease) -> str:
        """The code that gives the running kernel the environment of the slice it took at its first cell
        (its provisioner's ``environment_code``); empty where it has none to give."""
        try:
            provisioner = self._km(kernel_id).provisioner
        except KeyError:
            return ""
        return await provisioner.environment_code(lease) if isinstance(provisioner, PoolKernelProvisioner) else ""

    async def run_silently(self, kernel_id: str, code: str, timeout: float) -> str:
        """Run ``code`` in the kernel silently; return ``ran``, ``failed: <why>`` (it raised)
        or ``timeout`` (no answer within ``timeout``; the code runs on in the kernel).

        A silent execute still counts as activity for jupyter_server (it watches IOPub), so the
        kernel's ``last_activity`` is put back as it was: the culler's clock is the user's, not ours."""
        km = self._km(kernel_id)
        before_kernel = getattr(km, "last_activity", None)  # jupyter_server's, as execution_state
        before_server = getattr(self.manager, "last_kernel_activity", None)
        client = km.client()
        client.start_channels()
        try:
            if self.execution_state(kernel_id) == "starting":  # not for a busy kernel: kernel_info queues
                try:
                    await client.wait_for_ready(timeout=READY_TIMEOUT)
                except RuntimeError as e:  # the kernel died, or never answered
                    log.warning("kernel %s: not answering (%s); silent code not run", kernel_id, e)
                    return "timeout"
            reply = await client.execute(code, silent=True, store_history=False, reply=True, timeout=timeout)
            content = reply["content"]
            result = "ran" if content.get("status") == "ok" else f"failed: {content.get('evalue')}"
        except TimeoutError:
            return "timeout"  # the code runs on in the kernel; the caller leaves the kernel alone
        finally:
            client.stop_channels()
        # Let the server's activity watcher see our idle status before anyone asks whether the kernel is busy.
        for _ in range(40):
            if getattr(km, "execution_state", "idle") != "busy":
                break
            await asyncio.sleep(0.05)
        if before_kernel is not None and getattr(km, "execution_state", "idle") == "idle":
            km.last_activity = before_kernel
            if before_server is not None:
                self.manager.last_kernel_activity = before_server
        return result

    async def shutdown(self, kernel_id: str, now: bool = True, reason: str = "shutdown") -> None:
        """Shut the kernel down, its slice released with ``reason`` (``now``: kill it; a checkpointed
        kernel cannot finish its CUDA teardown)."""
        await shut_down(self.manager, kernel_id, reason, now=now)


def machine_ram() -> int:
    return psutil.virtual_memory().total


def available_ram() -> int:
    return psutil.virtual_memory().available


