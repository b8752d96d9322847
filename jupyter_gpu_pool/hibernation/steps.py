"""A kernel's residency stepped through the lifecycle's model (``pool.residency``) and written into the
ledger by compare-and-set: the model says what comes next and what to carry out, the ledger's phase
stays the one record every server reads.

A mover claims a kernel by moving its phase into the move's (:meth:`Steps.claim`: another mover that got
there first, or a shutdown, wins); each report of the move (:meth:`Steps.report`: a checkpoint done or
undone, a slice granted, a restore failed…) is stepped from the kernel's residency as the ledger has it
now (a shutdown may have won meanwhile: the model knows what a stopping kernel's move still does), and
the step's writes are made: the slice given back, a host-RAM claim dropped, the phase moved.  A report
the model refuses there (the kernel ended, or was moved by someone else) writes nothing.
"""

from __future__ import annotations

import asyncio
import logging

from ..pool import ACTIVE, RELEASED, Lease, LeaseNotFound
from ..pool import residency as M
from ..pool.phases import STOPPING, PhaseConflict, PhaseError, display_state
from .errors import HibernationFailed, HibernationRefused
from .handles import Handles

log = logging.getLogger(__name__)


class Steps:
    """The ledger side of this server's moves: read a kernel's lease, claim it, write each step."""

    def __init__(self, pool, handles: Handles):
        self.pool = pool
        self.handles = handles

    @property
    def ledger(self):
        return self.pool.ledger

    async def lease(self, kernel_id: str) -> Lease | None:
        return await asyncio.to_thread(self.ledger.by_kernel, kernel_id)

    def residency(self, lease: Lease | None, kernel_id: str, was: str = "") -> M.Residency:
        """The kernel's residency: its lease, and what this server remembers of the move under way."""
        k = self.handles[kernel_id]
        return M.residency_of(lease, first=k.taking_first, hint=k.hint_only, was=was)

    async def move(self, lease: Lease, to: str, *, expect: str, deadline: float | None = None) -> Lease | None:
        """Move the lease's phase from ``expect`` to ``to`` in the ledger (compare-and-set) and show
        the result.  A lease that ended meanwhile is shown released (None is returned); one being
        shut down is its provisioner's until released (returned as it is, unmoved)."""
        def move() -> Lease | None:
            try:
                return self.ledger.set_phase(lease.id, to, expect=expect, deadline=deadline)
            except LeaseNotFound:
                return None
            except PhaseConflict as e:
                if e.found == STOPPING:
                    return self.ledger.get(lease.id)
                raise

        updated = await asyncio.to_thread(move)
        await self.handles.show(lease.kernel_id, display_state(updated) if updated else RELEASED)
        return updated

    async def claim(self, lease: Lease, asked: M.Step, stopping: HibernationRefused) -> Lease:
        """Claim the kernel for the move ``asked`` begins: its phase into the move's, from the phase read
        (compare-and-set).  Another mover there first is refused ``in_progress``; a shutdown, ``stopping``."""
        to = M.ledger_view(asked.state)[1]
        try:
            claimed = await self.move(lease, to, expect=lease.phase)
        except PhaseConflict as e:
            raise HibernationRefused("in_progress", f"This kernel is {e.found}; try again when that is done.") from None
        if claimed is None or claimed.phase != to:
            raise stopping
        return claimed

    async def granted(self, lease: Lease, *, first: bool) -> Lease:
        """The pool gave the lease a slice (its state active now, the phase of its ask kept): step the ask
        (resuming, or queued) by ``SLICE_GRANTED`` and write the phase of what follows (restoring).  A lease
        whose shutdown won meanwhile keeps its phase."""
        if lease.phase not in (M.RESUMING, M.QUEUED):
            return lease
        asked = M.Residency(lease.phase, first=first)
        to = M.ledger_view(M.step(asked, M.SLICE_GRANTED).state)[1]
        if lease.phase == to:
            return lease
        return await self.move(lease, to, expect=lease.phase) or lease

    async def fail(self, kernel_id: str, event: str, was: str, states: dict[int, str], reason: str,
                   what: str) -> HibernationFailed:
        """Past the point of no return (``event``: a checkpoint or restore stuck): the kernel is marked
        failed; returns the failure, which says exactly where things are (its caller puts it on record)."""
        where = "; ".join(f"pid {pid}: CUDA {state}" for pid, state in sorted(states.items()))
        current = await self.lease(kernel_id)
        holds = "still holds its GPU slice" if current is not None and current.state == ACTIVE else "holds no GPU slice"
        message = (f"{what}: {where}. The kernel {holds}; its GPU state cannot be trusted. Save what you can "
                   "(CPU-only code still runs) and restart the kernel.")
        await self.report(kernel_id, event, was=was)
        log.error("kernel %s: %s", kernel_id, message)
        return HibernationFailed(reason, message, recovered=False, states=states)

    async def report(self, kernel_id: str, event: str, *, was: str = "", host_bytes: int = 0, reason: str = "",
                     last_gpus: tuple[str, ...] | None = None) -> tuple[Lease | None, M.Step | None]:
        """Step the kernel from its residency now (``was``: the stage of this server's move under way, for
        a kernel whose shutdown won meanwhile) by ``event``, and write the step: the slice given back
        (``host_bytes`` in host RAM, for ``reason``, its memory from ``last_gpus``), the host-RAM claim
        dropped, the phase moved.  Returns the lease after it and the step (None, with nothing written,
        where the model refuses the report there)."""
        current = await self.lease(kernel_id)
        try:
            done = M.step(self.residency(current, kernel_id, was), event)
        except PhaseError as e:  # (Refused among them) it ended, or was moved by someone else
            log.debug("kernel %s: %s; nothing to write", kernel_id, e)
            await self.handles.show(kernel_id, display_state(current) if current else RELEASED)
            return current, None
        lease, to = current, M.ledger_view(done.state)[1]
        if lease is None or done.state.stage == M.GONE:
            await self.handles.show(kernel_id, RELEASED)
            return None, done
        if M.GIVE_BACK in done.effects:
            lease = await asyncio.to_thread(self.ledger.hibernate, lease.id, host_bytes, reason, last_gpus, to)
        if M.FREE_HOST_RAM in done.effects and lease.host_bytes:
            await asyncio.to_thread(self.ledger.reserve_host_bytes, lease.id, 0, None, lease.host)
        if lease.phase != to:
            return await self.move(lease, to, expect=lease.phase), done
        await self.handles.show(kernel_id, display_state(lease))
        return lease, done
