"""Admission: does a new kernel fit under its user's quota and every quota of the user's groups?

Quotas are ``GPUQuota`` objects, read by :func:`jupyter_gpu_pool.cluster.quotas.read_quotas` into
the pool core's :class:`QuotaBook` (the same limits, and the same refusal text, as on one machine).
A quota object that does not parse refuses the kernels of the users it covers, naming the object.
The decision itself is the pool core's (:func:`jupyter_gpu_pool.pool.allocation.allocate`), the one
the local ledger makes too, with placement left to the cluster's scheduler.

The operator passes the leases that count (:func:`admit_against`: its owner's and those of the
owner's groups, which it keeps indexed), so an admission costs what that user and groups hold, not
what the whole cluster holds; :func:`admit` takes every kernel, as a test or a one-off caller has them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..cluster.kernels import as_lease, holds_quota, meta, spec, status
from ..cluster.quotas import QuotaMisconfigured, Quotas
from ..pool import Lease, PoolError, Profile, SliceSpec, Usage
from ..pool.allocation import Ask, Holdings, allocate
from .sharing import Rendering


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
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    groups = quotas.book.groups_of(owner)
    named = profile or Profile(name=profile_name, slice=SliceSpec(whole=True) if rendering.whole else
                               SliceSpec(memory=max(rendering.memory, 1)), isolation=isolation,
                               display_name=profile_name)
    ask = Ask(owner=owner, kernel_id=spec(kernel).get("kernelId", ""), profile=named, groups=groups,
              asked=Usage(rendering.memory, rendering.sm_percent, 1))
    result = allocate(Holdings(leases=holding), ask, quotas.book, now=now)
    if isinstance(result, PoolError):
        raise result
    return {"profile": profile_name, "isolation": isolation, "memory": rendering.memory,
            "smPercent": rendering.sm_percent, "gpuCount": rendering.gpu_count, "whole": rendering.whole,
            "groups": list(groups), "at": now}


def admit_resume(kernel: dict, quotas: Quotas, holding: tuple[Lease, ...], now: float) -> None:
    """A hibernated kernel's resume against quotas, or raise :class:`QuotaExceeded` /
    :class:`QuotaMisconfigured`: its slice counts again (a resume adds no kernel: ``new_kernel=False``),
    judged by the same decision as a resume on one machine.  ``holding`` as for :func:`admit_against`.
    Room is the node's (``hibernation.py``)."""
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    a = status(kernel).get("admitted") or {}
    name = a.get("profile") or spec(kernel).get("profile", "")
    profile = Profile(name=name, slice=SliceSpec(whole=True) if a.get("whole") else
                      SliceSpec(memory=max(int(a.get("memory", 0)), 1)), isolation=a.get("isolation", ""),
                      display_name=name)
    ask = Ask(owner=owner, kernel_id=spec(kernel).get("kernelId", ""), profile=profile,
              groups=quotas.book.groups_of(owner), new_kernel=False,
              asked=Usage(int(a.get("memory", 0)), int(a.get("smPercent", 0)), 0))
    result = allocate(Holdings(leases=holding), ask, quotas.book, now=now)
    if isinstance(result, PoolError):
        raise result
