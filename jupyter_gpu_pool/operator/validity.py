"""Each GPUQuota's and GPUPoolPolicy's ``status``: whether it parses, and if not why (one quota's problem can
be another's: two that set the same subject; a policy's reservations that cannot fit the GPU nodes).

Quota events only mark the quotas for a check; one check at a time reads them all once and writes the
status of each quota whose own status says otherwise, keeping each write's answer, so that a quota's
status is written once per change of its validity: N quotas made at once cost N writes, not N²."""

from __future__ import annotations

import asyncio
import logging
import time

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster.kernels import meta, spec, status
from ..cluster.resources import GROUP, POLICIES, POLICY_NAME, QUOTAS, VERSION
from ..cluster.room import SharingError, on_cluster, read_sharing
from ..pool.reservations import ReservationError, check_fit
from ..pool.rules import PolicyError, parse_policy
from ..pool.sharing import Sharing
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
        """Keep a GPUPoolPolicy and write whether it parses; the one named ``default`` sets the sharing the
        operator decides with (its reservations, queue order and fair share), where it sets any and is valid:
        an invalid one changes nothing, and the sharing in force stays."""
        name = meta(body)["name"]
        if event_type == "DELETED":
            self.cache.policies.pop(name, None)
            if name == POLICY_NAME:
                self.cache.room.set_sharing(None)  # the config file's again
            return
        self.cache.policies[name] = body
        sharing = None
        try:
            parse_policy(spec(body).get("rules") or [], bool(spec(body).get("dryRun", False)), self.profiles)
            sharing = read_sharing(spec(body))
            problem = self._unfit(sharing)
        except PolicyError as e:
            problem = f"rules{e}" if str(e).startswith("[") else str(e)
        except SharingError as e:
            problem = str(e)
        if problem is None and name == POLICY_NAME:
            self.cache.room.set_sharing(sharing)
        written = await self._write(POLICIES, body, {"valid": problem is None, "message": problem or ""})
        if written is not None:
            self.cache.policies[meta(body)["name"]] = written

    def _unfit(self, sharing: Sharing | None) -> str | None:
        """Why the reservations cannot fit the GPU nodes as last listed, alone or with those they overlap (the
        room counted in memory: ``cluster.room``); None where they fit, or no node is known yet."""
        gpus = self.cache.room.gpus
        if sharing is None or not sharing.reservations or not gpus:
            return None
        try:
            check_fit(on_cluster(sharing, gpus).reservations, gpus, time.time())
        except ReservationError as e:
            return f"reservations{e}"
        return None

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
