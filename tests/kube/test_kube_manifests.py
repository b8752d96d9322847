"""What the operator renders, per GPU sharing backend, and what the kustomize deployment holds:
every object valid against the real Kubernetes schemas (kubernetes-validate, strict), every custom
object valid against its CRD's schema, and RBAC that grants no more than each part needs."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml
from kube_helpers import GiB, PROFILES, REPO, kustomize
from testcluster.kinds import Kind
from testcluster.schemas import prune, validate_custom

from jupyter_gpu_pool.config import ConfigError, GPUPool
from jupyter_gpu_pool.operator.app import OperatorApp
from jupyter_gpu_pool.cluster.schema import crd_manifests
from jupyter_gpu_pool.operator.manifests import render_claim_templates, render_network_policy, render_pod, render_secret
from jupyter_gpu_pool.operator.settings import GPUPoolOperator, operator_settings
from jupyter_gpu_pool.operator.sharing import MigProfile, Sharing, SharingError, render
from jupyter_gpu_pool.pool import parse_profile

K8S = "1.34.0"
OVERLAYS = ["hami", "mps", "time-slicing", "mig", "whole", "dra"]
H100_MIG = tuple(MigProfile.parse(p) for p in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"))


def profile(slice_text: str, isolation: str | None = None):
    entry = {"slice": slice_text, **({"isolation": isolation} if isolation else {})}
    return parse_profile("p", entry)


# -- each backend's rendering -------------------------------------------------------------------

@pytest.mark.parametrize("sharing, slice_text, limits, memory, sm", [
    (Sharing("hami"), "10GiB", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}, 10 * GiB, 0),
    (Sharing("hami"), "20GiB,25%", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "25"},
     20 * GiB, 25),
    (Sharing("hami", gpu_memory=80 * GiB), "2 x whole", {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"},
     160 * GiB, 200),
    (Sharing("mps", 80 * GiB, replicas=4), "20GiB,25%", {"nvidia.com/gpu": "1"}, 20 * GiB, 25),
    (Sharing("mps", 80 * GiB, replicas=4, shared_resource="nvidia.com/gpu.shared"), "10GiB",
     {"nvidia.com/gpu.shared": "1"}, 20 * GiB, 25),  # one replica is held whatever the slice asks
    (Sharing("mps", 80 * GiB, replicas=2, shared_resource="nvidia.com/gpu.shared"), "whole",
     {"nvidia.com/gpu": "1"}, 80 * GiB, 100),
    (Sharing("time-slicing", 80 * GiB, replicas=4, shared_resource="nvidia.com/gpu.shared"), "20GiB",
     {"nvidia.com/gpu.shared": "1"}, 20 * GiB, 0),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG), "10GiB", {"nvidia.com/mig-1g.10gb": "1"}, 10 * GiB, 14),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG), "15GiB", {"nvidia.com/mig-1g.20gb": "1"}, 20 * GiB, 14),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG), "20GiB,25%", {"nvidia.com/mig-2g.20gb": "1"}, 20 * GiB, 28),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG), "10GiB,50%", {"nvidia.com/mig-4g.40gb": "1"}, 40 * GiB, 57),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG), "41GiB", {"nvidia.com/mig-7g.80gb": "1"}, 80 * GiB, 100),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG), "whole", {"nvidia.com/gpu": "1"}, 80 * GiB, 100),
    (Sharing("whole", 80 * GiB), "10GiB", {"nvidia.com/gpu": "1"}, 80 * GiB, 100),
    (Sharing("whole", 80 * GiB), "2 x whole", {"nvidia.com/gpu": "2"}, 160 * GiB, 200),
])
def test_each_backend_renders_a_slice_as_its_resources_and_holds_what_it_grants(sharing, slice_text, limits,
                                                                                memory, sm):
    r = render(profile(slice_text), sharing)
    assert r.limits == limits
    assert (r.memory, r.sm_percent) == (memory, sm)
    assert r.env["JUPYTER_GPU_POOL_SHARING"] == sharing.backend and r.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


DRA_MIG = Sharing("dra", 80 * GiB, mig_profiles=H100_MIG)
DRA_SHARES = Sharing("dra", 80 * GiB, dra_slices="shares", dra_time_slice_interval="Short")


def only_request(rendering) -> dict:
    [request] = rendering.claim["devices"]["requests"]
    assert request["name"] == "gpu" and rendering.limits == {}
    return request["exactly"]


@pytest.mark.parametrize("sharing, slice_text, exactly, memory, sm", [
    (DRA_MIG, "2 x whole", {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
     160 * GiB, 200),
    (DRA_MIG, "10GiB", {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == "
                                                             "'1g.10gb'"}}]}, 10 * GiB, 14),
    (DRA_MIG, "20GiB,50%", {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == "
                                                                 "'4g.40gb'"}}]}, 40 * GiB, 57),
    (DRA_SHARES, "10GiB", {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                           "capacity": {"requests": {"memory": "10Gi"}}}, 10 * GiB, 0),  # canonical, as stored
    (DRA_SHARES, "1.5GiB", {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                            "capacity": {"requests": {"memory": "1536Mi"}}}, 1536 * 2**20, 0),
])
def test_the_dra_backend_renders_a_profile_as_one_device_request(sharing, slice_text, exactly, memory, sm):
    r = render(profile(slice_text), sharing)
    assert only_request(r) == exactly
    assert (r.memory, r.sm_percent) == (memory, sm)
    config = r.claim["devices"].get("config")
    if sharing is DRA_SHARES:  # the driver's time-slicing interval, on GPU devices
        assert config == [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}}}}]
    else:
        assert config is None


def test_consumable_capacity_cannot_hold_an_sm_share():
    with pytest.raises(SharingError, match="consumable capacity shares a GPU's memory, not its SMs"):
        render(profile("20GiB,50%"), DRA_SHARES)


def test_time_slicing_gives_frameworks_soft_caps_of_the_slice():
    r = render(profile("20GiB"), Sharing("time-slicing", 80 * GiB, replicas=4))
    assert r.env["CUPY_GPU_MEMORY_LIMIT"] == str(20 * GiB) and r.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500"


@pytest.mark.parametrize("sharing, slice_text, words", [
    (Sharing("mps", 80 * GiB, replicas=4), "30GiB", "holds 20 GiB"),
    (Sharing("mps", 80 * GiB, replicas=4), "10GiB,50%", "holds 25% of the SMs"),
    (Sharing("mps", 80 * GiB, replicas=4), "whole", "cannot be asked for"),
    (Sharing("time-slicing", 80 * GiB, replicas=2), "20GiB,25%", "cannot reserve an SM share"),
    (Sharing("mig", 80 * GiB, mig_profiles=H100_MIG[:2]), "30GiB", "no MIG profile the nodes offer covers it"),
])
def test_a_slice_the_backend_cannot_hold_is_refused_naming_the_profile(sharing, slice_text, words):
    with pytest.raises(SharingError, match=re.escape(words)) as e:
        render(profile(slice_text), sharing)
    assert "profile 'p'" in str(e.value)


@pytest.mark.parametrize("settings, words", [
    ({"sharing": "mps"}, "needs the memory of one GPU"),
    ({"sharing": "mig", "gpu_memory": "80GiB", "mig_profiles": ["1g.10GB"]}, "'1g.10GB' is not a MIG profile"),
    ({"gpu_memory": "80 gigs"}, "GPUPoolOperator.gpu_memory"),
    ({"run_as_user": 0}, "never run as root"),
    ({"kernel_command": ["python", "-m", "ipykernel_launcher"]}, "must contain {connection_file}"),
    ({"port_base": 80}, "port_base"),
    ({"sharing": "dra", "mig_profiles": []}, "the dra backend's MIG slices need the MIG devices"),
    *[({name: value}, f"GPUPoolOperator.{name} must be a number of seconds above 0")
      for name in ("reconcile_interval", "heartbeat_timeout", "progress_interval", "api_retry_first",
                   "api_retry_max") for value in (float("nan"), -1, 0, "soon")],
    *[({"unschedulable_grace": value}, "GPUPoolOperator.unschedulable_grace must be a number of seconds, 0 or more")
      for value in (float("nan"), -1, float("inf"))],
])
def test_bad_operator_settings_are_refused_with_the_setting_named(settings, words):
    from traitlets.config import Config

    from jupyter_gpu_pool.operator.settings import operator_config

    pool = GPUPool(profiles=PROFILES).check()
    with pytest.raises(ConfigError, match=re.escape(words)):  # refused where it is read, as the operator reads it
        operator_settings(operator_config(Config({"GPUPoolOperator": settings})), pool)


@pytest.mark.parametrize("name", ["heartbeat_interval", "refresh_interval", "launch_timeout", "progress_interval"])
@pytest.mark.parametrize("value", [float("nan"), -1, 0, float("inf"), "later"])
def test_bad_server_cluster_settings_are_refused_with_the_setting_named(name, value, jp_environ):
    """A refresh_interval of 0 made the server extension's cluster reads spin; NaN passed every check."""
    from traitlets.config import Config

    from jupyter_gpu_pool.cluster.settings import kubernetes_settings

    with pytest.raises(ConfigError, match=re.escape(f"GPUPoolKubernetes.{name} must be a number of seconds above 0")):
        kubernetes_settings(Config({"GPUPoolKubernetes": {name: value}}))
    assert getattr(kubernetes_settings(Config({"GPUPoolKubernetes": {name: "90s"}})), name) == 90.0


