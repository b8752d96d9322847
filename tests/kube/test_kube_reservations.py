"""A reservation through the operator on the test cluster, with a real jupyter_server (``pool_backend =
"kubernetes"``, its culler and hook ``ClusterHibernation``), the real operator and the test-only stand-in for the
node agent's moves (tests/kube/agent_standin.py): the same scene as on one machine
(tests/hibernation/test_reservation_server.py).

A reservation for group ml101 opens seconds after the test's kernels are up (the GPUPoolPolicy's window, its
lead time a few seconds: time compressed through the settings); two non-members' idle kernels hold the room;
they are warned with the reason and hibernated (variables kept) before the window; a member's kernel is
admitted at once at the window; a non-member's start a lead time into the window borrows the unused room, is
told so, and is hibernated with a warning when a member asks (the member's start waits for it, then runs)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid

import pytest
from agent_standin import kernel, phase_of, report_free
from kube_helpers import HAMI_NODE, PROFILES, GiB, install, pod_processes, wait_until
from test_kube_server_hibernation import API, Cell, agent, body, extension, jp_server_config  # noqa: F401 (fixtures)

from jupyter_gpu_pool.cluster.resources import (API_VERSION, GROUP, HIBERNATED, KERNEL_KIND, KERNELS, POLICIES,
                                                RUNNING, VERSION, kernel_name)

NODE, GPU_A = "gpu-node-1", "GPU-aaaa"
# HAMi with deviceMemoryScaling 2: the node admits twice its GPUs' memory at the scheduler (so a hibernated
# kernel's memory can be used by others), its labels say what the GPUs really hold (2 x 40 GiB: the room).
CLASS_NODE = {**HAMI_NODE, "allocatable": {**HAMI_NODE["allocatable"], "nvidia.com/gpu": "20",
                                           "nvidia.com/gpumem": str(4 * 40960)}}
RULE = {"name": "class-time", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
        "action": "hibernate", "warn": 2}


@pytest.fixture
async def cluster(cluster_factory):
    c = cluster_factory(nodes=[CLASS_NODE])
    await install(c)
    yield c


def clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M")


async def reserve(kube, *, opens_in: float, lead: float, lasts: float) -> tuple[float, float]:
    """The admin's GPUPoolPolicy: the rule, and "ML 101 lab" (all 80 GiB of the node) for group ml101, once,
    opening ``opens_in`` seconds from now; its (start, end)."""
    now = time.time()
    start, end = int(now + opens_in), int(now + opens_in + lasts)
    moment = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    await kube.custom.create_cluster_custom_object(GROUP, VERSION, POLICIES, {
        "apiVersion": API_VERSION, "kind": "GPUPoolPolicy", "metadata": {"name": "default"},
        "spec": {"rules": [RULE], "reservations": [{
            "name": "ML 101 lab", "groups": ["ml101"], "start": moment(start), "end": moment(end),
            "timezone": "UTC", "memory": "80GiB", "lead": lead}]}})
    return start, end


async def member_starts(kube, owner: str = "ann") -> str:
    """A member's kernel, as her own server would ask for it (a 40 GiB slice)."""
    kid = uuid.uuid4().hex
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, {
        "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": kernel_name(kid)},
        "spec": {"owner": owner, "kernelId": kid, "profile": "big", "launch": 1}})
    return kernel_name(kid)


async def recent(jp_fetch, kid: str) -> list[dict]:
    """This server's record of what its culler did to a kernel, oldest first."""
    return [e for e in reversed(body(await jp_fetch(*API, "me"))["recent"]) if e["kernel_id"] == kid]


async def start(jp_fetch) -> str:
    return body(await jp_fetch("api", "kernels", method="POST", body='{"name": "gpu-pool-kubernetes-small"}'))["id"]


