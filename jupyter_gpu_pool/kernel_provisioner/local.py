"""The ``gpu-pool`` provisioner: a local kernel process on a slice of the pool.

A kernelspec selects it with::

    "metadata": {"kernel_provisioner": {"provisioner_name": "gpu-pool",
                                        "config": {"profile": "gpu-10g"}}}

Lifecycle (jupyter_client calls these; see ``KernelManager``):

- ``pre_launch`` takes a lease (or reuses this kernel's lease on a restart) and
  puts the slice into the kernel's environment; where the kernel's rule says
  ``slice_at: first-cell`` (and the server extension holds a first cell until the
  kernel has its slice: ``first_cell_served``), the lease holds nothing yet and the
  kernel sees no GPU; its first cell takes the slice, and ``environment_code`` puts
  the slice's environment into the running kernel before that cell runs;
- ``launch_kernel`` records the kernel process as the lease's holder;
- ``kill`` / ``terminate`` first re-checkpoint what a resume restored (a driver workaround, bounded:
  ``hibernation_checkpoint_before_kill``);
- ``cleanup(restart=True)`` keeps the lease for the next launch;
  ``cleanup(restart=False)`` releases it.  A failed launch releases it too.
- Exits that jupyter_client never reports (a kernel killed and not restarted, a
  server killed with ``kill -9``) are caught by the ledger's reconcile, which
  judges the holders recorded here.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Unicode

from ..config import ConfigError
from ..devices import checkpoint
from ..devices.mps import MPSUnavailable
from ..devices.processes import process_tree
from ..local import processes
from ..local.pool import Pool
from ..local.waiting import Place, QueueTimeout, wait_for_slice
from ..pool import ACTIVE, MPS, Lease, LeaseNotFound, PoolError, PoolExhausted, Profile, QuotaExceeded, UnknownProfile
from ..pool.budgets import BudgetExceeded
from ..pool.errors import MPSUserBusy
from ..pool.rules import FIRST_CELL
from ..pools import pool_for
from .base import KernelStartRefused, PoolKernelProvisioner
from .encryption import local_launch_kwargs
from .environment import no_slice_environment, set_environment_code, slice_environment
from .kernelspecs import PROVISIONER


def _refusal(err: Exception) -> KernelStartRefused:
    if isinstance(err, (QuotaExceeded, BudgetExceeded)):
        return KernelStartRefused(403, str(err), err.reason)
    if isinstance(err, (PoolExhausted, MPSUserBusy)):
        return KernelStartRefused(503, str(err), err.reason)
    if isinstance(err, UnknownProfile):
        return KernelStartRefused(400, str(err), err.reason)
    if isinstance(err, MPSUnavailable):
        return KernelStartRefused(503, f"This GPU profile needs NVIDIA MPS, which is unavailable: {err}", "mps")
    if isinstance(err, ConfigError):
        return KernelStartRefused(500, f"The GPU pool is misconfigured, tell your admin: {err}", "config")
    if isinstance(err, PoolError):  # the pool service down (503), or its refusal of the request
        return KernelStartRefused(err.status or 500, str(err), err.reason)
    return KernelStartRefused(500, str(err), "error")


class GPUPoolProvisioner(PoolKernelProvisioner, LocalProvisioner):
    """Starts a local kernel holding a lease on a slice of the GPU pool."""

    provisioner_name = PROVISIONER

    profile = Unicode(
        "",
        help="Profile name this kernelspec starts on (kernelspec provisioner config); "
        "empty means the admin's GPUPool.default_profile.",
    ).tag(config=True)

    lease_id = Unicode(None, allow_none=True, help="The lease this kernel holds (set by the provisioner).")

    first_cell_served = Bool(
        False,
        help="""Whether this server takes a kernel's slice when its first cell runs (set by the GPU pool's server
        extension, whose kernel websockets hold that cell until the slice is taken).  The policy's slice_at
        decides per rule; without this, every kernel takes its slice at start (nothing would take it later).""",
    ).tag(config=True)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)  # PoolKernelProvisioner checks the kernelspec's provisioner config
        self._pool: Pool | None = None
        self._lease: Lease | None = None
        self._base_pythonpath = ""  # the kernel's PYTHONPATH before the slice's, for a slice taken later

    # -- the pool ---------------------------------------------------------------------------

    async def pool(self) -> Pool:
        if self._pool is None:
            parent_config = self.parent.config if self.parent is not None else None
            try:
                self._pool = await asyncio.to_thread(pool_for, parent_config)
            except (ConfigError, PoolError) as e:  # a bad configuration, or the pool service not answering
                raise _refusal(e) from e
        return self._pool

    @property
    def lease(self) -> Lease | None:
        return self._lease if self.lease_id else None

    async def _take_lease(self, pool: Pool, label: str) -> tuple[Lease, Profile]:
        try:
            profile = pool.settings.profile(self.profile or None)
        except UnknownProfile as e:
            raise _refusal(e) from e
        if self.lease_id:  # a restart: keep the lease unless it is gone (or hibernated: nothing to restore into)
            lease = await asyncio.to_thread(pool.ledger.get, self.lease_id)
            if lease is not None and (lease.state == ACTIVE or lease.awaits_first_cell):
                return lease, pool.settings.profiles.get(lease.profile, profile)
            if lease is not None:
                await pool.arelease(lease.id, "restarted while hibernated")
            self.lease_id = None
        # The other profiles, so that a refusal can say which of them would start now.
        request = replace(pool.request(self.kernel_id, profile, label=label),
                          alternatives=tuple(pool.settings.profiles.values()))
        if self._slice_at_first_cell(pool, profile):
            try:
                return await asyncio.to_thread(pool.start_without_slice, request), profile
            except PoolError as e:
                raise _refusal(e) from e
        if pool.settings.start_queue_timeout > 0:
            return await self._wait_in_queue(pool, request), profile
        try:
            return await pool.aallocate(request), profile
        except PoolError as e:
            raise _refusal(e) from e

    def _slice_at_first_cell(self, pool: Pool, profile: Profile) -> bool:
        """Whether this kernel starts without a slice: its rule says ``slice_at: first-cell``, this server
        takes a slice at a first cell, and the kernel is Python (its first cell's environment is set by
        Python code in the kernel)."""
        if not self.first_cell_served:
            return False
        owner = pool.settings.owner
        kernelspec = (self.parent.kernel_name or "") if self.parent is not None else ""
        rule = pool.settings.idle_policy.rule_for(owner, pool.groups_of(owner), profile.name, kernelspec)
        if rule.slice_at != FIRST_CELL:
            return False
        language = (self.kernel_spec.language or "").lower() if self.kernel_spec is not None else ""
        if language != "python":
            self.log.info("kernel %s takes its GPU slice at start: its rule %r says first-cell, but only a Python "
                          "kernel can be given its slice's environment after it starts (this one is %r)",
                          self.kernel_id, rule.name, language or "unknown")
            return False
        return True

    async def _wait_in_queue(self, pool: Pool, request) -> Lease:
        timeout = pool.settings.start_queue_timeout
        place = Place(request.owner, request.kernel_id, request.profile.name, request.profile.slice,
                      label=request.label, groups=request.groups)

        async def moved(position: int) -> None:
            self.log.info("GPU pool full: kernel %s waits for a %s slice at queue position %d (up to %.0fs)",
                          self.kernel_id, request.profile.name, position, timeout)

        try:
            lease, _waited = await wait_for_slice(
                pool.ledger, lambda waiter_id: pool.allocate(request, waiter_id, record_refusal=False), place,
                timeout=timeout, on_position=moved)
        except QueueTimeout as e:
            await asyncio.to_thread(pool.ledger.record_refusal, request.kernel_id, request.owner,
                                    request.profile.name, e.refusal, request.label)
            raise KernelStartRefused(503, str(e), "queue_timeout") from None
        except (QuotaExceeded, PoolExhausted, BudgetExceeded, MPSUserBusy) as e:
            await asyncio.to_thread(pool.ledger.record_refusal, request.kernel_id, request.owner,
                                    request.profile.name, e, request.label)
            raise _refusal(e) from e
        return lease

    async def _release(self, reason: str) -> None:
        if not self.lease_id or self._pool is None:
            return
        lease_id, self.lease_id = self.lease_id, None
        try:
            released = await self._pool.arelease(lease_id, reason)
        except PoolError as e:  # the pool service is away: the kernel still goes (see _unreachable)
            self._unreachable("release its slice", e)
            return
        if released:
            self.log.info("GPU lease %s of kernel %s released (%s)", lease_id[:8], self.kernel_id, reason)

    # -- provisioner API --------------------------------------------------------------------

    async def _launch_failed(self) -> None:
        await self._release("launch failed")

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        async with self.start_step():
            pool = await self.pool()
            env = kwargs.get("env") or {}
            lease, profile = await self._take_lease(pool, label=self.notebook(env.get("JPY_SESSION_NAME", "")))
        self.lease_id, self._lease = lease.id, lease
        async with self.start_step(self._launch_failed):
            try:
                kwargs = await self._launch_environment(pool, lease, profile, kwargs)
            except (MPSUnavailable, ConfigError) as e:
                raise _refusal(e) from e
        return kwargs

    async def _launch_environment(self, pool: Pool, lease: Lease, profile: Profile,
                                  kwargs: dict[str, Any]) -> dict[str, Any]:
        """jupyter_client's launch arguments, with the slice's environment."""
        kwargs = await super().pre_launch(**local_launch_kwargs(self, kwargs))
        self._base_pythonpath = kwargs["env"].get("PYTHONPATH", "")
        if lease.awaits_first_cell:
            kwargs["env"].update(no_slice_environment(lease, profile))
            self.log.info("kernel %s starts without a GPU slice (lease %s): it takes %s when its first cell runs",
                          self.kernel_id, lease.short_id, profile.slice)
            return kwargs
        gpus = [g for g in (pool.gpu(u) for u in lease.gpus) if g is not None]
        mps_env = await asyncio.to_thread(pool.mps_env, lease) if profile.isolation == MPS else None
        kwargs["env"].update(slice_environment(lease, profile, gpus, mps_env, kwargs["env"].get("PYTHONPATH", "")))
        self.log.info("kernel %s holds GPU lease %s: %s on %s", self.kernel_id, lease.short_id,
                      profile.slice, ", ".join(g.label for g in gpus))
        return kwargs

    async def environment_code(self, lease: Lease) -> str:
        """Python code that puts the slice ``lease`` took at the kernel's first cell into the running
        kernel's environment (``os.environ``, and PyTorch's cap on a soft slice)."""
        pool = await self.pool()
        profile = pool.settings.profiles.get(lease.profile) or pool.settings.profile(self.profile or None)
        gpus = [g for g in (pool.gpu(u) for u in lease.gpus) if g is not None]
        mps_env = await asyncio.to_thread(pool.mps_env, lease) if profile.isolation == MPS else None
        self._lease = lease
        self.log.info("kernel %s took GPU lease %s at its first cell: %s on %s", self.kernel_id, lease.short_id,
                      profile.slice, ", ".join(g.label for g in gpus))
        return set_environment_code(slice_environment(lease, profile, gpus, mps_env, self._base_pythonpath))

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        async with self.start_step(self._launch_failed):
            info = await super().launch_kernel(cmd, **kwargs)
        try:
            holder = await asyncio.to_thread(processes.identify, self.pid)
        except Exception:  # exited already: record it so that reconcile reclaims the slice
            holder = processes.Holder(pid=self.pid, start=0.0, host=processes.hostname())
        try:
            await asyncio.to_thread(self._pool.ledger.set_holder, self.lease_id, holder, "")  # type: ignore[union-attr]
        except LeaseNotFound:
            self.log.warning("GPU lease of kernel %s vanished during launch", self.kernel_id)
        return info

    async def _mark_stopping(self) -> None:
        """A shutdown began: the kernel process is about to end on purpose.  Until cleanup
        releases the lease, reconcile must neither take it as a crash nor hand it out."""
        if self.lease_id and self._pool is not None:
            try:
                await asyncio.to_thread(self._pool.ledger.stop, self.lease_id)
            except LeaseNotFound:
                self.lease_id = None
            except PoolError as e:
                self._unreachable("mark it stopping", e)

    def _unreachable(self, what: str, error: Exception) -> None:
        """A kernel's shutdown never waits on the pool: where it cannot be told (the pool service is
        down), its reconcile gives the slice back once it sees the kernel's process gone."""
        self.log.warning("kernel %s: could not %s (%s); the pool reclaims the slice when it sees the kernel's "
                         "process gone", self.kernel_id, what, error)

    async def shutdown_requested(self, restart: bool = False) -> None:
        await super().shutdown_requested(restart=restart)
        await self._mark_stopping()

    async def _before_kill(self) -> None:
        """Re-checkpoint the kernel's processes a resume restored (``devices.checkpoint.prepare_kill``:
        killing a just-restored process hung a host on one driver), within the admin's bound."""
        pool = self._pool
        if pool is None or self.pid is None or pool.inventory.declared:
            return
        settings = pool.settings.hibernation
        if not settings.checkpoint_before_kill:
            return
        tree = await asyncio.to_thread(process_tree, self.pid)
        work = asyncio.to_thread(checkpoint.prepare_kill, checkpoint.driver(), tree, settings.lock_timeout)
        try:
            done = await asyncio.wait_for(work, settings.shutdown_timeout)
        except TimeoutError:
            self.log.warning("kernel %s: the checkpoint before its kill took more than %gs; killing it anyway",
                             self.kernel_id, settings.shutdown_timeout)
            return
        for pid, what in done.items():
            self.log.info("kernel %s: pid %s %s before the kill", self.kernel_id, pid, what)

    async def kill(self, restart: bool = False) -> None:
        await self._mark_stopping()
        await self._before_kill()
        await super().kill(restart=restart)

    async def terminate(self, restart: bool = False) -> None:
        await self._mark_stopping()
        await self._before_kill()
        await super().terminate(restart=restart)

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not self.lease_id or self._pool is None:
            return
        if restart:
            try:
                await asyncio.to_thread(self._pool.ledger.set_holder, self.lease_id, None)
            except LeaseNotFound:
                self.lease_id = None
            except PoolError as e:
                self._unreachable("record the restart", e)
        else:
            await self._release(self.release_reason)
            self._release_reason = "shutdown"

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update({"gpu_pool_lease_id": self.lease_id, "gpu_pool_profile": self.profile,
                     "gpu_pool_pythonpath": self._base_pythonpath})  # for a slice a first cell takes later
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """A restarted server adopts a running kernel: its lease gets this server as manager."""
        await super().load_provisioner_info(provisioner_info)
        self.profile = provisioner_info.get("gpu_pool_profile") or self.profile
        self._base_pythonpath = provisioner_info.get("gpu_pool_pythonpath") or ""
        lease_id = provisioner_info.get("gpu_pool_lease_id")
        if lease_id:
            pool = await self.pool()
            manager = await asyncio.to_thread(processes.identify)
            try:
                self._lease = await asyncio.to_thread(pool.ledger.adopt, lease_id, manager)
                self.lease_id = lease_id
            except LeaseNotFound:
                self.log.warning("kernel %s: its GPU lease %s is no longer held", self.kernel_id, lease_id[:8])
                self.lease_id = None