def test_the_agents_interval_is_refused_when_it_is_not_seconds():
    from traitlets import TraitError

    from jupyter_gpu_pool.operator.agent import AgentApp

    for value in (float("nan"), 0, -5):
        with pytest.raises(TraitError, match="AgentApp.interval must be a number of seconds above 0"):
            AgentApp(interval=value)


# -- rendered objects against the real schemas ---------------------------------------------------------

def kernel(server: bool = True) -> dict:
    spec = {"owner": "alice@example.org", "kernelId": "0b6f5d2e-8d0a-4f0e-9e1a-3f0c2b1a9d77", "profile": "small",
            "launch": 1}
    if server:
        spec["server"] = {"id": "alice", "namespace": "jhub", "pod": "jupyter-alice"}
    return {"apiVersion": "jupyter-gpu-pool.readthedocs.io/v1alpha1", "kind": "GPUKernel",
            "metadata": {"name": "k-0b6f5d2e-8d0a-4f0e-9e1a-3f0c2b1a9d77", "namespace": "jhub-kernels",
                         "uid": "4a6d3e1c-1111-4b2a-9c3d-5e6f7a8b9c0d"}, "spec": spec}


BACKEND_SETTINGS = {
    "hami": {"sharing": "hami"},
    "mps": {"sharing": "mps", "gpu_memory": "80GiB", "replicas": 2, "shared_resource": "nvidia.com/gpu.shared"},
    "time-slicing": {"sharing": "time-slicing", "gpu_memory": "80GiB", "replicas": 2,
                     "shared_resource": "nvidia.com/gpu.shared"},
    "mig": {"sharing": "mig", "gpu_memory": "80GiB"},
    "whole": {"sharing": "whole", "gpu_memory": "80GiB"},
    "dra": {"sharing": "dra", "gpu_memory": "80GiB", "dra_time_slice_interval": "Long"},
    "dra-shares": {"sharing": "dra", "dra_slices": "shares", "gpu_memory": "80GiB"},
}
NO_SM = {"small": PROFILES["small"], "big": {"slice": "30GiB"}, "whole": PROFILES["whole"]}


