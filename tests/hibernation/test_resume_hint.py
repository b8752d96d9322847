"""Resume before the cell runs: ``POST kernels/{id}/hint`` through a real jupyter_server, on the declared
test pool (2 x 40 GiB), with real ipykernels, the real ledger and queue and real kernel websockets.

A hint wakes a hibernated kernel only where a slice is free and nobody waits; it never queues, never
takes a waiter's room, never warns anyone.  A kernel it woke that runs no cell goes back to sleep,
calmly.  Only its user may hint, and not too often.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from kernel_helpers import wait_until
from server_hibernation_helpers import API, Server, body, texts
from test_declared_hibernation import HIBERNATE, fill_pool
from tornado.httpclient import HTTPClientError

from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED
from jupyter_gpu_pool.pool.hibernation import HibernationSettings
from jupyter_gpu_pool.pool.profiles import parse_profile

GiB = 2**30
OWNER = "alice"
BOB = {"Authorization": "token bob-token"}
ROOT = {"Authorization": "token root-token"}  # an admin


class TokenUsers(IdentityProvider):
    """The server's own token is alice (the pool's owner, no admin); ``bob-token`` is bob, ``root-token`` root."""

    def get_user(self, handler):
        auth = handler.request.headers.get("Authorization", "")
        token = auth[len("token "):].strip() if auth.lower().startswith("token ") else handler.get_argument("token", "")
        name = OWNER if token and token == self.token else {"bob-token": "bob", "root-token": "root"}.get(token)
        if not name:
            return None
        handler._token_authenticated = True
        return User(username=name)


@pytest.fixture
def jp_server_config(pool_home, request):
    """alice's server on the declared pool; rules hibernate; the extension's settings from the marker."""
    from traitlets.config import Config

    from jupyter_gpu_pool.server_extension.sleep.hook import PoolHibernation

    settings = {"owner": OWNER, "policy": [HIBERNATE], "unix_groups": False}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    pool_home.configure(**settings)
    ext = {"cull_interval": 0.3, "telemetry_interval": 0.5, "hibernator_class": PoolHibernation,
           "admin_users": ["root"], "hint_sleep_after": 30}
    marker = request.node.get_closest_marker("extension")
    if marker is not None:
        ext.update(marker.kwargs)
    return Config({"ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": True},
                                 "identity_provider_class": TokenUsers},
                   "GPUPoolExtension": ext})


@pytest.fixture
def server(jp_fetch, ext) -> Server:
    return Server(jp_fetch, ext)


async def hint(server: Server, kid: str, headers: dict | None = None):
    return await server.fetch(*API, "kernels", kid, "hint", method="POST", body="{}", headers=headers or {})


async def refused(server: Server, kid: str, headers: dict | None = None) -> tuple[int, dict, object]:
    with pytest.raises(HTTPClientError) as err:
        await hint(server, kid, headers)
    return err.value.code, json.loads(err.value.response.body), err.value.response.headers


def journal(server: Server, kid: str, since: float = 0.0) -> list:
    """The kernel's journal entries since ``since``, oldest first."""
    return [e for e in reversed(server.ext.backend.pool.ledger.journal()) if e.kernel_id == kid and e.at >= since]


async def event_where(events, predicate, timeout: float = 20.0) -> dict:
    """The first event the server pushed that ``predicate`` accepts, reading more as they come."""
    deadline = time.monotonic() + timeout
    while True:
        for e in events.seen:
            if predicate(e):
                return e
        left = deadline - time.monotonic()
        assert left > 0, f"no such event; saw {[(e.get('action'), e.get('reason')) for e in events.seen]}"
        try:
            events.seen.append(json.loads(await asyncio.wait_for(events.ws.read_message(), left)))
        except asyncio.TimeoutError:
            continue


async def hibernated_kernel(server: Server, channels) -> tuple[str, object]:
    kid, _ = await server.gpu_kernel()
    ch = await channels(kid)
    await ch.replies(await ch.execute("x = 42"))
    await server.hibernate(kid)
    return kid, ch


async def test_a_hint_wakes_a_hibernated_kernel_when_there_is_room_and_its_cell_then_runs_at_once(
        server, channels, events):
    kid, ch = await hibernated_kernel(server, channels)

    r = await hint(server, kid)

    answer = body(r)
    assert r.code == 202 and answer["woken"] is True and answer["state"] in ("resuming", "active")
    assert answer["message"].startswith("Waking up")
    await wait_until(lambda: server.lease(kid).state == ACTIVE and not server.lease(kid).phase, what="awake")
    resumed = await events.action("resumed", kid)
    assert resumed["reason"] == "hint" and resumed["declared"] is True
    assert server.ext.hibernator.hinted(kid)
    assert server.ext.backend.pool.ledger.waiters() == []  # it never queued

    got = await ch.replies(await ch.execute("print(x)"))

    assert "42\n" in texts(got) and not [t for t in texts(got) if t.startswith("Resuming")]  # no wait, no notice
    assert not server.ext.hibernator.hinted(kid)  # the cell came: the hint was right
    recorded = [(e.kind, e.reason) for e in journal(server, kid) if e.detail.get("source") == "policy"]
    assert recorded == [("hibernated", "user"), ("resumed", "hint")]  # one resume, on the hint

    r = await hint(server, kid)  # awake: nothing to wake
    assert r.code == 200 and body(r) == {**body(r), "woken": False, "reason": "not_hibernated", "state": "active"}


