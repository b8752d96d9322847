"""The ``gpu-pool-kubernetes`` provisioner: a kernel in its own pod, on a GPU slice of a cluster.

A kernelspec selects it with::

    "metadata": {"kernel_provisioner": {"provisioner_name": "gpu-pool-kubernetes",
                                        "config": {"profile": "gpu-10g"}}}

The server never creates a pod (it needs no right to): it creates a
``GPUKernel`` custom resource and follows its status through one watch per
server; the operator admits it against quotas and runs the pod (see
``jupyter_gpu_pool/operator``).  The kernel listens on ports fixed in advance
on its pod's address, so there is no call-back socket; readiness is a
``kernel_info`` reply.  The connection key comes from the kernel's Secret,
which the operator wrote: it is never in the GPUKernel, the pod spec, an
environment variable, a command line or a log line.

Lifecycle (jupyter_client calls these):

- ``launch_kernel`` creates the GPUKernel (launch 1), or on a restart bumps
  ``spec.launch`` (the operator then starts a new pod, with a new name), waits
  for the pod to run, reads the key, and confirms with ``kernel_info``.  A
  refusal (quota, no slice free, an image that cannot be pulled, a container
  that exits) fails the launch at once with the operator's message.
- ``poll`` / ``wait`` read the watched status; ``send_signal(SIGINT)`` is an
  ``interrupt_request`` message (a server cannot signal a pod);
  ``terminate`` / ``kill`` ask the operator to stop the pod (gracefully / now).
- ``cleanup`` deletes the GPUKernel (pod, Secret and NetworkPolicy go with it),
  except on a restart, where the slice stays admitted for the next launch.
- While the server lives it renews a heartbeat on its kernels; the operator
  deletes kernels whose server stopped (invariant 2).  A restarted server
  re-adopts its kernels with :func:`adopt_kernels` (``load_provisioner_info``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import socket
import time
import weakref
from typing import Any, Callable

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.provisioning import KernelProvisionerBase
from traitlets import Float, Unicode, default
from traitlets.config import Config, Configurable

from ..config import ConfigError, GPUPool, load_settings, read_config
from ..operator.crds import (
    ANNOTATION_HEARTBEAT,
    API_VERSION,
    FAILED,
    GROUP,
    IMAGE_PULL,
    INVALID,
    KERNEL_KIND,
    KERNELS,
    LABEL_OWNER,
    LABEL_PART_OF,
    LABEL_SERVER,
    PART_OF,
    QUOTA_EXCEEDED,
    RUNNING,
    STARTING,
    STOPPED,
    UNSCHEDULABLE,
    VERSION,
    kernel_name,
    label_value,
    secret_name,
)
from ..operator.settings import CONNECTION_FILE
from ..pool import UnknownProfile
from .local import GPUPoolProvisioner, KernelStartRefused

log = logging.getLogger("jupyter_gpu_pool.kubernetes")

MERGE = "application/merge-patch+json"
PROVISIONER = "gpu-pool-kubernetes"
_CONFIG_KEYS = {"profile", "image"}
_STATUS_OF = {QUOTA_EXCEEDED: 403, "QuotaMisconfigured": 403, INVALID: 400, UNSCHEDULABLE: 503, IMAGE_PULL: 502}


class GPUPoolKubernetes(Configurable):
    """Where a server's kernels go in the cluster (``c.GPUPoolKubernetes.*``)."""

    namespace = Unicode("", help="""Namespace of this server's kernels.  Empty: the namespace of this
        server's pod, else the kubeconfig context's, else 'default'.""").tag(config=True)

    kubeconfig = Unicode("", help="""A kubeconfig file.  Empty: in a pod, its service account; elsewhere
        KUBECONFIG or ~/.kube/config.""").tag(config=True)

    server_id = Unicode(help="""This server's identity: its kernels carry it, a restarted server with the same
        id re-adopts them, and each kernel's NetworkPolicy admits only the pod labelled
        jupyter-gpu-pool.readthedocs.io/server=<id>.  Default: JUPYTER_GPU_POOL_SERVER_ID, else the
        JupyterHub user and server name, else the host name.""").tag(config=True)

    @default("server_id")
    def _default_server_id(self) -> str:
        env = os.environ
        if env.get("JUPYTER_GPU_POOL_SERVER_ID"):
            return env["JUPYTER_GPU_POOL_SERVER_ID"]
        if env.get("JUPYTERHUB_USER"):
            return "--".join(p for p in (env["JUPYTERHUB_USER"], env.get("JUPYTERHUB_SERVER_NAME", "")) if p)
        return socket.gethostname()

    server_pod = Unicode(help="This server's pod (JUPYTER_GPU_POOL_SERVER_POD, from the downward API).").tag(
        config=True)

    @default("server_pod")
    def _default_server_pod(self) -> str:
        return os.environ.get("JUPYTER_GPU_POOL_SERVER_POD", "")

    server_pod_uid = Unicode(help="""This server's pod uid (JUPYTER_GPU_POOL_SERVER_POD_UID, from the downward
        API's metadata.uid).  When set and the kernels run in the server's own namespace, they are owned by the
        pod and deleted with it (an owner must be in its dependents' namespace).""").tag(config=True)

    server_namespace = Unicode(help="""The namespace of this server's pod, which each kernel's NetworkPolicy
        admits (default: the pod's service-account namespace, else the kernels' namespace).""").tag(config=True)

    @default("server_namespace")
    def _default_server_namespace(self) -> str:
        from ..operator.kube import namespace_of_this_pod

        return namespace_of_this_pod("")

    @default("server_pod_uid")
    def _default_server_pod_uid(self) -> str:
        return os.environ.get("JUPYTER_GPU_POOL_SERVER_POD_UID", "")

    image = Unicode("", help="The kernel image to ask for (empty: the operator's kernel_image).").tag(config=True)

    heartbeat_interval = Float(30.0, help="""Seconds between heartbeats on this server's kernels; keep it well
        under the operator's heartbeat_timeout.""").tag(config=True)

    refresh_interval = Float(10.0, help="""Seconds between two reads of the cluster's quotas, policy and GPU nodes
        by the server extension (its kernels are watched, not re-read).""").tag(config=True)

    launch_timeout = Float(300.0, help="""Seconds a kernel launch may take (an image pull on a fresh node can take
        minutes).  Launches the cluster can never satisfy fail long before, with the reason.""").tag(config=True)