@pytest.mark.parametrize("backend", [*OVERLAYS, "dra-shares"])
def test_every_object_the_operator_renders_is_valid_for_every_backend(backend):
    profiles = NO_SM if backend in ("time-slicing", "dra-shares") else PROFILES
    settings = operator_settings(GPUPoolOperator(**BACKEND_SETTINGS[backend]),
                                 GPUPool(profiles=profiles).check())
    k = kernel()
    objects = [render_secret(k, settings, "0" * 64), render_network_policy(k, settings),
               render_network_policy(kernel(server=False), settings)]
    pods = [render_pod(k, settings, settings.renderings[p], settings.kernel_image, 1) for p in profiles]
    templates = render_claim_templates(settings, "jhub-kernels")
    for obj in objects + pods + templates:
        kubernetes_validate.validate(obj, K8S, strict=True)  # resource.k8s.io/v1 included
    for pod in pods:
        resources = pod["spec"]["containers"][0]["resources"]
        if backend.startswith("dra"):  # a claim from its profile's template, and no device-plugin limit
            assert resources["claims"] == [{"name": "gpu"}] and "nvidia.com/gpu" not in resources["limits"]
            [claim] = pod["spec"]["resourceClaims"]
            assert claim["resourceClaimTemplateName"] in {t["metadata"]["name"] for t in templates}
        else:
            assert any(k.startswith("nvidia.com/") for k in resources["limits"]) and templates == []
    assert len(templates) == (len(profiles) if backend.startswith("dra") else 0)
    if backend == "dra-shares":  # the shares' capacity requests, valid and in canonical form
        capacities = [t["spec"]["spec"]["devices"]["requests"][0]["exactly"].get("capacity") for t in templates]
        assert {"requests": {"memory": "10Gi"}} in capacities and {"requests": {"memory": "30Gi"}} in capacities


