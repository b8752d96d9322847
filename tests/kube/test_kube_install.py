"""The documented install, as an admin runs it: `kubectl apply -k deploy/overlays/<backend>` on a fresh
cluster (the test cluster, with the real kubectl), then the examples; a second apply changes nothing;
and the namespaces are the overlay's settings, each one created by the install itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kube_helpers import REPO, kustomize

OVERLAYS = ["hami", "mps", "time-slicing", "mig", "whole", "dra"]


def kubectl(cluster, *args: str) -> subprocess.CompletedProcess:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (the install is checked with the real kubectl)")
    # The test API server serves no OpenAPI documents, which kubectl's client-side validation downloads;
    # the server itself validates every object against the real 1.34 schemas, strictly.
    validate = ["--validate=false"] if args[0] == "apply" else []
    return subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, *args, *validate],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_command_installs_on_a_fresh_cluster_and_a_second_apply_changes_nothing(cluster_factory, overlay):
    cluster = cluster_factory()
    first = kubectl(cluster, "apply", "-k", str(REPO / "deploy" / "overlays" / overlay))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    assert lines and all(line.endswith(" created") for line in lines), first.stdout
    assert {"namespace/gpu-pool-system created", "namespace/jhub created", "namespace/jhub-kernels created"} <= \
        set(lines)
    again = kubectl(cluster, "apply", "-k", str(REPO / "deploy" / "overlays" / overlay))
    assert again.returncode == 0, again.stderr
    changed = [line for line in again.stdout.strip().splitlines() if not line.endswith(" unchanged")]
    assert changed == []  # GitOps tools see it in sync: nothing the API server drops or rewrites
    examples = kubectl(cluster, "apply", "-k", str(REPO / "deploy" / "examples"))
    assert examples.returncode == 0, examples.stderr


def test_the_documented_uninstall_keeps_the_hubs_namespace(cluster_factory):
    cluster = cluster_factory()
    overlay = str(REPO / "deploy" / "overlays" / "hami")
    assert kubectl(cluster, "apply", "-k", overlay).returncode == 0
    gone = kubectl(cluster, "delete", "-k", overlay, "-l", "jupyter-gpu-pool.readthedocs.io/keep-on-uninstall!=true")
    assert gone.returncode == 0, gone.stderr
    assert "namespace \"jhub-kernels\" deleted" in gone.stdout and "namespace \"jhub\"" not in gone.stdout
    left = kubectl(cluster, "get", "namespaces", "-o", "name")
    assert "namespace/jhub\n" in left.stdout + "\n"  # the hub's namespace, and what is in it, stay


def namespaces_used(docs: list[dict]) -> set[str]:
    used = {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}
    used |= {s["namespace"] for d in docs for s in d.get("subjects") or [] if s.get("namespace")}
    return used


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespace_an_overlay_uses_is_created_by_it(overlay):
    docs = kustomize(REPO / "deploy" / "overlays" / overlay)
    created = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert namespaces_used(docs) <= created == {"gpu-pool-system", "jhub", "jhub-kernels"}
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpu-pool-namespaces"]


def test_the_hub_and_kernel_namespaces_are_the_overlays_settings(tmp_path):
    deploy = Path(shutil.copytree(REPO / "deploy", tmp_path / "deploy"))
    overlay = deploy / "overlays" / "hami" / "kustomization.yaml"
    text = overlay.read_text()
    assert "literals: [hub=jhub, kernels=jhub-kernels]" in text  # the documented defaults
    overlay.write_text(text.replace("literals: [hub=jhub, kernels=jhub-kernels]",
                                    "literals: [hub=lab, kernels=lab-gpu-kernels]"))
    docs = kustomize(deploy / "overlays" / "hami")
    assert "jhub" not in yaml.safe_dump_all(docs)  # every mention follows the setting
    created = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert namespaces_used(docs) <= created == {"gpu-pool-system", "lab", "lab-gpu-kernels"}
    [operator] = [d for d in docs if d["kind"] == "Deployment"]
    [agent] = [d for d in docs if d["kind"] == "DaemonSet"]
    assert "--GPUPoolOperator.namespaces=lab-gpu-kernels" in operator["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert agent["spec"]["template"]["spec"]["containers"][0]["args"] == ["--AgentApp.namespaces=lab-gpu-kernels"]
    [server_sa] = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "gpu-pool-server"]
    assert server_sa["metadata"]["namespace"] == "lab"
    bindings = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert bindings["gpu-pool-server"]["metadata"]["namespace"] == "lab-gpu-kernels"
    assert bindings["gpu-pool-server"]["subjects"][0]["namespace"] == "lab"
    assert bindings["gpu-pool-server-reader"]["subjects"][0]["namespace"] == "lab"
