"""End to end on the test cluster: kernels started through the gpu-pool-kubernetes kernelspecs run in
their own pods, give their slice back, restart into a new pod, and refuse clearly and fast."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import pytest
from jupyter_client.manager import AsyncKernelManager
from kernel_helpers import run_code
from kube_helpers import HAMI_NODE, KERNEL_IMAGE, GiB, Kube, wait_until

from jupyter_gpu_pool.kernel_provisioner import KernelStartRefused
from jupyter_gpu_pool.kernel_provisioner.kubernetes import GPUPoolKubernetesProvisioner
from jupyter_gpu_pool.cluster.resources import GROUP, KERNELS, LABEL_KERNEL, VERSION, kernel_name

REAL_CLUSTER_TOO = True  # also run, marked k8s, on the cluster KUBECONFIG names


@pytest.fixture
def kms(server_config, kube_sessions, managers):
    """Kernel managers on the gpu-pool-kubernetes kernelspecs (shut down before the watches close)."""
    return lambda name="gpu-pool-kubernetes-small": managers(name)


async def timed_refusal(km: AsyncKernelManager) -> tuple[KernelStartRefused, float]:
    """The refusal of a launch that cannot succeed, and the seconds it took to come."""
    t0 = time.monotonic()
    with pytest.raises(KernelStartRefused) as refusal:
        await km.start_kernel()
    return refusal.value, time.monotonic() - t0


async def refused(km: AsyncKernelManager) -> KernelStartRefused:
    """The refusal of a launch that cannot succeed, which must come within seconds, not at a timeout."""
    refusal, waited = await timed_refusal(km)
    assert waited < 10
    return refusal


async def gone(kube: Kube, kernel_id: str) -> bool:
    name = kernel_name(kernel_id)
    kernels = [k for k in await kube.kernels() if k["metadata"]["name"] == name]
    pods = [p for p in await kube.pods() if p["metadata"]["labels"].get(LABEL_KERNEL) == name]
    secrets = [s for s in await kube.secrets() if s["metadata"]["labels"].get(LABEL_KERNEL) == name]
    return not (kernels or pods or secrets)


@pytest.mark.slow
async def test_a_kernel_runs_code_in_its_own_pod_and_leaves_nothing_behind(cluster, operator, kms, kube):
    km = kms()
    await km.start_kernel()
    assert isinstance(km.provisioner, GPUPoolKubernetesProvisioner)
    env = json.loads(await run_code(km, "import os, json; print(json.dumps(dict(os.environ)))"))
    [kernel] = await kube.kernels()
    uid = kernel["metadata"]["uid"]
    # the pod's name is its launch's, of this GPUKernel object: a kernel made again under the name never meets it
    assert env["HOSTNAME"] == km.provisioner.pod == f"{kernel_name(km.kernel_id)}-1-{uid[:8]}"
    assert env["JUPYTER_GPU_POOL_PROFILE"] == "small"
    st = kernel["status"]
    assert st["phase"] == "Running" and st["node"] and st["podIP"] == km.ip
    assert st["admitted"]["profile"] == "small"
    if cluster.local:  # the test cluster runs HAMi's resources
        assert env["JUPYTER_GPU_POOL_SHARING"] == "hami" and env["JUPYTER_GPU_POOL_MEMORY_BYTES"] == str(10 * GiB)
        assert st["node"] == "gpu-node-1" and st["admitted"]["memory"] == 10 * GiB
        assert st["gpu"] == {"sharing": "hami", "resources": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}}
    [pod] = await kube.pods()
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    [container] = spec["containers"]
    assert container["volumeMounts"][0]["readOnly"] is True
    assert any(k.startswith("nvidia.com/") for k in container["resources"]["limits"])
    assert pod["metadata"]["ownerReferences"][0]["uid"] == kernel["metadata"]["uid"]

    await km.shutdown_kernel()
    await wait_until(lambda: gone(kube, km.kernel_id), timeout=20, what="the kernel's objects to go")


async def test_a_notebook_session_over_rest_runs_in_a_pod(cluster, operator, server_config, kube_sessions,
                                                          jp_fetch, jp_serverapp, kube):
    body = {"path": "analysis/gpu.ipynb", "type": "notebook", "name": "gpu.ipynb",
            "kernel": {"name": "gpu-pool-kubernetes-small"}}
    reply = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)
    kernel_id = reply["kernel"]["id"]
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    assert "6" in await run_code(km, "print(2 * 3)")
    [kernel] = await kube.kernels()
    assert kernel["spec"]["label"] == "gpu.ipynb" and kernel["spec"]["owner"] == cluster.user
    assert kernel["spec"]["kernelName"] == "gpu-pool-kubernetes-small"
    await jp_fetch("api", "sessions", reply["id"], method="DELETE")
    await wait_until(lambda: gone(kube, kernel_id), timeout=20, what="the kernel's objects to go")


async def test_a_restart_runs_a_new_pod_on_the_same_admitted_slice(cluster, operator, kms, kube):
    km = kms()
    await km.start_kernel()
    await run_code(km, "x = 42")
    [before] = await kube.kernels()
    first_pod = km.provisioner.pod
    await km.restart_kernel()
    assert km.provisioner.pod == f"{kernel_name(km.kernel_id)}-2-{before['metadata']['uid'][:8]}" != first_pod
    assert "no x" in await run_code(km, "print('x' in dir() and 'has x' or 'no x')")
    [after] = await kube.kernels()
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["admitted"] == before["status"]["admitted"] and after["spec"]["launch"] == 2
    await wait_until(lambda: _pod_names(kube), timeout=20)
    assert await _pod_names(kube) == {km.provisioner.pod}  # the first launch's pod is gone


async def test_an_interrupt_reaches_the_kernel_in_its_pod(cluster, operator, kms):
    km = kms()
    await km.start_kernel()
    assert km.kernel_spec.interrupt_mode == "message"  # a server cannot signal a pod
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        msg_id = kc.execute("import time; time.sleep(60)")
        await wait_until(lambda: km.provisioner.kernel is not None, timeout=5)
        await _executing(kc, msg_id)  # the interrupt comes while the cell runs, not before it
        t0 = time.monotonic()
        await km.interrupt_kernel()
        reply = await kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = await kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - t0 < 10
    finally:
        kc.stop_channels()
    assert "still here" in await run_code(km, "print('still here')")


async def _executing(kc, msg_id: str) -> None:
    """Until the kernel says it runs the request (its execute_input on iopub)."""
    while True:
        msg = await kc.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "execute_input" and msg["parent_header"].get("msg_id") == msg_id:
            return


async def _pod_names(kube: Kube) -> set[str]:
    return {p["metadata"]["name"] for p in await kube.pods() if not p["metadata"].get("deletionTimestamp")}


async def test_a_quota_refusal_reaches_the_user_within_seconds(cluster, operator, kms, kube):
    await kube.quota("user", cluster.user, kernels=1)
    await wait_until(lambda: _quota_valid(kube, f"user-{cluster.user}"), timeout=20)
    first = kms()
    await first.start_kernel()
    second = kms()
    refusal = await refused(second)
    assert refusal.status_code == 403 and refusal.pool_reason == "QuotaExceeded"
    message = str(refusal)
    assert message.startswith("GPU quota exceeded: you hold 1 GPU kernel, as many as your quota allows, so 'Python 3 · ")
    await wait_until(lambda: gone(kube, second.kernel_id), timeout=20, what="the refused kernel's objects to go")
    assert len(await kube.kernels()) == 1


async def _quota_valid(kube: Kube, name: str) -> bool:
    from jupyter_gpu_pool.cluster.resources import QUOTAS

    obj = await kube.custom.get_cluster_custom_object(GROUP, VERSION, QUOTAS, name)
    return (obj.get("status") or {}).get("valid") is True


async def test_a_slice_no_node_can_hold_fails_the_launch_within_seconds(cluster, operator, kms, kube):
    km = kms("gpu-pool-kubernetes-huge")  # 64 whole GPUs
    refusal = await refused(km)
    assert refusal.status_code == 503 and refusal.pool_reason == "Unschedulable"
    message = str(refusal)
    assert message.startswith("No GPU slice is free for profile 'huge'") and "Insufficient nvidia.com/gpu" in message
    await wait_until(lambda: gone(kube, km.kernel_id), timeout=20)


async def test_no_free_slice_fails_the_launch_within_seconds_with_the_schedulers_reason(cluster, operator, kms,
                                                                                         kube):
    if not cluster.local:
        pytest.skip("fills the test cluster's one node; a real cluster's size is unknown")
    whole = [kms("gpu-pool-kubernetes-whole") for _ in range(2)]
    await asyncio.gather(*(km.start_kernel() for km in whole))
    third = kms("gpu-pool-kubernetes-small")
    refusal = await refused(third)
    assert refusal.status_code == 503 and refusal.pool_reason == "Unschedulable"
    message = str(refusal)
    assert message.startswith("No GPU slice is free for profile 'small'") and "Insufficient nvidia.com/gpu" in message
    await wait_until(lambda: gone(kube, third.kernel_id), timeout=20)


async def test_an_image_that_cannot_be_pulled_fails_the_launch_within_seconds(cluster, operator_factory, kms,
                                                                               jp_data_dir, kube):
    await operator_factory(cluster, **{"GPUPoolOperator.allowed_images": ["quay.io/*", "registry.invalid/*"]})
    _kernelspec(jp_data_dir, "gpu-missing-image", {"profile": "small", "image": "registry.invalid/nope:1"})
    km = kms("gpu-missing-image")
    refusal = await refused(km)
    assert refusal.pool_reason == "ImagePullFailed"
    assert str(refusal).startswith("The kernel image 'registry.invalid/nope:1' cannot be pulled")
    await wait_until(lambda: gone(kube, km.kernel_id), timeout=20)


async def test_an_unknown_profile_is_refused_before_anything_is_created(cluster, operator, kms, jp_data_dir,
                                                                         kube):
    _kernelspec(jp_data_dir, "gpu-typo", {"profile": "smal"})
    refusal = await refused(kms("gpu-typo"))
    assert refusal.status_code == 400 and str(refusal).startswith("There is no GPU profile named 'smal'")
    assert await kube.kernels() == []


async def test_an_image_the_admin_does_not_allow_is_refused(cluster, operator, kms, jp_data_dir, kube):
    _kernelspec(jp_data_dir, "gpu-other-image", {"profile": "small", "image": "docker.io/someone/else:1"})
    refusal = await refused(kms("gpu-other-image"))
    assert refusal.status_code == 400 and "is not one the admin allows" in str(refusal)
    assert await kube.pods() == []


async def test_a_crashing_container_fails_the_launch_with_its_exit_code(cluster, operator_factory, kms, kube):
    await operator_factory(cluster, **{"GPUPoolOperator.kernel_command": [
        "python", "-c", "import sys; sys.exit(3)", "{connection_file}"]})
    km = kms()
    refusal = await refused(km)
    assert refusal.pool_reason == "ContainerCrashed" and "exited with code 3" in str(refusal)
    await wait_until(lambda: gone(kube, km.kernel_id), timeout=20)


# A kernel that opens its ports a while after its container starts (a big image importing ipykernel), and one
# that never does.
SLOW_TO_LISTEN = ["/bin/sh", "-c", 'sleep 2 && exec python -m ipykernel_launcher -f "$0"', "{connection_file}"]
NEVER_LISTENS = ["python", "-c", "import time; time.sleep(600)", "{connection_file}"]


async def test_a_kernel_slow_to_open_its_ports_starts(cluster, operator_factory, kms, kube):
    """Readiness is the kernel's kernel_info reply within the start timeout, however long after its container
    started the kernel binds its ports (a client's heartbeat gave up after about 1 s and refused it)."""
    await operator_factory(cluster, **{"GPUPoolOperator.kernel_command": SLOW_TO_LISTEN})
    km = kms()
    await km.start_kernel()
    timings = km.provisioner.timings
    assert timings["ready"] - timings["running"] >= 1.5  # it really waited for a kernel not yet listening
    assert "slow but here" in await run_code(km, "print('slow but here')")
    [kernel] = await kube.kernels()
    assert kernel["status"]["phase"] == "Running"


async def test_a_kernel_that_never_listens_is_refused_at_the_timeout_saying_so(
        cluster, operator_factory, configure_server, kube_sessions, managers, kube):
    await operator_factory(cluster, **{"GPUPoolOperator.kernel_command": NEVER_LISTENS})
    configure_server(cluster, **{"GPUPoolKubernetes.launch_timeout": 5.0})
    km = managers("gpu-pool-kubernetes-small")
    refusal, waited = await timed_refusal(km)
    message = str(refusal)
    assert 4.0 <= waited <= 9.0  # it waited for the whole start timeout, not a heartbeat's second
    assert refusal.pool_reason == "not_ready" and refusal.status_code == 504
    said = int(re.search(r"did not answer within (\d+) s", message).group(1))
    assert abs(said - waited) <= 1.5
    assert "nothing listens on its ports" in message
    assert "died" not in message and "ipykernel 7.3" not in message  # neither a death nor an old kernel
    await wait_until(lambda: gone(kube, km.kernel_id), timeout=20, what="the refused kernel's objects to go")


async def test_deleting_the_kernel_resource_deletes_its_pod_and_secret(cluster, operator, kms, kube):
    km = kms()
    await km.start_kernel()
    name = kernel_name(km.kernel_id)
    await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, KERNELS, name)
    await wait_until(lambda: gone(kube, km.kernel_id), timeout=20, what="the pod and Secret to go")
    assert await km.provisioner.poll() is not None  # the server sees its kernel gone


