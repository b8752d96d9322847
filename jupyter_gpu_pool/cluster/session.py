"""One Jupyter server's view of the GPUKernels of its namespace (a list + watch), and the heartbeat
it renews on its own kernels.

One session per (server, event loop), shared by the server's provisioners and its pool backend
(which shows the namespace's kernels: a user's own in ``me``, all of them to admins in ``pool``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Callable

from ..periodic import every
from .resources import ANNOTATION_HEARTBEAT, GROUP, KERNELS, VERSION
from .settings import GPUPoolKubernetes
from .watch import list_and_watch

log = logging.getLogger("jupyter_gpu_pool.kubernetes")

MERGE = "application/merge-patch+json"


class KernelSession:
    """The GPUKernels of one namespace, kept current by a watch, and the heartbeat of this server's."""

    _sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, settings: GPUPoolKubernetes):
        self.settings = settings
        self.kernels: dict[str, dict] = {}
        self.owned: set[str] = set()  # kernels this process manages and keeps alive
        self.changed = asyncio.Condition()
        self.listeners: list[Callable[[str, dict], None]] = []  # called with (event type, object)
        self._synced = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.api = None
        self.namespace = ""

    @classmethod
    async def get(cls, settings: GPUPoolKubernetes) -> KernelSession:
        loop = asyncio.get_running_loop()
        per_loop = cls._sessions.setdefault(loop, {})
        key = (settings.kubeconfig, settings.namespace, settings.server_id)
        session = per_loop.get(key)
        if session is None:
            session = per_loop[key] = cls(settings)
            try:
                await session._start()
            except BaseException:
                per_loop.pop(key, None)
                raise
        await session._synced.wait()
        return session

    @classmethod
    async def close_all(cls) -> None:
        """Stop every session of this loop (tests; a server that exits simply stops)."""
        per_loop = cls._sessions.pop(asyncio.get_running_loop(), {})
        for session in per_loop.values():
            await session.close()

    async def _start(self) -> None:
        from kubernetes_asyncio import client, config as kube_config

        from .client import api_client, namespace_of_this_pod

        self.api = await api_client(self.settings.kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        namespace = self.settings.namespace
        if not namespace:
            namespace = namespace_of_this_pod("")
        if not namespace:
            try:
                _, active = kube_config.list_kube_config_contexts(self.settings.kubeconfig or None)
                namespace = (active or {}).get("context", {}).get("namespace", "")
            except Exception:  # no kubeconfig: in-cluster without a namespace file
                namespace = ""
        self.namespace = namespace or "default"
        self._tasks = [asyncio.create_task(list_and_watch(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, KERNELS,
            replace=self._replace, apply=self._apply, what=f"GPU kernels in {self.namespace}")),
            asyncio.create_task(every(self.settings.heartbeat_interval, self._beat_all, self._stop,
                                      what=f"the heartbeats of this server's kernels in {self.namespace}"))]

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.api is not None:
            await self.api.close()

    def stop_heartbeat(self) -> None:
        """Stop renewing heartbeats, as a server that died would (tests)."""
        self._tasks[1].cancel()

    async def _replace(self, items: list[dict]) -> None:
        async with self.changed:
            self.kernels = {i["metadata"]["name"]: i for i in items}
            self.changed.notify_all()
        self._synced.set()

    async def _apply(self, event_type: str, obj: dict) -> None:
        async with self.changed:
            name = obj["metadata"]["name"]
            if event_type == "DELETED":
                self.kernels.pop(name, None)
            elif int(obj["metadata"]["resourceVersion"]) >= int(
                    self.kernels.get(name, {}).get("metadata", {}).get("resourceVersion", 0)):
                self.kernels[name] = obj
            for listener in self.listeners:
                listener(event_type, obj)
            self.changed.notify_all()

    async def remember(self, obj: dict) -> None:
        """What a write of ours answered (so a waiter never sees the object as it was before)."""
        await self._apply("MODIFIED", obj)

    async def beat(self, name: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, KERNELS, name,
                {"metadata": {"annotations": {ANNOTATION_HEARTBEAT: f"{time.time():.3f}"}}}, _content_type=MERGE)
        except ApiException as e:
            if e.status == 404:
                self.owned.discard(name)
            else:
                log.warning("heartbeat on kernel %s failed: %s %s", name, e.status, e.reason)
        except Exception as e:  # the API server may be away for a moment; the next beat tries again
            log.warning("heartbeat on kernel %s failed: %s", name, e)

    async def _beat_all(self) -> None:
        await asyncio.gather(*(self.beat(name) for name in list(self.owned)), return_exceptions=True)

    async def wait_for(self, name: str, predicate: Callable[[dict | None], bool],
                       timeout: float | None) -> dict | None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: predicate(self.kernels.get(name))), timeout)
            return self.kernels.get(name)
