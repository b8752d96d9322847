"""GPU sharing backends: how a profile's slice becomes a pod's resource limits.

The admin picks the backend the cluster runs (``GPUPoolOperator.sharing``):

- ``hami``: HAMi's device plugin and scheduler: ``nvidia.com/gpu: 1``,
  ``nvidia.com/gpumem`` (MiB, enforced in the container) and, with an SM share,
  ``nvidia.com/gpucores`` (percent).  A whole GPU is ``gpucores: 100``
  (HAMi gives such a container the card alone).
- ``mps``: NVIDIA's device plugin with MPS sharing: each GPU is advertised as
  ``replicas`` replicas, each capped by MPS at 1/replicas of the memory and SMs.
  A kernel takes one replica, so a slice must fit in one.
- ``time-slicing``: the device plugin's time-slicing: replicas as above but
  with no memory or SM isolation; the memory share is passed to frameworks
  (JAX, CuPy) as soft caps, and an SM share cannot be held at all.
- ``mig``: Multi-Instance GPU (mixed strategy): the smallest
  ``nvidia.com/mig-<profile>`` of the admin's list that covers the slice.
- ``whole``: every kernel gets whole GPUs (``nvidia.com/gpu: N``).
- ``dra``: Dynamic Resource Allocation (``resource.k8s.io/v1``, GA since
  Kubernetes 1.34) with NVIDIA's DRA driver: no limits, but one
  ResourceClaimTemplate per profile (:class:`Claim`), from which each kernel's
  pod gets a claim of its own.  Whole GPUs are ``gpu.nvidia.com`` devices; a
  slice is either the smallest MIG device of ``mig_profiles``
  (``mig.nvidia.com``, ``dra_slices = 'mig'``), or its memory of a GPU shared
  through consumable capacity (``dra_slices = 'shares'``: Kubernetes'
  DRAConsumableCapacity gate and the driver's ConsumableShares gate, both
  alpha and off by default).  The driver's time-slicing interval
  (``dra_time_slice_interval``, its TimeSlicingSettings gate, alpha) can be
  set on GPU devices.

A slice a backend cannot hold is an error naming the profile and what to
change, raised when the operator starts, never a pod that cannot fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..pool import Profile, format_size

HAMI, MPS, TIME_SLICING, MIG, WHOLE, DRA = "hami", "mps", "time-slicing", "mig", "whole", "dra"
BACKENDS = (HAMI, MPS, TIME_SLICING, MIG, WHOLE, DRA)
DRA_MIG, DRA_SHARES = "mig", "shares"
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")  # the NVIDIA DRA driver's GpuConfig intervals
NVIDIA_CONFIG_API = "resource.nvidia.com/v1beta1"
CLAIM = "gpu"  # the name of the pod's claim, and of the claim's one device request

GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
MIG_COMPUTE_SLICES = 7  # A100 / H100 / H200: a MIG "Ng" instance has N of 7 compute slices

_MIG = re.compile(r"^(\d)g\.(\d+)gb$")


class SharingError(ValueError):
    """A profile this backend cannot hold, or a bad backend setting."""


@dataclass(frozen=True)
class MigProfile:
    name: str  # "2g.20gb"
    compute: int  # compute slices out of 7
    memory: int  # bytes (the nominal size in the name, read as GiB)

    @property
    def sm_percent(self) -> int:
        return math.floor(100 * self.compute / MIG_COMPUTE_SLICES)

    @classmethod
    def parse(cls, name: str) -> MigProfile:
        m = _MIG.match(name.strip()) if isinstance(name, str) else None
        if not m:
            raise SharingError(f"{name!r} is not a MIG profile name such as '1g.10gb' or '3g.40gb'")
        compute = int(m.group(1))
        if not 1 <= compute <= MIG_COMPUTE_SLICES:
            raise SharingError(f"MIG profile {name!r}: a GPU has 1 to {MIG_COMPUTE_SLICES} compute slices")
        return cls(name=name.strip(), compute=compute, memory=int(m.group(2)) * 2**30)


@dataclass(frozen=True)
class Sharing:
    """The cluster's GPU sharing, as the admin configured it."""

    backend: str
    gpu_memory: int | None = None  # bytes of one GPU; needed by mps / time-slicing and to count whole GPUs
    replicas: int = 1  # mps / time-slicing: replicas per GPU
    shared_resource: str = GPU  # mps / time-slicing: the replicas' resource (nvidia.com/gpu.shared if renamed)
    whole_resource: str = GPU
    mig_profiles: tuple[MigProfile, ...] = ()
    dra_slices: str = DRA_MIG  # dra: how a slice is held (a MIG device, or a share of a GPU's memory)
    dra_driver: str = "gpu.nvidia.com"
    dra_gpu_class: str = "gpu.nvidia.com"  # dra: the DeviceClass of whole GPUs
    dra_mig_class: str = "mig.nvidia.com"  # dra: the DeviceClass of MIG devices
    dra_time_slice_interval: str = ""  # dra: the driver's time-slice interval on GPU devices ("": its default)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise SharingError(f"sharing backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.backend in (MPS, TIME_SLICING):
            if self.replicas < 1:
                raise SharingError(f"replicas must be at least 1, not {self.replicas}")
            if not self.gpu_memory:
                raise SharingError(f"the {self.backend} backend needs the memory of one GPU (gpu_memory, "
                                   "such as 80GiB) to know what one replica holds")
        if self.backend == MIG and not self.mig_profiles:
            raise SharingError("the mig backend needs the MIG profiles the nodes offer (mig_profiles, such as "
                               "['1g.10gb', '2g.20gb', '3g.40gb', '7g.80gb'])")
        if self.backend == DRA:
            if self.dra_slices not in (DRA_MIG, DRA_SHARES):
                raise SharingError(f"dra_slices must be {DRA_MIG!r} or {DRA_SHARES!r}, not {self.dra_slices!r}")
            if self.dra_slices == DRA_MIG and not self.mig_profiles:
                raise SharingError("the dra backend's MIG slices need the MIG devices the nodes offer (mig_profiles, "
                                   "such as ['1g.10gb', '2g.20gb', '3g.40gb', '7g.80gb'])")
            if self.dra_time_slice_interval not in ("", *TIME_SLICE_INTERVALS):
                raise SharingError(f"dra_time_slice_interval must be one of {', '.join(TIME_SLICE_INTERVALS)} "
                                   f"(or empty), not {self.dra_time_slice_interval!r}")

    @property
    def replica_memory(self) -> int:
        return (self.gpu_memory or 0) // self.replicas

    @property
    def replica_sm(self) -> int:
        return 100 // self.replicas


