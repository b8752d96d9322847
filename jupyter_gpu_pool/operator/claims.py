"""dra: the kernels' ResourceClaimTemplates (one per profile, per namespace) and the cluster's device
facts (the DeviceClass a claim names, its driver's ResourceSlices) that explain a claim no node can
meet.  Used by the controller only where the sharing backend is ``dra``."""

from __future__ import annotations

import logging

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster import resources
from ..cluster.kernels import meta
from ..cluster.watch import list_all
from .events import Events
from .manifests import MANAGER, PROFILE_ANNOTATION, SPEC_ANNOTATION, render_claim_templates
from .settings import OperatorSettings
from .sharing import DeviceNeed

log = logging.getLogger("jupyter_gpu_pool.operator")


class ClaimTemplates:
    """The namespaces' ResourceClaimTemplates as rendered from the profiles, and why a profile's claim
    cannot be held as written (``unsupported``: profile -> the message its kernels are refused with)."""

    def __init__(self, settings: OperatorSettings, resource: client.ResourceV1Api, events: Events):
        self.settings = settings
        self.resource = resource
        self.events = events
        self.unsupported: dict[str, str] = {}
        self._ok: set[str] = set()  # namespaces whose templates are as rendered

    def look_again(self) -> None:
        """Check every namespace's templates again on next use (someone may have deleted one)."""
        self._ok.clear()

    async def ensure(self, namespace: str) -> None:
        """The namespace's ResourceClaimTemplates are those rendered from the profiles (a template's
        spec cannot change: a changed one is deleted and made again; one of a removed profile goes).

        A template is known by the hash of the spec it was written from (an annotation), not by comparing
        specs: the API server stores its own form (canonical quantities, defaults), and drops a device
        request's ``capacity`` where consumable capacity is off.  Such a drop is refused loudly: the claim
        would get a whole GPU while its kernel is counted as a slice."""
        if namespace in self._ok:
            return
        wanted = {meta(t)["name"]: t for t in render_claim_templates(self.settings, namespace)}
        existing, _ = await list_all(self.resource.list_namespaced_resource_claim_template, namespace,
                                     label_selector=f"{resources.LABEL_MANAGED_BY}={MANAGER}")
        have = {meta(t)["name"]: t for t in existing}
        for name in set(have) - set(wanted):
            await self._delete(namespace, name)
        for name, template in wanted.items():
            current = have.get(name)
            written = meta(template)["annotations"][SPEC_ANNOTATION]
            if current is not None and (meta(current).get("annotations") or {}).get(SPEC_ANNOTATION) == written:
                await self._check(template, current)
                continue
            if current is not None:
                await self._delete(namespace, name)
            try:
                stored = await self.resource.create_namespaced_resource_claim_template(namespace, template)
            except ApiException as e:
                if e.status != 409:
                    raise
                continue  # made meanwhile (another pass): looked at on the next sweep
            log.info("ResourceClaimTemplate %s/%s written for profile %s", namespace, name,
                     meta(template)["annotations"][PROFILE_ANNOTATION])
            await self._check(template, self.resource.api_client.sanitize_for_serialization(stored))
        self._ok.add(namespace)

    async def _check(self, rendered: dict, stored: dict) -> None:
        """Whether the API server kept each device request's ``capacity`` (consumable capacity, dra_slices
        'shares'); where it dropped one, kernels of the profile are refused with the reason."""
        profile = meta(rendered)["annotations"][PROFILE_ANNOTATION]
        kept = {r.get("name"): (r.get("exactly") or {}).get("capacity")
                for r in ((((stored.get("spec") or {}).get("spec") or {}).get("devices") or {}).get("requests") or [])}
        dropped = [r["name"] for r in rendered["spec"]["spec"]["devices"]["requests"]
                   if (r.get("exactly") or {}).get("capacity") and not kept.get(r["name"])]
        if not dropped:
            self.unsupported.pop(profile, None)
            return
        message = (f"Profile {profile!r} holds its slice as a share of a GPU's memory (DRA consumable capacity), "
                   f"but the cluster dropped the capacity request from its ResourceClaimTemplate "
                   f"{meta(stored).get('name')!r}: its API server does not serve consumable capacity (Kubernetes' "
                   "DRAConsumableCapacity feature gate is off; it is alpha in 1.34). A kernel would get a whole GPU "
                   "while counted as a slice, so kernels of this profile are refused. Ask your admin to turn the "
                   "gate on (API server, scheduler and kubelets, with the DRA driver's ConsumableShares), or to set "
                   "GPUPoolOperator.dra_slices to 'mig'.")
        if self.unsupported.get(profile) != message:
            log.error("%s", message)
            await self.events.post(stored, "resource.k8s.io/v1", "ResourceClaimTemplate", "Warning",
                                   resources.UNSUPPORTED, message)
        self.unsupported[profile] = message

    async def _delete(self, namespace: str, name: str) -> None:
        try:
            await self.resource.delete_namespaced_resource_claim_template(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise


class DeviceFacts:
    """The DeviceClass a claim names (None: there is none) and the ResourceSlices of its driver, read at
    most once per ``progress_interval`` per (class, driver); None when they cannot be read."""

    def __init__(self, resource: client.ResourceV1Api, progress_interval: float):
        self.resource = resource
        self.progress_interval = progress_interval
        self._read: dict[tuple[str, str], tuple[float, tuple | None]] = {}  # (class, driver) -> (at, facts)

    async def of(self, need: DeviceNeed, now: float) -> tuple[dict | None, list[dict]] | None:
        key_ = (need.device_class, need.driver)
        if key_ in self._read and now - self._read[key_][0] < self.progress_interval:
            return self._read[key_][1]  # a failed read too: the API is asked again next interval
        try:
            try:
                device_class = self.resource.api_client.sanitize_for_serialization(
                    await self.resource.read_device_class(need.device_class))
            except ApiException as e:
                if e.status != 404:
                    raise
                device_class = None
            slices, _ = await list_all(self.resource.list_resource_slice, field_selector=f"spec.driver={need.driver}")
            facts = (device_class, slices)
        except Exception as e:  # noqa: BLE001 (the refusal then names both causes, as the scheduler's words do)
            log.warning("could not read the cluster's DRA devices: %s", e)
            facts = None
        self._read[key_] = (now, facts)
        return facts

    def prune(self, now: float) -> None:
        """Forget facts read a ``progress_interval`` ago or more."""
        for key_ in [k for k, (at, _) in self._read.items() if now - at >= self.progress_interval]:
            del self._read[key_]