def test_the_key_is_rendered_into_the_secret_only():
    settings = operator_settings(GPUPoolOperator(), GPUPool(profiles=PROFILES).check())
    key = "f" * 64
    k = kernel()
    secret = render_secret(k, settings, key)
    pod = render_pod(k, settings, settings.renderings["small"], settings.kernel_image, 1)
    assert key in json.loads(secret["stringData"]["connection.json"])["key"]
    assert key not in json.dumps(pod) and key not in json.dumps(render_network_policy(k, settings))
    container = pod["spec"]["containers"][0]
    assert container["command"][-1] == "/var/run/jupyter-gpu-pool-kernel/connection.json"  # a path, not the key
    assert container["command"][3:5] == ["/var/run/jupyter-gpu-pool/connection.json",  # from the Secret
                                         "/var/run/jupyter-gpu-pool-kernel/connection.json"]  # to a copy in memory
    assert pod["spec"]["volumes"][1] == {"name": "kernel", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert pod["spec"]["automountServiceAccountToken"] is False and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["volumes"][0]["secret"]["defaultMode"] == 0o440
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_a_kernels_network_policy_admits_only_its_servers_pod():
    settings = operator_settings(GPUPoolOperator(), GPUPool(profiles=PROFILES).check())
    policy = render_network_policy(kernel(), settings)["spec"]
    assert policy["podSelector"] == {"matchLabels": {"jupyter-gpu-pool.readthedocs.io/kernel":
                                                     "k-0b6f5d2e-8d0a-4f0e-9e1a-3f0c2b1a9d77"}}
    [rule] = policy["ingress"]
    [peer] = rule["from"]
    assert peer["podSelector"] == {"matchLabels": {"jupyter-gpu-pool.readthedocs.io/server": "alice"}}
    # the server's namespace (jhub), not the kernel's (jhub-kernels)
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}}
    assert sorted(p["port"] for p in rule["ports"]) == list(range(52700, 52705))
    nobody = render_network_policy(kernel(server=False), settings)["spec"]  # no server: nobody
    assert "ingress" not in nobody and nobody["policyTypes"] == ["Ingress"]