@pytest.mark.extension(hint_sleep_after=2.5)
@pytest.mark.pool_settings(policy=[{**HIBERNATE, "idle_timeout": 4, "warn": 1}])
async def test_a_kernel_woken_on_a_hint_that_runs_no_cell_sleeps_again_unwarned(server, channels, events):
    """Its last cell is long past the rule's idle timeout: a culler that judged it would warn at once.
    It is not warned; after hint_sleep_after it is hibernated again, recorded as an unused hint."""
    kid, _ch = await hibernated_kernel(server, channels)
    await asyncio.sleep(4.5)  # idle for longer than the rule's timeout (it sleeps, so nothing is due)
    since = time.time()

    assert (await hint(server, kid)).code == 202
    await wait_until(lambda: server.lease(kid).state == ACTIVE, what="awake")
    awake = time.monotonic()
    await wait_until(lambda: server.lease(kid).state == HIBERNATED and not server.lease(kid).phase, timeout=30,
                     what="asleep again")
    slept = time.monotonic() - awake

    assert 2.0 <= slept < 10, slept
    entries = journal(server, kid, since)
    assert "warned" not in [e.kind for e in entries] and "culled" not in [e.kind for e in entries]
    again = [e for e in entries if e.kind == "hibernated" and e.detail.get("source") == "policy"]
    assert len(again) == 1 and again[0].reason == "hint_unused" and again[0].detail["rule"] == "hibernation"
    assert "no cell ran within 2.5 s" in again[0].detail["message"]
    await event_where(events, lambda e: e.get("action") == "hibernated" and e.get("reason") == "hint_unused")
    assert "warned" not in events.actions(kid)
    assert not server.ext.hibernator.hinted(kid)


async def test_a_hint_does_nothing_on_a_full_pool_or_while_someone_waits_and_the_waiter_is_served_first(
        server, channels):
    pool = server.ext.backend.pool
    kid, _ch = await hibernated_kernel(server, channels)
    blockers = fill_pool(pool)

    r = await hint(server, kid)  # the pool is full

    assert r.code == 200 and body(r)["woken"] is False and body(r)["reason"] == "no_room"
    assert "No GPU slice is free now" in body(r)["message"]
    await asyncio.sleep(0.5)
    assert (server.lease(kid).state, server.lease(kid).phase) == (HIBERNATED, "")
    assert pool.ledger.waiters() == []  # it took no place in the queue

    pool.ledger.release(blockers[0].id)  # 40 GiB free: room for the kernel's 10 GiB, or for bob's start
    waiter = pool.ledger.enqueue("bob", "bobs-start", "full", parse_profile("full", "40GiB").slice)

    r = await hint(server, kid)  # room, but someone waits

    assert r.code == 200 and body(r)["woken"] is False and body(r)["reason"] == "others_waiting"
    await asyncio.sleep(0.5)
    assert (server.lease(kid).state, server.lease(kid).phase) == (HIBERNATED, "")
    assert [w.id for w in pool.ledger.waiters()] == [waiter.id]
    from jupyter_gpu_pool.pool import LeaseRequest, Profile, SliceSpec

    served = pool.ledger.allocate(LeaseRequest(owner="bob", kernel_id="bobs-start",  # the waiter takes its room
                                               profile=Profile("full", SliceSpec.parse("40GiB"), "soft", "full")),
                                  pool.settings.quotas, waiter_id=waiter.id)
    assert served.gpus == blockers[0].gpus and pool.ledger.waiters() == []
    kinds = [e.kind for e in journal(server, kid)]
    assert kinds.count("resumed") == 0 and "refused" not in kinds and "warned" not in kinds  # nobody warned


async def test_a_kernel_woken_on_a_hint_gives_its_slice_back_unwarned_as_soon_as_someone_waits(server, channels):
    """hint_sleep_after is 30 s here: the waiter does not wait for it."""
    from jupyter_gpu_pool.pool import LeaseRequest, Profile, SliceSpec

    pool = server.ext.backend.pool
    kid, _ch = await hibernated_kernel(server, channels)
    assert (await hint(server, kid)).code == 202
    await wait_until(lambda: server.lease(kid).state == ACTIVE and not server.lease(kid).phase, what="awake")
    gpu = server.lease(kid).gpus
    for name, size in (("bob-rest", "30GiB"), ("bob-other", "40GiB")):  # the rest of its GPU, then the other GPU
        pool.ledger.allocate(LeaseRequest(owner="bob", kernel_id=name, profile=Profile(name, SliceSpec.parse(size),
                                                                                        "soft", name)),
                             pool.settings.quotas)
    since = time.time()
    small = Profile("small", SliceSpec.parse("10GiB"), "soft", "small")
    waiter = pool.ledger.enqueue("bob", "bobs-start", "small", small.slice)

    await wait_until(lambda: server.lease(kid).state == HIBERNATED and not server.lease(kid).phase, timeout=10,
                     what="asleep again for the waiter")

    assert time.time() - since < 8
    served = pool.ledger.allocate(LeaseRequest(owner="bob", kernel_id="bobs-start", profile=small),
                                  pool.settings.quotas, waiter_id=waiter.id)
    assert served.gpus == gpu  # the room the hint had taken
    # the policy's entry (why it slept) is written once the move is done: wait for it, not for the state alone
    policy_slept = await wait_until(lambda: [e for e in journal(server, kid, since) if e.kind == "hibernated"
                                             and e.detail.get("source") == "policy"], timeout=10, what="its entry")
    assert "warned" not in [e.kind for e in journal(server, kid, since)]
    [again] = policy_slept
    assert again.reason == "hint_unused" and "someone is waiting for a GPU slice" in again.detail["message"]


