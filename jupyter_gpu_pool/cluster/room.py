"""The room of a cluster as reservations and the fair queue count it (docs/kubernetes.md, "Reservations and
fair share").  Pure: the operator and the server's cluster backend read their objects into these, and the
decisions are the pool core's (``pool.allocation.allocate``, ``pool.reclaim.reserved_for``, ``pool.sharing``).

A cluster has no per-GPU ledger: the device plugin picks the GPU a pod gets.  So the room is counted in GPU
memory, node by node: each GPU node is one entry of the pool (:func:`node_gpu`: its GPUs' memory together,
named after their model, from NVIDIA's GPU feature discovery labels), and each kernel that holds a slice counts
its memory on the node its pod runs on (:func:`room_lease`; a whole GPU as that GPU's memory).  A reservation's
``gpus`` count as that many GPUs' memory of its models (:func:`on_cluster`).  What a hibernated kernel held is
free, as the operator's resume admission counts it.

The admin's sharing comes from the ``GPUPoolPolicy`` named ``default`` (:func:`read_sharing`: ``reservations``,
``queueOrder``, ``fairShare``), else from the config file's ``c.GPUPool.reservations`` and ``queue_order``, as the
idle policy does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..pool import ACTIVE, DETECTED, GPU, GPUUsage, Lease, SliceSpec, Waiter
from ..pool.fairshare import QUEUE_ORDERS, FairShare, parse_half_life, parse_weight, parse_weights
from ..pool.reservations import ReservationError, parse_reservations
from ..pool.sharing import Sharing
from ..pool.units import parse_seconds
from .kernels import hibernation, meta, spec, status
from .resources import FAILED

NODE_PREFIX = "node/"
SHARING_KEYS = ("reservations", "queueOrder", "fairShare")  # the policy's spec fields that set sharing
_FAIR_KEYS = {"weights": parse_weights, "othersWeight": parse_weight, "halfLife": parse_half_life,
              "aging": lambda v: parse_seconds(v, zero_allowed=False)}


class SharingError(ValueError):
    """A policy's sharing that does not parse: the message names the field ("reservations[1] ('Lab').timezone: …")."""