async def test_a_kernel_goes_with_its_server_pod(cluster, operator, kube, server_config, jp_serverapp,
                                                 kube_sessions):
    """In a cluster the server's pod owns its kernels: deleting the pod deletes them (garbage collection)."""
    server_pod = await kube.core.create_namespaced_pod(cluster.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "jupyter-alice"},
        "spec": {"containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook:latest",
                                 "command": ["sleep", "600"]}]}})
    jp_serverapp.config.GPUPoolKubernetes.server_pod = "jupyter-alice"
    jp_serverapp.config.GPUPoolKubernetes.server_pod_uid = server_pod.metadata.uid
    kernel_id = await jp_serverapp.kernel_manager.start_kernel(kernel_name="gpu-pool-kubernetes-small")
    [kernel] = await kube.kernels()
    assert kernel["metadata"]["ownerReferences"][0]["uid"] == server_pod.metadata.uid
    await kube.core.delete_namespaced_pod("jupyter-alice", cluster.namespace, grace_period_seconds=0)
    await wait_until(lambda: gone(kube, kernel_id), timeout=20, what="the kernel to go with its server's pod")


@pytest.mark.slow
async def test_a_pod_on_a_node_that_never_starts_is_explained_with_true_numbers(
        cluster_factory, operator_factory, configure_server, kube_sessions, managers, caplog):
    """The scheduler places the pod on a node whose kubelet is gone: the user reads where it is and why
    nothing happens, how long they really waited, and the server's log said so while they waited."""
    from kube_helpers import install

    caplog.set_level(logging.INFO, "jupyter_gpu_pool")
    cluster = cluster_factory(nodes=[{**HAMI_NODE, "name": "gpu-node-gone", "kubelet": False}])
    await install(cluster)
    await operator_factory(cluster, **{"GPUPoolOperator.progress_interval": 0.5})
    configure_server(cluster, **{"GPUPoolKubernetes.launch_timeout": 5.0,
                                 "GPUPoolKubernetes.progress_interval": 1.0})
    km = managers("gpu-pool-kubernetes-small")
    refusal, waited = await timed_refusal(km)
    message = str(refusal)
    assert refusal.pool_reason == "launch_timeout" and refusal.status_code == 504
    said = int(re.search(r"did not start within (\d+) s", message).group(1))
    assert abs(said - waited) <= 1.0  # the number the user reads is the wait they had
    assert "waits on node 'gpu-node-gone'" in message and "not ready" in message
    assert "Kubelet stopped posting node status." in message
    placed = int(re.search(r"waits on node 'gpu-node-gone', (\d+) s so far", message).group(1))
    assert 2 <= placed <= said  # the operator's number is true too, and fresh
    assert "Is the operator running" not in message
    progress = [r.getMessage() for r in caplog.records if "still starting after" in r.getMessage()]
    assert len(progress) >= 3 and any("not ready" in line for line in progress)  # while the user waited