@pytest.mark.pool_settings(default_user_quota={"memory": "10GiB", "kernels": 4})
async def test_a_hint_over_the_users_quota_does_nothing_and_records_no_refusal(server, channels):
    kid, ch = await hibernated_kernel(server, channels)
    await server.gpu_kernel()  # the user's whole 10 GiB quota, taken while the first slept
    since = time.time()

    r = await hint(server, kid)

    assert r.code == 200 and body(r)["woken"] is False and body(r)["reason"] == "not_now"
    assert "quota" in body(r)["message"]
    await asyncio.sleep(0.5)
    assert (server.lease(kid).state, server.lease(kid).phase) == (HIBERNATED, "")
    assert not journal(server, kid, since) and server.ext.backend.pool.ledger.waiters() == []
    got = await ch.replies(await ch.execute("print(x)"))  # a cell still says why, as before hints
    assert "GPUPoolResumeError" in [c.get("ename") for _ch, kind, c in got if kind == "error"]


@pytest.mark.pool_settings(hibernation_declared_restore_cost="1.5s + 0s/GiB")
async def test_a_cell_sent_while_the_hinted_resume_is_under_way_waits_for_that_resume(server, channels, events):
    """The modelled restore (1.5 s) keeps the hinted resume under way when the cell arrives: the cell joins it
    (one resume, no second), and the kernel, used, does not go back to sleep."""
    kid, ch = await hibernated_kernel(server, channels)
    since = time.time()

    assert (await hint(server, kid)).code == 202
    assert server.lease(kid).phase == "resuming"
    started = time.monotonic()
    got = await ch.replies(await ch.execute("print(x)"))

    assert "42\n" in texts(got) and time.monotonic() - started < 5
    resumed = [e for e in journal(server, kid, since) if e.kind == "resumed"]
    assert len(resumed) == 2 and {e.detail.get("source") for e in resumed} == {None, "policy"}  # ledger + record
    assert (await events.action("resumed", kid))["reason"] == "cell"  # it was for the cell after all
    assert not server.ext.hibernator.hinted(kid)


@pytest.mark.pool_settings(hibernation_declared_restore_cost="0.306s + 0.179s/GiB")
async def test_the_restore_cost_model_delays_a_declared_resume_by_the_h100_line(server, channels, events):
    kid, ch = await hibernated_kernel(server, channels)  # a 10 GiB slice: 0.306 + 1.79 = 2.096 s
    await ch.replies(await ch.execute("print(x)"))
    resumed = await events.action("resumed", kid)
    assert 2.09 <= resumed["duration"] < 4
    assert HibernationSettings().declared_restore_seconds(10 * GiB) == 0.0  # the default: no delay


async def test_hints_on_someone_elses_kernel_are_refused_as_any_kernel_action_and_change_nothing(
        server, channels):
    kid, _ch = await hibernated_kernel(server, channels)

    for headers in (BOB, ROOT):  # another user, and an admin (a hint is its own user's guess)
        code, err, _ = await refused(server, kid, headers)
        assert code == 403 and err["reason"] == "not_yours", err
    code, err, _ = await refused(server, "no-such-kernel")
    assert code == 404 and err["reason"] == "no_such_kernel"
    with pytest.raises(HTTPClientError) as bad:
        await server.fetch(*API, "kernels", kid, "hint", method="POST", body='{"now": true}')
    assert bad.value.code == 400
    await asyncio.sleep(0.5)
    assert (server.lease(kid).state, server.lease(kid).phase) == (HIBERNATED, "")
    assert not server.ext.hibernator.hinted(kid)


@pytest.mark.extension(hint_rate_limit=3)
async def test_a_flood_of_hints_is_answered_429_with_retry_after_per_user(server, channels):
    kid, _ch = await hibernated_kernel(server, channels)

    answers = [(await hint(server, kid)).code for _ in range(3)]
    code, err, headers = await refused(server, kid)

    assert answers[0] == 202 and set(answers[1:]) == {200}  # woken once; then awake already
    assert code == 429 and err["reason"] == "too_many_hints" and "at most 3 a minute" in err["message"]
    assert 1 <= int(headers["Retry-After"]) <= 60
    code, err, _ = await refused(server, "no-such-kernel", BOB)  # bob has his own allowance
    assert code == 404
