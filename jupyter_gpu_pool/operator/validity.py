"""Each GPUQuota's and GPUPoolPolicy's ``status``: whether it parses, and if not why (one quota's problem can
be another's: two that set the same subject).

Quota events only mark the quotas for a check; one check at a time reads them all once and writes the
status of each quota whose own status says otherwise, keeping each write's answer, so that a quota's
status is written once per change of its validity: N quotas made at once cost N writes, not N²."""

from __future__ import annotations

import asyncio
import logging

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster.kernels import meta, spec, status
from ..cluster.resources import GROUP, POLICIES, QUOTAS, VERSION
from ..pool.rules import PolicyError, parse_policy
from .cache import Cache

log = logging.getLogger("jupyter_gpu_pool.operator")

MERGE = "application/merge-patch+json"


class Validity:
    def __init__(self, custom: client.CustomObjectsApi, cache: Cache, profiles: tuple[str, ...]):
        self.custom = custom
        self.cache = cache
        self.profiles = profiles
        self._check: asyncio.Task | None = None
        self._again = False

    def quotas_changed(self) -> None:
        """Check the quotas' statuses soon (once, however many quota events come meanwhile)."""
        if self._check is not None and not self._check.done():
            self._again = True
            return
        self._check = asyncio.create_task(self._check_quotas())

    async def _check_quotas(self) -> None:
        while True:
            self._again = False
            problems = self.cache.quota_book().problems
            try:
                for name, obj in list(self.cache.quotas.items()):
                    problem = problems.get(name)
                    written = await self._write(QUOTAS, obj, {"valid": problem is None, "message": problem or ""})
                    if written is not None:
                        self.cache.quota_seen("MODIFIED", written)
            except Exception:  # noqa: BLE001 (the sweep checks again)
                log.exception("writing the GPUQuotas' status failed")
                return
            if not self._again:
                return

    async def settle(self) -> None:
        """Wait for the check under way, if any."""
        while self._check is not None and not self._check.done():
            await asyncio.gather(self._check, return_exceptions=True)

    async def stop(self) -> None:
        if self._check is not None:
            self._check.cancel()
            await asyncio.gather(self._check, return_exceptions=True)

    async def policy_event(self, event_type: str | None, body: dict) -> None:
        if event_type == "DELETED":
            self.cache.policies.pop(meta(body)["name"], None)
            return
        self.cache.policies[meta(body)["name"]] = body
        try:
            parse_policy(spec(body).get("rules") or [], bool(spec(body).get("dryRun", False)), self.profiles)
            problem = None
        except PolicyError as e:
            problem = f"rules{e}" if str(e).startswith("[") else str(e)
        written = await self._write(POLICIES, body, {"valid": problem is None, "message": problem or ""})
        if written is not None:
            self.cache.policies[meta(body)["name"]] = written

    async def _write(self, plural: str, obj: dict, wanted: dict) -> dict | None:
        """The object's status where it says otherwise; what was written (None: nothing, or it is gone)."""
        if all(status(obj).get(k) == v for k, v in wanted.items()):
            return None
        try:
            return await self.custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, meta(obj)["name"],
                                                                        {"status": wanted}, _content_type=MERGE)
        except ApiException as e:
            if e.status != 404:
                raise
            return None
