"""The kinds the test API server serves: each resource's group, version, plural, kind, scope and
subresources (built in, or from a CustomResourceDefinition, with its schema)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    schema: dict | None = None  # a custom resource's openAPIV3Schema
    custom: bool = False
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


BUILTIN = [
    Kind("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), ("status",)),
    Kind("", "v1", "nodes", "Node", False, "node", ("no",), ("status",)),
    Kind("", "v1", "pods", "Pod", True, "pod", ("po",), ("status", "log", "eviction")),
    Kind("", "v1", "secrets", "Secret", True, "secret"),
    Kind("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",)),
    Kind("", "v1", "events", "Event", True, "event", ("ev",)),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",)),
    Kind("", "v1", "resourcequotas", "ResourceQuota", True, "resourcequota", ("quota",), ("status",)),
    Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
         "customresourcedefinition", ("crd", "crds"), ("status",)),
    Kind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, "networkpolicy", ("netpol",)),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True, "lease"),
    Kind("", "v1", "services", "Service", True, "service", ("svc",), ("status",)),
    Kind("apps", "v1", "deployments", "Deployment", True, "deployment", ("deploy",), ("status",)),
    Kind("apps", "v1", "daemonsets", "DaemonSet", True, "daemonset", ("ds",), ("status",)),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", True, "role"),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "rolebinding"),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, "clusterrole"),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False,
         "clusterrolebinding"),
    # Dynamic Resource Allocation (GA in 1.34): see dra.py for the claim controller and allocation.
    Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, "deviceclass"),
    Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, "resourceslice"),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, "resourceclaim", (), ("status",)),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
         "resourceclaimtemplate"),
]


def crd_kinds(crd: dict) -> list[Kind]:
    """The kinds a CustomResourceDefinition serves: one per served version."""
    spec = crd["spec"]
    return [Kind(group=spec["group"], version=version["name"], plural=spec["names"]["plural"],
                 kind=spec["names"]["kind"], namespaced=spec["scope"] == "Namespaced",
                 singular=spec["names"].get("singular", spec["names"]["kind"].lower()),
                 short_names=tuple(spec["names"].get("shortNames", [])),
                 subresources=tuple(version.get("subresources", {}) or {}),
                 schema=(version.get("schema") or {}).get("openAPIV3Schema"), custom=True)
            for version in spec["versions"] if version.get("served", True)]


def crd_status(crd: dict, at: str) -> dict:
    """A served CRD's status, as the API server's controllers write it at once."""
    spec = crd["spec"]
    return {
        "acceptedNames": spec["names"],
        "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
             "lastTransitionTime": at},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": at},
        ],
    }
