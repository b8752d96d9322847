"""Admission: does a new kernel fit under its user's quota and every quota of the user's groups?

Quotas are ``GPUQuota`` objects, read by :func:`jupyter_gpu_pool.cluster.quotas.read_quotas` into
the pool core's :class:`QuotaBook` (the same limits, and the same refusal text, as on one machine).
A quota object that does not parse refuses the kernels of the users it covers, naming the object.
The decision itself is the pool core's (:func:`jupyter_gpu_pool.pool.allocation.allocate`), the one
the local ledger makes too, with placement left to the cluster's scheduler.

The operator passes the leases that count (:func:`admit_against`: its owner's and those of the
owner's groups, which it keeps indexed), so an admission costs what that user and groups hold, not
what the whole cluster holds; :func:`admit` takes every kernel, as a test or a one-off caller has them.

Where the admin's reservations keep room now (``Shared``, from ``room.py``), the same decision also counts
the room, node by node (``cluster.room``): a non-member is refused the room a reservation keeps (and may
borrow what its members leave unused, from a lead time into its window: :attr:`Admitted.borrowed`), and a
member whose reserved room others hold waits for it (:class:`WaitForRoom`) while they are hibernated for
them.  Any other shortfall of the count is the scheduler's to decide, as without reservations: a pod's
placement is the cluster's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..cluster.kernels import as_lease, holds_quota, meta, spec, status
from ..cluster.quotas import QuotaMisconfigured, Quotas
from ..cluster.room import NODE_PREFIX
from ..pool import SPREAD, GPUUsage, Lease, PoolExhausted, Profile, SliceSpec, Usage, Waiter
from ..pool.allocation import ASKING, Ask, Grant, Holdings, allocate, line_of
from ..pool.fairshare import ordinal
from ..pool.sharing import Sharing
from .sharing import Rendering


@dataclass(frozen=True)
class Shared:
    """What the admin's sharing reads of the cluster for an admission while a reservation keeps room: each
    node's usage (``cluster.room``), the members' leases of the reservations keeping room, the starts waiting
    for room (arrival order) and each share group's decayed use."""

    sharing: Sharing
    gpus: tuple[GPUUsage, ...]
    everyone: tuple[Lease, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    group_use: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Admitted:
    """An admission: the ``status.admitted`` record, the reservations whose unused room it borrows, and the
    node entry the decision counted it on (empty where the scheduler alone places it)."""

    record: dict
    borrowed: tuple[str, ...] = ()
    on: str = ""


class WaitForRoom(Exception):
    """A member's start finds the room reserved for them held by others: it waits, at ``position`` (``why``,
    where sharing orders the queue), while they give it back."""

    def __init__(self, message: str, position: int, why: str, memory: int, groups: tuple[str, ...]):
        super().__init__(message)
        self.message, self.position, self.why, self.memory, self.groups = message, position, why, memory, groups


def held_leases(kernels: Iterable[dict], but: str | None = None) -> tuple[Lease, ...]:
    """The leases of the kernels that hold their slice, but the one of uid ``but``."""
    return tuple(as_lease(k) for k in kernels if holds_quota(k) and meta(k).get("uid") != but)


def admit(kernel: dict, profile_name: str, isolation: str, rendering: Rendering, quotas: Quotas,
          others: list[dict], now: float, profile: Profile | None = None) -> dict:
    """:func:`admit_against` every kernel of ``others`` that holds its slice."""
    return admit_against(kernel, profile_name, isolation, rendering, quotas,
                         held_leases(others, meta(kernel).get("uid")), now, profile)


def admit_against(kernel: dict, profile_name: str, isolation: str, rendering: Rendering, quotas: Quotas,
                  holding: tuple[Lease, ...], now: float, profile: Profile | None = None) -> dict:
    """The kernel's ``status.admitted`` record, or raise :class:`QuotaExceeded` / :class:`QuotaMisconfigured`.

    ``holding``: the leases held by others (at least the owner's and those of the owner's groups).  What
    the kernel asks is what its pod will hold (the rendering: a MIG instance may be bigger than the slice).
    """
    return admit_start(kernel, profile_name, isolation, rendering, quotas, holding, now, profile).record


def _holdings(holding: tuple[Lease, ...], shared: Shared | None) -> Holdings:
    if shared is None:
        return Holdings(leases=holding)
    return Holdings(leases=holding, gpus=shared.gpus, waiters=shared.waiters, everyone=shared.everyone,
                    group_use=shared.group_use)


def admit_start(kernel: dict, profile_name: str, isolation: str, rendering: Rendering, quotas: Quotas,
                holding: tuple[Lease, ...], now: float, profile: Profile | None = None,
                shared: Shared | None = None) -> Admitted:
    """:func:`admit_against`, with the room a reservation keeps where ``shared`` says one does: raises a
    :class:`PoolExhausted` naming the reservation for a non-member kept from its room, or :class:`WaitForRoom`
    for a member whose room others hold (the kernel's place: ``status.waiting``)."""
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    groups = quotas.book.groups_of(owner)
    counted = SliceSpec(memory=max(rendering.memory, 1))  # the room counts memory (cluster.room)
    named = profile or Profile(name=profile_name, slice=SliceSpec(whole=True) if rendering.whole and shared is None
                               else counted, isolation=isolation, display_name=profile_name)
    ask = Ask(owner=owner, kernel_id=spec(kernel).get("kernelId", ""), profile=named, groups=groups,
              asked=Usage(rendering.memory, rendering.sm_percent, 1))
    waiter_id = meta(kernel).get("uid") if status(kernel).get("waiting") and shared is not None else None
    holdings = _holdings(holding, shared)
    result = allocate(holdings, ask, quotas.book, now=now, placement=SPREAD, waiter_id=waiter_id,
                      sharing=shared.sharing if shared is not None else None)
    record = {"profile": profile_name, "isolation": isolation, "memory": rendering.memory,
              "smPercent": rendering.sm_percent, "gpuCount": rendering.gpu_count, "whole": rendering.whole,
              "groups": list(groups), "at": now}
    if isinstance(result, Grant):
        return Admitted(record, result.borrowed, result.gpus[0].uuid if result.gpus else "")
    if not isinstance(result, PoolExhausted) or shared is None or result.reserved:
        raise result
    line = line_of(holdings, shared.sharing, now, ask if waiter_id is None else None)
    mine = [n for n in (line.unused if line is not None else ()) if n.slot.reservation.member(owner, groups)]
    if not mine:
        return Admitted(record)  # no room by the count, nothing reserved for them in it: the scheduler decides
    me = next(w for w in line.told() if w.id == (waiter_id or ASKING))
    place = me.why or f"{ordinal(me.position)} in the queue"
    raise WaitForRoom(f"Waiting for GPU room: {mine[0].slot.words(now, member=True)}, and kernels of others hold "
                      f"it now: they give it back (hibernated, their variables kept, with a warning). {place}.",
                      me.position, me.why, rendering.memory, groups)


def admit_resume(kernel: dict, quotas: Quotas, holding: tuple[Lease, ...], now: float,
                 shared: Shared | None = None) -> tuple[str, ...]:
    """A hibernated kernel's resume against quotas, or raise :class:`QuotaExceeded` /
    :class:`QuotaMisconfigured`: its slice counts again (a resume adds no kernel: ``new_kernel=False``),
    judged by the same decision as a resume on one machine.  ``holding`` as for :func:`admit_against`.
    Room is the node's (``hibernation.py``); where a reservation keeps room (``shared``), a non-member's
    resume into it is refused (:class:`PoolExhausted` naming it) and one that borrows says which (returned)."""
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    a = status(kernel).get("admitted") or {}
    name = a.get("profile") or spec(kernel).get("profile", "")
    profile = Profile(name=name, slice=SliceSpec(whole=True) if a.get("whole") and shared is None else
                      SliceSpec(memory=max(int(a.get("memory", 0)), 1)), isolation=a.get("isolation", ""),
                      display_name=name)
    node = status(kernel).get("node") or ""
    ask = Ask(owner=owner, kernel_id=spec(kernel).get("kernelId", ""), profile=profile,
              groups=quotas.book.groups_of(owner), new_kernel=False, only=(NODE_PREFIX + node,) if shared else None,
              asked=Usage(int(a.get("memory", 0)), int(a.get("smPercent", 0)), 0))
    result = allocate(_holdings(holding, shared), ask, quotas.book, now=now, placement=SPREAD,
                      sharing=shared.sharing if shared is not None else None)
    if isinstance(result, Grant):
        return result.borrowed
    if isinstance(result, PoolExhausted) and shared is not None and not result.reserved:
        return ()  # the room the count lacks is the node agent's reading's to judge (safe wake)
    raise result
