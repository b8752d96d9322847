"""A GPU held only while cells run, for kernel pods: a rule's ``hibernate_after_cell`` in the cluster, with
the real parts together (as tests/kube/test_kube_hibernation_e2e.py): a real jupyter_server (its
``ClusterHibernation`` hook and ``SleepTimers``), the real operator (admission, accounting) and the real
node agent checkpointing the pod's process on the stand-in driver.

After each cell ends, a kernel pod whose rule says ``hibernate_after_cell: 2s`` is asked to hibernate 2 s
later, without a warning, unless another cell starts first; the kernel's silent executes start nothing; its
next cell resumes it through the agent with its variables; the journal and the event say ``after_cell``,
as on one machine (tests/hibernation/test_after_cell.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from agent_standin import kernel, phase_of
from kube_helpers import Kube, wait_until
from test_kube_hibernation_e2e import start_on_gpu
from test_kube_server_extension import set_policy
from test_kube_server_hibernation import API, Cell, body, extension, jp_server_config  # noqa: F401

from jupyter_gpu_pool.cluster.resources import HIBERNATED, RUNNING
from jupyter_gpu_pool.devices import checkpoint as cp

BETWEEN_CELLS = {"name": "between-cells", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
                 "action": "hibernate", "hibernate_after_cell": "2s"}
S = cp.ProcessState


async def hibernated_at(kube: Kube, name: str, timeout: float = 30.0) -> float:
    """Wait until the kernel's GPUKernel is Hibernated; the monotonic time it was seen so."""
    await wait_until(lambda: _phase(kube, name, HIBERNATED), timeout=timeout, interval=0.05,
                     what="the kernel pod to hibernate after its cell")
    return time.monotonic()


async def asked_to_sleep(kube: Kube, name: str) -> bool:
    return (await kernel(kube, name))["spec"].get("desiredState") == "Hibernated"


async def policy_entries(jp_fetch, kid: str) -> list[tuple[str, str]]:
    """(kind, reason) of what the policy and the hook put on the journal for the kernel, oldest first."""
    recent = body(await jp_fetch(*API, "me"))["recent"]
    return [(e["kind"], e["reason"]) for e in reversed(recent) if e["kernel_id"] == kid]


@pytest.mark.slow
async def test_a_kernel_pod_sleeps_unwarned_after_its_cell_and_its_next_cell_wakes_it_with_its_variables(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node):
    await operator_factory(cluster, **{"GPUPoolOperator.hami_memory_scaling": 2.0})
    ext = await extension(jp_serverapp)
    try:
        await set_policy(kube, ext, [BETWEEN_CELLS])
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        await wait_until(lambda: _me_kernel(jp_fetch, kid, "sleeps_after_cell", 2.0), timeout=20,
                         what="GET me to say it sleeps 2 s after each cell")
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")

        await Cell(ws, "x = 41").run()
        ended = time.monotonic()
        await asyncio.sleep(1.2)
        assert not await asked_to_sleep(kube, name) and phase_of(await kernel(kube, name)) == RUNNING
        slept = await hibernated_at(kube, name) - ended

        assert 1.9 <= slept < 10, slept
        obj = await kernel(kube, name)
        assert obj["spec"]["hibernateReason"] == "after_cell"
        assert obj["status"]["hibernation"]["bytes"] == 6 * 2**30
        assert node.driver.procs[pid].state == S.CHECKPOINTED  # the real agent's checkpoint

        async def slice_free():
            me = body(await jp_fetch(*API, "me"))
            [k] = me["kernels"]
            [gpu] = body(await jp_fetch(*API, "pool"))["gpus"]
            return k["state"] == "hibernated" and me["usage"]["memory"] == 0 and gpu["used_memory"] == 0

        await wait_until(slice_free, timeout=20, what="its slice free in the operator's accounting")
        entries = [e for e in body(await jp_fetch(*API, "me"))["recent"] if e["kernel_id"] == kid]
        assert "warned" not in [e["kind"] for e in entries]
        [hibernated] = [e for e in entries if e["kind"] == "hibernated"]
        assert hibernated["reason"] == "after_cell" and "Asleep between cells" in hibernated["message"]
        [journal] = [e for e in await ext.backend.journal(kinds=("hibernated",)) if e.kernel_id == kid]
        assert journal.reason == "after_cell" and journal.detail["rule"] == "between-cells"
        assert journal.detail["decided"] <= journal.at

        cell = Cell(ws, "print(x + 1)")
        await asyncio.wait_for(cell.run(), 60)

        assert "42\n" in cell.texts()  # its variables were kept
        assert any(t.startswith("Resuming") for t in cell.texts())  # the cell resumed it, then ran
        assert node.driver.procs[pid].state == S.RUNNING  # the real agent's restore, on the GPU it came from
        assert node.driver.procs[pid].restores == 1 and node.driver.procs[pid].restored_on[0] == \
            obj["status"]["hibernation"]["devices"][0]
        await hibernated_at(kube, name)  # and 2 s after that cell, asleep again
        await wait_until(lambda: _entries_are(jp_fetch, kid, [("hibernated", "after_cell"), ("resumed", "cell"),
                                                               ("hibernated", "after_cell")]),
                         timeout=20, what="the journal: asleep, resumed by the cell, asleep again")
        ws.close()
    finally:
        await ext.stop_extension()