async def test_a_slow_image_pull_is_reported_as_such(cluster_factory, operator_factory, configure_server,
                                                     kube_sessions, managers):
    from kube_helpers import install

    cluster = cluster_factory(slow_images={KERNEL_IMAGE: 60})
    await install(cluster)
    await operator_factory(cluster, **{"GPUPoolOperator.progress_interval": 0.5})
    configure_server(cluster, **{"GPUPoolKubernetes.launch_timeout": 4.0})
    with pytest.raises(KernelStartRefused) as refusal:
        await managers("gpu-pool-kubernetes-small").start_kernel()
    message = str(refusal.value)
    assert f"is pulling the kernel image {KERNEL_IMAGE!r}" in message
    pulled = int(re.search(r"pulling the kernel image '[^']+': (\d+) s so far", message).group(1))
    said = int(re.search(r"did not start within (\d+) s", message).group(1))
    assert 2 <= pulled <= said


async def test_real_cluster_runs_bring_their_own_quota(cluster_factory, operator_factory, configure_server,
                                                       kube_sessions, managers, tmp_path):
    """`pytest -m k8s` against a cluster with the documented example quotas applied (a default of 40 GiB):
    the run's own user gets a quota of its own, so a kernel holding 80 GiB (a whole GPU) starts."""
    import yaml
    from kube_helpers import install
    from kube_helpers import REPO, RealCluster

    from jupyter_gpu_pool.cluster.resources import QUOTAS

    admins = cluster_factory()
    await install(admins)
    kube = Kube(await admins.api(), admins.namespace)
    try:
        for quota in yaml.safe_load_all((REPO / "deploy" / "examples" / "quotas.yaml").read_text()):
            await kube.custom.create_cluster_custom_object(GROUP, VERSION, QUOTAS, quota)
        real = RealCluster(tmp_path / "k8s-run", kubeconfig=admins.kubeconfig).start()  # what -m k8s uses
        await install(real)
        await operator_factory(real)  # whole GPUs of 80 GiB, serving the run's namespace
        configure_server(real)
        km = managers("gpu-pool-kubernetes-small")
        await km.start_kernel()
        assert "mine" in await run_code(km, "print('mine')")
        [kernel] = await kube.kernels(real.namespace)
        assert kernel["status"]["admitted"]["memory"] == 80 * GiB
    finally:
        await kube.close()