# -- CRDs and the deployment ------------------------------------------------------------------------

def crd_kind(crd: dict) -> Kind:
    v = crd["spec"]["versions"][0]
    return Kind(crd["spec"]["group"], v["name"], crd["spec"]["names"]["plural"], crd["spec"]["names"]["kind"],
                crd["spec"]["scope"] == "Namespaced", schema=v["schema"]["openAPIV3Schema"], custom=True)


def validate_custom_object(obj: dict) -> None:
    """Against its CRD's schema, and nothing the schema would prune (an unknown field is an error here)."""
    [crd] = [c for c in crd_manifests() if c["spec"]["names"]["kind"] == obj["kind"]]
    kind = crd_kind(crd)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    assert prune(body, kind.schema) == body, f"{obj['kind']} {obj['metadata']['name']} has fields the CRD lacks"
    validate_custom(kind, obj)


def test_the_crd_yaml_is_what_crds_py_says_and_valid():
    written = [d for d in yaml.safe_load_all((REPO / "deploy/base/crds.yaml").read_text()) if d]
    assert written == crd_manifests(), "regenerate: python -m jupyter_gpu_pool.operator crds > deploy/base/crds.yaml"
    for crd in written:
        kubernetes_validate.validate(crd, K8S, strict=True)
    validate_custom_object(kernel())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_valid_objects_and_settings_the_operator_accepts(overlay):
    docs = kustomize(REPO / "deploy" / "overlays" / overlay)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "DaemonSet", "ClusterRole", "NetworkPolicy"} <= kinds
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpu-pool-config"]
    config = json.loads(config_map["data"]["jupyter_gpu_pool_config.json"])
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--GPUPoolOperator.sharing={overlay}" in args
    app = OperatorApp()
    app.parse_command_line(args)
    cli = app.config
    app.update_config(type(cli)(config))
    app.update_config(cli)
    settings = app.settings()  # would raise ConfigError if a profile did not fit the backend
    assert settings.sharing.backend == overlay
    for name, rendering in settings.renderings.items():
        kubernetes_validate.validate(render_pod(kernel(), settings, rendering, settings.kernel_image, 1), K8S,
                                     strict=True)


def _walk(node, path=()):
    """Every mapping in a manifest, with its path."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, (*path, i))


@pytest.mark.parametrize("where", [f"overlays/{o}" for o in OVERLAYS] + ["examples"])
def test_every_manifest_writes_what_the_api_server_stores_where_it_compares_whole(where):
    """Server-side apply (and GitOps tools that diff with it) compares some structures whole, and keys some
    lists by fields the API server defaults: a manifest that leaves such a field out conflicts with what the
    server stored (kubectl apply --server-side over the install failed on the agent's fieldRef, to which the
    server adds apiVersion: v1).  So these are written as stored: every fieldRef's apiVersion, every port's
    protocol (with the port, its list's key), and every quantity in its canonical form.  Other defaults (a
    probe's timings) are merged field by field and need not be written."""
    from testcluster.quantities import canonical_quantity

    docs = kustomize(REPO / "deploy" / where)
    if where.startswith("overlays/") and where.split("/")[1] in ("mps", "time-slicing"):
        docs.append(yaml.safe_load((REPO / "deploy" / where / "device-plugin-config.yaml").read_text()))
    found = {"fieldRef": 0, "ports": 0}
    for doc in docs:
        for path, node in _walk(doc):
            if "fieldRef" in node:
                found["fieldRef"] += 1
                assert node["fieldRef"].get("apiVersion") == "v1", (doc["metadata"]["name"], path)
            if path[-2:-1] == ("ports",) and ("containerPort" in node or "port" in node):
                found["ports"] += 1
                assert node.get("protocol") in ("TCP", "UDP", "SCTP"), (doc["metadata"]["name"], path)
            if path[-1:] in (("requests",), ("limits",)) and "resources" in path:
                for name, value in node.items():
                    assert str(value) == canonical_quantity(value), (doc["metadata"]["name"], path, name)
    if where.startswith("overlays/"):
        assert found["fieldRef"] >= 1 and found["ports"] >= 4  # the agent's NODE_NAME; the two pods', the Service's


def test_the_examples_and_device_plugin_configs_are_valid():
    for doc in kustomize(REPO / "deploy" / "examples"):
        validate_custom_object(doc)
    for overlay in ("mps", "time-slicing"):
        doc = yaml.safe_load((REPO / "deploy/overlays" / overlay / "device-plugin-config.yaml").read_text())
        kubernetes_validate.validate(doc, K8S, strict=True)
        sharing = yaml.safe_load(doc["data"]["config.yaml"])["sharing"]
        [(strategy, plugin)] = sharing.items()
        assert strategy == {"mps": "mps", "time-slicing": "timeSlicing"}[overlay] and plugin["renameByDefault"]
        [deployment] = [d for d in kustomize(REPO / "deploy/overlays" / overlay) if d["kind"] == "Deployment"]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--GPUPoolOperator.replicas={plugin['resources'][0]['replicas']}" in args  # the two agree


def rules_of(docs: list[dict], role: str) -> list[dict]:
    [r] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role]
    return r["rules"]


