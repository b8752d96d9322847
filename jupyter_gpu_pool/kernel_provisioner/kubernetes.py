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
environment variable, a command line or a log line.  With the operator's
transport encryption (the default) the Secret also holds the kernel's CurveZMQ
key pair, and the server's channels to the kernel are encrypted.

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
  re-adopts its kernels (``load_provisioner_info``; see
  ``jupyter_gpu_pool.server_extension.backends.adoption``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import queue
import signal
import time
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.provisioning import KernelProvisionerBase
from traitlets import Unicode

from .. import compat
from ..cluster.resources import (
    ANNOTATION_HEARTBEAT,
    API_VERSION,
    DESIRED_RUNNING,
    FAILED,
    GROUP,
    HIBERNATED,
    HIBERNATING,
    IMAGE_PULL,
    INVALID,
    KERNEL_KIND,
    KERNELS,
    LABEL_OWNER,
    LABEL_PART_OF,
    LABEL_SERVER,
    PART_OF,
    QUOTA_EXCEEDED,
    RESUMING,
    ROOM_RESERVED,
    RUNNING,
    STARTING,
    STOPPED,
    UNSCHEDULABLE,
    UNSUPPORTED,
    VERSION,
    CONNECTION_FILE,
    kernel_name,
    label_value,
    secret_name,
)
from ..cluster.kernels import as_of
from ..cluster.session import KernelSession
from ..cluster.settings import GPUPoolKubernetes, kubernetes_settings
from ..config import ConfigError, GPUPool, load_settings
from ..pool import UnknownProfile
from ..pool.rules import FIRST_CELL
from .base import KernelStartRefused, PoolKernelProvisioner

# The pod's kernel process lives: running, or hibernated (its GPU memory in host memory) or on the way.
ALIVE = (RUNNING, HIBERNATING, HIBERNATED, RESUMING)
log = logging.getLogger("jupyter_gpu_pool.kubernetes")
_ASK_AGAIN = 2.0  # seconds between kernel_info requests while a kernel starts
_PRECAUTION_WAIT = 300.0  # at most, for the operator's kill precaution (its own timeout ends it sooner)

MERGE = "application/merge-patch+json"
PROVISIONER = "gpu-pool-kubernetes"
_STATUS_OF = {QUOTA_EXCEEDED: 403, "QuotaMisconfigured": 403, INVALID: 400, UNSCHEDULABLE: 503, IMAGE_PULL: 502,
              UNSUPPORTED: 503, ROOM_RESERVED: 503}


def _status(body: dict | None) -> dict:
    return (body or {}).get("status") or {}


class GPUPoolKubernetesProvisioner(PoolKernelProvisioner, KernelProvisionerBase):  # type: ignore[misc]
    """A kernel in its own pod on a GPU slice of the cluster."""

    provisioner_name = PROVISIONER
    config_keys = ("profile", "image")
    profile = Unicode("", help="Profile this kernelspec starts on (empty: GPUPool.default_profile).").tag(config=True)
    image = Unicode("", help="The kernel image (empty: GPUPoolKubernetes.image, else the operator's).").tag(
        config=True)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)  # PoolKernelProvisioner checks the kernelspec's provisioner config
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

    def _note_slice_at(self, profile: str) -> None:
        """A pod gets its GPU from the scheduler when it is created: a cluster kernel takes its slice at start
        whatever its rule's ``slice_at`` says (docs/kubernetes.md).  Said in the log, never silently."""
        pool = self._pool
        assert pool is not None
        kernelspec = (self.parent.kernel_name or "") if self.parent is not None else ""
        rule = pool.idle_policy.rule_for(pool.owner, pool.groups_of(pool.owner), profile, kernelspec)
        if rule.slice_at == FIRST_CELL:
            log.info("kernel %s: its rule %r says slice_at: first-cell, but a cluster kernel's pod gets its GPU from "
                     "the scheduler when it is created, so it takes its slice at start", self.kernel_id, rule.name)

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
            self._note_slice_at(profile)
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
                # It exists already (this server's watch had not shown it yet): wait for the watch.
                existing = await session.wait_for(self.name, lambda b: b is not None, 30)
        self.launch = int(existing["spec"]["launch"]) + 1
        patched = await session.custom.patch_namespaced_custom_object(
            GROUP, VERSION, session.namespace, KERNELS, self.name,
            {"spec": {"launch": self.launch, "stopped": False, "desiredState": DESIRED_RUNNING},  # a new kernel runs
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
        if st.get("phase") in ALIVE and st.get("podIP"):
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

    async def _confirm_ready(self, info: dict, deadline: float) -> bool:
        """True once the kernel answers ``kernel_info`` over its own channels (so the key, the encryption
        and the network path work); False at ``deadline`` (``time.monotonic()``).

        A kernel opens its ports a while after its container starts (a big image importing ipykernel):
        until then ZMQ retries the connection by itself.  No heartbeat is judged: jupyter_client's
        ``wait_for_ready`` calls a kernel dead whose heartbeat fails for a second, which refused such kernels."""
        client = AsyncKernelClient()
        client.load_connection_info(info)
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        try:
            while (left := deadline - time.monotonic()) > 0:
                client.kernel_info()  # asked again each round, in case a request was lost on the way
                try:
                    reply = await client.get_shell_msg(timeout=min(left, _ASK_AGAIN))
                except queue.Empty:
                    continue
                if reply["msg_type"] == "kernel_info_reply":
                    return True
            return False
        finally:
            client.stop_channels()

    async def _wait_for_kernel(self, info: dict, started: float) -> None:
        """Until the pod's kernel answers; refused at the start timeout, or where the pod ends first."""
        session, settings = self.session, self._settings
        assert session is not None and settings is not None
        # A pod that runs just before the timeout still gets a moment to answer.
        deadline = max(started + settings.launch_timeout, time.monotonic() + 1.0)
        ready = asyncio.create_task(self._confirm_ready(info, deadline))
        ended = asyncio.create_task(session.wait_for(self.name, lambda b: self._launch_state(b) != "running", None))
        try:
            done, _ = await asyncio.wait([ready, ended], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ready, ended):
                task.cancel()
        if ready in done:
            if ready.exception() is not None:
                raise KernelStartRefused(500, f"The kernel's pod runs, but this server could not ask its kernel for "
                                         f"kernel_info: {ready.exception()}. Ask your admin.", "not_ready")
            if ready.result():
                return
            raise KernelStartRefused(504, await self._not_ready_message(info, started), "not_ready")
        st = _status(self.kernel)
        why = st.get("message") or ("its GPUKernel was deleted" if self.kernel is None else st.get("phase"))
        raise KernelStartRefused(_STATUS_OF.get(st.get("reason", ""), 500),
                                 f"The kernel's pod ended before its kernel answered: {why}",
                                 st.get("reason") or "not_ready")

    async def _not_ready_message(self, info: dict, started: float) -> str:
        """What the user is told at the start timeout: whether anything listens on the kernel's ports
        tells a kernel that has not started (or never will) from one that cannot be reached."""
        settings = self._settings
        assert settings is not None
        head = (f"The kernel's pod {_status(self.kernel).get('pod') or self.name} runs, but its kernel did not "
                f"answer within {time.monotonic() - started:.0f} s of the start")
        if not await _listening(info["ip"], info["shell_port"]):
            return (f"{head}: nothing listens on its ports ({info['ip']}:{info['shell_port']}). Its command has not "
                    f"started the kernel yet (a slower start needs a GPUPoolKubernetes.launch_timeout above "
                    f"{settings.launch_timeout:g} s), or does not start it at all. Ask your admin: the pod's log "
                    "says what it does.")
        if info.get("curve_publickey"):
            return (f"{head}: its ports accept connections, but it did not reply to kernel_info. Its connection is "
                    "encrypted (CurveZMQ), which needs ipykernel 7.3 or newer in the kernel image: an older kernel "
                    "cannot be reached. Ask your admin to update the image (or to set "
                    "GPUPoolOperator.transport_encryption = False).")
        return (f"{head}: its ports accept connections, but it did not reply to kernel_info. Ask your admin: the "
                "pod's log says what the kernel does.")

    # -- provisioner API --------------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        return bool(self.pod)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        async with self.start_step():
            await self._session()
        if self.kernel_spec is not None:
            # A server cannot signal a pod: interrupts travel as messages on the control channel.
            self.kernel_spec.interrupt_mode = "message"
        kwargs = await super().pre_launch(**kwargs)
        kwargs.setdefault("cmd", [])
        return kwargs

    async def _wait_for_pod(self, started: float) -> dict | None:
        """Until this launch's pod runs, fails or is gone; every ``progress_interval`` the server's log
        says what the pod is doing (the operator's status.message: pulling the image for N s, ...)."""
        session, settings = self.session, self._settings
        assert session is not None and settings is not None
        while True:
            left = settings.launch_timeout - (time.monotonic() - started)
            if left <= 0:
                raise KernelStartRefused(504, self._timeout_message(time.monotonic() - started), "launch_timeout")
            try:
                return await session.wait_for(self.name, lambda b: self._launch_state(b) != "waiting",
                                              min(left, settings.progress_interval))
            except asyncio.TimeoutError:
                said = as_of(_status(self.kernel).get("message") or "no word from the operator yet", time.time())
                log.info("kernel %s: still starting after %.0f s: %s", self.kernel_id, time.monotonic() - started,
                         said)

    def _timeout_message(self, waited: float) -> str:
        where = f"GPUKernel {self.session.namespace}/{self.name}" if self.session else f"GPUKernel {self.name}"
        st = _status(self.kernel)
        if not st:
            return (f"The kernel did not start: in {waited:.0f} s the jupyter-gpu-pool operator did not take up "
                    f"its {where}. Is the operator running, and serving this namespace? Ask your admin.")
        return (f"The kernel did not start within {waited:.0f} s ({where}). The cluster's last word: "
                f"{as_of(st.get('message') or '', time.time()) or st.get('phase')} Try again later, or ask your admin.")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict:
        session = await self._session()
        env = kwargs.get("env") or {}
        started = time.monotonic()
        self.timings = {"requested": time.time()}
        async with self.start_step(self._delete):  # a refused start leaves no GPUKernel behind
            await self._request_launch(self.notebook(env.get("JPY_SESSION_NAME", "")))
            self.timings["created"] = time.time()
            body = await self._wait_for_pod(started)
            state = self._launch_state(body)
            if state != "running":
                st = _status(body)
                reason = st.get("reason") or ("KernelDeleted" if state == "gone" else "LaunchFailed")
                message = st.get("message") or "The kernel's GPUKernel was deleted while it started."
                raise KernelStartRefused(_STATUS_OF.get(reason, 500), message, reason)
            self.timings["running"] = time.time()
            info = await self._connection_info(body)  # type: ignore[arg-type]
            await self._wait_for_kernel(info, started)
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
        if st.get("launch") != self.launch or st.get("phase") in (STARTING, *ALIVE):
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
            km.session.send(compat.control_socket(km), km.session.msg("interrupt_request", content={}))
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
            await self._precaution_done()
            await self._delete()
            self.pod = ""

    async def _precaution_done(self) -> None:
        """Wait while the operator has the node agent checkpoint this kernel's restored GPU processes before
        it deletes the pod (status.killPrecaution asked, unanswered, the pod not yet stopped): deleting the
        GPUKernel now would have the garbage collector delete the pod before that precaution is done.
        jupyter_client waits 5 s for a killed kernel to end, less than a large checkpoint may take.  The
        operator's kill_precaution_timeout ends the wait; ``_PRECAUTION_WAIT`` bounds it should the
        operator be down."""
        def waiting(body: dict | None) -> bool:
            asked = _status(body).get("killPrecaution") or {}
            return body is not None and self._exit_code(body) is None and asked.get("pod") == self.pod and \
                asked.get("requestedAt") is not None and asked.get("answeredAt") is None

        if self.session is None or not waiting(self.kernel):
            return
        log.info("kernel %s: waiting for the node agent to make its restored GPU processes safe to kill",
                 self.kernel_id)
        try:
            await self.session.wait_for(self.name, lambda b: not waiting(b), _PRECAUTION_WAIT)
        except asyncio.TimeoutError:
            log.warning("kernel %s: the operator did not stop its pod within %.0f s; deleting its GPUKernel anyway",
                        self.kernel_id, _PRECAUTION_WAIT)

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


async def _listening(ip: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``ip:port`` (a kernel binds its ports when it starts)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 2)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def _api_message(e) -> str:
    try:
        return json.loads(e.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return ""