@pytest.mark.slow
async def test_a_cell_started_within_the_time_cancels_it_and_a_silent_execute_does_not_arm_it(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node):
    await operator_factory(cluster, **{"GPUPoolOperator.hami_memory_scaling": 2.0})
    ext = await extension(jp_serverapp)
    try:
        await set_policy(kube, ext, [BETWEEN_CELLS])
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")

        # a silent execute (a frontend's own code, not a cell) arms nothing
        await Cell(ws, "a = 1", silent=True).run()
        await asyncio.sleep(3.5)
        assert not await asked_to_sleep(kube, name) and phase_of(await kernel(kube, name)) == RUNNING
        assert ext.hibernator.timers.pending(kid) is None

        # a cell within the 2 s cancels the wait; the wait starts again at its end
        await Cell(ws, "x = 1").run()
        await asyncio.sleep(1.2)
        await Cell(ws, "y = 2").run()
        second = time.monotonic()
        await asyncio.sleep(1.3)  # 2.5 s after the first cell's end, 1.3 s after the second's
        assert not await asked_to_sleep(kube, name) and phase_of(await kernel(kube, name)) == RUNNING
        assert node.driver.procs[pid].state == S.RUNNING

        slept = await hibernated_at(kube, name) - second
        assert 1.9 <= slept < 10, slept
        assert node.driver.procs[pid].checkpoints == 1
        await wait_until(lambda: _entries_are(jp_fetch, kid, [("hibernated", "after_cell")]), timeout=20,
                         what="one hibernation on the journal, after the second cell")
        ws.close()
    finally:
        await ext.stop_extension()


@pytest.mark.slow
async def test_a_cell_while_its_hibernation_waits_for_the_operator_calls_it_off_and_runs(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node):
    """The operator is down when the wait ends: the server's request (spec.desiredState Hibernated) stands
    unanswered.  A cell run then is held, withdraws the request (compare-and-set: the operator's admission
    cannot come after it) and runs at once; when the operator is back it does not hibernate the kernel under
    that cell, unrecorded: the kernel sleeps 2 s after that cell, once, on the journal as after_cell."""
    settings = {"GPUPoolOperator.hami_memory_scaling": 2.0}
    operator = await operator_factory(cluster, **settings)
    ext = await extension(jp_serverapp)
    try:
        await set_policy(kube, ext, [BETWEEN_CELLS])
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")

        await Cell(ws, "x = 41").run()
        await asyncio.to_thread(operator.stop)
        await wait_until(lambda: asked_to_sleep(kube, name), timeout=15, what="the server's request to stand")
        assert phase_of(await kernel(kube, name)) == RUNNING

        cell = Cell(ws, "print(x + 1)")
        await asyncio.wait_for(cell.run(), 15)  # not the admission timeout's 30 s
        assert "42\n" in cell.texts()
        assert not await asked_to_sleep(kube, name)  # withdrawn
        assert node.driver.procs[pid].checkpoints == 0

        await operator_factory(cluster, **settings)
        await hibernated_at(kube, name, timeout=40)  # 2 s after that cell, by a new request
        assert node.driver.procs[pid].checkpoints == 1
        await wait_until(lambda: _entries_are(jp_fetch, kid, [("hibernated", "after_cell")]), timeout=20,
                         what="one hibernation on the journal and no resume of a kernel that never slept")
        ws.close()
    finally:
        await ext.stop_extension()


@pytest.mark.slow
async def test_a_kernel_pod_that_cannot_hibernate_is_left_alone_between_cells_and_said_so_once(
        cluster, operator_factory, jp_serverapp, jp_fetch, jp_ws_fetch, kube_sessions, kube, node, caplog):
    """HAMi without memory oversubscription: the operator refuses the first request for good (its words in
    the log, once); the kernel keeps running, is neither warned nor shut down, and is asked no more."""
    await operator_factory(cluster)
    ext = await extension(jp_serverapp)
    caplog.set_level(logging.INFO, logger="jupyter_gpu_pool.server_extension.sleep.timers")
    try:
        await set_policy(kube, ext, [BETWEEN_CELLS])
        await node.start()
        kid, name, pid = await start_on_gpu(jp_fetch, kube, node)
        ws = await jp_ws_fetch("api", "kernels", kid, "channels")

        await Cell(ws, "x = 1").run()
        await wait_until(lambda: _told(caplog), timeout=20, what="the refusal said in the log")
        obj = await kernel(kube, name)
        assert obj["spec"]["hibernateReason"] == "after_cell"  # asked once, refused, withdrawn
        asked = obj["metadata"]["generation"]
        await Cell(ws, "y = 2").run()
        await asyncio.sleep(3.0)

        obj = await kernel(kube, name)
        assert phase_of(obj) == RUNNING and obj["spec"]["desiredState"] == "Running"
        assert obj["metadata"]["generation"] == asked  # not asked again after the second cell
        assert node.driver.procs[pid].checkpoints == 0 and node.driver.procs[pid].state == S.RUNNING
        said = _told(caplog)
        assert len(said) == 1 and "HAMi without memory oversubscription" in said[0] and "between-cells" in said[0]
        kinds = [e["kind"] for e in body(await jp_fetch(*API, "me"))["recent"] if e["kernel_id"] == kid]
        assert not {"warned", "culled", "hibernated"} & set(kinds)
        ws.close()
    finally:
        await ext.stop_extension()


def _told(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cannot hibernate here" in r.getMessage()]


async def _phase(kube: Kube, name: str, phase: str) -> bool:
    return phase_of(await kernel(kube, name)) == phase


async def _me_kernel(jp_fetch, kid: str, key: str, value) -> bool:
    return any(k["kernel_id"] == kid and k.get(key) == value for k in body(await jp_fetch(*API, "me"))["kernels"])


async def _entries_are(jp_fetch, kid: str, expected: list[tuple[str, str]]) -> bool:
    return await policy_entries(jp_fetch, kid) == expected