def kubernetes_settings(parent_config: Config | None = None) -> GPUPoolKubernetes:
    config, _ = read_config()
    if parent_config is not None and "GPUPoolKubernetes" in parent_config:
        config.merge(Config({"GPUPoolKubernetes": parent_config.GPUPoolKubernetes}))
    return GPUPoolKubernetes(config=config)


def _status(body: dict | None) -> dict:
    return (body or {}).get("status") or {}


class KernelSession:
    """One server's view of the GPUKernels of its namespace (a list + watch) and the heartbeat of its own.

    One per (server, event loop), shared by the server's provisioners and its pool backend (which
    shows the namespace's kernels: a user's own in ``me``, all of them to admins in ``pool``).
    """

    _sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, settings: GPUPoolKubernetes):
        self.settings = settings
        self.kernels: dict[str, dict] = {}
        self.owned: set[str] = set()  # kernels this process manages and keeps alive
        self.changed = asyncio.Condition()
        self.listeners: list[Callable[[str, dict], None]] = []  # called with (event type, object)
        self._synced = asyncio.Event()
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

        from ..operator.kube import api_client, namespace_of_this_pod

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
        self._tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._heartbeat())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.api is not None:
            await self.api.close()

    def stop_heartbeat(self) -> None:
        """Stop renewing heartbeats, as a server that died would (tests)."""
        self._tasks[1].cancel()

    async def _update(self, items: dict[str, dict] | None = None, event: dict | None = None) -> None:
        async with self.changed:
            if items is not None:
                self.kernels = items
            elif event is not None:
                obj = event["raw_object"]
                name = obj["metadata"]["name"]
                if event["type"] == "DELETED":
                    self.kernels.pop(name, None)
                elif int(obj["metadata"]["resourceVersion"]) >= int(
                        self.kernels.get(name, {}).get("metadata", {}).get("resourceVersion", 0)):
                    self.kernels[name] = obj
                for listener in self.listeners:
                    listener(event["type"], obj)
            self.changed.notify_all()

    async def remember(self, obj: dict) -> None:
        """What a write of ours answered (so a waiter never sees the object as it was before)."""
        await self._update(event={"type": "MODIFIED", "raw_object": obj})

    async def _watch(self) -> None:
        from aiohttp import ClientError
        from kubernetes_asyncio import watch
        from kubernetes_asyncio.client.exceptions import ApiException

        while True:
            try:
                listing = await self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, KERNELS)
                rv = listing["metadata"]["resourceVersion"]
                await self._update(items={i["metadata"]["name"]: i for i in listing["items"]})
                self._synced.set()
                while True:
                    async with watch.Watch() as w:
                        async for event in w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                                                    self.namespace, KERNELS, resource_version=rv,
                                                    allow_watch_bookmarks=True, timeout_seconds=240):
                            rv = event["raw_object"]["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                await self._update(event=event)
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status != 410:  # 410: our version is too old: list afresh
                    log.warning("watching GPU kernels in %s failed (%s %s); retrying", self.namespace, e.status,
                                e.reason)
                    await asyncio.sleep(1.0)
            except (ClientError, asyncio.TimeoutError, OSError) as e:
                log.warning("watching GPU kernels in %s failed (%s); retrying", self.namespace, e)
                await asyncio.sleep(1.0)

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

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval)
            await asyncio.gather(*(self.beat(name) for name in list(self.owned)), return_exceptions=True)

    async def wait_for(self, name: str, predicate: Callable[[dict | None], bool],
                       timeout: float | None) -> dict | None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: predicate(self.kernels.get(name))), timeout)
            return self.kernels.get(name)


class GPUPoolKubernetesProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """A kernel in its own pod on a GPU slice of the cluster."""

    profile = Unicode("", help="Profile this kernelspec starts on (empty: GPUPool.default_profile).").tag(config=True)
    image = Unicode("", help="The kernel image (empty: GPUPoolKubernetes.image, else the operator's).").tag(
        config=True)

    def __init__(self, **kwargs: Any):
        unknown = set(kwargs) - _CONFIG_KEYS - {"kernel_id", "kernel_spec", "parent", "config", "log"}
        if unknown:
            raise KernelStartRefused(400, f"The kernelspec's {PROVISIONER} provisioner config has unknown keys "
                                     f"{sorted(unknown)}; the known keys are 'profile' and 'image'.",
                                     "bad_kernelspec")
        super().__init__(**kwargs)
        self.name = kernel_name(self.kernel_id)
        self.launch = 0
        self.pod = ""
        self.session: KernelSession | None = None
        self.timings: dict[str, float] = {}  # the last launch: created, running, ready (Unix seconds)
        self._settings: GPUPoolKubernetes | None = None
        self._pool: GPUPool | None = None

    # -- the cluster ------------------------------------------------------------------------

    async def _session(self) -> KernelSession:
        if self.session is None:
            parent_config = self.parent.config if self.parent is not None else None
            try:
                self._pool = await asyncio.to_thread(load_settings, parent_config)
            except ConfigError as e:
                raise KernelStartRefused(500, f"The GPU pool is misconfigured: {e}", "config_error") from e
            self._settings = kubernetes_settings(parent_config)
            try:
                self.session = await asyncio.wait_for(KernelSession.get(self._settings), 30)
            except Exception as e:
                raise KernelStartRefused(503, f"The Kubernetes cluster cannot be reached ({e}). Try again later, "
                                         "or ask your admin.", "cluster_unreachable") from e
        return self.session

    @property
    def kernel(self) -> dict | None:
        return self.session.kernels.get(self.name) if self.session else None

    def _body(self, profile: str, label: str) -> dict:
        settings, pool = self._settings, self._pool
        assert settings is not None and pool is not None and self.session is not None
        metadata: dict = {
            "name": self.name, "namespace": self.session.namespace,
            "labels": {LABEL_SERVER: label_value(settings.server_id), LABEL_OWNER: label_value(pool.owner),
                       LABEL_PART_OF: PART_OF},
            "annotations": {ANNOTATION_HEARTBEAT: f"{time.time():.3f}"},
        }
        server_namespace = settings.server_namespace or self.session.namespace
        if settings.server_pod and settings.server_pod_uid and server_namespace == self.session.namespace:
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": settings.server_pod,
                                            "uid": settings.server_pod_uid}]
        spec = {"owner": pool.owner, "kernelId": self.kernel_id, "kernelName": getattr(self.parent, "kernel_name", ""),
                "profile": profile, "launch": 1, "stopped": False, "label": label,
                "server": {"id": settings.server_id, "namespace": server_namespace, "pod": settings.server_pod}}
        image = self.image or settings.image
        if image:
            spec["image"] = image
        return {"apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": metadata, "spec": spec}

    async def _request_launch(self, label: str) -> None:
        """Create the GPUKernel, or (a restart) ask for its next launch."""
        from kubernetes_asyncio.client.exceptions import ApiException

        session = self.session
        assert session is not None and self._pool is not None
        try:
            profile = self._pool.profile(self.profile or None).name
        except UnknownProfile as e:
            raise KernelStartRefused(400, str(e), e.reason) from e
        existing = self.kernel
        if existing is None:
            try:
                created = await session.custom.create_namespaced_custom_object(
                    GROUP, VERSION, session.namespace, KERNELS, self._body(profile, label))
                await session.remember(created)
                self.launch = 1
                session.owned.add(self.name)
                log.info("kernel %s: GPUKernel %s/%s created on profile %s", self.kernel_id, session.namespace,
                         self.name, profile)
                return
            except ApiException as e:
                if e.status != 409:
                    raise KernelStartRefused(e.status if e.status in (400, 403, 422) else 503,
                                             f"The cluster refused the kernel: {e.reason}: {_api_message(e)}",
                                             "cluster_refused") from e
                existing = await session.custom.get_namespaced_custom_object(GROUP, VERSION, session.namespace,
                                                                             KERNELS, self.name)
        self.launch = int(existing["spec"]["launch"]) + 1
        patched = await session.custom.patch_namespaced_custom_object(
            GROUP, VERSION, session.namespace, KERNELS, self.name,
            {"spec": {"launch": self.launch, "stopped": False},
             "metadata": {"annotations": {ANNOTATION_HEARTBEAT: f"{time.time():.3f}"}}}, _content_type=MERGE)
        await session.remember(patched)
        session.owned.add(self.name)
        log.info("kernel %s: launch %d of GPUKernel %s requested", self.kernel_id, self.launch, self.name)

    def _launch_state(self, body: dict | None) -> str:
        """'running', 'failed', 'gone' or 'waiting' for this provisioner's launch."""
        if body is None:
            return "gone"
        st = _status(body)
        if st.get("phase") == FAILED:
            return "failed"
        if st.get("launch") != self.launch:
            return "waiting"
        if st.get("phase") == RUNNING and st.get("podIP"):
            return "running"
        if st.get("phase") == STOPPED:
            return "failed"
        return "waiting"

    async def _connection_info(self, body: dict) -> dict:
        session = self.session
        assert session is not None
        secret = await session.core.read_namespaced_secret(secret_name(self.name), session.namespace)
        info = json.loads(base64.b64decode(secret.data[CONNECTION_FILE]))
        info["ip"] = _status(body)["podIP"]
        info["key"] = info["key"].encode()  # as jupyter_client's KernelManager holds it
        return info

    async def _confirm_ready(self, info: dict, timeout: float) -> None:
        """A kernel_info reply over the kernel's own channels (so the key and the network path work)."""
        client = AsyncKernelClient()
        client.load_connection_info(info)
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=timeout)
        finally:
            client.stop_channels()

    # -- provisioner API --------------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        return bool(self.pod)

    def _forget_failed_start(self) -> None:
        """jupyter_client keeps a kernel whose start failed among its pending ones, and shutdown_all then
        fails on it: a refusal is an everyday event, so the kernel is forgotten (as gpu-pool does)."""
        getattr(getattr(self.parent, "parent", None), "_pending_kernels", {}).pop(self.kernel_id, None)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        try:
            await self._session()
        except BaseException:
            self._forget_failed_start()
            raise
        if self.kernel_spec is not None:
            # A server cannot signal a pod: interrupts travel as messages on the control channel.
            self.kernel_spec.interrupt_mode = "message"
        kwargs = await super().pre_launch(**kwargs)
        kwargs.setdefault("cmd", [])
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict:
        session = await self._session()
        settings = self._settings
        assert settings is not None
        env = kwargs.get("env") or {}
        deadline = time.monotonic() + settings.launch_timeout
        self.timings = {"requested": time.time()}
        try:
            # The notebook as its user knows it, relative to the server's root, as gpu-pool names it.
            await self._request_launch(GPUPoolProvisioner._notebook(self, env.get("JPY_SESSION_NAME", "")))
            self.timings["created"] = time.time()
            try:
                body = await session.wait_for(self.name, lambda b: self._launch_state(b) != "waiting",
                                              settings.launch_timeout)
            except asyncio.TimeoutError:
                said = _status(self.kernel).get("message", "no word from the operator")
                raise KernelStartRefused(504, f"The kernel did not start within {settings.launch_timeout:.0f}s "
                                         f"({said}). Is the jupyter-gpu-pool operator running?",
                                         "launch_timeout") from None
            state = self._launch_state(body)
            if state != "running":
                st = _status(body)
                reason = st.get("reason") or ("KernelDeleted" if state == "gone" else "LaunchFailed")
                message = st.get("message") or "The kernel's GPUKernel was deleted while it started."
                raise KernelStartRefused(_STATUS_OF.get(reason, 500), message, reason)
            self.timings["running"] = time.time()
            info = await self._connection_info(body)  # type: ignore[arg-type]
            ready = asyncio.create_task(self._confirm_ready(info, max(deadline - time.monotonic(), 1.0)))
            died = asyncio.create_task(session.wait_for(self.name, lambda b: self._launch_state(b) != "running",
                                                        settings.launch_timeout))
            done, _ = await asyncio.wait([ready, died], return_when=asyncio.FIRST_COMPLETED)
            for task in (ready, died):
                task.cancel()
            if ready not in done or ready.cancelled() or ready.exception():
                st = _status(self.kernel)
                why = st.get("message") or (str(ready.exception()) if ready in done and ready.exception() else
                                            "it stopped")
                raise KernelStartRefused(500, f"The kernel's pod runs but the kernel did not answer: {why}",
                                         st.get("reason") or "not_ready")
        except BaseException:
            await self._delete()
            self._forget_failed_start()
            raise
        self.timings["ready"] = time.time()
        self.pod = _status(body).get("pod", "")
        self.connection_info = info
        log.info("kernel %s ready in pod %s/%s (launch %d)", self.kernel_id, session.namespace, self.pod,
                 self.launch)
        return info

    def _exit_code(self, body: dict | None) -> int | None:
        if body is None:
            return 1  # deleted (by its owner, or as an orphan): the kernel is gone
        st = _status(body)
        if st.get("launch") != self.launch or st.get("phase") in (STARTING, RUNNING):
            return None
        if st.get("exitCode") is not None:
            return int(st["exitCode"])
        return 0 if st.get("reason") == "Exited" else 1

    async def poll(self) -> int | None:
        if not self.pod:
            return 0
        return self._exit_code(self.kernel)

    async def wait(self) -> int | None:
        if not self.pod or self.session is None:
            return 0
        body = await self.session.wait_for(self.name, lambda b: self._exit_code(b) is not None, None)
        return self._exit_code(body)

    async def send_signal(self, signum: int) -> None:
        if signum == 0:
            return
        if signum == signal.SIGINT:
            km = self.parent
            msg = km.session.msg("interrupt_request", content={})
            km._connect_control_socket()
            km.session.send(km._control_socket, msg)
        elif signum == signal.SIGKILL:
            await self.kill()
        elif signum == signal.SIGTERM:
            await self.terminate()
        else:
            log.warning("kernel %s: signal %d cannot be sent to a pod; ignored", self.kernel_id, signum)

    async def _stop(self, grace: int) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.session is None or self.kernel is None:
            return
        try:
            await self.session.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.session.namespace, KERNELS, self.name,
                {"spec": {"stopped": True, "stopGraceSeconds": grace}}, _content_type=MERGE)
        except ApiException as e:
            if e.status != 404:
                raise

    async def kill(self, restart: bool = False) -> None:
        await self._stop(0)

    async def terminate(self, restart: bool = False) -> None:
        await self._stop(10)

    async def _delete(self) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        session = self.session
        if session is None:
            return
        session.owned.discard(self.name)
        try:
            await session.custom.delete_namespaced_custom_object(GROUP, VERSION, session.namespace, KERNELS,
                                                                 self.name, body={"propagationPolicy": "Background"})
            log.info("kernel %s: GPUKernel %s deleted", self.kernel_id, self.name)
        except ApiException as e:
            if e.status != 404:
                raise

    async def cleanup(self, restart: bool = False) -> None:
        if not restart:
            await self._delete()
            self.pod = ""

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update({"gpu_pool_kubernetes": {"name": self.name, "namespace": self.session.namespace
                                             if self.session else "", "launch": self.launch, "pod": self.pod,
                                             "profile": self.profile}})
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Take over a running kernel (a restarted server): resume its heartbeat, read its connection."""
        await super().load_provisioner_info(provisioner_info)
        mine = provisioner_info.get("gpu_pool_kubernetes") or {}
        session = await self._session()
        self.name = mine.get("name") or self.name
        self.profile = mine.get("profile") or self.profile
        body = self.kernel
        if body is None:
            raise KernelStartRefused(404, f"GPUKernel {self.name} is gone: its kernel cannot be adopted",
                                     "kernel_gone")
        self.launch = int(body["spec"]["launch"])
        if self._launch_state(body) != "running":
            raise KernelStartRefused(409, f"kernel {self.kernel_id} is not running ({_status(body).get('phase')})",
                                     "not_running")
        session.owned.add(self.name)
        await session.beat(self.name)
        self.pod = _status(body).get("pod", "")
        self.connection_info = await self._connection_info(body)


def _api_message(e) -> str:
    try:
        return json.loads(e.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return ""


async def adopt_kernels(kernel_manager, settings: GPUPoolKubernetes | None = None) -> list[str]:
    """Adopt this server's running kernels (same ``server_id``) into jupyter_server's ``MappingKernelManager``.

    A server that was killed and started again (same ``server_id``) finds its
    GPUKernels still running (within the operator's heartbeat timeout) and
    serves them again, with their state (variables) intact.  Returns the ids.
    """
    from jupyter_client.provisioning import KernelProvisionerFactory as KPF
    from jupyter_server._tz import utcnow

    settings = settings or kubernetes_settings(kernel_manager.config)
    session = await KernelSession.get(settings)
    adopted = []
    mine = label_value(settings.server_id)
    for name, body in list(session.kernels.items()):
        spec, st = body.get("spec") or {}, _status(body)
        kernel_id = spec.get("kernelId")
        if (body["metadata"].get("labels") or {}).get(LABEL_SERVER) != mine:
            continue  # another server's kernel
        if not kernel_id or kernel_id in kernel_manager or st.get("phase") != RUNNING:
            continue
        km = kernel_manager.kernel_manager_factory(parent=kernel_manager, log=kernel_manager.log,
                                                   kernel_name=spec.get("kernelName") or "")
        km.kernel_id = kernel_id
        try:
            km.provisioner = KPF.instance(parent=kernel_manager.parent).create_provisioner_instance(
                kernel_id, km.kernel_spec, parent=km)
            await km.provisioner.load_provisioner_info(
                {"kernel_id": kernel_id, "connection_info": {},
                 "gpu_pool_kubernetes": {"name": name, "profile": spec.get("profile", "")}})
        except Exception as e:
            kernel_manager.log.warning("could not adopt GPU kernel %s: %s", kernel_id, e)
            continue
        km.load_connection_info(km.provisioner.connection_info)
        km.kernel_spec.interrupt_mode = "message"
        km.ready.set_result(None)
        km.last_activity = utcnow()
        km.execution_state = "idle"
        km.reason = ""
        km.start_restarter()
        km._connect_control_socket()
        kernel_manager._kernels[kernel_id] = km
        kernel_manager._kernel_connections[kernel_id] = 0
        kernel_manager._kernel_ports[kernel_id] = km.ports
        kernel_manager.start_watching_activity(kernel_id)
        kernel_manager.add_restart_callback(kernel_id, lambda k=kernel_id: kernel_manager._handle_kernel_died(k),
                                            "dead")
        adopted.append(kernel_id)
        kernel_manager.log.info("adopted GPU kernel %s (GPUKernel %s/%s, pod %s)", kernel_id, session.namespace,
                                name, km.provisioner.pod)
    return adopted
