"""The pool backend for a cluster: ``me``, ``pool``, culling and events read Kubernetes.

Selected with ``c.GPUPoolExtension.pool_backend = "kubernetes"`` (with kernelspecs that use the
``gpu-pool-kubernetes`` provisioner).  What the local backend reads from the SQLite ledger, this
one reads from the cluster, without a handler or the culler changing:

- leases: the GPUKernels of the server's namespace that hold a slice (the same watch the
  provisioners use, so no request per view);
- quotas and group members: the ``GPUQuota`` objects; the policy and the admin's sharing (reservations,
  the queue's order): the ``GPUPoolPolicy`` named ``default`` (else ``c.GPUPool.policy``, and the config
  file's reservations and queue order), both re-read every ``refresh`` seconds;
- GPUs: one entry per GPU node (``N x <product>``, from the node's GPU feature discovery labels
  and allocatable GPUs: ``cluster.room.node_gpu``), with the slices held on it by the kernels this server
  can see; the queue: the starts waiting for room a reservation keeps for their owner (``status.waiting``);
- reservations: which of this server's kernels give back the room a reservation keeps (:meth:`reserved`),
  judged by ``pool.reclaim.reserved_for`` on the room as the operator counts it (``cluster.room``), on the
  kernels this server can see;
- telemetry: each kernel's ``status.usage``, written by the node agent from NVML;
- the journal: this server's own decisions, plus refusals the operator wrote on its kernels.

Hibernation goes through the kernels' GPUKernels (``cluster_hibernation.ClusterHibernation``, the default
hook here): the server asks in the spec, the operator admits and the node agent moves the pod's GPU memory.
A hibernated kernel's slice is free in the pool view, as the operator counts it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from ...config import load_settings
from ...devices.telemetry import Reading, Sampler
from ...periodic import every
from ...cluster.kernels import as_lease, holds_quota, spec, status
from ...cluster.quotas import read_quotas
from ...cluster.resources import FAILED, GROUP, POLICIES, POLICY_NAME, QUOTAS, VERSION
from ...cluster.room import NODE_PREFIX, SharingError, node_gpu, on_cluster, read_sharing, room_lease, \
    start_waiter, usage_of
from ...cluster.session import KernelSession
from ...cluster.settings import kubernetes_settings
from ...pool import ACTIVE, GPU, GPUUsage, SPREAD, JournalEntry, Lease, Profile, Quota, Snapshot, Waiter
from ...pool.reclaim import reserved_for
from ...pool.rules import Policy, PolicyError, parse_policy
from ...pool.sharing import Sharing
from .adoption import adopt_kernels
from .base import PoolBackend

log = logging.getLogger(__name__)


class KubernetesBackend(PoolBackend):
    """The pool of a cluster: kernels as GPUKernel objects, watched; quotas and policy from the cluster."""

    hibernation = True  # through the GPUKernels (the operator and the node agent move the memory)

    def __init__(self, parent_config):
        self.settings = load_settings(parent_config)
        self.kube = kubernetes_settings(parent_config)
        self.refresh = self.kube.refresh_interval
        self.session: KernelSession | None = None
        self._quotas = read_quotas([])
        self._policy = self.settings.idle_policy
        self._sharing = self.settings.sharing  # the GPUPoolPolicy's, where it sets any; else the config file's
        self._nodes: list[GPU] = []
        self._journal: list[JournalEntry] = []
        self._seq = 0
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self.adopted: asyncio.Future | None = None  # done with the ids of the kernels re-adopted at start
        self.note = f"Kubernetes cluster, namespace {self.kube.namespace or '(this pod’s)'} (connecting)"

    # -- life -----------------------------------------------------------------------------------

    async def start(self, kernel_manager) -> None:
        """In the background (a server starts even while the cluster is unreachable): watch the
        namespace's kernels, re-adopt this server's running ones, and keep quotas and policy read."""
        self.adopted = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(kernel_manager))
        self._task.add_done_callback(_report_end)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, kernel_manager) -> None:
        connected = asyncio.Event()

        async def connect() -> None:
            try:
                session = await asyncio.wait_for(KernelSession.get(self.kube), 30)
            except Exception as e:
                log.error("GPU pool: the Kubernetes cluster cannot be reached (%s); retrying", e)
                self.note = f"Kubernetes cluster unreachable: {e}"
                return
            session.listeners.append(self._seen)
            self.session = session
            connected.set()

        await every(self.refresh, connect, connected, what="connecting to the Kubernetes cluster")
        if self.session is None:  # stopped before it connected
            return
        refresh = asyncio.create_task(every(self.refresh, self._refresh, self._stop,
                                            what="reading the cluster's quotas, policy and nodes"))
        try:
            adopted = await adopt_kernels(kernel_manager, self.kube)
            if adopted:
                log.info("GPU pool: adopted %d running kernel(s) of this server: %s", len(adopted),
                         ", ".join(adopted))
            self.adopted.set_result(adopted)
            await refresh
        finally:
            refresh.cancel()

    async def _refresh(self) -> None:
        try:
            await self.read_cluster()
        except Exception as e:  # the cluster may blink; the last good read stays
            log.warning("GPU pool: reading quotas, policy and nodes failed: %s", e)

    async def read_cluster(self) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        session = self.session
        assert session is not None
        quotas = await session.custom.list_cluster_custom_object(GROUP, VERSION, QUOTAS)
        self._quotas = read_quotas(quotas["items"])
        try:
            obj = await session.custom.get_cluster_custom_object(GROUP, VERSION, POLICIES, POLICY_NAME)
            rules, dry_run = spec(obj).get("rules") or [], bool(spec(obj).get("dryRun", False))
            policy, sharing = parse_policy(rules, dry_run, tuple(self.settings.profiles)), read_sharing(spec(obj))
            self._policy, self._sharing = policy, sharing or self.settings.sharing
        except ApiException as e:
            if e.status != 404:
                raise
            self._policy = self.settings.idle_policy  # no cluster policy: the config file's
            self._sharing = self.settings.sharing
        except (PolicyError, SharingError) as e:  # the operator marks it invalid too; keep the last good one
            log.warning("GPU pool: GPUPoolPolicy %r is invalid (%s); keeping the previous policy", POLICY_NAME, e)
        nodes = session.api.sanitize_for_serialization(await session.core.list_node())
        self._nodes = [gpu for i, node in enumerate(nodes.get("items") or []) if (gpu := node_gpu(node, i)) is not None]
        count = sum(int(g.extra.get("count", 1)) for g in self._nodes)
        self.note = (f"Kubernetes cluster: {len(self._nodes)} GPU node(s), {count} GPU(s); kernels in namespace "
                     f"{session.namespace}")

    def _seen(self, event_type: str, obj: dict) -> None:
        """A refusal the operator wrote on one of this server's kernels goes on the journal."""
        st = status(obj)
        if event_type == "DELETED" or st.get("phase") != FAILED:
            return
        kernel_id = spec(obj).get("kernelId")
        if any(e.kernel_id == kernel_id and e.kind == "refused" for e in self._journal[-50:]):
            return
        self._append("refused", lease_id=None, kernel_id=kernel_id, owner=spec(obj).get("owner"),
                     reason=st.get("reason", ""), detail={"message": st.get("message", ""),
                                                          "profile": spec(obj).get("profile"),
                                                          "name": spec(obj).get("label", "")})

    # -- the PoolBackend protocol ---------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def owner(self) -> str:
        return self.settings.owner

    @property
    def sharing(self) -> Sharing:
        return self._sharing

    def gpus(self) -> list[GPU]:
        return list(self._nodes)

    def profile(self, name: str) -> Profile | None:
        return self.settings.profiles.get(name)

    def profiles(self) -> dict[str, Profile]:
        return self.settings.profiles

    def groups_of(self, user: str) -> tuple[str, ...]:
        return self._quotas.book.groups_of(user)

    def user_quota(self, user: str) -> Quota:
        return self._quotas.book.user_quota(user)

    def group_quota(self, group: str) -> Quota | None:
        return self._quotas.book.groups.get(group)

    def leases(self) -> list[Lease]:
        kernels = list(self.session.kernels.values()) if self.session else []
        return [dataclasses.replace(lease, gpus=(NODE_PREFIX + lease.host,) if lease.host and lease.state == ACTIVE
                                    else (), last_gpus=(NODE_PREFIX + lease.host,) if lease.host else ())
                for lease in (as_lease(k) for k in kernels if holds_quota(k))]

    async def snapshot(self) -> Snapshot:
        leases = self.leases()
        usage = []
        for gpu in self._nodes:
            here = [lease for lease in leases if lease.gpus and lease.gpus[0] == gpu.uuid and lease.state == ACTIVE]
            usage.append(GPUUsage(gpu=gpu, memory=sum(lease.total_memory for lease in here),
                                  sm_percent=sum(lease.total_sm for lease in here), leases=len(here)))
        now = time.time()
        return Snapshot(at=now, gpus=usage, leases=leases, waiters=self.waiters(now))

    def waiters(self, now: float) -> list[Waiter]:
        """The starts waiting for room a reservation keeps for their owners (the operator's ``status.waiting``),
        in the order it serves them."""
        kernels = list(self.session.kernels.values()) if self.session else []
        return sorted((w for k in kernels if (w := start_waiter(k, now)) is not None),
                      key=lambda w: (w.position or 0, w.enqueued, w.id))

    async def reserved(self, candidates: list, freeing: tuple[str, ...] = (),
                       warned: tuple[str, ...] = ()) -> dict[str, str]:
        """Of this server's idle ``candidates``, those to give back the room a reservation keeps now, with why:
        the pool core's choice (``reserved_for``) on the room as the operator counts it, node by node
        (``cluster.room``), with the kernels this server can see and the members' starts waiting for room."""
        now = time.time()
        sharing = on_cluster(self.sharing, self._nodes)
        if not candidates or not sharing.needs_everyone(now):
            return {}
        kernels = list(self.session.kernels.values()) if self.session else []
        leases = [room_lease(lease, lease.host) for lease in (as_lease(k) for k in kernels if holds_quota(k))]
        mine = [dataclasses.replace(c, lease=room_lease(c.lease, c.lease.host)) for c in candidates]
        return reserved_for(sharing, usage_of(self._nodes, leases), leases, self.waiters(now), mine, now,
                            freeing=freeing, warned=warned, placement=SPREAD)

    async def reconcile(self) -> list[Lease]:
        return []  # the operator reclaims what a dead server left, by its heartbeat

    async def journal(self, *, since: float = 0.0, kinds: tuple[str, ...] = (), owner: str | None = None,
                      limit: int = 200) -> list[JournalEntry]:
        found = [e for e in reversed(self._journal) if e.at >= since and (not kinds or e.kind in kinds)
                 and (owner is None or e.owner == owner)]
        return found[:limit]

    async def record(self, kind: str, *, lease_id: str | None = None, kernel_id: str | None = None,
                     owner: str | None = None, reason: str = "", detail: dict | None = None) -> None:
        self._append(kind, lease_id=lease_id, kernel_id=kernel_id, owner=owner, reason=reason, detail=detail or {})

    def _append(self, kind: str, *, lease_id, kernel_id, owner, reason: str, detail: dict) -> None:
        self._seq += 1
        self._journal.append(JournalEntry(self._seq, time.time(), kind, lease_id, kernel_id, owner, reason, detail))
        del self._journal[:-1000]

    # -- telemetry -------------------------------------------------------------------------------------

    def make_sampler(self, source, thresholds: tuple[float, ...], history: int) -> Sampler:
        """Readings come from the node agents (through the GPUKernel objects), not from this pod's NVML."""
        return ClusterSampler(self, thresholds=thresholds, history=history)

    def usage_of(self, kernel_id: str) -> dict | None:
        for kernel in list(self.session.kernels.values()) if self.session else []:
            if spec(kernel).get("kernelId") == kernel_id:
                return status(kernel).get("usage")
        return None


class ClusterSampler(Sampler):
    """Readings from the kernels' ``status.usage`` (the node agent's NVML reads), not from local NVML."""

    def __init__(self, backend: KubernetesBackend, **kwargs):
        super().__init__(None, **kwargs)
        self.backend = backend
        self._last: dict[str, float] = {}

    @property
    def available(self) -> tuple[bool, str]:
        return True, ""

    def sample_once(self) -> None:
        with self._lock:
            tracked = dict(self._kernels)
        for kernel_id, k in tracked.items():
            usage = self.backend.usage_of(kernel_id)
            if not usage or usage.get("sampledAt", 0) <= self._last.get(kernel_id, 0):
                continue
            self._last[kernel_id] = usage["sampledAt"]
            with self._lock:
                self._record(k, Reading(usage["sampledAt"], usage.get("memoryUsed"), usage.get("utilization")))


def _report_end(task: asyncio.Task) -> None:
    """The backend's watch ends only when the server stops: anything else is a fault to show."""
    if not task.cancelled() and task.exception() is not None:
        log.error("GPU pool: the Kubernetes backend stopped: %r", task.exception(), exc_info=task.exception())
