"""Host RAM for hibernated kernels: a checkpoint's claim under the admin's cap (``hibernation.host_memory``),
and what happens past it (``over_cap``: the kernel keeps running, is shut down instead, or the kernels
hibernated longest are evicted: warned, then shut down at a deadline unless their users resume them).

Claims are the ledger's (``reserve_host_bytes``, atomic against every server of the machine); an eviction
is the lease's phase ``evicting`` with its deadline, carried out by the evicted kernel's own server.
Blocking calls (ledger, the machine's RAM) run in threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..pool import HIBERNATED, Lease, LeaseNotFound, format_size
from ..pool import residency as M
from ..pool.hibernation import EVICT_OLDEST, KEEP_RUNNING, SHUTDOWN, HibernationSettings
from ..pool.phases import EVICTING, PhaseConflict
from ..pool.units import format_age
from .errors import HibernationRefused
from .handles import Handle
from .kernels import Kernels
from .outcomes import Notice

RAM_MARGIN = 2 * 2**30  # keep this much RAM free beyond a checkpoint, for everything else on the machine


class HostMemory:
    """Host-RAM claims and evictions on this machine (``ram_total()``, ``ram_available()``: its RAM)."""

    def __init__(self, pool, settings: HibernationSettings, ram_total: Callable[[], int],
                 ram_available: Callable[[], int], clock: Callable[[], float]):
        self.pool, self.settings = pool, settings
        self.ram_total, self.ram_available, self.clock = ram_total, ram_available, clock

    @property
    def ledger(self):
        return self.pool.ledger

    def cap(self) -> int | None:
        return self.settings.cap_bytes(self.ram_total())

    async def claim(self, lease: Lease, needed: int) -> None:
        """Claim host RAM for the checkpoint under the cap, or apply the over-cap policy (refused)."""
        if not needed:  # nothing to hold (declared GPUs, a kernel that never used CUDA): always fits
            await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, 0, None, lease.host)
            return
        available = await asyncio.to_thread(self.ram_available)
        if needed + RAM_MARGIN > available:
            raise HibernationRefused(
                "host_ram", f"This machine has {format_size(available)} of RAM free, too little to hold this "
                f"kernel's {format_size(needed)} of GPU memory safely; it keeps running on its GPU.")
        cap = self.cap()
        granted, others = await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, needed, cap, lease.host)
        if not granted:
            assert cap is not None
            raise await self._over_cap(lease, needed, others, cap)

    async def _over_cap(self, lease: Lease, needed: int, others: int, cap: int) -> HibernationRefused:
        """The refusal of a claim past the cap, having done what the over-cap policy says."""
        cap_text = self.settings.describe_cap(self.ram_total())
        policy = self.settings.over_cap
        base = (f"Hibernated kernels on this machine hold {format_size(others)} of host RAM; this kernel's "
                f"{format_size(needed)} would pass the cap of {cap_text}.")
        if policy == KEEP_RUNNING or needed > cap:
            return HibernationRefused("host_memory", base + " It keeps running on its GPU.")
        if policy == SHUTDOWN:  # the caller (the culler) shuts it down, as for any kernel that cannot hibernate
            return HibernationRefused("host_memory", base + " The pool's setting says to shut it down instead.",
                                      keep_running=False)
        assert policy == EVICT_OLDEST
        deadline = self.clock() + self.settings.eviction_warning
        victims = await asyncio.to_thread(self._mark_victims, lease.host, others + needed - cap, deadline)
        if not victims:
            return HibernationRefused("host_memory", base + " Kernels already being shut down to make room will "
                                      "free it soon; it keeps running on its GPU until then.",
                                      retry_after=self.settings.eviction_warning)
        return HibernationRefused(
            "host_memory", base + f" The {len(victims)} kernel(s) hibernated longest will be shut down in "
            f"{format_age(self.settings.eviction_warning)} to make room (their owners are warned); this kernel "
            "keeps running on its GPU until then.", retry_after=self.settings.eviction_warning)

    def _mark_victims(self, host: str, over: int, deadline: float) -> list[Lease]:
        """Mark the longest-hibernated leases on ``host`` for eviction (the model's ``EVICT``) until ``over``
        bytes are covered (those already marked count).  Runs in a thread."""
        hibernated = sorted((lease for lease in self.ledger.leases(states=(HIBERNATED,))
                             if lease.host == host), key=lambda lease: lease.state_since)
        covered = sum(lease.host_bytes for lease in hibernated if lease.phase == EVICTING)
        marked = []
        for lease in hibernated:
            if covered >= over:
                break
            if lease.phase or not M.allowed(M.residency_of(lease), M.EVICT):
                continue  # evicting already, or moving; or it never held anything (no host RAM to free)
            try:
                self.ledger.set_phase(lease.id, EVICTING, expect="", deadline=deadline)
            except (LeaseNotFound, PhaseConflict):
                continue  # ended, or its own server started moving it
            covered += lease.host_bytes
            marked.append(lease)
        return marked

    async def evict(self, lease: Lease, k: Handle, now: float, kernels: Kernels) -> list[Notice]:
        """An evicting kernel of this server: its owner warned once for its deadline (``EVICT``'s warning),
        and at the deadline (``DEADLINE``) shut down.  Returns what was warned of or done."""
        deadline = lease.phase_deadline or now
        notices = []
        if k.warned_eviction != deadline:
            k.warned_eviction = deadline
            notices.append(Notice(
                "warned", lease, "host_memory",
                f"Hibernated kernels on this machine use up the host RAM set aside for them: this kernel, hibernated "
                f"for {format_age(now - lease.state_since)}, will be shut down in {format_age(max(deadline - now, 0))} "
                "to make room, unless you resume it (run a cell) or save your work first.", deadline))
        if now >= deadline and M.SHUT_DOWN in M.step(M.residency_of(lease), M.DEADLINE).effects:
            notices.append(Notice("culled", lease, "host_memory",
                                  "Shut down to make room in the host RAM set aside for hibernated kernels: it had "
                                  f"been hibernated for {format_age(now - lease.state_since)}."))
            await kernels.shutdown(lease.kernel_id, now=True, reason="host_memory")
        return notices
