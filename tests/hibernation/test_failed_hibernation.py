"""A hibernation the policy ordered that fails, but is undone (every process put back running on the GPU
slice it still holds): the kernel keeps running with its variables, its user is told so in plain words,
and the culler neither shuts it down instead nor tries again on every pass.  A real jupyter_server, real
kernels, a real ledger; only the checkpoint driver is the stand-in (hibernation_standin.py), failing once.
"""

from __future__ import annotations

import asyncio

import pytest
from kernel_helpers import wait_until
from server_hibernation_helpers import Server, texts

from jupyter_gpu_pool.devices import checkpoint as cp

HIBERNATE_IDLE = {"name": "hibernate-idle", "idle_timeout": 3, "warn": 1, "gpu_idle_timeout": None,
                  "max_hibernated": None, "action": "hibernate"}
CHECKPOINT = "cuCheckpointProcessCheckpoint"


@pytest.fixture
def server(jp_fetch, ext, standin) -> Server:
    return Server(jp_fetch, ext, standin)


@pytest.mark.pool_settings(policy=[HIBERNATE_IDLE])
async def test_a_recovered_failed_hibernation_keeps_the_kernel_running_and_is_not_retried_every_pass(
        server, channels, events, standin):
    kid, pid = await server.gpu_kernel()
    ch = await channels(kid)
    await ch.replies(await ch.execute("x = 42"))
    standin.fail_next(CHECKPOINT, pid, cp.CUDA_ERROR_NOT_PERMITTED)

    failed = await events.action("refused", kid, timeout=30)  # hibernation_failed is announced as a refusal
    assert failed["reason"] == "hibernation_failed"
    assert failed["message"].startswith("Hibernation failed: ") and "the kernel kept running" in failed["message"]
    assert "CUDA_ERROR_NOT_PERMITTED" in failed["message"]

    await asyncio.sleep(1.5)  # five culling passes: none shuts it down, none tries again yet
    km = server.ext.serverapp.kernel_manager
    assert kid in km and km.get_kernel(kid).provisioner.pid == pid
    lease = server.lease(kid)
    assert lease.state == "active" and lease.phase == ""
    assert standin.procs[pid].state == cp.ProcessState.RUNNING
    assert [c for c in standin.calls if c == (CHECKPOINT, pid)] == [(CHECKPOINT, pid)]
    assert "culled" not in events.actions(kid)
    journal = [e for e in server.ext.backend.pool.ledger.journal() if e.kernel_id == kid]
    assert [e.kind for e in journal if e.kind in ("culled", "released")] == []
    recorded = [e for e in journal if e.kind == "hibernation_failed"]
    assert len(recorded) == 1 and recorded[0].detail["recovered"] is True
    assert recorded[0].detail["message"] == failed["message"]
    me = await server.me()
    assert any(item["kind"] == "hibernation_failed" and item["kernel_id"] == kid
               and "the kernel kept running" in item["message"] for item in me["recent"])
    assert (await server.me_kernel(kid))["state"] == "active"
    got = await ch.replies(await ch.execute("print(x)"))  # its variables are all there
    assert "42\n" in texts(got)

    # Once its rule's idle time has passed again, the policy warns and hibernates it as usual.
    hibernated = await events.action("hibernated", kid, timeout=30)
    assert hibernated["reason"] == "idle"
    assert server.lease(kid).state == "hibernated"
    assert standin.procs[pid].state == cp.ProcessState.CHECKPOINTED
