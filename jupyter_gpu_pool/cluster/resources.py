"""Names of the contract: the API group, kinds, labels, annotations, phases, reasons, object names.

- ``GPUKernel`` (namespaced): one notebook kernel on a GPU slice.  A user's
  server creates it (spec), the operator admits it and runs its pod (status).
- ``GPUQuota`` (cluster): the default user quota, one user's, or one group's
  (with its members).  Same fields as ``GPUPool.user_quotas``.
- ``GPUPoolPolicy`` (cluster): the idle-culling policy, the same rules as
  ``GPUPool.policy``.  The one named ``default`` is used.
- The kernel's ``Secret`` (``<kernel>-connection``, written by the operator,
  read by the server) holds ``connection.json``: the kernel's connection file,
  with its HMAC key and, when transport encryption is on, its CurveZMQ keys.
"""

from __future__ import annotations

import hashlib
import re

GROUP = "jupyter-gpu-pool.readthedocs.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

KERNEL_KIND, KERNELS = "GPUKernel", "gpukernels"
QUOTA_KIND, QUOTAS = "GPUQuota", "gpuquotas"
POLICY_KIND, POLICIES = "GPUPoolPolicy", "gpupoolpolicies"
POLICY_NAME = "default"

# Labels and annotations (keys under the project's group).
LABEL_KERNEL = f"{GROUP}/kernel"  # on the kernel's pod, secret and network policy: the GPUKernel's name
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_OWNER = f"{GROUP}/owner"  # label-safe form of the owner's name
LABEL_SERVER = f"{GROUP}/server"  # label-safe server id; also the label a server's pod carries
LABEL_LAUNCH = f"{GROUP}/launch"
ANNOTATION_HEARTBEAT = f"{GROUP}/heartbeat"  # Unix seconds, renewed by the owning server
# On a Node, written by its agent: JSON {"devices": {gpu uuid: NVML free bytes}, "sampledAt": unix seconds}
# (what the operator admits a resume against: safe wake).
ANNOTATION_GPU_FREE = f"{GROUP}/gpu-free"
PART_OF = "jupyter-gpu-pool"
KERNEL_COMPONENT = "kernel"

# Kernel phases (status.phase) and reasons (status.reason).
PENDING, STARTING, RUNNING, STOPPED, FAILED = "Pending", "Starting", "Running", "Stopped", "Failed"
# Hibernation (docs/kubernetes.md): the server asks through spec.desiredState; the operator admits
# (Running -> Hibernating; Hibernated -> Resuming, or the kernel waits with status.hibernation.queuePosition);
# the node agent moves the pod's CUDA processes and settles Hibernating -> Hibernated, Resuming -> Running.
HIBERNATING, HIBERNATED, RESUMING = "Hibernating", "Hibernated", "Resuming"
PHASES = (PENDING, STARTING, RUNNING, HIBERNATING, HIBERNATED, RESUMING, STOPPED, FAILED)
# spec.desiredState: what the kernel's server wants (written with the object's resourceVersion: compare-and-set).
DESIRED_RUNNING, DESIRED_HIBERNATED = "Running", "Hibernated"
DESIRED_STATES = (DESIRED_RUNNING, DESIRED_HIBERNATED)
QUOTA_EXCEEDED = "QuotaExceeded"
UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL = "ImagePullFailed"
CRASHED = "ContainerCrashed"
EXITED = "Exited"
INVALID = "InvalidSpec"
SERVER_GONE = "ServerGone"
UNSUPPORTED = "DeviceUnsupported"  # dra: the cluster cannot hold the profile's claim as written
PREEMPTED = "PodDeleted"
POD_REFUSED = "PodRefused"  # the API server refused the kernel's pod (a ResourceQuota, an admission policy)
HIBERNATION_REFUSED = "HibernationRefused"  # nothing moved: the backend, host memory or the node's cap says no
HIBERNATION_FAILED = "HibernationFailed"  # the agent's checkpoint or restore failed (the message says what state it left)
KILL_PRECAUTION_TIMED_OUT = "KillPrecautionTimedOut"  # the agent did not answer: a resumed kernel's pod deleted anyway
WAITING_FOR_ROOM = "WaitingForRoom"  # a resume waits for room on its node's GPU (queuePosition), or reserved
# room; a member's start waits for the room reserved for them, others' kernels holding it (status.waiting)
ROOM_RESERVED = "RoomReserved"  # a start refused: the room it would fit in is reserved for others
RESUME_DECLINED = "ResumeDeclined"  # a resume asked on a hint (spec.resumeHint) that would have had to wait

_LABEL_OK = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """A label-safe form of any text: itself when valid, else a readable prefix and a hash."""
    if _LABEL_OK.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:50].strip("-._")
    return f"{safe}-{digest}" if safe else digest


def kernel_name(kernel_id: str) -> str:
    """The GPUKernel for a Jupyter kernel id (a uuid): ``k-<id>``."""
    return f"k-{kernel_id}"


def pod_name(kernel: str, launch: int, uid: str) -> str:
    """One pod name per launch of one GPUKernel object (``uid``): a restarted kernel never meets its
    predecessor's pod, nor a GPUKernel made again under the same name the pod of the one before it, which
    may still be in its grace period or waiting for the garbage collector."""
    return f"{kernel}-{launch}-{uid.split('-')[0][:8]}"


def secret_name(kernel: str) -> str:
    return f"{kernel}-connection"


def policy_name(kernel: str) -> str:
    return f"{kernel}-ingress"


_DNS_OK = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


def claim_template_name(profile: str) -> str:
    """The ResourceClaimTemplate of a profile (the ``dra`` backend): ``gpu-pool-<profile>``, made a valid
    object name (lower case, a hash where characters had to change)."""
    if _DNS_OK.match(profile):
        return f"gpu-pool-{profile}"
    digest = hashlib.sha256(profile.encode()).hexdigest()[:8]
    safe = re.sub(r"[^a-z0-9-]+", "-", profile.lower()).strip("-")[:30].strip("-")
    return f"gpu-pool-{safe}-{digest}" if safe else f"gpu-pool-{digest}"


CONNECTION_FILE = "connection.json"  # the key of the kernel's Secret that holds its connection file