def grants(rules: list[dict], resource: str) -> set[str]:
    return {v for r in rules if resource in r["resources"] for v in r["verbs"]}


def test_rbac_gives_each_part_only_what_it_needs():
    docs = kustomize(REPO / "deploy" / "base")
    server = rules_of(docs, "gpu-pool-server") + rules_of(docs, "gpu-pool-server-reader")
    assert grants(server, "pods") == set()  # users' servers never create (or touch) pods
    assert grants(server, "gpukernels") == {"create", "list", "watch", "patch", "delete"}
    assert grants(server, "secrets") == {"get"} and grants(server, "gpukernels/status") == set()
    assert grants(server, "nodes") == {"list"}
    operator = rules_of(docs, "gpu-pool-operator") + rules_of(docs, "gpu-pool-operator-kernels")
    assert grants(operator, "secrets") == {"create"}  # writes the key, never reads a Secret back
    assert "create" not in grants(operator, "gpukernels") and "get" not in grants(operator, "gpukernels")
    assert grants(operator, "events") == {"create", "list"}
    agent = rules_of(docs, "gpu-pool-agent")
    assert grants(agent, "secrets") == set() and grants(agent, "gpukernels/status") == {"patch"}
    assert grants(agent, "gpukernels") == {"list", "watch"} and grants(agent, "pods") == {"list", "watch"}
    assert grants(rules_of(docs, "gpu-pool-agent-node"), "nodes") == {"patch"}  # its GPUs' free memory, on its Node
    every = [v for d in docs if d["kind"] == "ClusterRole" for r in d["rules"] for v in r["verbs"]]
    assert "*" not in every and "escalate" not in every and "bind" not in every
    # the Secret right is granted where kernels run, apart from the servers' (and the hub's) namespace
    [binding] = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "gpu-pool-server"]
    assert binding["roleRef"]["name"] == "gpu-pool-server" and binding["metadata"]["namespace"] == "jhub-kernels"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-pool-server", "namespace": "jhub"}]
    # pods, Secrets and events only in the kernels' namespace, for the operator and the agent too
    namespaced = {d["roleRef"]["name"]: d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding"}
    assert namespaced == {"gpu-pool-server": "jhub-kernels", "gpu-pool-operator-kernels": "jhub-kernels",
                          "gpu-pool-agent": "jhub-kernels"}
    [deny] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert deny["metadata"]["namespace"] == "jhub-kernels"
    assert "ingress" not in deny["spec"] and deny["spec"]["policyTypes"] == ["Ingress"]  # no rule: nothing in
