"""A teaching lab on one box: alice and bob, real Unix users, each run a Jupyter server as their own uid
against one pool service run by root.  What one student must not be able to do to another, or to the
pool, and that the service says who is who from the kernel, not from a name the student can set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from service_helpers import raw, request, uid_of

from jupyter_gpu_pool.service.operations import MAX_WAITERS

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def shared(lab):
    """The service, and alice with a kernel on a slice."""
    lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201, (kernel, alice.log()[-12000:])
    lease = next(k for k in alice.me()["kernels"] if k["kernel_id"] == kernel["id"])
    return lab, alice, kernel["id"], lease["lease_id"]


def test_the_service_knows_each_user_from_the_socket_and_keeps_the_ledger_to_itself(shared):
    lab, alice, kid, lease_id = shared
    assert alice.me()["user"] == "alice"  # jupyter-alice, less the TLJH prefix
    [who] = raw(lab, "bob", [request("whoami")])
    assert who["result"]["user"] == "bob" and who["result"]["uid"] == uid_of("bob") and not who["result"]["admin"]
    for name in ("bob", "alice"):  # nobody but the service reads or writes the ledger
        done = lab.run_as(name, [sys.executable, "-c", f"open({lab.ledger!r}, 'rb').read(1)"])
        assert done.returncode != 0 and "Permission denied" in done.stderr
        done = lab.run_as(name, [sys.executable, "-c", f"open({lab.ledger!r}, 'ab')"])
        assert done.returncode != 0 and "Permission denied" in done.stderr


@pytest.mark.slow
def test_bob_cannot_release_or_snooze_alices_kernel_by_rest_cli_or_socket(shared):
    lab, alice, kid, lease_id = shared
    bob = lab.server("bob")
    for action in ("release", "snooze"):  # REST: his server is not told of her kernel (as admin: the test below)
        code, reply = bob.request("POST", f"gpu-pool/api/v1/kernels/{kid}/{action}", {})
        assert (code, reply["reason"]) == (404, "no_such_kernel"), (action, code, reply)
    assert all(k["kernel_id"] != kid for k in bob.me()["kernels"])
    done = lab.run_as("bob", [sys.executable, "-m", "jupyter_gpu_pool.cli", "release", kid])
    assert done.returncode == 2 and "may release" in done.stderr  # CLI: alice's kernel is not his
    replies = raw(lab, "bob", [request("release", lease_id=lease_id, reason="bob was here"),
                               request("stop", lease_id=lease_id),
                               request("set_phase", lease_id=lease_id, to="hibernating", expect=""),
                               request("hibernate", lease_id=lease_id, host_bytes=0),
                               request("get", lease_id=lease_id),
                               request("journal", owner="alice")])
    # answered as an unknown lease is: he learns nothing of whose it is
    [unknown] = raw(lab, "bob", [request("stop", lease_id="no-such-lease")])
    assert replies[0]["ok"] and replies[0]["result"] is None  # as a release of a lease long gone
    assert [r["error"]["reason"] for r in replies[1:4]] == ["lease_not_found"] * 3
    assert {r["error"]["message"].replace(lease_id, "?") for r in replies[1:4]} == {
        unknown["error"]["message"].replace("no-such-lease", "?")}
    assert replies[4]["result"] is None  # he cannot even see it
    assert all(e["owner"] == "bob" for e in replies[5]["result"])  # the journal he reads is his own
    lease = next(k for k in alice.me()["kernels"] if k["kernel_id"] == kid)
    assert lease["state"] == "active" and lease["lease_id"] == lease_id  # nothing changed for alice
    done = lab.run_as("alice", [sys.executable, "-m", "jupyter_gpu_pool.cli", "status", "--json"])
    assert [x["kernel_id"] for x in json.loads(done.stdout)["leases"]] == [kid]
    done = lab.run_as("bob", [sys.executable, "-m", "jupyter_gpu_pool.cli", "status", "--json"])
    assert json.loads(done.stdout)["leases"] == []  # users see their own leases
    # an admin (root here; members of PoolService.admin_groups) may release anyone's kernel
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu_pool.cli", "release", kid[:8]], capture_output=True,
                          text=True, env={**os.environ, "JUPYTER_GPU_POOL_SOCKET": lab.socket}, timeout=120)
    assert done.returncode == 0 and "released the small slice" in done.stdout and "(alice)" in done.stdout, done.stderr
    [gone] = raw(lab, "alice", [request("get", lease_id=lease_id)])
    assert gone["result"]["state"] == "released" and gone["result"]["reason"] == "released from the command line"


# bob's own server runs his own code: his config may make it believe anything of him.
ADMIN_CLAIM = """
c.GPUPoolExtension.admin_users = {"bob"}  # (a server under JupyterHub takes admins from this list)
from jupyter_gpu_pool.service import client as _client
_given = _client.ServicePool.__init__
def _admin(self, *args, **kwargs):  # (a personal server takes its owner's admin flag from the pool)
    _given(self, *args, **kwargs)
    self.admin = True