def binary_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity in its canonical form (what the API server stores and answers):
    the largest binary suffix that divides it exactly, ``10Gi`` and never ``10240Mi``."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 2 ** (10 * ("KMGTPE".index(suffix[0]) + 1))
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def device_attribute(device: dict, driver: str, name: str):
    """A ResourceSlice device's attribute (named with or without its driver's domain), as a plain value."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name, attributes.get(f"{driver}/{name}"))
    return next(iter(value.values()), None) if isinstance(value, dict) and value else None


_QUANTITY = re.compile(r"^([0-9.]+)(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?)$")
_SUFFIXES = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
             **{s: 2 ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}}


def quantity_value(text) -> float | None:
    """A Kubernetes quantity (``24Gi``, ``500m``, ``1e9``) as a number; None when it is not one."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        return None
    number = float(m.group(1))
    return number * 10 ** int(m.group(2)) if m.group(2) else number * _SUFFIXES[m.group(3) or ""]


def _capacity(device: dict, driver: str, name: str) -> float | None:
    capacity = device.get("capacity") or {}
    value = (capacity.get(name) or capacity.get(f"{driver}/{name}") or {}).get("value")
    return None if value is None else quantity_value(value)


@dataclass(frozen=True)
class DeviceNeed:
    """What a ``dra`` kernel's claim needs of the devices NVIDIA's DRA driver publishes (attribute ``type``
    ``gpu`` or ``mig``, ``profile`` of a MIG device, capacity ``memory``): so that the operator can tell a
    device no node has from devices that are all taken, which the scheduler's words do not."""

    device_class: str
    driver: str
    count: int = 1
    mig_profile: str | None = None  # a MIG device of this profile
    memory: int | None = None  # shares: a GPU shared by memory with at least this much

    def matches(self, device: dict) -> bool:
        kind = device_attribute(device, self.driver, "type")
        if self.mig_profile is not None:
            return kind in ("mig", None) and device_attribute(device, self.driver, "profile") == self.mig_profile
        if kind not in ("gpu", None):
            return False
        if self.memory is not None:
            return bool(device.get("allowMultipleAllocations")) and (
                _capacity(device, self.driver, "memory") or 0) >= self.memory
        return True

    @property
    def wanted(self) -> str:
        if self.mig_profile is not None:
            return f"a MIG {self.mig_profile} device"
        if self.memory is not None:
            return f"a GPU shared by memory with {format_size(self.memory)} free"
        return f"{self.count} GPU(s) on one node"


