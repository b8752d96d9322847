"""The custom resources, as data: names, labels, and the CustomResourceDefinitions.

``deploy/base/crds.yaml`` is this module's :func:`crd_manifests` written out
(``python -m jupyter_gpu_pool.operator crds``); a test keeps the two equal.

- ``GPUKernel`` (namespaced): one notebook kernel on a GPU slice.  A user's
  server creates it (spec), the operator admits it and runs its pod (status).
- ``GPUQuota`` (cluster): the default user quota, one user's, or one group's
  (with its members).  Same fields as ``GPUPool.user_quotas``.
- ``GPUPoolPolicy`` (cluster): the idle-culling policy, the same rules as
  ``GPUPool.policy``.  The one named ``default`` is used.
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
ANNOTATION_PROVISIONER = f"{GROUP}/provisioner-info"  # JSON for re-adoption (never holds the key)
PART_OF = "jupyter-gpu-pool"
KERNEL_COMPONENT = "kernel"

# Kernel phases (status.phase) and reasons (status.reason).
PENDING, STARTING, RUNNING, STOPPED, FAILED = "Pending", "Starting", "Running", "Stopped", "Failed"
PHASES = (PENDING, STARTING, RUNNING, STOPPED, FAILED)
QUOTA_EXCEEDED = "QuotaExceeded"
UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL = "ImagePullFailed"
CRASHED = "ContainerCrashed"
EXITED = "Exited"
INVALID = "InvalidSpec"
SERVER_GONE = "ServerGone"
PREEMPTED = "PodDeleted"

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


def pod_name(kernel: str, launch: int) -> str:
    """One pod name per launch, so a restarted kernel never meets its predecessor's pod."""
    return f"{kernel}-{launch}"


def secret_name(kernel: str) -> str:
    return f"{kernel}-connection"


def policy_name(kernel: str) -> str:
    return f"{kernel}-ingress"


# -- CustomResourceDefinitions -------------------------------------------------------------------

_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NAMES = {"type": "array", "items": {"type": "string"}}
_DURATION = {"x-kubernetes-int-or-string": True, "nullable": True,
             "description": "Seconds, or text such as 90s, 30m, 2h, 1d; null turns the limit off."}

KERNEL_SCHEMA = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["owner", "kernelId", "profile", "launch"],
            "properties": {
                "owner": {**_STR, "minLength": 1, "description": "The user the kernel runs for."},
                "kernelId": {**_STR, "minLength": 1, "description": "The Jupyter kernel id."},
                "kernelName": {**_STR, "description": "The kernelspec it was started from (policy matching)."},
                "profile": {**_STR, "minLength": 1, "description": "The admin's GPU profile, by name."},
                "launch": {**_INT, "minimum": 1, "description": "Which launch is wanted; each gets its own pod."},
                "stopped": {**_BOOL, "description": "True: stop the current pod (the slice stays admitted)."},
                "stopGraceSeconds": {**_INT, "minimum": 0},
                "image": {**_STR, "description": "The kernel image; must be one the admin allows."},
                "label": {**_STR, "description": "What the user calls it (the notebook's path)."},
                "server": {
                    "type": "object",
                    "description": "The Jupyter server that owns the kernel (the only pod allowed to reach it).",
                    "properties": {"id": _STR, "namespace": _STR, "pod": _STR},
                },
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {**_STR, "enum": list(PHASES)},
                "reason": _STR,
                "message": {**_STR, "description": "What went wrong, in words for the notebook's user."},
                "launch": _INT,
                "pod": _STR,
                "podIP": _STR,
                "node": _STR,
                "exitCode": _INT,
                "observedGeneration": _INT,
                "admitted": {
                    "type": "object",
                    "description": "The slice held against quotas since admission.",
                    "properties": {"profile": _STR, "isolation": _STR, "memory": _INT, "smPercent": _INT,
                                   "gpuCount": _INT, "whole": _BOOL, "groups": _NAMES, "at": {"type": "number"}},
                },
                "gpu": {
                    "type": "object",
                    "description": "The GPU granted: what the pod asked the cluster for, and where it runs.",
                    "properties": {"sharing": _STR,
                                   "resources": {"type": "object", "additionalProperties": _STR},
                                   "devices": _NAMES},
                },
                "usage": {
                    "type": "object",
                    "description": "From the node agent: the pod's GPU memory and SM utilization.",
                    "properties": {"memoryUsed": _INT, "utilization": {"type": "number"},
                                   "devices": _NAMES, "sampledAt": {"type": "number"}},
                },
                "startedAt": {"type": "number"},
                "runningAt": {"type": "number"},
            },
        },
    },
}