async def test_real_cluster_runs_write_nothing_shared_and_wait_for_their_own_operator(
        cluster_factory, operator_factory, tmp_path):
    """`pytest -m k8s` on a cluster that has its admin's GPUPoolPolicy "default": waiting for the run's
    operator neither writes that policy (nor any shared object) nor takes the policy's existence, which
    says nothing of the run's operator, for readiness."""
    from kube_helpers import RealCluster, install, operator_ready

    from jupyter_gpu_pool.cluster.resources import POLICIES

    admins = cluster_factory()
    await install(admins)
    kube = Kube(await admins.api(), admins.namespace)
    try:
        policy = await kube.custom.create_cluster_custom_object(GROUP, VERSION, POLICIES, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUPoolPolicy", "metadata": {"name": "default"},
            "spec": {"rules": [{"name": "the admin's", "idle_timeout": "2h"}]}})
        real = RealCluster(tmp_path / "k8s-run", kubeconfig=admins.kubeconfig).start()
        await install(real)
        # no operator serves the run's namespace yet: not ready (a readiness taken from the policy's existence
        # would answer at its first look)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(operator_ready(real), 1)
        before = len(await admins.audit())
        await operator_factory(real)  # waits for this run's operator
        shared = [c for c in (await admins.audit())[before:] if c["resource"] in ("gpupoolpolicies", "gpuquotas")
                  and c["verb"] in ("create", "update", "patch", "delete")]
        assert shared == []  # not even a create that the API server refuses
        after = await kube.custom.get_cluster_custom_object(GROUP, VERSION, POLICIES, "default")
        assert after["spec"] == policy["spec"]
        assert [k for k in await kube.kernels(real.namespace)] == []  # the probe is gone
    finally:
        await kube.close()


def _kernelspec(data_dir, name: str, config: dict) -> None:
    import os
    import sys

    path = os.path.join(data_dir, "kernels", name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "kernel.json"), "w") as f:
        json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": name, "language": "python",
                   "metadata": {"kernel_provisioner": {"provisioner_name": "gpu-pool-kubernetes",
                                                       "config": config}}}, f)