@pytest.mark.slow
async def test_a_reservation_through_the_operator_makes_its_room_before_the_window_and_takes_borrowed_room_back(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, agent):
    await operator_factory(cluster, **{"GPUPoolOperator.hami_memory_scaling": 2.0,
                                       "GPUPoolOperator.heartbeat_timeout": 600.0,  # the members' kernels have no server
                                       "GPUPool.profiles": {**PROFILES, "big": {"slice": "40GiB"}}})
    await kube.quota("group", "ml101", members=["ann"], kernels=10)
    ext = await extension(jp_serverapp)
    try:
        a, b = await start(jp_fetch), await start(jp_fetch)
        ws = await jp_ws_fetch("api", "kernels", a, "channels")
        await Cell(ws, "x = 42").run()
        start_at, end = await reserve(kube, opens_in=12, lead=8, lasts=600)
        await room_made_before_the_window(jp_fetch, kube, (a, b), start_at)

        # at the window: the member's kernel is admitted at once, into her room
        await wait_until(lambda: time.time() >= start_at, timeout=30, what="the window")
        first = await member_starts(kube)
        await wait_until(lambda: _phase(kube, first, RUNNING), timeout=30, what="the member's kernel to run")
        st = (await kernel(kube, first))["status"]
        assert "borrowed" not in st and "waiting" not in st

        await wait_until(lambda: time.time() >= start_at + 8, timeout=30, what="borrowing")
        second = await borrowed_room_taken_back(jp_fetch, kube)

        # the member leaves; a cell on the first kernel resumes it into the free room (borrowed again): its
        # variables are there
        for name in (first, second):
            await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)
        await report_free(kube, NODE, {GPU_A: 70 * GiB})
        cell = Cell(ws, "print(x)")
        await asyncio.wait_for(cell.run(), 90)
        assert "42\n" in cell.texts()
        assert (await kernel(kube, kernel_name(a)))["status"]["borrowed"] == ["ML 101 lab"] and time.time() < end
        ws.close()
    finally:
        await ext.stop_extension()


async def room_made_before_the_window(jp_fetch, kube, kernels: tuple[str, ...], start_at: float) -> None:
    """Before the window: the idle kernels are warned with the reason, then hibernated (the least that makes the
    80 GiB: both 10 GiB slices), their pods' processes and variables kept; others read what is reserved."""
    pods = {kid: (await kernel(kube, kernel_name(kid)))["status"]["pod"] for kid in kernels}
    for kid in kernels:
        await wait_until(lambda kid=kid: _phase(kube, kernel_name(kid), HIBERNATED), timeout=60,
                         what=f"{kid} hibernated for the reservation")
        warned, hibernated = await wait_until(lambda kid=kid: _done(jp_fetch, kid), timeout=20,
                                              what="the hibernation on record")
        assert warned["reason"] == "reserved" and hibernated["reason"] == "reserved"
        assert warned["message"].startswith(f"The GPU room this kernel holds is reserved for ML 101 lab from "
                                            f"{clock(start_at)}: this kernel will be hibernated")
        assert hibernated["at"] - warned["at"] >= 2 and hibernated["at"] < start_at  # warned its time, in time
        assert (await kernel(kube, kernel_name(kid)))["spec"]["hibernateReason"] == "reserved"
        assert pod_processes(pods[kid])  # its process lives on: a hibernation, not a shutdown
    [shown] = body(await jp_fetch(*API, "me"))["reservations"]
    assert shown["member"] is False and shown["words"].startswith("80 GiB reserved for ML 101 lab from")


async def borrowed_room_taken_back(jp_fetch, kube) -> str:
    """A lead time into the window: a non-member's new kernel borrows what the member leaves, and is told so; the
    member asks for 40 GiB more, where 30 GiB is free: she waits, told her place, the borrowing kernel is warned
    and hibernated for her, and her kernel runs.  Her second kernel's name."""
    c = await start(jp_fetch)
    assert (await kernel(kube, kernel_name(c)))["status"]["borrowed"] == ["ML 101 lab"]
    told = next(k for k in body(await jp_fetch(*API, "me"))["kernels"] if k["kernel_id"] == c)["borrowed"]
    assert told.startswith("Borrowed from the room reserved for ML 101 lab until") and "member needs" in told

    second = await member_starts(kube)
    waiting = await wait_until(lambda: _waiting(kube, second), timeout=20, what="the member's start to wait")
    assert waiting["reason"] == "WaitingForRoom" and waiting["waiting"]["position"] == 1
    assert waiting["message"].startswith("Waiting for GPU room: ML 101 lab: 80 GiB reserved until")
    await wait_until(lambda: _phase(kube, kernel_name(c), HIBERNATED), timeout=60, what="the borrower hibernated")
    await wait_until(lambda: _phase(kube, second, RUNNING), timeout=30, what="the member's second kernel to run")
    warned, hibernated = await wait_until(lambda: _done(jp_fetch, c), timeout=20, what="the borrower's record")
    assert warned["reason"] == "reserved" and "and a member needs it" in warned["message"]
    assert hibernated["at"] - warned["at"] >= 2
    assert "borrowed" not in (await kernel(kube, second))["status"]
    return second


