"""A rule the admin gave no name is shown by whom it covers, not as "rule 0": on the kernel (GET me),
in "What happened" (the journal's entries), in the words of the action and in the lease's release
reason.  A real jupyter_server, a real kernel, a real ledger, the policy acting on its own."""

from __future__ import annotations

import pytest
from server_helpers import body, start_kernel, subscribe, wait_until

from jupyter_gpu_pool.pool import RELEASED

pytestmark = pytest.mark.usefixtures("ext")

ME = ("gpu-pool", "api", "v1", "me")
UNNAMED = {"match": {"profile": "small"}, "idle_timeout": 3, "gpu_idle_timeout": None, "warn": 1.5}


@pytest.mark.policy(rules=[UNNAMED])
@pytest.mark.extension(hibernator_class=None)
async def test_an_unnamed_rule_is_shown_by_whom_it_covers_everywhere(jp_fetch, jp_ws_fetch, pool_home):
    events = await subscribe(jp_ws_fetch)
    kid = await start_kernel(jp_fetch)
    me = body(await jp_fetch(*ME))
    kernel = next(k for k in me["kernels"] if k["kernel_id"] == kid)
    assert kernel["rule"] == "rule 0"  # the rule's identity, as the journal and the planner's trace keep it
    assert kernel["rule_label"] == "for profile small"

    culled = (await events.through("culled", kid))[-1]
    assert culled["message"].startswith("Shut down by the pool's rule for profile small. Idle for ")
    assert "rule 0" not in culled["message"]

    async def recorded():
        recent = body(await jp_fetch(*ME))["recent"]
        return next((r for r in recent if r["kind"] == "culled" and r["kernel_id"] == kid), None)

    entry = await wait_until(recorded, what="the culled entry in What happened")
    assert entry["rule"] == "rule 0" and entry["rule_label"] == "for profile small"
    lease = await wait_until(lambda: next((x for x in pool_home.ledger().leases(states=(RELEASED,))
                                           if x.kernel_id == kid), None), what="the lease released")
    assert lease.reason == "culled: idle (rule for profile small)"
    events.close()
