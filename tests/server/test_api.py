"""The REST API against the ledger it reports: who sees what, who may act, and clear 4xx errors."""

from __future__ import annotations

import json

import pytest
from server_helpers import BOB, ROOT, GiB, body, start_kernel, wait_until
from tornado.httpclient import HTTPClientError

from jupyter_gpu_pool.pool import LeaseRequest, build_quota_book
from jupyter_gpu_pool.pool.profiles import parse_profile

pytestmark = pytest.mark.usefixtures("ext")
API = ("gpu-pool", "api", "v1")


async def fails(jp_fetch, *parts, **kwargs) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(*parts, **kwargs)
    return err.value.code, json.loads(err.value.response.body)


def other_lease(pool_home, owner: str, kernel_id: str, profile: str = "small", groups=()):
    """A lease held by another user's server on the same ledger file."""
    ledger = pool_home.ledger()
    spec = pool_home.settings["profiles"][profile]
    request = LeaseRequest(owner=owner, kernel_id=kernel_id, profile=parse_profile(profile, spec), groups=groups)
    return ledger.allocate(request, build_quota_book({}, {}, {}, {}))


async def test_me_and_pool_return_what_the_ledger_holds(jp_fetch, pool_home, ext):
    kid = await start_kernel(jp_fetch)
    other_lease(pool_home, "bob", "bobs-kernel", "small", groups=("students",))
    other_lease(pool_home, "carol", "carols-kernel", "half")
    ledger = pool_home.ledger()

    me = body(await jp_fetch(*API, "me"))
    assert me["user"] == "alice" and me["admin"] is False
    assert [k["kernel_id"] for k in me["kernels"]] == [kid]  # never another user's kernel
    k = me["kernels"][0]
    lease = ledger.by_kernel(kid)
    assert k["lease_id"] == lease.id and k["profile"] == "small" and k["memory_limit"] == 10 * GiB
    assert k["gpus"][0]["uuid"] == lease.gpus[0] and k["gpus"][0]["source"] == "declared"
    assert k["memory_used"] is None and k["utilization"]["current"] is None  # declared GPU: no reading
    assert k["state"] == "active" and "release" in k["actions"]
    assert me["usage"] == ledger.usage_of("alice").to_dict()
    snap = ledger.snapshot()
    assert me["pool"]["memory_free"] == sum(u.free_memory for u in snap.gpus)
    assert me["pool"]["gpus"] == 2 and me["pool"]["declared"] is True

    pool = body(await jp_fetch(*API, "pool", headers=ROOT))
    assert {lease["kernel_id"] for lease in pool["leases"]} == {kid, "bobs-kernel", "carols-kernel"}
    assert {lease["owner"] for lease in pool["leases"]} == {"alice", "bob", "carol"}
    by_uuid = {u.gpu.uuid: u for u in snap.gpus}
    for gpu in pool["gpus"]:
        assert gpu["used_memory"] == by_uuid[gpu["uuid"]].memory
        assert gpu["slices"] == by_uuid[gpu["uuid"]].leases
    assert pool["policy"]["dry_run"] is False and len(pool["policy"]["rules"]) == 1

    bobs = body(await jp_fetch(*API, "me", headers=BOB))
    assert bobs["user"] == "bob" and [k["kernel_id"] for k in bobs["kernels"]] == ["bobs-kernel"]
    assert bobs["kernels"][0]["here"] is False and bobs["kernels"][0]["actions"] == []  # runs in bob's server


@pytest.mark.pool_settings(default_user_quota={"memory": "40GiB", "kernels": 4},
                           group_quotas={"students": {"memory": "60GiB"}})