async def _phase(kube, name: str, phase: str) -> bool:
    return phase_of(await kernel(kube, name)) == phase


async def _waiting(kube, name: str) -> dict | None:
    st = (await kernel(kube, name)).get("status") or {}
    return st if st.get("waiting") else None


async def _done(jp_fetch, kid: str) -> tuple[dict, dict] | None:
    """The warning for a reservation, and the hibernation that followed it."""
    entries = [e for e in await recent(jp_fetch, kid) if e["kind"] in ("warned", "hibernated")]
    warned = next((e for e in entries if e["kind"] == "warned" and e["reason"] == "reserved"), None)
    hibernated = next((e for e in entries if e["kind"] == "hibernated" and warned and e["at"] >= warned["at"]), None)
    return (warned, hibernated) if hibernated else None


async def test_a_policys_bad_reservation_is_marked_invalid_naming_it_and_changes_nothing(cluster, operator_factory,
                                                                                        kube):
    """An unknown time zone, or room the GPU nodes cannot hold (200 GiB on a node of 2 x 40 GiB), is written on
    the policy's status naming the reservation and the field; the operator keeps deciding as before (a
    non-member's kernel starts during the window that could not fit), and the fixed policy is valid."""
    await operator_factory(cluster)
    now = time.time()
    moment = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    lab = {"name": "Lab", "groups": ["ml101"], "start": moment(now - 60), "end": moment(now + 3600),
           "timezone": "Mars/Olympus", "memory": "200GiB", "lead": 0}
    await kube.custom.create_cluster_custom_object(GROUP, VERSION, POLICIES, {
        "apiVersion": API_VERSION, "kind": "GPUPoolPolicy", "metadata": {"name": "default"},
        "spec": {"rules": [], "reservations": [lab]}})
    said = await wait_until(lambda: _policy_status(kube, False), timeout=20, what="the policy marked invalid")
    assert said["message"].startswith("reservations[0] ('Lab').timezone: 'Mars/Olympus' is not a time zone")
    await kube.custom.patch_cluster_custom_object(GROUP, VERSION, POLICIES, "default", {"spec": {"reservations": [
        {**lab, "timezone": "UTC"}]}}, _content_type="application/merge-patch+json")
    said = await wait_until(lambda: _policy_status(kube, False, "cannot fit"), timeout=20, what="the fit judged")
    assert said["message"] == ("reservations[0] ('Lab'): it reserves 200 GiB on GPUs that hold 80 GiB: it cannot "
                               "fit the pool")
    kid = uuid.uuid4().hex
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, {
        "apiVersion": API_VERSION, "kind": KERNEL_KIND, "metadata": {"name": kernel_name(kid)},
        "spec": {"owner": "alice", "kernelId": kid, "profile": "small", "launch": 1}})
    await wait_until(lambda: _phase(kube, kernel_name(kid), RUNNING), timeout=30, what="alice's kernel to run")
    await kube.custom.patch_cluster_custom_object(GROUP, VERSION, POLICIES, "default", {"spec": {"reservations": [
        {**lab, "timezone": "UTC", "memory": "80GiB"}]}}, _content_type="application/merge-patch+json")
    await wait_until(lambda: _policy_status(kube, True), timeout=20, what="the fixed policy marked valid")


async def _policy_status(kube, valid: bool, words: str = "") -> dict | None:
    st = (await kube.custom.get_cluster_custom_object(GROUP, VERSION, POLICIES, "default")).get("status") or {}
    return st if st.get("valid") is valid and words in st.get("message", "") else None
