"""GPU-hour budgets on a shared box: the user's server warns at 90% and acts at 100% with the settings
the service gives it; and where a user's own server does not act (its user turned the policy off),
the service ends the kernel itself once the grace is over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from service_helpers import raw, request, wait_for

pytestmark = pytest.mark.timeout(300)

# A 10 GiB slice of a 40 GiB GPU costs 0.25 GPU-hours an hour: this budget lasts that many seconds of it.
def budget(seconds: float) -> dict:
    return {"alice": {"gpu_hours": 0.25 * seconds / 3600, "period": "day"}}


POLICY = [{"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "warn": 1, "action": "shutdown"}]


def _journal(lab, name: str, *kinds: str) -> list[dict]:
    [reply] = raw(lab, name, [request("journal", kinds=list(kinds))])
    return reply["result"]


def _lease_of(lab, name: str, kernel_id: str) -> dict | None:
    [reply] = raw(lab, name, [request("leases", states=["active", "hibernated", "released"])])
    return next((x for x in reply["result"] if x["kernel_id"] == kernel_id), None)


@pytest.mark.slow
def test_a_kernel_is_warned_at_90_percent_of_the_budget_and_shut_down_at_100_through_the_service(lab):
    lab.configure(budgets=budget(20), policy=POLICY)
    lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201, kernel
    kid = kernel["id"]
    standing = alice.me()["budget"]
    assert standing["gpu_hours"] == pytest.approx(0.25 * 20 / 3600) and standing["period"] == "day"
    warned = wait_for(lambda: [e for e in _journal(lab, "alice", "warned") if e["kernel_id"] == kid], timeout=90,
                      what="the budget warning")
    assert warned[0]["reason"] == "budget" and "GPU hours budgeted today are used" in warned[0]["detail"]["message"]
    culled = wait_for(lambda: [e for e in _journal(lab, "alice", "culled") if e["kernel_id"] == kid], timeout=90,
                      what="the shutdown at 100%")
    assert culled[0]["reason"] == "budget"
    assert culled[0]["at"] > warned[0]["at"]  # warned first (at 90%), acted on at 100%
    lease = wait_for(lambda: (x := _lease_of(lab, "alice", kid)) and x["state"] == "released" and x, what="released")
    assert lease["reason"] == "culled: budget (rule 'lab')"
    assert alice.request("GET", f"api/kernels/{kid}")[0] == 404
    spent = alice.me()["budget"]
    assert spent["used_hours"] >= spent["gpu_hours"] * 0.99
    code, refused = alice.start_kernel()  # nothing starts until the budget resets
    assert code == 403 and refused["message"].startswith("GPU time used up") and "resets on" in refused["message"]
    # She sees her GPU time in `status`; bob sees nothing of hers; an admin (root) sees everyone's.
    status = [sys.executable, "-m", "jupyter_gpu_pool.cli", "status"]
    [hers] = json.loads(lab.run_as("alice", [*status, "--json"]).stdout)["gpu_time"]
    assert hers["user"] == "alice" and hers["used_hours"] >= hers["gpu_hours"] * 0.99
    assert "GPU time:" in lab.run_as("alice", status).stdout and "(used up)" in lab.run_as("alice", status).stdout
    assert json.loads(lab.run_as("bob", [*status, "--json"]).stdout)["gpu_time"] == []
    admin = subprocess.run([*status, "--json"], env={**os.environ, "JUPYTER_GPU_POOL_SOCKET": lab.socket},
                           capture_output=True, text=True, timeout=120)
    assert [x["user"] for x in json.loads(admin.stdout)["gpu_time"]] == ["alice"], admin.stderr


@pytest.mark.slow
def test_at_100_percent_a_kernel_on_a_declared_gpu_is_hibernated_and_its_resume_refused_until_the_reset(lab):
    """The rule's action is hibernate: on a declared GPU the kernel keeps its process (nothing to move) and
    gives its slice back; hibernated time is free, and resuming it is refused with when the budget resets."""
    lab.configure(budgets=budget(20), policy=[{**POLICY[0], "action": "hibernate"}])
    lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201, kernel
    kid = kernel["id"]
    holder = wait_for(lambda: (x := _lease_of(lab, "alice", kid)) and x["holder_pid"], what="the kernel's process")
    warned = wait_for(lambda: [e for e in _journal(lab, "alice", "warned") if e["kernel_id"] == kid], timeout=90,
                      what="the budget warning")
    assert warned[0]["reason"] == "budget" and "GPU hours budgeted today are used" in warned[0]["detail"]["message"]
    assert _lease_of(lab, "alice", kid)["state"] == "active"  # warned at 90%, not acted on yet
    hibernated = wait_for(lambda: [e for e in _journal(lab, "alice", "hibernated") if e["kernel_id"] == kid],
                          timeout=90, what="the hibernation at 100%")
    assert hibernated[0]["reason"] == "budget" and hibernated[0]["at"] > warned[0]["at"]
    lease = _lease_of(lab, "alice", kid)
    assert lease["state"] == "hibernated" and lease["gpus"] == []  # the slice is back in the pool
    assert psutil.pid_exists(holder) and alice.request("GET", f"api/kernels/{kid}")[0] == 200  # the kernel lives on
    assert not _journal(lab, "alice", "culled")  # hibernated, not shut down
    # The resume's answer waits for the pool's word (a slice, a queue place, or this refusal); the refusal also
    # reaches the user as an event and in GET me's recent entries, as any resume's outcome does.
    code, reply = alice.request("POST", f"gpu-pool/api/v1/kernels/{kid}/resume", {})
    assert code == 403 and reply["reason"] == "budget_exceeded", reply
    refused = wait_for(lambda: [e for e in alice.me()["recent"] if e["kind"] == "refused" and e["kernel_id"] == kid],
                       what="the resume's refusal")
    assert refused[0]["reason"] == "budget_exceeded" and refused[0]["action"] == "resume"
    resets = time.strftime("%a %d %b at %H:%M", time.localtime(alice.me()["budget"]["resets_at"]))
    assert "GPU time used up" in refused[0]["message"] and f"resets on {resets}" in refused[0]["message"]
    assert reply["message"] == refused[0]["message"]
    lease = _lease_of(lab, "alice", kid)
    assert lease["state"] == "hibernated" and lease["gpus"] == [] and not lease["phase"]  # and it stays so


@pytest.mark.slow
def test_the_service_ends_a_kernel_past_its_budget_when_its_server_does_not(lab):
    lab.configure(budgets=budget(3), service={"budget_grace": 2})
    lab.service()
    # alice's server passes over its kernels once, at its start, and never again: nothing of hers acts
    alice = lab.server("alice", args=("--GPUPoolExtension.cull_interval=100000",))
    code, kernel = alice.start_kernel()
    assert code == 201, kernel
    kid = kernel["id"]
    holder = wait_for(lambda: (x := _lease_of(lab, "alice", kid)) and x["holder_pid"], what="the kernel's process")
    process = psutil.Process(holder)
    lease = wait_for(lambda: (x := _lease_of(lab, "alice", kid)) and x["state"] == "released" and x, timeout=90,
                     what="the service to end the kernel")
    assert lease["reason"] == "budget: GPU time used up (ended by the pool service)"
    process.wait(timeout=30)  # its process ended with it (not only its lease)
    assert not _journal(lab, "alice", "warned", "culled")  # her server did nothing: the service did it
    code, refused = alice.start_kernel()
    assert code == 403 and refused["message"].startswith("GPU time used up")