async def test_me_reports_quota_group_usage_and_queue(jp_fetch, pool_home):
    other_lease(pool_home, "bob", "bobs-kernel", "small", groups=("students",))
    other_lease(pool_home, "alice", "alices-other-server-kernel", "small", groups=("students",))
    me = body(await jp_fetch(*API, "me"))
    assert me["quota"] == {"memory": 40 * GiB, "sm_percent": None, "kernels": 4}
    assert me["usage"] == {"memory": 10 * GiB, "sm_percent": 0, "kernels": 1}
    assert me["groups"] == [{"name": "students", "quota": {"memory": 60 * GiB, "sm_percent": None, "kernels": None},
                             "usage": {"memory": 20 * GiB, "sm_percent": 0, "kernels": 2}}]
    assert me["queue"] == []
    pool_home.ledger().enqueue("alice", "queued-kernel", "whole", parse_profile("whole", "whole").slice)
    me = body(await jp_fetch(*API, "me"))
    assert me["queue"][0]["kernel_id"] == "queued-kernel" and me["queue"][0]["for"] == "start"
    queued = next(k for k in me["kernels"] if k["kernel_id"] == "queued-kernel")
    assert queued["state"] == "queued" and queued["queue_position"] == 1


async def test_non_admin_gets_403_from_pool_and_from_other_users_kernels(jp_fetch, pool_home):
    kid = await start_kernel(jp_fetch)
    code, err = await fails(jp_fetch, *API, "pool", headers=BOB)
    assert code == 403 and err["reason"] == "not_admin" and "admin" in err["message"]
    code, err = await fails(jp_fetch, *API, "pool")  # alice is no admin either
    assert code == 403
    for action in ("snooze", "release"):
        code, err = await fails(jp_fetch, *API, "kernels", kid, action, method="POST", body="{}", headers=BOB)
        assert code == 403 and err["reason"] == "not_yours"
    assert pool_home.ledger().by_kernel(kid).state == "active"  # nothing changed
    # an admin may act on it
    r = await jp_fetch(*API, "kernels", kid, "snooze", method="POST", body="{}", headers=ROOT)
    assert r.code == 200 and body(r)["snoozed_until"] is not None


@pytest.mark.parametrize("action, payload, reason, words", [
    ("snooze", "not json", "bad_json", "not valid JSON"),
    ("snooze", "[1, 2]", "bad_body", "must be a JSON object"),
    ("snooze", '{"minutes": 5}', "unknown_keys", "the allowed key is seconds"),
    ("snooze", '{"seconds": "ten"}', "bad_snooze", "must be a number of seconds"),
    ("snooze", '{"seconds": true}', "bad_snooze", "must be a number of seconds"),
    ("snooze", '{"seconds": -5}', "bad_snooze", "more than 0"),
    ("snooze", '{"seconds": 999999}', "bad_snooze", "at most 1800 seconds"),
    ("release", '{"now": true}', "unknown_keys", "send {}"),
    ("release", '"x"', "bad_body", "must be a JSON object"),
    # hostile bodies: a 400 with a message, never a 500
    # (short ids: a test's id is in every report and in PYTEST_CURRENT_TEST, which the kernels it starts inherit,
    # and one environment string over 128 KiB makes their launch fail with "Argument list too long")
    pytest.param("snooze", "[" * 100_000 + "]" * 100_000, "bad_json", "nests too deeply", id="snooze-deep-list"),
    pytest.param("snooze", '{"seconds": ' + "9" * 400 + "}", "bad_snooze", "must be a number of seconds",
                 id="snooze-400-digits"),
    ("snooze", '{"seconds": NaN}', "bad_snooze", "must be a number of seconds"),
    ("snooze", '{"seconds": 1e999}', "bad_snooze", "must be a number of seconds"),
    pytest.param("release", '{"a": ' * 50_000 + "1" + "}" * 50_000, "bad_json", "nests too deeply",
                 id="release-deep-object"),
])
async def test_malformed_payloads_get_400_with_a_message(jp_fetch, pool_home, action, payload, reason, words):
    kid = await start_kernel(jp_fetch)
    code, err = await fails(jp_fetch, *API, "kernels", kid, action, method="POST", body=payload)
    assert code == 400 and err["reason"] == reason and words in err["message"]
    assert pool_home.ledger().by_kernel(kid).state == "active"


