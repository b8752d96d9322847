"""The objects the operator creates for a kernel: its Secret, its Pod, its NetworkPolicy.

Each is owned by the GPUKernel (``ownerReferences``), so deleting the kernel
deletes them through the cluster's garbage collector, even when the operator
is down.  The connection key (and, with transport encryption, the kernel's
CurveZMQ key pair) lives only in the Secret: the pod mounts it as a read-only
file and is given no service-account token; nothing else (the pod spec, env,
command line, the GPUKernel, a log line) ever holds a key.
"""

from __future__ import annotations

import hashlib
import json
import secrets

from ..cluster.resources import (
    API_VERSION,
    CONNECTION_FILE,
    KERNEL_COMPONENT,
    KERNEL_KIND,
    LABEL_COMPONENT,
    LABEL_KERNEL,
    LABEL_LAUNCH,
    LABEL_MANAGED_BY,
    LABEL_OWNER,
    LABEL_PART_OF,
    LABEL_SERVER,
    PART_OF,
    claim_template_name,
    label_value,
    pod_name,
    policy_name,
    secret_name,
)
from ..cluster.kernels import meta, spec
from .settings import CONNECTION_DIR, KERNEL_DIR, OperatorSettings
from .sharing import CLAIM, Rendering

MANAGER = "jupyter-gpu-pool-operator"
PROFILE_ANNOTATION = f"{LABEL_KERNEL}-profile"
GPU_ANNOTATION = f"{LABEL_KERNEL}-gpu"
SPEC_ANNOTATION = f"{LABEL_KERNEL}-spec-hash"  # a claim template: the hash of the spec it was written with


def spec_hash(spec: dict) -> str:
    """A short hash of a rendered spec: what a stored object was written from, whatever the API server
    made of it (canonical quantities, defaults, fields a feature gate drops)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def new_key() -> str:
    return secrets.token_hex(32)


def new_curve_keys() -> tuple[str, str]:
    """A CurveZMQ key pair (public, secret; Z85 text) for one kernel's sockets."""
    import zmq

    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def owner_reference(kernel: dict) -> dict:
    return {"apiVersion": API_VERSION, "kind": KERNEL_KIND, "name": meta(kernel)["name"],
            "uid": meta(kernel)["uid"], "controller": True, "blockOwnerDeletion": True}


def labels(kernel: dict) -> dict[str, str]:
    s = spec(kernel)
    out = {LABEL_PART_OF: PART_OF, LABEL_COMPONENT: KERNEL_COMPONENT, LABEL_MANAGED_BY: MANAGER,
           LABEL_KERNEL: meta(kernel)["name"], LABEL_OWNER: label_value(s["owner"])}
    if (s.get("server") or {}).get("id"):
        out[LABEL_SERVER] = label_value(s["server"]["id"])
    return out


def _meta(kernel: dict, name: str) -> dict:
    return {"name": name, "namespace": meta(kernel)["namespace"], "labels": labels(kernel),
            "ownerReferences": [owner_reference(kernel)]}


def connection_info(settings: OperatorSettings, key: str, curve: tuple[str, str] | None = None) -> dict:
    """The kernel's connection file: it binds every address of its pod on the fixed ports; with
    ``curve`` (public, secret) its sockets are CurveZMQ servers (jupyter_client's and ipykernel's
    ``curve_publickey`` / ``curve_secretkey``), so its traffic is encrypted."""
    ports = settings.ports
    info = {"ip": "0.0.0.0", "transport": "tcp", "signature_scheme": "hmac-sha256", "key": key,
            "shell_port": ports["shell"], "iopub_port": ports["iopub"], "stdin_port": ports["stdin"],
            "control_port": ports["control"], "hb_port": ports["hb"], "kernel_name": ""}
    if curve is not None:
        info["curve_publickey"], info["curve_secretkey"] = curve
    return info


