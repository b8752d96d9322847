"""JupyterHub on one box, for real: jupyterhub (from PyPI) with its proxy (configurable-http-proxy, from
npm), LocalProcessSpawner starting alice's and bob's servers as their own Unix users, and the pool
service run by the hub as a managed service, which learns hub groups and hub admins through the hub's
API.  Both users' kernels start on the pool; bob's group quota refuses his second with the usual message."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import users_registry
from hub_helpers import Hub, npm_available, proxy_command
from service_helpers import raw, request

pytest.importorskip("jupyterhub", reason="JupyterHub comes with the 'hub' extra: pip install jupyter-gpu-pool[hub]")
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="session")
def proxy() -> str:
    if not npm_available():
        pytest.skip("npm is not installed: JupyterHub's proxy (configurable-http-proxy) comes from npm")
    cache = Path(os.environ.get("JUPYTER_GPU_POOL_TEST_CACHE", Path.home() / ".cache" / "jupyter-gpu-pool-tests"))
    with users_registry.locked("proxy-install"):  # one npm install at a time into the shared cache
        return proxy_command(cache / "configurable-http-proxy")


@pytest.mark.slow
def test_a_real_jupyterhub_spawns_two_users_whose_kernels_share_the_pool(system_homes, lab, proxy):
    # (system_homes before lab: the homes stay this test's until the lab has stopped the hub and its servers)
    # Hub names are the Unix names here (LocalProcessSpawner), so the service strips no prefix; "students"
    # is a hub group only, and its quota holds one kernel for all its members.
    lab.configure(service={"user_prefix": "", "admin_groups": []}, group_quotas={"students": {"kernels": 1}})
    hub = Hub(lab, proxy, admins=["jupyter-alice"], groups={"students": ["jupyter-bob"]})
    lab.processes.append(hub)
    hub.start()
    alice, bob = hub.spawn("jupyter-alice"), hub.spawn("jupyter-bob")

    started = [alice.start_kernel(), alice.start_kernel(), bob.start_kernel()]
    assert [code for code, _ in started] == [201, 201, 201], (started, hub.log()[-3000:])
    code, refused = bob.start_kernel()
    assert code == 403, refused
    assert refused["message"].startswith("GPU quota exceeded: group 'students' holds 1 GPU kernel (all its members together), as many as its quota allows")

    # Who is who comes from the hub: bob's hub group, alice's hub admin flag; names as the hub knows them.
    [alice_is, bob_is] = [raw(lab, name, [request("whoami")])[0]["result"] for name in ("alice", "bob")]
    assert bob_is["user"] == "jupyter-bob" and "students" in bob_is["groups"] and not bob_is["admin"]
    assert alice_is["user"] == "jupyter-alice" and alice_is["admin"] and "students" not in alice_is["groups"]

    # Each user's server shows them their own kernels; the hub admin sees everyone's leases in status.
    me = bob.me()
    assert me["user"] == "jupyter-bob" and [k["kernel_id"] for k in me["kernels"]] == [started[2][1]["id"]]
    assert {k["kernel_id"] for k in alice.me()["kernels"]} == {started[0][1]["id"], started[1][1]["id"]}
    status = [sys.executable, "-m", "jupyter_gpu_pool.cli", "status", "--json"]
    owners = {x["owner"] for x in json.loads(lab.run_as("alice", status).stdout)["leases"]}
    assert owners == {"jupyter-alice", "jupyter-bob"}
    owners = {x["owner"] for x in json.loads(lab.run_as("bob", status).stdout)["leases"]}
    assert owners == {"jupyter-bob"}
    refusals = [e for e in raw(lab, "bob", [request("journal", kinds=["refused"])])[0]["result"]]
    assert [e["reason"] for e in refusals] == ["quota_exceeded"]  # on the record, under his name