QUOTA_SCHEMA = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["scope"],
            "properties": {
                "scope": {**_STR, "enum": ["default", "user", "group"],
                          "description": "default: every user without a quota of their own."},
                "name": {**_STR, "description": "The user or group (not for scope default)."},
                "members": {**_NAMES, "description": "Users in the group (scope group)."},
                "memory": {**_STR, "description": "GPU memory, such as 40GiB."},
                "smPercent": {**_INT, "minimum": 1, "description": "Sum of SM shares; 100 = one GPU's SMs."},
                "kernels": {**_INT, "minimum": 0},
            },
        },
        "status": {"type": "object", "properties": {"valid": _BOOL, "message": _STR}},
    },
}

_RULE = {
    "type": "object",
    "properties": {
        "name": _STR,
        "match": {"type": "object", "properties": {"user": _NAMES, "group": _NAMES, "profile": _NAMES,
                                                   "kernelspec": _NAMES}},
        "idle_timeout": _DURATION, "gpu_idle_timeout": _DURATION, "max_busy": _DURATION, "max_age": _DURATION,
        "max_hibernated": _DURATION, "warn": _DURATION, "snooze": _DURATION, "over_memory_grace": _DURATION,
        "gpu_idle_threshold": {"type": "number"},
        "max_snoozes": {**_INT, "minimum": 0},
        "action": {**_STR, "enum": ["hibernate", "shutdown"]},
        "pressure_factor": {"type": "number"},
    },
}

POLICY_SCHEMA = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {"type": "object", "properties": {"dryRun": _BOOL, "rules": {"type": "array", "items": _RULE}}},
        "status": {"type": "object", "properties": {"valid": _BOOL, "message": _STR}},
    },
}


def _crd(kind: str, plural: str, scope: str, schema: dict, short: list[str], columns: list[dict]) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {LABEL_PART_OF: PART_OF}},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "shortNames": short,
                      "categories": [PART_OF]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
            }],
        },
    }


def crd_manifests() -> list[dict]:
    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    return [
        _crd(KERNEL_KIND, KERNELS, "Namespaced", KERNEL_SCHEMA, ["gk"], [
            {"name": "Owner", "type": "string", "jsonPath": ".spec.owner"},
            {"name": "Profile", "type": "string", "jsonPath": ".spec.profile"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
            {"name": "Node", "type": "string", "jsonPath": ".status.node"},
            age,
        ]),
        _crd(QUOTA_KIND, QUOTAS, "Cluster", QUOTA_SCHEMA, ["gq"], [
            {"name": "Scope", "type": "string", "jsonPath": ".spec.scope"},
            {"name": "Name", "type": "string", "jsonPath": ".spec.name"},
            {"name": "Memory", "type": "string", "jsonPath": ".spec.memory"},
            {"name": "Kernels", "type": "integer", "jsonPath": ".spec.kernels"},
            {"name": "Valid", "type": "boolean", "jsonPath": ".status.valid"},
        ]),
        _crd(POLICY_KIND, POLICIES, "Cluster", POLICY_SCHEMA, ["gpp"], [
            {"name": "Dry-run", "type": "boolean", "jsonPath": ".spec.dryRun"},
            {"name": "Valid", "type": "boolean", "jsonPath": ".status.valid"},
        ]),
    ]