@dataclass(frozen=True)
class Rendering:
    """What a kernel's pod asks the cluster for, and what it holds against quotas."""

    limits: dict[str, str]
    env: dict[str, str]
    memory: int  # bytes held (per the backend: a MIG instance may be bigger than the slice asked)
    sm_percent: int  # SM percent held (sum over GPUs)
    description: str  # for people: "10 GiB of GPU memory and 25% of SMs (HAMi)"
    whole: bool = False  # holds whole GPUs
    gpu_count: int = 1
    claim: dict | None = None  # dra: the ResourceClaimTemplate's spec.spec (the devices a kernel claims)
    need: DeviceNeed | None = None  # dra: what the claim needs of the published devices


def _mib(n: int) -> int:
    return -(-n // 2**20)


def _base_env(profile: Profile, sharing: Sharing, memory: int) -> dict[str, str]:
    env = {
        "JUPYTER_GPU_POOL_PROFILE": profile.name,
        "JUPYTER_GPU_POOL_SLICE": profile.slice.to_text(),
        "JUPYTER_GPU_POOL_SHARING": sharing.backend,
        "JUPYTER_GPU_POOL_MEMORY_BYTES": str(memory),
        # A framework grabbing 75% of the GPU at start would defeat any sharing.
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    if profile.slice.sm_percent is not None:
        env["JUPYTER_GPU_POOL_SM_PERCENT"] = str(profile.slice.sm_percent)
    return env


def _smallest_mig(where: str, memory: int, sm: int | None, offered: tuple[MigProfile, ...]) -> MigProfile:
    """The smallest MIG profile offered that covers both the memory and the SM share."""
    need_compute = math.ceil((sm or 0) * MIG_COMPUTE_SLICES / 100)
    fitting = [p for p in offered if p.memory >= memory and p.compute >= need_compute]
    if not fitting:
        names = ", ".join(p.name for p in offered)
        raise SharingError(f"{where}: no MIG profile the nodes offer covers it (offered: {names}). "
                           "Make the profile smaller or offer a bigger MIG profile.")
    return min(fitting, key=lambda p: (p.memory, p.compute))


def _render_dra(profile: Profile, sharing: Sharing, where: str) -> Rendering:
    """One device request (``exactly``) of the driver's classes; the pod holds no limits."""
    spec = profile.slice
    request: dict = {"deviceClassName": sharing.dra_gpu_class, "allocationMode": "ExactCount", "count": 1}
    gpu_class = True
    if spec.whole:
        count = spec.gpu_count
        request["count"] = count
        memory = count * (sharing.gpu_memory or 0)
        held = (memory, 100 * count, f"{count} whole GPU(s) ({sharing.dra_gpu_class}, DRA)", True, count)
        env = _base_env(profile, sharing, memory)
        need = DeviceNeed(sharing.dra_gpu_class, sharing.dra_driver, count=count)
    elif sharing.dra_slices == DRA_MIG:
        chosen = _smallest_mig(where, int(spec.memory), spec.sm_percent, sharing.mig_profiles)  # type: ignore[arg-type]
        request["deviceClassName"] = sharing.dra_mig_class
        request["selectors"] = [{"cel": {"expression":
                                         f"device.attributes['{sharing.dra_driver}'].profile == '{chosen.name}'"}}]
        gpu_class = False
        held = (chosen.memory, chosen.sm_percent, f"a MIG {chosen.name} device ({format_size(chosen.memory)}, "
                f"{chosen.compute}/7 of the SMs; {sharing.dra_mig_class}, DRA)", False, 1)
        env = _base_env(profile, sharing, chosen.memory)
        env["JUPYTER_GPU_POOL_MIG_PROFILE"] = chosen.name
        need = DeviceNeed(sharing.dra_mig_class, sharing.dra_driver, mig_profile=chosen.name)
    else:
        if spec.sm_percent is not None:
            raise SharingError(f"{where}: consumable capacity shares a GPU's memory, not its SMs, so an SM share "
                               "cannot be held; use dra_slices 'mig', or drop the percentage from the profile.")
        memory = int(spec.memory)  # type: ignore[arg-type]
        # Canonical form: the API server stores 10240Mi as 10Gi, and a template must read back as written.
        request["capacity"] = {"requests": {"memory": binary_quantity(_mib(memory) * 2**20)}}
        held = (_mib(memory) * 2**20, 0, f"{format_size(memory)} of a shared GPU's memory ({sharing.dra_gpu_class}, "
                "DRA consumable capacity)", False, 1)
        env = _base_env(profile, sharing, memory)
        need = DeviceNeed(sharing.dra_gpu_class, sharing.dra_driver, memory=_mib(memory) * 2**20)
    claim: dict = {"devices": {"requests": [{"name": CLAIM, "exactly": request}]}}
    if gpu_class and sharing.dra_time_slice_interval:
        claim["devices"]["config"] = [{"requests": [CLAIM], "opaque": {"driver": sharing.dra_driver, "parameters": {
            "apiVersion": NVIDIA_CONFIG_API, "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing",
                        "timeSlicingConfig": {"interval": sharing.dra_time_slice_interval}}}}}]
    memory, sm, what, whole, count = held
    return Rendering({}, env, memory, sm, what, whole, count, claim, need)


def render(profile: Profile, sharing: Sharing) -> Rendering:
    """The resources for ``profile`` under ``sharing``; :class:`SharingError` if it cannot hold it."""
    spec = profile.slice
    where = f"profile {profile.name!r} ({spec})"
    if sharing.backend == DRA:
        return _render_dra(profile, sharing, where)
    if spec.whole or sharing.backend == WHOLE:
        count = spec.gpu_count if spec.whole else 1
        if sharing.backend in (MPS, TIME_SLICING) and sharing.whole_resource == sharing.shared_resource:
            raise SharingError(
                f"{where}: with {sharing.backend} sharing, {sharing.shared_resource} is a shared replica, so a "
                "whole GPU cannot be asked for. Rename the replicas (device plugin renameByDefault: true, "
                "shared_resource 'nvidia.com/gpu.shared') or drop whole-GPU profiles.")
        limits = {sharing.whole_resource: str(count)}
        if sharing.backend == HAMI:
            limits[HAMI_CORES] = "100"  # HAMi: 100% of the cores means the card alone
        memory = count * (sharing.gpu_memory or 0)
        what = f"{count} whole GPU(s)" + (" (a slice's profile on the whole-GPU backend)" if not spec.whole else "")
        return Rendering(limits, _base_env(profile, sharing, memory), memory, 100 * count, what, True, count)
    memory, sm = int(spec.memory), spec.sm_percent  # type: ignore[arg-type]
    if sharing.backend == HAMI:
        limits = {GPU: "1", HAMI_MEMORY: str(_mib(memory))}
        if sm is not None:
            limits[HAMI_CORES] = str(sm)
        what = f"{format_size(memory)} of GPU memory" + (f" and {sm}% of SMs" if sm else "") + " (HAMi)"
        return Rendering(limits, _base_env(profile, sharing, memory), memory, sm or 0, what)
    if sharing.backend in (MPS, TIME_SLICING):
        if memory > sharing.replica_memory:
            raise SharingError(
                f"{where}: one {sharing.backend} replica of a {format_size(sharing.gpu_memory)} GPU shared "
                f"{sharing.replicas} ways holds {format_size(sharing.replica_memory)}. Make the profile at most "
                "that, or configure fewer replicas.")
        if sm is not None and sharing.backend == TIME_SLICING:
            raise SharingError(f"{where}: time-slicing cannot reserve an SM share; use the mps or hami backend, "
                               "or drop the percentage from the profile.")
        if sm is not None and sm > sharing.replica_sm:
            raise SharingError(f"{where}: one MPS replica holds {sharing.replica_sm}% of the SMs; make the share "
                               "at most that, or configure fewer replicas.")
        env = _base_env(profile, sharing, memory)
        held_memory, held_sm = sharing.replica_memory, sharing.replica_sm
        if sharing.backend == TIME_SLICING:
            fraction = memory / int(sharing.gpu_memory)  # type: ignore[arg-type]
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
            env["CUPY_GPU_MEMORY_LIMIT"] = str(memory)
            env["JUPYTER_GPU_POOL_MEMORY_FRACTION"] = f"{fraction:.6f}"
            held_memory, held_sm = memory, 0
        what = (f"one of {sharing.replicas} {sharing.backend} replicas of a GPU "
                f"({format_size(held_memory)}" + (f", {held_sm}% of SMs)" if held_sm else ")"))
        return Rendering({sharing.shared_resource: "1"}, env, held_memory, held_sm, what)
    # MIG: the smallest instance that covers both the memory and the SM share.
    chosen = _smallest_mig(where, memory, sm, sharing.mig_profiles)
    env = _base_env(profile, sharing, chosen.memory)
    env["JUPYTER_GPU_POOL_MIG_PROFILE"] = chosen.name
    return Rendering({f"nvidia.com/mig-{chosen.name}": "1"}, env, chosen.memory, chosen.sm_percent,
                     f"a MIG {chosen.name} instance ({format_size(chosen.memory)}, {chosen.compute}/7 of the SMs)")
