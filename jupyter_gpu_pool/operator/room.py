"""What the operator keeps of the cluster's room for the admin's sharing (reservations, a fair queue), kept up to
date on each change so that a decision reads it in what its kernel concerns, never by counting every kernel:

- the GPU nodes as the pool's entries (``cluster.room.node_gpu``), from the last listing of the Nodes (the
  sweep lists them while a reservation is configured);
- each node's GPU memory held by the active slices on it (a kernel counts where its pod runs, and one admitted
  into a reservation's room but not placed yet where its admission put it, until its pod is placed);
- each share group's decayed use (the fair queue's: GPU memory held over time, half as much every half-life),
  kept per set of groups as slices come and go (``pool.fairshare.Decaying``); a restarted operator counts the
  kernels holding slices then from their admission, and nothing of those that ended before;
- the starts waiting for room (``status.waiting``), in arrival order.

:meth:`RoomBook.shared` gives an admission what ``pool.allocation.allocate`` reads of it (``Shared``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

from ..cluster.room import NODE_PREFIX, node_gpu, on_cluster, room_lease, usage
from ..pool import ACTIVE, GPU, Lease, Waiter
from ..pool.fairshare import Decaying, decayed
from ..pool.sharing import Sharing
from .admission import Shared


class RoomBook:
    def __init__(self, clock: Callable[[], float], sharing: Sharing):
        self.clock = clock
        self.configured = sharing  # the config file's: what applies while no GPUPoolPolicy sets sharing
        self.sharing = sharing  # as the admin wrote it (the policy's, else the config file's)
        self.decided = sharing  # as the cluster counts it (on_cluster: whole GPUs as their memory)
        self.gpus: list[GPU] = []
        self._held: dict[str, tuple[int, int]] = {}  # node entry -> (bytes, kernels) of its active slices
        self._counted: dict[str, tuple[str, int, frozenset]] = {}  # uid -> (entry, bytes, groups) counted
        self._guess: dict[str, str] = {}  # uid -> node entry its admission chose, until its pod is placed
        self._use: dict[frozenset, Decaying] = {}  # a set of groups -> its slices' decayed use
        self.waiting: dict[str, Waiter] = {}  # uid -> a start waiting for room

    # -- what applies ------------------------------------------------------------------------------

    def set_sharing(self, sharing: Sharing | None) -> None:
        """The policy's sharing (None: the config file's applies)."""
        sharing = sharing if sharing is not None else self.configured
        rate_changed = sharing.fair.half_life != self.sharing.fair.half_life
        self.sharing = sharing
        self.decided = on_cluster(sharing, self.gpus)
        if rate_changed:  # counted at another rate from now on: the slices held now, not the past
            self._use.clear()
            now = self.clock()
            for _entry, memory, groups in self._counted.values():
                self._decaying(groups).change(now, memory)

    def set_nodes(self, nodes: Iterable[dict]) -> None:
        self.gpus = [g for i, n in enumerate(nodes) if (g := node_gpu(n, i)) is not None]
        self.decided = on_cluster(self.sharing, self.gpus)

    def keeps(self, now: float) -> bool:
        """Whether a reservation keeps room now (an admission then counts the room, node by node)."""
        return self.decided.needs_everyone(now)

    # -- counting, on each change of a kernel ---------------------------------------------------------

    def count(self, uid: str, lease: Lease | None, *, seed: bool = False) -> None:
        """Count ``lease`` (None: the kernel holds nothing now) where it is; ``seed``: the operator just started,
        so count its use from its admission on (otherwise from now)."""
        now = self.clock()
        node = lease.host if lease is not None else ""
        if node:
            self._guess.pop(uid, None)
        entry = NODE_PREFIX + node if node else self._guess.get(uid, "")
        active = lease is not None and lease.state == ACTIVE
        wanted = (entry, lease.total_memory, frozenset(lease.groups)) if active else None
        old = self._counted.get(uid)
        if old == wanted:
            return
        if old is not None:
            self._add(old, -1, now)
            del self._counted[uid]
        if wanted is not None:
            self._add(wanted, 1, now)
            self._counted[uid] = wanted
            if seed and old is None and lease.state_since < now:
                self._decaying(wanted[2]).value += decayed([(wanted[1], lease.state_since, None)], now,
                                                           self.sharing.fair.half_life)
        if lease is None:
            self._guess.pop(uid, None)

    def guess(self, uid: str, entry: str, lease: Lease) -> None:
        """An admission put the kernel on node ``entry``: it counts there until its pod is placed."""
        self._guess[uid] = entry
        self.count(uid, lease)

    def _add(self, counted: tuple[str, int, frozenset], sign: int, now: float) -> None:
        entry, memory, groups = counted
        if entry:
            held, kernels = self._held.get(entry, (0, 0))
            held, kernels = held + sign * memory, kernels + sign
            if kernels:
                self._held[entry] = (held, kernels)
            else:
                self._held.pop(entry, None)
        self._decaying(groups).change(now, sign * memory)

    def _decaying(self, groups: frozenset) -> Decaying:
        found = self._use.get(groups)
        if found is None:
            found = self._use[groups] = Decaying(self.sharing.fair.half_life, at=self.clock())
        return found

    def group_use(self, now: float) -> dict[str, float]:
        """Each share group's decayed use (GiB-seconds) at ``now``."""
        fair, use = self.sharing.fair, {}
        for groups, decaying in self._use.items():
            group = fair.group_of(groups)
            use[group] = use.get(group, 0.0) + decaying.at_time(now)
        return use

    def wait(self, uid: str, waiter: Waiter | None) -> None:
        if waiter is None:
            self.waiting.pop(uid, None)
        else:
            self.waiting[uid] = waiter

    # -- what an admission reads --------------------------------------------------------------------

    def shared(self, now: float, members: Callable[[tuple[str, ...], tuple[str, ...]], Iterable[tuple[Lease, str]]]
               ) -> Shared:
        """What an admission at ``now`` reads for the sharing: each node's usage, the members' leases of the
        reservations keeping room (``members(users, groups)``: their leases, each with where it counts), the
        starts waiting, and the share groups' use."""
        users, groups = set(), set()
        for slot in self.decided.active(now):
            users.update(slot.reservation.users)
            groups.update(slot.reservation.groups)
        everyone = tuple(room_lease(lease, node) for lease, node in members(tuple(users), tuple(groups)))
        waiters = tuple(sorted(self.waiting.values(), key=lambda w: (w.enqueued, w.id)))
        return Shared(self.decided, tuple(usage(self.gpus, self._held)), everyone, waiters, self.group_use(now))

    def where(self, uid: str, lease: Lease) -> str:
        """The node a kernel's slice counts on (its pod's, else the one its admission chose)."""
        if lease.host:
            return lease.host
        return self._guess.get(uid, "").removeprefix(NODE_PREFIX)
