"""The operator's settings: ``c.GPUPoolOperator.*`` in the pool's config file, or on the command line.

The operator reads the same ``jupyter_gpu_pool_config.{py,json}`` as the
servers (profiles come from ``c.GPUPool.profiles``, so users' kernelspecs and
the operator agree on them), mounted from a ConfigMap at ``/etc/jupyter``;
``--GPUPoolOperator.sharing=mig`` and the like override it (the kustomize
overlays set the backend that way).
"""

from __future__ import annotations

from dataclasses import dataclass

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode
from traitlets.config import Config, Configurable

from ..config import ConfigError, GPUPool
from ..pool import Profile, parse_size
from ..pool.hibernation import parse_host_memory
from ..traits import Seconds
from .sharing import BACKENDS, DRA, DRA_MIG, DRA_SHARES, HAMI, MIG, TIME_SLICE_INTERVALS, MigProfile, Rendering, \
    Sharing, SharingError, render

CONNECTION_DIR = "/var/run/jupyter-gpu-pool"  # the kernel's Secret, read-only
KERNEL_DIR = "/var/run/jupyter-gpu-pool-kernel"  # a memory-backed emptyDir: the kernel's own copy
PORT_NAMES = ("shell", "iopub", "stdin", "control", "hb")


class GPUPoolOperator(Configurable):
    """How the operator turns kernels into pods."""

    sharing = Enum(list(BACKENDS), default_value=HAMI, help="""The cluster's GPU sharing: 'hami' (HAMi:
        nvidia.com/gpumem and gpucores), 'mps' or 'time-slicing' (NVIDIA device plugin replicas), 'mig'
        (nvidia.com/mig-<profile>), 'whole' (a whole GPU per kernel), or 'dra' (Dynamic Resource
        Allocation with NVIDIA's DRA driver: one ResourceClaimTemplate per profile).""").tag(config=True)

    dra_slices = Enum([DRA_MIG, DRA_SHARES], default_value=DRA_MIG, help="""'dra': how a slice (a profile that
        is not whole GPUs) is held: 'mig', the smallest MIG device of mig_profiles that covers it (the
        nodes' GPUs partitioned into MIG devices); or 'shares', its memory of a GPU shared through
        consumable capacity (Kubernetes' DRAConsumableCapacity feature gate and the driver's ConsumableShares
        gate with consumableShares=memory; both alpha, off by default).""").tag(config=True)

    dra_device_class = Unicode("gpu.nvidia.com", help="'dra': the DeviceClass of whole GPUs.").tag(config=True)

    dra_mig_device_class = Unicode("mig.nvidia.com", help="'dra': the DeviceClass of MIG devices.").tag(
        config=True)

    dra_driver = Unicode("gpu.nvidia.com", help="""'dra': the DRA driver's name (its device attributes' domain,
        and the driver of its opaque configuration).""").tag(config=True)

    dra_time_slice_interval = Enum(["", *TIME_SLICE_INTERVALS], default_value="", help="""'dra': the driver's
        time-slice interval on GPU devices (GpuConfig sharing strategy TimeSlicing; needs the driver's
        TimeSlicingSettings gate, alpha, off by default).  Empty: the driver's default.""").tag(config=True)

    gpu_memory = Unicode("", help="""Memory of one GPU, such as '80GiB'.  Needed by 'mps' and
        'time-slicing' (what one replica holds) and to count whole GPUs against memory quotas.""").tag(config=True)

    replicas = Int(4, help="""'mps' / 'time-slicing': replicas per GPU, as in the device plugin's sharing
        config.""").tag(config=True)

    shared_resource = Unicode("nvidia.com/gpu", help="""'mps' / 'time-slicing': the resource name of a replica
        ('nvidia.com/gpu.shared' when the device plugin renames shared GPUs).""").tag(config=True)

    whole_resource = Unicode("nvidia.com/gpu", help="The resource name of a whole GPU.").tag(config=True)

    mig_profiles = List(Unicode(), default_value=["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
                        help="""'mig' (and 'dra' with MIG slices): the MIG profiles the nodes offer
        (nvidia.com/mig-<name>, or MIG devices of that profile); a kernel gets the smallest that covers its
        slice.""").tag(config=True)

    kernel_image = Unicode("quay.io/jupyter/pytorch-notebook:cuda12-latest", help="""The image kernels run in
        when the kernel does not name one.  It needs ipykernel.""").tag(config=True)

    allowed_images = List(Unicode(), default_value=[], help="""Glob patterns of images a kernel may name
        (spec.image); empty: only kernel_image.""").tag(config=True)

    kernel_command = List(Unicode(), default_value=["python", "-m", "ipykernel_launcher", "-f",
                                                    "{connection_file}"],
                          help="""The kernel's command; {connection_file} is the kernel's connection file: a
        copy, in a memory-backed emptyDir, of the one in its Secret (ipykernel rewrites its connection file at
        start when it holds CurveZMQ keys, which a Secret's read-only mount refuses).  The copy is made by
        /bin/sh and cp, which the kernel image needs.""").tag(config=True)

    port_base = Int(52700, help="""The kernel listens on five fixed ports from this one (shell, iopub, stdin,
        control, heartbeat), on its pod's address.""").tag(config=True)

    resources = Dict(default_value={"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "16Gi"}},
                     help="""CPU and memory of a kernel's container ({"requests": {...}, "limits": {...}}); the
        GPU resources are added to the limits.""").tag(config=True)

    node_selector = Dict(default_value={}, help="nodeSelector of kernel pods.").tag(config=True)

    tolerations = List(default_value=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                       help="Tolerations of kernel pods (GPU nodes are often tainted).").tag(config=True)

    runtime_class_name = Unicode("", help="runtimeClassName of kernel pods (such as 'nvidia'), if needed.").tag(
        config=True)

    image_pull_secrets = List(Unicode(), default_value=[], help="Image pull secrets of kernel pods, by name.").tag(
        config=True)

    run_as_user = Int(1000, help="The kernel's user id (never root).").tag(config=True)
    run_as_group = Int(100, help="The kernel's group id.").tag(config=True)
    fs_group = Int(100, help="The group that may read the connection file.").tag(config=True)

    network_policy = Bool(True, help="""Give each kernel a NetworkPolicy that lets only its owning server's
        pod reach it.  Needs a network plugin that enforces NetworkPolicies.""").tag(config=True)

    transport_encryption = Bool(True, help="""Encrypt the traffic between a server and its kernel's pod
        with CurveZMQ: the operator makes a key pair per kernel and writes it into the kernel's Secret
        beside the HMAC key, the kernel serves its sockets as CurveZMQ servers, and only a client with
        the kernel's keys can talk to it.  Needs ipykernel 7.3 or newer in the kernel image (older kernels
        ignore the keys and cannot be reached: set this to False for them).""").tag(config=True)

    reconcile_interval = Seconds(30.0, help="""Seconds between sweeps over every kernel: orphans (no heartbeat
        from their server) are deleted within this much after heartbeat_timeout.""").tag(config=True)

    heartbeat_timeout = Seconds(120.0, help="""A kernel whose server has not renewed its heartbeat for this long
        is deleted with its pod (the server is gone).""").tag(config=True)

    unschedulable_grace = Seconds(0.0, zero_allowed=True, help="""Seconds a kernel pod may stay unschedulable
        before its launch fails.  0: fail at once with the scheduler's reason (set it higher where a cluster
        autoscaler adds GPU nodes).""").tag(config=True)

    api_retry_first = Seconds(1.0, help="""The wait before kopf retries a failed API request (a 5xx, a 403 during
        an upgrade, a refused connection); it doubles with each failure up to api_retry_max and the request is
        retried for as long as it fails: with a finite schedule, kopf gives up after it and the watch of
        GPUKernels, GPUQuotas or GPUPoolPolicies stops for good.""").tag(config=True)

    api_retry_max = Seconds(30.0, help="""The longest wait between two tries of a failed API request of kopf's
        (see api_retry_first).""").tag(config=True)

    namespaces = List(Unicode(), default_value=[], help="""Namespaces whose kernels to serve (the kernels'
        namespaces; the deployment names its kernels' namespace here).  Empty: GPUKernels anywhere in the
        cluster, each namespace's kernel pods watched from its first kernel on.""").tag(config=True)

    progress_interval = Seconds(5.0, help="""A kernel whose pod has not started this long after it was made is
        explained in its status.message (what the pod waits for: the scheduler, the image pull, its volumes,
        its node, and since when), looked at again this often while it waits; a pod that starts sooner is
        not reported until it runs.""").tag(config=True)

    workers = Int(16, help="""Kernels the operator reconciles at once (each pass waits on the API server, so
        others go on meanwhile; one kernel is never reconciled twice at once).  Must be at least 1.""").tag(
        config=True)

    metrics_port = Int(9090, help="Port of the operator's Prometheus /metrics (0: off).").tag(config=True)

    hami_memory_scaling = Float(1.0, help="""'hami': the deviceMemoryScaling of HAMi's device plugin on the GPU
        nodes (write the same number here).  Above 1, a node admits more kernels' GPU memory than its GPUs
        hold, so a hibernated kernel's memory can be used by others: kernels may hibernate, and the operator
        resumes one only into memory that is physically free.  At 1 (HAMi's default), hibernation is
        refused: the hibernated pod keeps its nvidia.com/gpumem at the scheduler.""").tag(config=True)

    hibernated_memory_per_node = Unicode("50%", help="""The most host memory that hibernated kernels may hold
        on one node: a size ('128GiB'), a share of the node's allocatable memory ('50%'), or 'none'.  A
        hibernation that would pass it is refused (the kernel keeps running), as the host-RAM cap
        (GPUPool.hibernation_host_memory) does on one machine.""").tag(config=True)

    resume_margin = Unicode("1GiB", help="""GPU memory a resume needs free on its GPU beyond its checkpoint, in
        the node agent's NVML reading (safe wake: a restore that runs out of memory can leave the kernel stuck
        checkpointed).""").tag(config=True)

    gpu_free_max_age = Seconds(60.0, help="""A node's free GPU memory reading (written by its agent) older than
        this counts as no room: resumes on that node wait until the agent reports again.""").tag(config=True)

    kill_precaution_timeout = Seconds(30.0, zero_allowed=True, help="""Before it deletes the pod of a kernel
        its node agent resumed, the operator asks that agent to lock and checkpoint the restored processes again
        (killing a just-restored process hung a host on one driver: cuda-checkpoint issue 53), and waits this
        many seconds at most for the answer; past it, the pod is deleted anyway (a Warning Event says so).
        Kernels never resumed are deleted at once. 0: never ask.""").tag(config=True)


@dataclass(frozen=True)
class OperatorSettings:
    """The validated settings."""

    pool: GPUPool
    sharing: Sharing
    renderings: dict[str, Rendering]  # per profile
    kernel_image: str
    allowed_images: tuple[str, ...]
    kernel_command: tuple[str, ...]
    port_base: int
    resources: dict
    node_selector: dict
    tolerations: list
    runtime_class_name: str
    image_pull_secrets: tuple[str, ...]
    run_as_user: int
    run_as_group: int
    fs_group: int
    network_policy: bool
    reconcile_interval: float
    heartbeat_timeout: float
    unschedulable_grace: float
    namespaces: tuple[str, ...]
    metrics_port: int
    progress_interval: float = 5.0
    transport_encryption: bool = True
    api_retry_first: float = 1.0
    api_retry_max: float = 30.0
    hami_memory_scaling: float = 1.0
    hibernated_cap: tuple[int | None, float | None] = (None, 50.0)  # bytes, or percent of the node's memory
    resume_margin: int = 2**30
    gpu_free_max_age: float = 60.0
    kill_precaution_timeout: float = 30.0
    workers: int = 16

    def hibernated_cap_bytes(self, node_memory: int | None) -> int | None:
        """The per-node cap on hibernated bytes for a node with ``node_memory`` allocatable (None: no cap;
        a share of an unknown node's memory caps nothing)."""
        size, percent = self.hibernated_cap
        if size is not None:
            return size
        if percent is None or not node_memory:
            return None
        return int(node_memory * percent / 100)

    @property
    def ports(self) -> dict[str, int]:
        return {name: self.port_base + i for i, name in enumerate(PORT_NAMES)}

    def profile(self, name: str) -> Profile | None:
        return self.pool.profiles.get(name)


def operator_config(config: Config, parent=None) -> GPUPoolOperator:
    """``c.GPUPoolOperator.*`` read from ``config``; a bad value (an interval of NaN, 0 or less, ...) is a
    :class:`ConfigError` naming the setting, raised where the trait refuses it."""
    try:
        return GPUPoolOperator(config=config, parent=parent)
    except TraitError as e:  # Seconds' messages name the setting; traitlets' own name only the trait
        raise ConfigError(str(e) if str(e).startswith("GPUPoolOperator") else f"GPUPoolOperator: {e}") from None


def operator_settings(op: GPUPoolOperator, pool: GPUPool) -> OperatorSettings:
    """Validate; a bad setting is a :class:`ConfigError` naming it."""
    try:
        gpu_memory = parse_size(op.gpu_memory) if op.gpu_memory else None
    except ValueError as e:
        raise ConfigError(f"GPUPoolOperator.gpu_memory: {e}") from None
    try:
        uses_mig = op.sharing == MIG or (op.sharing == DRA and op.dra_slices == DRA_MIG)
        mig = tuple(MigProfile.parse(p) for p in op.mig_profiles) if uses_mig else ()
        sharing = Sharing(op.sharing, gpu_memory, op.replicas, op.shared_resource, op.whole_resource, mig,
                          dra_slices=op.dra_slices, dra_driver=op.dra_driver, dra_gpu_class=op.dra_device_class,
                          dra_mig_class=op.dra_mig_device_class, dra_time_slice_interval=op.dra_time_slice_interval)
        renderings = {name: render(p, sharing) for name, p in pool.profiles.items()}
    except SharingError as e:
        raise ConfigError(f"GPUPoolOperator.sharing={op.sharing!r}: {e}") from None
    if "{connection_file}" not in " ".join(op.kernel_command):
        raise ConfigError("GPUPoolOperator.kernel_command must contain {connection_file}, where the kernel "
                          "reads its connection file")
    if not 1024 <= op.port_base <= 65535 - len(PORT_NAMES):
        raise ConfigError(f"GPUPoolOperator.port_base must be between 1024 and {65535 - len(PORT_NAMES)}, "
                          f"not {op.port_base}")
    if op.run_as_user == 0:
        raise ConfigError("GPUPoolOperator.run_as_user must not be 0: kernels never run as root")
    if not op.hami_memory_scaling > 0:
        raise ConfigError(f"GPUPoolOperator.hami_memory_scaling must be above 0 (HAMi's deviceMemoryScaling), "
                          f"not {op.hami_memory_scaling}")
    try:
        hibernated_cap = parse_host_memory(op.hibernated_memory_per_node)
    except ValueError as e:
        raise ConfigError(f"GPUPoolOperator.hibernated_memory_per_node: {e}") from None
    try:
        resume_margin = parse_size(op.resume_margin)
    except ValueError as e:
        raise ConfigError(f"GPUPoolOperator.resume_margin: {e}") from None
    if op.workers < 1:
        raise ConfigError(f"GPUPoolOperator.workers must be at least 1, not {op.workers}")
    for key in op.resources:
        if key not in ("requests", "limits"):
            raise ConfigError(f"GPUPoolOperator.resources has an unknown key {key!r}; the keys are requests, limits")
    return OperatorSettings(
        pool=pool, sharing=sharing, renderings=renderings, kernel_image=op.kernel_image,
        allowed_images=tuple(op.allowed_images) or (op.kernel_image,), kernel_command=tuple(op.kernel_command),
        port_base=op.port_base, resources=dict(op.resources), node_selector=dict(op.node_selector),
        tolerations=list(op.tolerations), runtime_class_name=op.runtime_class_name,
        image_pull_secrets=tuple(op.image_pull_secrets), run_as_user=op.run_as_user, run_as_group=op.run_as_group,
        fs_group=op.fs_group, network_policy=op.network_policy, reconcile_interval=op.reconcile_interval,
        heartbeat_timeout=op.heartbeat_timeout, unschedulable_grace=op.unschedulable_grace,
        namespaces=tuple(op.namespaces), metrics_port=op.metrics_port, progress_interval=op.progress_interval,
        transport_encryption=op.transport_encryption, api_retry_first=op.api_retry_first,
        api_retry_max=max(op.api_retry_max, op.api_retry_first), hami_memory_scaling=op.hami_memory_scaling,
        hibernated_cap=hibernated_cap, resume_margin=resume_margin, gpu_free_max_age=op.gpu_free_max_age,
        kill_precaution_timeout=op.kill_precaution_timeout, workers=op.workers,
    )
