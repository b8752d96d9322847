"""Admission: does a new kernel fit under its user's quota and every quota of the user's groups?

Quotas are ``GPUQuota`` objects, read by :func:`jupyter_gpu_pool.cluster.quotas.read_quotas` into
the pool core's :class:`QuotaBook` (the same limits, and the same refusal text, as on one machine).
A quota object that does not parse refuses the kernels of the users it covers, naming the object.
The decision itself is the pool core's (:func:`jupyter_gpu_pool.pool.allocation.allocate`), the one
the local ledger makes too, with placement left to the cluster's scheduler.
"""

from __future__ import annotations

from ..cluster.kernels import as_lease, holds_quota, meta, spec, status
from ..cluster.quotas import QuotaMisconfigured, Quotas
from ..pool import PoolError, Profile, SliceSpec, Usage
from ..pool.allocation import Ask, Holdings, allocate
from .sharing import Rendering


def admit(kernel: dict, profile_name: str, isolation: str, rendering: Rendering, quotas: Quotas,
          others: list[dict], now: float, profile: Profile | None = None) -> dict:
    """The kernel's ``status.admitted`` record, or raise :class:`QuotaExceeded` / :class:`QuotaMisconfigured`.

    ``others`` are every kernel the operator knows; those that hold their slice count.  What the
    kernel asks is what its pod will hold (the rendering: a MIG instance may be bigger than the slice).
    """
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    groups = quotas.book.groups_of(owner)
    me = meta(kernel).get("uid")
    holding = tuple(as_lease(k) for k in others if holds_quota(k) and meta(k).get("uid") != me)
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


def admit_resume(kernel: dict, quotas: Quotas, others: list[dict], now: float) -> None:
    """A hibernated kernel's resume against quotas, or raise :class:`QuotaExceeded` /
    :class:`QuotaMisconfigured`: its slice counts again (a resume adds no kernel: ``new_kernel=False``),
    judged by the same decision as a resume on one machine.  Room is the node's (``hibernation.py``)."""
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    a = status(kernel).get("admitted") or {}
    me = meta(kernel).get("uid")
    holding = tuple(as_lease(k) for k in others if holds_quota(k) and meta(k).get("uid") != me)
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
