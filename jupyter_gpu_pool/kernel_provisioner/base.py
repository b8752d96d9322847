"""What the local and the Kubernetes provisioners share, and what the rest of the pool may ask of either:
the refusal a start raises, the kernelspec's config check, the notebook's name as its user knows it, and
the clean-up of a start that failed.  Each provisioner mixes :class:`PoolKernelProvisioner` in; neither
imports the other (a cluster kernel never loads ``local/`` or the checkpoint binding)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from jupyter_core.utils import ensure_async

from ..compat import VerbatimHTTPError, forget_pending_start
from ..pool.words import notebook_label

# What jupyter_client passes a provisioner besides the kernelspec's provisioner config.
_UPSTREAM_KEYS = {"kernel_id", "kernel_spec", "parent", "config", "log"}


class KernelStartRefused(VerbatimHTTPError, RuntimeError):
    """A kernel start the pool refused.  An HTTPError, so that jupyter_server answers the
    frontend with this status and message instead of a 500 and a traceback."""

    def __init__(self, status: int, message: str, reason: str = "refused"):
        super().__init__(status, message)
        self.message = message
        self.pool_reason = reason

    def __str__(self) -> str:
        return self.message


def check_config(provisioner: str, known: tuple[str, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a kernelspec's provisioner config with a key other than ``known`` (a typo), or a value of one
    that is not a name: each is a name (a profile, an image)."""
    unknown = set(kwargs) - set(known) - _UPSTREAM_KEYS
    if unknown:
        keys = " and ".join(repr(k) for k in known)
        raise KernelStartRefused(
            400, f"The kernelspec's {provisioner} provisioner config has unknown keys {sorted(unknown)}; the known "
            f"{'key is' if len(known) == 1 else 'keys are'} {keys}. Fix the kernelspec (jupyter gpu-pool "
            "kernelspec install).", "bad_kernelspec")
    for key in known:
        if key in kwargs and not isinstance(kwargs[key], str):
            raise KernelStartRefused(
                400, f"The kernelspec's {provisioner} {key} must be a name, not {kwargs[key]!r}. Fix the kernelspec "
                "(jupyter gpu-pool kernelspec install).", "bad_kernelspec")


class PoolKernelProvisioner:
    """A provisioner whose kernel holds a slice of the pool."""

    provisioner_name = ""  # as kernelspecs name it
    config_keys: tuple[str, ...] = ("profile",)  # what its kernelspec's provisioner config may hold
    _release_reason = "shutdown"
    pid: int | None = None  # the kernel's process on this machine (jupyter_client's local provisioner sets it)
    # Set by jupyter_client's KernelProvisionerBase, which each provisioner also derives from.
    parent: Any
    kernel_id: str

    def __init__(self, **kwargs: Any):
        try:
            check_config(self.provisioner_name, self.config_keys, kwargs)  # before anything is taken
        except KernelStartRefused:  # a refusal as the provisioner is made is a start that failed, too
            forget_pending_start(kwargs.get("parent"), kwargs.get("kernel_id", ""))
            raise
        super().__init__(**kwargs)

    def release(self, reason: str) -> None:
        """The kernel is about to be shut down for ``reason`` (culled, released by its user, evicted
        from host RAM): when it stops, its slice goes back to the pool with that reason on record."""
        self._release_reason = reason

    @property
    def release_reason(self) -> str:
        return self._release_reason

    async def environment_code(self, lease) -> str:
        """Python code the running kernel runs (silently) before its first cell, where it took its slice at
        that cell (the rule's ``slice_at``): the slice's environment, set in the kernel's process.  Empty
        where this provisioner's kernels always take their slice at start."""
        return ""

    def notebook(self, session_name: str) -> str:
        """The notebook's path as its user knows it, the label of its slice: relative to the server's root
        directory (jupyter_server passes the absolute path in JPY_SESSION_NAME); "" where the session names
        no file (a session of a REST client on the root folder: "." is no name, the kernel's id is)."""
        root = getattr(getattr(self.parent, "parent", None), "root_dir", None)  # a bare KernelManager has none
        if session_name and root and os.path.isabs(session_name):
            try:
                relative = os.path.relpath(session_name, root)
            except ValueError:
                return notebook_label(session_name)
            if not relative.startswith(".."):
                return notebook_label(relative)
        return notebook_label(session_name)

    @asynccontextmanager
    async def start_step(self, undo: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[None]:
        """A step of a start: where it fails, ``undo`` gives back what the start took (a lease, a GPUKernel)
        and the kernel is forgotten (a refusal is an everyday event; jupyter_server's shutdown_all would
        otherwise fail on the kernel)."""
        try:
            yield
        except BaseException:
            if undo is not None:
                await undo()
            forget_pending_start(self.parent, self.kernel_id)
            raise


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