def render_secret(kernel: dict, settings: OperatorSettings, key: str, curve: tuple[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(kernel, secret_name(meta(kernel)["name"])),
            "stringData": {CONNECTION_FILE: json.dumps(connection_info(settings, key, curve))}}


def _resources(settings: OperatorSettings, rendering: Rendering) -> dict:
    requests = dict(settings.resources.get("requests") or {})
    limits = {**(settings.resources.get("limits") or {}), **rendering.limits}
    out: dict = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    if rendering.claim is not None:
        out["claims"] = [{"name": CLAIM}]
    return out


def render_claim_templates(settings: OperatorSettings, namespace: str) -> list[dict]:
    """The ``dra`` backend's ResourceClaimTemplates: one per profile, in a namespace of kernels.  Each
    kernel pod gets a claim of its own from its profile's template (the resource claim controller makes
    it, owned by the pod, and deletes it when the pod is done)."""
    templates = []
    for name, rendering in sorted(settings.renderings.items()):
        if rendering.claim is None:
            continue
        spec = {"spec": rendering.claim}
        templates.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": claim_template_name(name), "namespace": namespace,
                         "labels": {LABEL_PART_OF: PART_OF, LABEL_MANAGED_BY: MANAGER},
                         "annotations": {PROFILE_ANNOTATION: name, GPU_ANNOTATION: rendering.description,
                                         SPEC_ANNOTATION: spec_hash(spec)}},
            "spec": spec})
    return templates


# The kernel starts from a copy of its connection file that it may write: ipykernel (7.3 and newer) rewrites
# the file at start when it holds CurveZMQ keys, and a Secret is mounted read-only.  $0: the Secret's file,
# $1: the copy (mode 0600), then the kernel's own command.
COPY_THEN_RUN = 'cp "$0" "$1" && chmod 600 "$1" && shift && exec "$@"'


def render_pod(kernel: dict, settings: OperatorSettings, rendering: Rendering, image: str, launch: int) -> dict:
    name = meta(kernel)["name"]
    secret_file, connection_file = f"{CONNECTION_DIR}/{CONNECTION_FILE}", f"{KERNEL_DIR}/{CONNECTION_FILE}"
    command = ["/bin/sh", "-c", COPY_THEN_RUN, secret_file, connection_file] + [
        arg.replace("{connection_file}", connection_file) for arg in settings.kernel_command]
    env = [{"name": k, "value": v} for k, v in sorted(rendering.env.items())]
    env.append({"name": "JUPYTER_GPU_POOL_KERNEL", "value": name})
    pod_meta = _meta(kernel, pod_name(name, launch, meta(kernel)["uid"]))
    pod_meta["labels"][LABEL_LAUNCH] = str(launch)
    pod_meta["annotations"] = {PROFILE_ANNOTATION: spec(kernel)["profile"], GPU_ANNOTATION: rendering.description}
    pod_spec: dict = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {"runAsNonRoot": True, "runAsUser": settings.run_as_user,
                            "runAsGroup": settings.run_as_group, "fsGroup": settings.fs_group,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "connection", "secret": {
            "secretName": secret_name(name), "defaultMode": 0o440,
            "items": [{"key": CONNECTION_FILE, "path": CONNECTION_FILE}]}},
            {"name": "kernel", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
        "containers": [{
            "name": "kernel",
            "image": image,
            "command": command,
            "env": env,
            "ports": [{"name": port, "containerPort": number, "protocol": "TCP"}
                      for port, number in settings.ports.items()],
            "resources": _resources(settings, rendering),
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "connection", "mountPath": CONNECTION_DIR, "readOnly": True},
                             {"name": "kernel", "mountPath": KERNEL_DIR}],
        }],
    }
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = list(settings.tolerations)
    if settings.runtime_class_name:
        pod_spec["runtimeClassName"] = settings.runtime_class_name
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    if rendering.claim is not None:
        pod_spec["resourceClaims"] = [{"name": CLAIM,
                                       "resourceClaimTemplateName": claim_template_name(spec(kernel)["profile"])}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


def render_network_policy(kernel: dict, settings: OperatorSettings) -> dict:
    """Ingress to the kernel's pod only from its owning server's pod, only on the kernel's ports.

    The server's pod is the one labelled ``<group>/server=<server id>`` in the server's
    namespace (JupyterHub: ``singleuser.extraLabels``, see docs/kubernetes.md).  A kernel
    without a server id admits nobody.
    """
    name = meta(kernel)["name"]
    server = spec(kernel).get("server") or {}
    ingress = []
    if server.get("id"):
        ingress.append({
            "from": [{"podSelector": {"matchLabels": {LABEL_SERVER: label_value(server["id"])}},
                      "namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": server.get("namespace") or meta(kernel)["namespace"]}}}],
            "ports": [{"protocol": "TCP", "port": number} for number in settings.ports.values()],
        })
    policy = {"podSelector": {"matchLabels": {LABEL_KERNEL: name}}, "policyTypes": ["Ingress"]}
    if ingress:  # no rule at all admits nobody (an empty list is what the API server would drop anyway)
        policy["ingress"] = ingress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(kernel, policy_name(name)),
            "spec": policy}
