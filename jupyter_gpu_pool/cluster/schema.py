"""The CustomResourceDefinitions, as data.

``deploy/base/crds.yaml`` is :func:`crd_manifests` written out
(``python -m jupyter_gpu_pool.operator crds``); a test keeps the two equal.
"""

from __future__ import annotations

from .resources import (DESIRED_STATES, GROUP, KERNEL_KIND, KERNELS, LABEL_PART_OF, PART_OF, PHASES, POLICIES,
                        POLICY_KIND, QUOTA_KIND, QUOTAS, VERSION)

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
                "desiredState": {**_STR, "enum": list(DESIRED_STATES),
                                 "description": "Running (default) or Hibernated: the kernel's server asks, with "
                                                "the object's resourceVersion; the operator admits, the node agent moves."},
                "hibernateReason": {**_STR, "description": "Why the server asked (idle, user, admin, pressure)."},
                "resumeHint": {**_BOOL, "description": "True with desiredState Running: a guess that a cell is "
                                                      "coming; resumed only where its node has room now and "
                                                      "nobody waits, else declined (status.reason "
                                                      "ResumeDeclined), never queued."},
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
                                   "claimTemplate": {**_STR, "description": "dra: the ResourceClaimTemplate the "
                                                     "kernel's pod claims its devices from."},
                                   "devices": _NAMES},
                },
                "usage": {
                    "type": "object",
                    "description": "From the node agent: the pod's GPU memory and SM utilization.",
                    "properties": {"memoryUsed": _INT, "utilization": {"type": "number"},
                                   "devices": _NAMES, "sampledAt": {"type": "number"}},
                },
                "hibernation": {
                    "type": "object",
                    "description": "The last hibernation and resume, from the operator and the node agent.",
                    "properties": {"requestedAt": {"type": "number"}, "hibernatedAt": {"type": "number"},
                                   "resumedAt": {"type": "number"}, "bytes": _INT,
                                   "pod": {**_STR, "description": "The pod the node agent last resumed."},
                                   "checkpointSeconds": {"type": "number"}, "restoreSeconds": {"type": "number"},
                                   "devices": _NAMES, "queuePosition": {**_INT, "nullable": True},
                                   "reason": _STR, "message": _STR,
                                   "why": {**_STR, "description": "Why a waiting resume is where it is in a "
                                                                 "shared queue (a fair queue)."},
                                   "declined": {**_STR, "description": "Why a resume asked on a hint was "
                                                                       "declined: no_room, others_waiting, "
                                                                       "not_now (its owner's quota)."}},
                },
                "killPrecaution": {
                    "type": "object",
                    "description": "Before the operator deletes a pod the node agent resumed, it asks the agent to "
                                   "lock and checkpoint the restored processes again (cuda-checkpoint issue 53); "
                                   "the agent answers here.",
                    "properties": {"pod": _STR, "requestedAt": {"type": "number"},
                                   "answeredAt": {"type": "number"}, "message": _STR},
                },
                "borrowed": {**_NAMES, "description": "The reservations whose room, unused by their members, "
                                                    "the kernel borrows: it is hibernated, with a warning, when a "
                                                    "member needs the room."},
                "waiting": {
                    "type": "object",
                    "description": "A start waiting for room reserved for its owner, while others' kernels give it "
                                   "back (reason WaitingForRoom): since when, what it asks, its place and why.",
                    "properties": {"since": {"type": "number"}, "memory": _INT, "groups": _NAMES,
                                   "position": _INT, "why": _STR},
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
        "hibernate_after_cell": _DURATION,
        "gpu_idle_threshold": {"type": "number"},
        "max_snoozes": {**_INT, "minimum": 0},
        "action": {**_STR, "enum": ["hibernate", "shutdown"]},
        "pressure_factor": {"type": "number"},
        "slice_at": {**_STR, "enum": ["first-cell", "start"]},
    },
}

_RESERVATION = {
    "type": "object",
    "required": ["name", "start", "end", "timezone"],
    "description": "Room kept for a group (or users) in a window: the same fields as c.GPUPool.reservations.",
    "properties": {
        "name": _STR, "groups": _NAMES, "users": _NAMES,
        "days": {**_NAMES, "description": "Weekly on these days (mon ... sun), times of day; none: once, dates."},
        "start": {**_STR, "description": "10:00 (weekly), or 2025-03-04 10:00 (once)."}, "end": _STR,
        "timezone": {**_STR, "description": "An IANA time zone such as Europe/Paris."},
        "memory": {**_STR, "description": "GPU memory in all, such as 160GiB."},
        "gpus": {**_INT, "minimum": 1, "description": "Whole GPUs (counted as their memory on a cluster)."},
        "models": {**_NAMES, "description": "Glob patterns of GPU models (the nodes' nvidia.com/gpu.product)."},
        "lead": {"x-kubernetes-int-or-string": True, "description": "Seconds (or 10m) before the window that "
                                                                   "the room is made; default 10 minutes."},
    },
}

POLICY_SCHEMA = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {"type": "object", "properties": {
            "dryRun": _BOOL, "rules": {"type": "array", "items": _RULE},
            "reservations": {"type": "array", "items": _RESERVATION},
            "queueOrder": {**_STR, "enum": ["fifo", "fair"], "description": "fifo (default): first come, first "
                                                                           "served; fair: by fair share."},
            "fairShare": {"type": "object", "properties": {
                "weights": {"type": "object", "additionalProperties": {"type": "number"},
                            "description": "Each group's weight, such as {ml101: 2, research: 1}."},
                "othersWeight": {"type": "number"},
                "halfLife": {"x-kubernetes-int-or-string": True, "description": "Seconds or 1d: how fast use is "
                                                                                "forgotten."},
                "aging": {"x-kubernetes-int-or-string": True, "description": "Seconds or 30m: waiting this long "
                                                                            "counts as a whole share."}}},
        }},
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
