"""What others did, read from the pool's journal once a culling pass: this server's user's refused starts
and new places in the queue are announced (the event the UI turns into a toast), and admins' requests for
this server's kernels (``admin_requests``) are carried out through the culler's own path, ``Culler.act``.

The culler owns the policy; this owns only how far it has read the journal and which queue places it has
announced, so that each is said once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..pool import Lease, Snapshot
from ..pool.words import not_done
from . import admin_requests, messages
from .backends.base import PoolBackend
from .context import ServerContext
from .recorder import Recorder

log = logging.getLogger(__name__)


class JournalWatch:
    def __init__(self, *, backend: PoolBackend, recorder: Recorder, context: ServerContext,
                 act: Callable[[Lease, str, str | None], str]):
        self.backend, self.recorder, self.context = backend, recorder, context
        self.act = act  # Culler.act: start an action on a kernel of this server, as its user's request would
        self._seq: int | None = None  # the last journal entry read (None: not read yet)
        self._waiters_seen: set[str] = set()

    async def follow(self, snapshot: Snapshot) -> None:
        """Announce what the ledger journaled for this server's user since the last pass (refused starts)
        and its new waiters; carry out admins' requests for this server's kernels."""
        owner = self.backend.owner
        entries = await self.backend.journal(kinds=("refused", admin_requests.KIND), owner=owner, limit=50)
        asked = []
        if self._seq is None:  # at start: only what happens from now on
            self._seq = max((e.seq for e in entries), default=0)
        else:
            for e in sorted(entries, key=lambda e: e.seq):
                if e.seq <= self._seq:
                    continue
                self._seq = e.seq
                if e.kind == admin_requests.KIND:
                    asked.append(e)
                    continue
                if e.detail.get("source") == "policy":
                    continue  # put on record (and announced) by the recorder already
                self.recorder.announce("refused", kernel_id=e.kernel_id or "", user=e.owner or owner,
                                       reason=e.reason, message=str(e.detail.get("message", "")),
                                       profile=e.detail.get("profile"))
        await self._carry_out(asked)
        await self._announce_waiters(snapshot, owner)

    async def _announce_waiters(self, snapshot: Snapshot, owner: str) -> None:
        mine = [w for w in snapshot.waiters if w.owner == owner]
        new = [w for w in mine if w.id not in self._waiters_seen]
        paths = await self.context.notebooks.paths() if new else {}
        for w in new:
            profile = self.backend.profile(w.profile)
            message = messages.queued(w.for_resume, paths.get(w.kernel_id, w.label),
                                      profile.display_name if profile else None, w.position)
            self.recorder.announce("queued", kernel_id=w.kernel_id, user=w.owner, reason="pool_exhausted",
                                   message=message, profile=w.profile)
        self._waiters_seen = {w.id for w in mine}

    async def _carry_out(self, entries) -> None:
        """Carry out the admins' requests among ``entries`` for kernels this server runs; a request for a
        kernel that ended meanwhile has nothing to do."""
        if not entries:
            return
        snapshot = await self.backend.snapshot()
        for e in entries:
            if e.kernel_id not in self.context.km or self.context.busy(e.kernel_id):
                continue
            lease = snapshot.lease_of_kernel(e.kernel_id)
            action, by = e.detail.get("action"), str(e.detail.get("by") or "an admin")
            if lease is None or lease.phase or action not in admin_requests.ACTIONS:
                continue
            try:
                done = self.act(lease, action, by)
            except ValueError as why:
                log.info("kernel %s: %s's request to %s it is not carried out: %s", e.kernel_id, by, action, why)
                await self.recorder.record("refused", lease, reason="admin", message=not_done(action, str(why)),
                                           action=action)
                continue
            log.info("kernel %s: %s at the request of admin %s", e.kernel_id, done, by)
