"""The ResourceQuota admission plugin, as the real API server's ``ResourceQuota`` plugin and pod evaluator
do it for pods (other kinds are not quota'd here).

A pod created in a namespace is refused (403 Forbidden) when, with it, the namespace's usage would exceed
any of its ResourceQuotas' ``spec.hard``, in the real server's words::

    pods "NAME" is forbidden: exceeded quota: QUOTA, requested: requests.nvidia.com/gpu=1,
    used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=0

Which ``spec.hard`` names count a pod, as the pod evaluator matches them:

- ``count/pods``: every pod object; ``pods``: pods not yet Succeeded or Failed;
- ``cpu``/``memory``/``ephemeral-storage`` (= ``requests.*``), ``requests.*`` and ``limits.*`` of those;
- ``requests.<extended resource>`` (``requests.nvidia.com/gpu``): an extended resource is quota'd by its
  requests only, and a bare ``nvidia.com/gpu`` in ``spec.hard`` limits no pod (the real server accepts
  it and ignores it for pods);
- a container's request of a resource it sets only a limit for is that limit (the real defaulting).

Usage is summed from the namespace's pods at admission (what the quota controller keeps in
``status.used``), and ``status`` (``hard``, ``used``) is written when a quota is created and when a pod
is admitted.  Not modelled: scopes and ``scopeSelector`` (refused, not ignored), init containers, pod
overhead, quotas of other kinds.
"""

from __future__ import annotations

from fractions import Fraction

from .errors import ApiError, invalid
from .quantities import canonical_quantity, parse_quantity

# The names without a "/" that a ResourceQuota may hold (the real server's standard quota resource names).
STANDARD = {"pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
            "persistentvolumeclaims", "services.nodeports", "services.loadbalancers", "cpu", "memory",
            "ephemeral-storage", "requests.cpu", "requests.memory", "requests.storage",
            "requests.ephemeral-storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage"}
_COMPUTE = ("cpu", "memory", "ephemeral-storage")


def _extended(name: str) -> bool:
    """A resource name outside kubernetes.io (``nvidia.com/gpu``): requests only, no overcommit."""
    return "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io") and not name.startswith("requests.")


def check_quota(obj: dict) -> None:
    """What the real server's hand-written validation refuses of a ResourceQuota (beyond its schema), and
    what this server does not model."""
    name = obj["metadata"].get("name", "")
    spec = obj.get("spec") or {}
    if spec.get("scopes") or spec.get("scopeSelector"):
        raise ApiError(400, "BadRequest", "ResourceQuota scopes are not supported by this test server")
    for resource, value in (spec.get("hard") or {}).items():
        if "/" not in resource and resource not in STANDARD:
            raise invalid("ResourceQuota", name, f"spec.hard[{resource}]: Invalid value: {resource!r}: must be a "
                          "standard resource for quota")
        try:
            if parse_quantity(value) < 0:
                raise ValueError
        except ValueError:
            raise invalid("ResourceQuota", name, f"spec.hard[{resource}]: Invalid value: {value!r}: must be "
                          "greater than or equal to 0") from None


def pod_usage(pod: dict) -> dict[str, Fraction]:
    """What one pod counts against a quota, under every name the pod evaluator knows of."""
    usage: dict[str, Fraction] = {"count/pods": Fraction(1)}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return usage  # end of life: only the object count
    usage["pods"] = Fraction(1)
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for resource in {*limits, *requests}:
            request = requests.get(resource, limits.get(resource))
            if resource in _COMPUTE:
                for name in (resource, f"requests.{resource}"):
                    usage[name] = usage.get(name, Fraction(0)) + parse_quantity(request)
                if resource in limits:
                    name = f"limits.{resource}"
                    usage[name] = usage.get(name, Fraction(0)) + parse_quantity(limits[resource])
            elif _extended(resource):
                name = f"requests.{resource}"
                usage[name] = usage.get(name, Fraction(0)) + parse_quantity(request)
    return usage


def used(quota: dict, pods: list[dict]) -> dict[str, Fraction]:
    """The usage of each of the quota's ``spec.hard`` names by these pods (0 for names no pod counts)."""
    total = {name: Fraction(0) for name in (quota.get("spec") or {}).get("hard") or {}}
    for pod in pods:
        for name, amount in pod_usage(pod).items():
            if name in total:
                total[name] += amount
    return total


def status_of(quota: dict, pods: list[dict]) -> dict:
    hard = dict((quota.get("spec") or {}).get("hard") or {})
    return {"hard": hard, "used": {k: canonical_quantity(_decimal(v)) for k, v in used(quota, pods).items()}}


def admit_pod(pod: dict, quotas: list[dict], pods: list[dict]) -> None:
    """Refuse the pod, as the real plugin does, if it takes any quota of its namespace over a hard limit."""
    wants = pod_usage(pod)
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = (quota.get("spec") or {}).get("hard") or {}
        now = used(quota, pods)
        over = sorted(name for name in hard if name in wants and now[name] + wants[name] > parse_quantity(hard[name]))
        if over:
            def pretty(values: dict) -> str:
                return ",".join(f"{name}={canonical_quantity(_decimal(values[name]))}" for name in over)
            name = pod["metadata"].get("name", "")
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: '
                           f'{quota["metadata"]["name"]}, requested: {pretty(wants)}, used: {pretty(now)}, '
                           f'limited: {",".join(f"{n}={hard[n]}" for n in over)}',
                           {"name": name, "kind": "pods"})


def _decimal(value: Fraction) -> str:
    """An exact amount as a quantity the canonical form reads: binary where it is whole kibibytes (a sum
    of ``Mi``/``Gi`` amounts keeps their format on the real server), else decimal (nano units at least)."""
    if value.denominator == 1:
        return f"{value.numerator // 1024}Ki" if value and value.numerator % 1024 == 0 else str(value.numerator)
    return f"{-((-value * 10**9) // 1)}n"