def node_gpu(node: dict, index: int = 0) -> GPU | None:
    """A GPU node (as JSON) as one entry of the pool: its GPUs' memory together (``extra``: their count and
    each one's memory), named "2 × NVIDIA-H100-80GB-HBM3"; None for a node without GPUs."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        count = int(labels.get("nvidia.com/gpu.count") or allocatable.get("nvidia.com/gpu") or 0)
        each = int(labels.get("nvidia.com/gpu.memory") or 0) * 2**20  # MiB
    except ValueError:
        return None
    if count <= 0:
        return None
    name = (node.get("metadata") or {}).get("name", "")
    product = labels.get("nvidia.com/gpu.product", "GPU")
    return GPU(uuid=NODE_PREFIX + name, name=f"{count} × {product}", memory=count * each, index=index, node=name,
               source=DETECTED, extra={"count": count, "each": each})


def node_of(entry: str) -> str:
    return entry.removeprefix(NODE_PREFIX)


def read_sharing(spec: Mapping) -> Sharing | None:
    """The sharing a GPUPoolPolicy's spec sets (None: it sets none, so the config file's applies), or
    :class:`SharingError` naming the field."""
    if not any(k in spec for k in SHARING_KEYS):
        return None
    try:
        reservations = parse_reservations(spec.get("reservations") or [])
    except ReservationError as e:
        raise SharingError(f"reservations{e}") from None
    order = spec.get("queueOrder", "fifo")
    if order not in QUEUE_ORDERS:
        raise SharingError(f"queueOrder must be one of {', '.join(QUEUE_ORDERS)}, not {order!r}")
    fair = spec.get("fairShare") or {}
    unknown = sorted(set(fair) - set(_FAIR_KEYS))
    if unknown:
        raise SharingError(f"fairShare has an unknown field {unknown[0]!r}; the fields are {', '.join(_FAIR_KEYS)}")
    parsed = {}
    for key, parse in _FAIR_KEYS.items():
        if key in fair:
            try:
                parsed[key] = parse(fair[key])
            except ValueError as e:
                raise SharingError(f"fairShare.{key} {e}") from None
    defaults = FairShare()
    return Sharing(reservations=reservations, order=order, fair=FairShare(
        weights=parsed.get("weights", {}), half_life=parsed.get("halfLife", defaults.half_life),
        aging=parsed.get("aging", defaults.aging), others_weight=parsed.get("othersWeight", defaults.others_weight)))


def on_cluster(sharing: Sharing, gpus: Iterable[GPU]) -> Sharing:
    """``sharing`` as the cluster counts it: each reservation's whole GPUs as that many GPUs' memory of its
    models (the smallest such GPU's), since the device plugin, not the pool, picks a pod's GPU."""
    gpus = list(gpus)
    converted = []
    for r in sharing.reservations:
        if r.gpus:
            sizes = [g.extra.get("each", 0) for g in gpus if r.on(g)]
            r = replace(r, memory=(r.memory or 0) + r.gpus * min(sizes, default=0), gpus=None)
        converted.append(r)
    return replace(sharing, reservations=tuple(converted))


def room_lease(lease: Lease, node: str) -> Lease:
    """A kernel's lease as the room counts it: its memory on its node's entry (none where its pod is not
    placed), a whole GPU as that GPU's memory; what it held is free once it is hibernated."""
    return replace(lease, memory=lease.total_memory, sm_percent=None, whole=False, gpu_count=1,
                   gpus=(NODE_PREFIX + node,) if node and lease.state == ACTIVE else (),
                   last_gpus=(NODE_PREFIX + node,) if node else ())


def usage(gpus: Iterable[GPU], held: Mapping[str, tuple[int, int]]) -> list[GPUUsage]:
    """Each node's usage from ``held`` (node entry -> (bytes, kernels) of the active slices on it)."""
    return [GPUUsage(g, memory=held.get(g.uuid, (0, 0))[0], leases=held.get(g.uuid, (0, 0))[1]) for g in gpus]


def usage_of(gpus: Iterable[GPU], leases: Iterable[Lease]) -> list[GPUUsage]:
    """Each node's usage summed from room leases (:func:`room_lease`)."""
    held: dict[str, tuple[int, int]] = {}
    for lease in leases:
        for entry in lease.gpus if lease.state == ACTIVE else ():
            memory, count = held.get(entry, (0, 0))
            held[entry] = (memory + lease.total_memory, count + 1)
    return usage(gpus, held)


def _waiter(kernel: dict, memory: int, since: float, groups, lease_id: str | None, now: float, position: int = 0,
            why: str = "") -> Waiter:
    m, s = meta(kernel), spec(kernel)
    return Waiter(id=m.get("uid", ""), owner=s.get("owner", ""), kernel_id=s.get("kernelId", ""), lease_id=lease_id,
                  profile=s.get("profile", ""), slice=SliceSpec(memory=max(int(memory), 1)), label=s.get("label", ""),
                  enqueued=float(since), heartbeat=now, position=position, groups=tuple(groups or ()), why=why)


def start_waiter(kernel: dict, now: float) -> Waiter | None:
    """A kernel whose start waits for room (``status.waiting``, which the operator writes: a member's start
    while others hold the room reserved for them) as the pool's queue has it; None for any other."""
    st = status(kernel)
    w = st.get("waiting")
    if not w or st.get("admitted") or st.get("phase") == FAILED:
        return None
    return _waiter(kernel, w.get("memory", 0), w.get("since", now), w.get("groups"), None, now,
                   int(w.get("position") or 0), w.get("why") or "")


def resume_waiter(kernel: dict, now: float) -> Waiter:
    """A hibernated kernel whose resume is asked, as the pool's queue has it (its slice, since it was asked)."""
    a, h = status(kernel).get("admitted") or {}, hibernation(kernel)
    return _waiter(kernel, a.get("memory", 0), h.get("requestedAt") or now, a.get("groups"), meta(kernel).get("uid"),
                   now, int(h.get("queuePosition") or 0), h.get("why") or "")
