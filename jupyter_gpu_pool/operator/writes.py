"""The operator's writes to the API server, each one's answer kept at once (``cache.py``), so that its
watch event, when it comes back, is nothing new.

- Status writes (:meth:`Writer.status`): a merge patch of what changed; on a kernel with writers beside
  the operator, compare-and-set on the resourceVersion read (409: read again, decided again).  A 404 is
  a kernel deleted unseen: forgotten.
- Creates are of objects owned by one GPUKernel object (:meth:`Writer.ensure`).  An AlreadyExists is
  read and its owner compared: the kernel's own (made before an operator restart) is taken as made; one
  of another uid belongs to a kernel of the same name that is gone (its pod in its grace period, or
  waiting for the garbage collector): a Secret or NetworkPolicy of it is deleted (it is no kernel's now)
  and made again, and a pod (whose name carries the kernel's uid, so this is rare) is waited for.
- A pod is deleted once: the delete is remembered until the pod is gone, so the pass that follows (its
  kernel's status write coming back) does not delete it again.
"""

from __future__ import annotations

import json
import logging

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..cluster.kernels import controller_uid, key, meta, spec
from ..cluster.resources import GROUP, KERNELS, VERSION
from ..cluster.watch import answer
from .cache import Cache
from .manifests import new_curve_keys, new_key, render_network_policy, render_pod, render_secret
from .plan import POD, POLICY, SECRET, Write
from .settings import OperatorSettings

log = logging.getLogger("jupyter_gpu_pool.operator")

MERGE = "application/merge-patch+json"


class Foreign(Exception):
    """An object of the kernel's name that another GPUKernel (gone, of the same name) owns, still there."""

    def __init__(self, what: str, name: str):
        super().__init__(f"{what} {name} belongs to an earlier kernel of the same name; waiting for it to go")
        self.what, self.name = what, name


def api_message(e: ApiException) -> str:
    """The API server's own words of a refusal (its Status's message), else its HTTP reason."""
    try:
        said = json.loads(e.body or "{}").get("message") or ""
    except (ValueError, AttributeError):
        said = ""
    said = said or f"{e.status} {e.reason}"
    return said if said.endswith(".") else said + "."