async def test_unknown_and_foreign_kernels(jp_fetch, pool_home):
    code, err = await fails(jp_fetch, *API, "kernels", "no-such-kernel", "release", method="POST", body="{}")
    assert code == 404 and err["reason"] == "no_such_kernel"
    other_lease(pool_home, "alice", "alices-kernel-elsewhere")
    code, err = await fails(jp_fetch, *API, "kernels", "alices-kernel-elsewhere", "release", method="POST",
                            body="{}")
    assert code == 409 and err["reason"] == "other_server" and "another Jupyter server" in err["message"]


async def test_polling_the_api_is_not_user_activity(jp_fetch):
    before = body(await jp_fetch("api", "status"))["last_activity"]
    for _ in range(3):
        await jp_fetch(*API, "me")
        await jp_fetch(*API, "pool", headers=ROOT)
    assert body(await jp_fetch("api", "status"))["last_activity"] == before


async def test_metrics_join_the_servers_metrics(jp_fetch, ext):
    from jupyter_gpu_pool.server_extension import metrics

    kid = await start_kernel(jp_fetch)
    await wait_until(lambda: kid in ext.culler.seen, what="a culling pass over the kernel")
    metrics.count("culled", "idle")
    text = (await jp_fetch("metrics")).body.decode()
    assert 'jupyter_gpu_pool_gpu_memory_used_bytes{gpu="DECLARED-local-0",name="Test GPU"} 1.073741824e+10' in text
    assert 'jupyter_gpu_pool_gpu_memory_total_bytes{gpu="DECLARED-local-1",name="Test GPU"} 4.294967296e+10' in text
    assert 'jupyter_gpu_pool_gpu_slices_used{gpu="DECLARED-local-0"} 1.0' in text
    assert 'jupyter_gpu_pool_gpu_slices_total{gpu="DECLARED-local-0",profile="small"} 4.0' in text
    assert 'jupyter_gpu_pool_gpu_slices_free{gpu="DECLARED-local-0",profile="small"} 3.0' in text
    assert 'jupyter_gpu_pool_leases{state="active"} 1.0' in text
    assert 'jupyter_gpu_pool_policy_actions_total{action="culled",dry_run="false",reason="idle"}' in text
    assert "jupyter_gpu_pool_kernel_gpu_utilization_percent{" not in text  # no reading on a declared GPU


async def start_session(jp_fetch, kernel: str, path: str):
    body_ = {"path": path, "type": "notebook", "name": path, "kernel": {"name": kernel}}
    return await jp_fetch("api", "sessions", method="POST", body=json.dumps(body_))


@pytest.mark.pool_settings(default_user_quota={"sm_percent": 40})
async def test_a_percent_in_a_refusal_reaches_both_start_endpoints_as_written(jp_fetch):
    """A profile "20GiB,50%" refused for quota: JupyterLab's "Error Starting Kernel" dialog (POST /api/sessions)
    and POST /api/kernels both read "50%", never "50%%", with the refusal's own status."""
    from tornado.httpclient import HTTPClientError

    replies = []
    for call in (jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu-pool-half"})),
                 start_session(jp_fetch, "gpu-pool-half", "half.ipynb")):
        with pytest.raises(HTTPClientError) as err:
            await call
        replies.append((err.value.code, json.loads(err.value.response.body)["message"]))
    for code, message in replies:
        assert code == 403 and message.startswith(
            "GPU quota exceeded: 'Python 3 · GPU 20 GiB · 50%' needs a 50% SM share (of a GPU's compute), more than "
            "your whole quota of 40%: it cannot start even with no kernel running.")
        assert "'Python 3 · GPU 10 GiB' would start now." in message and "%%" not in message
    assert replies[0][1] == replies[1][1]  # the same words on both endpoints


@pytest.mark.pool_settings(inventory=[{"name": "Test GPU", "memory": "40GiB", "count": 1}])
async def test_a_percent_in_a_full_pool_refusal_reaches_the_user_as_written(jp_fetch):
    from tornado.httpclient import HTTPClientError

    assert (await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu-pool-whole"}))).code == 201
    with pytest.raises(HTTPClientError) as err:
        await start_session(jp_fetch, "gpu-pool-half", "half.ipynb")
    message = json.loads(err.value.response.body)["message"]
    assert err.value.code == 503 and "20 GiB · 50%" in message and "%%" not in message