_client.ServicePool.__init__ = _admin
"""


@pytest.mark.slow
def test_bob_declaring_himself_admin_in_his_own_server_gains_nothing_over_alices_kernel(shared):
    lab, alice, kid, lease_id = shared
    config = lab.home("bob") / ".jupyter"
    config.mkdir()
    (config / "jupyter_server_config.py").write_text(ADMIN_CLAIM)
    for path in (config, config / "jupyter_server_config.py"):
        os.chown(path, uid_of("bob"), -1)
    bob = lab.server("bob")
    assert bob.me()["admin"] is True  # his server believes him
    code, view = bob.request("GET", "gpu-pool/api/v1/pool")
    assert code == 200  # so it shows him the admins' pool view, as the service serves it to him: his own
    text = json.dumps(view)
    assert kid not in text and lease_id not in text and '"alice"' not in text, text[:2000]
    for action in ("release", "hibernate", "shutdown"):  # the admins' routes: alice's kernel is not there for him
        code, reply = bob.request("POST", f"gpu-pool/api/v1/kernels/{kid}/{action}", {})
        assert (code, reply["reason"]) == (404, "no_such_kernel"), (action, code, reply)
    # Knowing her lease, he asks her server for it the way an admin's server does (the journal), or puts the
    # request under his own name: both are refused (neither her lease nor her kernel id is his to record about).
    replies = raw(lab, "bob", [request("record", kind="requested", lease_id=lease_id, kernel_id=kid, reason="admin",
                                       detail={"action": "shutdown", "by": "bob"}),
                               request("record", kind="requested", kernel_id=kid, reason="admin",
                                       detail={"action": "shutdown", "by": "bob"}),
                               request("snapshot"), request("leases", owner="alice")])
    assert replies[0]["error"]["reason"] == "lease_not_found" and replies[1]["error"]["reason"] == "not_yours"
    assert all(x["owner"] == "bob" for x in replies[2]["result"]["leases"]) and replies[3]["result"] == []
    time.sleep(3)  # three of her server's culling passes (each reads her journal)
    [lease] = raw(lab, "alice", [request("get", lease_id=lease_id)])
    assert lease["result"]["state"] == "active" and not lease["result"]["phase"], lease  # untouched
    assert alice.request("GET", f"api/kernels/{kid}")[0] == 200
    [entries] = raw(lab, "alice", [request("journal")])
    assert all(e["owner"] == "alice" and e["kind"] != "requested" for e in entries["result"])


def test_bob_gains_no_quota_from_his_own_config_a_borrowed_owner_or_jupyterhub_user(lab):
    lab.service()
    jupyter_dir = lab.home("bob") / ".jupyter"
    lab.run_as("bob", [sys.executable, "-c", f"import os; os.makedirs({str(jupyter_dir)!r})"])
    lab.run_as("bob", [sys.executable, "-c", f"open({str(jupyter_dir / 'jupyter_gpu_pool_config.py')!r}, 'w')"
                      ".write(\"c.GPUPool.default_user_quota = {'kernels': 99}\\n"
                      "c.GPUPool.user_quotas = {'bob': {'kernels': 99}}\\nc.GPUPool.owner = 'alice'\\n\")"])
    bob = lab.server("bob", JUPYTERHUB_USER="alice")  # a name he could set: not who he is
    assert [bob.start_kernel()[0] for _ in range(2)] == [201, 201]
    code, refused = bob.start_kernel()
    assert code == 403 and refused["message"].startswith("GPU quota exceeded: you hold 2 GPU kernels, as many as your quota allows")
    me = bob.me()
    assert me["user"] == "bob" and {k["kernel_id"] for k in me["kernels"]} and me["quota"]["kernels"] == 2
    [leases] = raw(lab, "bob", [request("leases")])
    assert {x["owner"] for x in leases["result"]} == {"bob"}  # held under his own name


@pytest.mark.slow
def test_bob_cannot_register_a_process_of_another_uid_as_his_kernel(shared):
    lab, alice, kid, lease_id = shared
    alices_kernel = next(k for k in alice.me()["kernels"] if k["kernel_id"] == kid)
    bob = lab.server("bob")
    code, mine = bob.start_kernel()
    assert code == 201
    [own] = [k for k in bob.me()["kernels"] if k["kernel_id"] == mine["id"]]
    [held] = raw(lab, "alice", [request("get", lease_id=lease_id)])
    alice_pid = held["result"]["holder_pid"]
    replies = raw(lab, "bob", [request("set_holder", lease_id=own["lease_id"], pid=alice_pid),
                               request("set_holder", lease_id=own["lease_id"], pid=1)])
    assert [r["error"]["reason"] for r in replies] == ["not_yours", "not_yours"]
    assert "not yours" in replies[0]["error"]["message"]
    [still] = raw(lab, "bob", [request("get", lease_id=own["lease_id"])])
    assert still["result"]["holder_pid"] != alice_pid and alices_kernel["state"] == "active"


def test_bob_cannot_take_alices_kernel_id_nor_queue_for_more_than_the_admins_profiles(shared):
    lab, alice, kid, lease_id = shared
    replies = raw(lab, "bob", [request("allocate", kernel_id=kid, profile="small"),
                               request("enqueue", kernel_id=kid, profile="small"),
                               request("enqueue", kernel_id="k-bob-1", profile="small", slice="8 x whole"),
                               request("enqueue", kernel_id="k-bob-2", profile="huge"),
                               *[request("enqueue", kernel_id=f"k-bob-{i}", profile="small") for i in range(3, 13)]])
    assert [r["error"]["reason"] for r in replies[:2]] == ["not_yours", "not_yours"]
    assert "another user's kernel" in replies[0]["error"]["message"]
    assert replies[2]["ok"] and replies[2]["result"]["slice"]["text"] == "10GiB"  # the profile's, not his word
    assert replies[3]["error"]["reason"] == "unknown_profile"
    assert [r["ok"] for r in replies[4:]] == [True] * (MAX_WAITERS - 1) + [False] * (11 - MAX_WAITERS)
    assert {r["error"]["reason"] for r in replies[4 + MAX_WAITERS - 1:]} == {"too_many"}
    [mine] = raw(lab, "alice", [request("by_kernel", kernel_id=kid)])
    assert mine["result"]["id"] == lease_id  # her kernel's lease is still the one found by its id


def test_a_refusal_through_the_service_names_what_would_start_now(lab):
    """The advice is the pool's own, judged by the service on the admin's profiles: a memory quota that
    refuses a 20 GiB kernel names the 10 GiB one that fits, by the name the launcher shows."""
    from jupyter_gpu_pool.pool import parse_profiles

    lab.configure(default_user_quota={"memory": "30GiB", "kernels": 4})
    lab.service()
    alice = lab.server("alice")
    assert alice.start_kernel("half")[0] == 201
    code, refused = alice.start_kernel("half")
    small = parse_profiles({"small": {"slice": "10GiB", "isolation": "soft"}})["small"]
    assert code == 403 and "GPU quota exceeded" in refused["message"], refused
    assert f"'{small.launcher_name}' would start now" in refused["message"]
    assert alice.start_kernel("small")[0] == 201  # and it does


def test_only_a_leases_own_user_renames_its_notebook(shared):
    lab, alice, kid, lease_id = shared
    [before] = raw(lab, "alice", [request("get", lease_id=lease_id)])
    replies = raw(lab, "bob", [request("relabel", lease_id=lease_id, label="bobs-name.ipynb")])
    assert replies[0]["error"]["reason"] == "lease_not_found", replies  # not his: as if it did not exist
    [after] = raw(lab, "alice", [request("get", lease_id=lease_id)])
    assert after["result"]["label"] == before["result"]["label"] != "bobs-name.ipynb"
    [too_long, renamed] = raw(lab, "alice", [request("relabel", lease_id=lease_id, label="x" * 5000),
                                             request("relabel", lease_id=lease_id, label="renamed.ipynb")])
    assert too_long["error"]["reason"] == "bad_request" and renamed["ok"], (too_long, renamed)
    [now] = raw(lab, "alice", [request("get", lease_id=lease_id)])
    assert now["result"]["label"] == "renamed.ipynb"
    raw(lab, "alice", [request("relabel", lease_id=lease_id, label=before["result"]["label"])])
