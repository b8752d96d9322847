"""Admission: does a new kernel fit under its user's quota and every quota of the user's groups?

Quotas are ``GPUQuota`` objects, read by :func:`jupyter_gpu_pool.cluster.quotas.read_quotas` into
the pool core's :class:`QuotaBook` (the same limits, and the same refusal text, as on one machine).
A quota object that does not parse refuses the kernels of the users it covers, naming the object.
"""

from __future__ import annotations

from ..cluster.kernels import as_lease, held, holds_quota, meta, spec
from ..cluster.quotas import QuotaMisconfigured, Quotas
from ..pool import Quota, QuotaExceeded, Usage
from ..pool.quotas import first_excess
from .sharing import Rendering


def admit(kernel: dict, profile_name: str, isolation: str, rendering: Rendering, quotas: Quotas,
          others: list[dict], now: float) -> dict:
    """The kernel's ``status.admitted`` record, or raise :class:`QuotaExceeded` / :class:`QuotaMisconfigured`.

    ``others`` are every kernel the operator knows; those that hold their slice count.
    """
    owner = spec(kernel)["owner"]
    bad = quotas.problem_for(owner)
    if bad:
        raise QuotaMisconfigured(*bad)
    groups = quotas.book.groups_of(owner)
    me = meta(kernel).get("uid")
    holding = [k for k in others if holds_quota(k) and meta(k).get("uid") != me]
    asked = Usage(rendering.memory, rendering.sm_percent, 1)
    scopes: list[tuple[str, Usage, Quota]] = [
        ("user", sum((held(k) for k in holding if spec(k).get("owner") == owner), Usage()),
         quotas.book.user_quota(owner))]
    for group in quotas.book.limited_groups(groups):
        used = sum((held(k) for k in holding if group in ((k.get("status") or {}).get("admitted") or {})
                    .get("groups", [])), Usage())
        scopes.append((group, used, quotas.book.groups[group]))
    for scope, used, quota in scopes:
        excess = first_excess(quota, used, asked)
        if excess:
            resource, limit, used_text, asked_text = excess
            mine = [as_lease(k) for k in holding if spec(k).get("owner") == owner]
            raise QuotaExceeded(owner=owner, profile=profile_name, scope=scope, resource=resource, limit=limit,
                                used=used_text, asked=asked_text, holdings=mine, now=now)
    return {"profile": profile_name, "isolation": isolation, "memory": rendering.memory,
            "smPercent": rendering.sm_percent, "gpuCount": rendering.gpu_count, "whole": rendering.whole,
            "groups": list(groups), "at": now}
