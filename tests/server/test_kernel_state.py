"""The state a kernel's card shows is the kernel's own: a kernel started over the REST API that no
browser (or any client) has talked to yet answers, and shows idle, not "starting" for ever.
A real jupyter_server and a real ipykernel."""

from __future__ import annotations

import asyncio

import pytest
from server_helpers import body, start_kernel, wait_until

pytestmark = pytest.mark.usefixtures("ext")

ME = ("gpu-pool", "api", "v1", "me")


async def test_a_kernel_started_over_rest_with_no_client_shows_idle_not_starting(jp_fetch, ext):
    kid = await start_kernel(jp_fetch)
    km = ext.serverapp.kernel_manager
    assert km.get_kernel(kid).execution_state == "starting"  # jupyter_server's word until a status comes
    await asyncio.sleep(1.0)  # (jupyter_server sets its last activity once it watches the kernel)
    started = km.get_kernel(kid).last_activity

    async def card():
        me = body(await jp_fetch(*ME))
        return next(k for k in me["kernels"] if k["kernel_id"] == kid)["execution_state"]

    assert await wait_until(lambda: _is(card(), "idle"), timeout=20, what="the card to show idle")
    assert km.get_kernel(kid).execution_state == "idle"  # jupyter_server's own API says so too
    assert km.get_kernel(kid).last_activity == started  # asking it is no activity: its idle time runs on
    rest = body(await jp_fetch("api", "kernels", kid))
    assert rest["execution_state"] == "idle" and rest["connections"] == 0  # still no client attached


async def _is(value, wanted) -> bool:
    return await value == wanted