class Writer:
    def __init__(self, api: client.ApiClient, cache: Cache, settings: OperatorSettings, read_again):
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.net = client.NetworkingV1Api(api)
        self.cache = cache
        self.settings = settings
        self.read_again_later = read_again  # (key) -> None: look at a kernel again once its pass ends
        self.made: set[tuple[str, str]] = set()  # (kernel uid, SECRET / POLICY) made or found made

    # -- status ----------------------------------------------------------------------------------

    async def status(self, kernel: dict, write: Write) -> dict | None:
        """One status write; the kernel as written, or None when it is gone (a 404) or, for a compare-and-set
        write, changed since it was read (a 409: it is read again, and decided again)."""
        ns, name = key(kernel)
        body: dict = {"status": write.changes}
        version = meta(kernel).get("resourceVersion")
        if write.compare and version:
            body["metadata"] = {"resourceVersion": version}
        try:
            written = await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, KERNELS, name, body, _content_type=MERGE)
        except ApiException as e:
            if e.status == 404:
                log.info("kernel %s/%s is gone; forgetting it", ns, name)
                self.cache.forget(key(kernel), meta(kernel)["uid"], gone=True)
                return None
            if e.status == 409 and "metadata" in body:
                log.info("kernel %s/%s changed since it was read (version %s): read again, decided again", ns,
                         name, version)
                await self.read_again(kernel)
                return None
            raise
        if "phase" in write.changes:
            log.info("kernel %s/%s: %s%s", ns, name, write.changes["phase"],
                     f" ({write.changes['reason']})" if write.changes.get("reason") else "")
        self.cache.remember(written)
        return self.cache.kernels.get(key(written), written)

    async def read_again(self, kernel: dict) -> None:
        """The kernel as the API server has it now (an empty status patch: no write, no watch event, and no
        right beyond the status patch the operator holds), then a pass over it once the one under way ends."""
        ns, name = key(kernel)
        try:
            fresh = await self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, KERNELS, name, {},
                                                                            _content_type=MERGE)
        except ApiException as e:
            if e.status != 404:
                raise
            self.cache.forget(key(kernel), meta(kernel)["uid"], gone=True)
            return
        self.cache.remember(fresh)
        self.read_again_later(key(kernel))

    # -- the kernel's objects ------------------------------------------------------------------------

    async def ensure(self, kernel: dict, what: str, launch: int = 0) -> None:
        """The kernel's Secret, NetworkPolicy or pod of ``launch`` exists, owned by this GPUKernel object.
        A pod the API server refuses raises its ``ApiException``; one of another kernel, :class:`Foreign`."""
        uid = meta(kernel)["uid"]
        if what == POD:
            rendering = self.settings.renderings[spec(kernel)["profile"]]
            image = spec(kernel).get("image") or self.settings.kernel_image
            pod = await self._create(kernel, POD, self.core.create_namespaced_pod, self.core.read_namespaced_pod,
                                     None, render_pod(kernel, self.settings, rendering, image, launch))
            if pod is not None:
                self.cache.pod_seen("ADDED", pod)
                log.info("kernel %s/%s: pod %s made (launch %d)", *key(kernel), meta(pod)["name"], launch)
            return
        if (uid, what) in self.made:
            return
        if what == SECRET:
            curve = new_curve_keys() if self.settings.transport_encryption else None
            await self._create(kernel, SECRET, self.core.create_namespaced_secret, self.core.read_namespaced_secret,
                               self.core.delete_namespaced_secret, render_secret(kernel, self.settings, new_key(), curve))
        else:
            await self._create(kernel, POLICY, self.net.create_namespaced_network_policy,
                               self.net.read_namespaced_network_policy, self.net.delete_namespaced_network_policy,
                               render_network_policy(kernel, self.settings))
        self.made.add((uid, what))

    async def _create(self, kernel: dict, what: str, create, read, delete, body: dict) -> dict | None:
        """Create ``body``; on AlreadyExists, compare the owner of what is there (see the module's docstring).
        What was made (or found made by this kernel), as JSON."""
        ns, name = meta(kernel)["namespace"], body["metadata"]["name"]
        for _ in range(2):
            try:
                return await answer(create, ns, body)
            except ApiException as e:
                if e.status != 409:
                    raise
            try:
                there = await answer(read, name, ns)
            except ApiException as e:
                if e.status == 404:
                    continue  # gone meanwhile: make it
                raise
            if controller_uid(there) == meta(kernel)["uid"]:
                return there  # made by this kernel before (an operator restart)
            if delete is None:
                raise Foreign(what, name)
            log.info("kernel %s/%s: %s %s belongs to an earlier kernel of the same name (uid %s): deleted, made "
                     "again", *key(kernel), what, name, controller_uid(there))
            await self._delete(delete, name, ns, meta(there)["uid"])
        raise Foreign(what, name)

    @staticmethod
    async def _delete(delete, name: str, ns: str, uid: str, grace: int | None = None) -> None:
        """Delete an object if it is still the one of ``uid`` (a precondition: never its successor)."""
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                         grace_period_seconds=grace)
        try:
            await delete(name, ns, body=options)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or already another object of that name
                raise

    async def delete_pod(self, pod: dict, grace: int | None) -> None:
        """Delete a pod once (its uid remembered until it is seen gone)."""
        if self.cache.going(pod):
            return
        await self._delete(self.core.delete_namespaced_pod, meta(pod)["name"], meta(pod)["namespace"],
                           meta(pod)["uid"], grace)
        self.cache.deleting.add(meta(pod)["uid"])

    async def delete_kernel(self, kernel: dict) -> bool:
        """Delete the GPUKernel (its objects go with it); False where it was gone already."""
        ns, name = key(kernel)
        try:
            await self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, KERNELS, name,
                                                              body={"propagationPolicy": "Background"})
            deleted = True
        except ApiException as e:
            if e.status != 404:
                raise
            deleted = False  # deleted by someone else, unseen: nothing to say about it
        self.cache.forget(key(kernel), meta(kernel)["uid"], gone=True)
        return deleted

    def prune(self) -> None:
        """Forget which objects were made for kernels no longer kept."""
        known = {meta(k).get("uid") for k in self.cache.kernels.values()}
        self.made = {(uid, what) for uid, what in self.made if uid in known}

