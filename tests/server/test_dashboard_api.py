"""What the UI's new views read and do, over REST on a real jupyter_server with real kernels: the
dashboard's readings (GET pool/telemetry), what each lease allows an admin, everyone's GPU time,
the profiles a user could start now, when the policy acts on an idle kernel, and Release /
Hibernate / Shut down on any kernel: here at once, in another server of the pool by a request that
server carries out. Non-admins get 403, bad input 400, and nothing changes."""

from __future__ import annotations

import json

import pytest
from server_helpers import BOB, ROOT, GiB, ScriptedReadings, body, start_kernel, wait_until
from test_api import API, fails, other_lease

pytestmark = pytest.mark.usefixtures("ext")

IDLE = [{"name": "lab", "idle_timeout": "10m", "gpu_idle_timeout": None, "warn": "1m", "max_hibernated": None,
         "action": "hibernate"}]


async def test_telemetry_gives_each_kernels_readings_over_the_window_to_admins_only(jp_fetch, pool_home, ext):
    kid = await start_kernel(jp_fetch)
    other_lease(pool_home, "bob", "bobs-kernel", "small")
    ScriptedReadings.set(3 * GiB, 40.0)
    ScriptedReadings.device = 55.0
    await wait_until(lambda: len(ext.sampler.history(kid)) >= 3, 30, what="three readings")

    data = body(await jp_fetch(*API, "pool", "telemetry", params={"window": "600"}, headers=ROOT))
    assert data["window"] == 600
    mine = next(k for k in data["kernels"] if k["kernel_id"] == kid)
    assert mine["owner"] == "alice" and mine["slice_memory"] == 10 * GiB and len(mine["gpus"]) == 1
    assert len(mine["samples"]) >= 3 and all(s[1:] == [3 * GiB, 40.0] for s in mine["samples"])
    assert [s[0] for s in mine["samples"]] == sorted(s[0] for s in mine["samples"])
    bobs = next(k for k in data["kernels"] if k["kernel_id"] == "bobs-kernel")
    assert bobs["samples"] == [] and bobs["held_since"] > 0  # another server's kernel: its slice, no readings
    gpu = next(g for g in data["gpus"] if g["uuid"] == mine["gpus"][0])
    assert gpu["utilization"] and all(v == 55.0 for _, v in gpu["utilization"])
    # a shorter window leaves the older readings out
    first = mine["samples"][0][0]
    window = data["now"] - first - 0.05
    short = body(await jp_fetch(*API, "pool", "telemetry", params={"window": str(window)}, headers=ROOT))
    kept = next(k for k in short["kernels"] if k["kernel_id"] == kid)["samples"]
    assert first not in [s[0] for s in kept] and all(s[0] >= short["now"] - window for s in kept)

    code, err = await fails(jp_fetch, *API, "pool", "telemetry", headers=BOB)
    assert code == 403 and err["reason"] == "not_admin"
    code, err = await fails(jp_fetch, *API, "pool", "telemetry")  # alice is no admin either
    assert code == 403


@pytest.mark.parametrize("window", ["ten", "0", "-5", "nan", "1e99", "9" * 400])
async def test_telemetry_refuses_a_bad_window_with_400(jp_fetch, window):
    code, err = await fails(jp_fetch, *API, "pool", "telemetry", params={"window": window}, headers=ROOT)
    assert code == 400 and err["reason"] == "bad_window" and "'window' must be a number of seconds" in err["message"]


@pytest.mark.pool_settings(budgets={"alice": {"gpu_hours": 10}, "students": {"gpu_hours": 4}})
async def test_the_pool_view_has_each_leases_actions_and_everyones_gpu_time(jp_fetch, pool_home):
    kid = await start_kernel(jp_fetch)
    other_lease(pool_home, "bob", "bobs-kernel", "small", groups=("students",))
    pool = body(await jp_fetch(*API, "pool", headers=ROOT))
    leases = {lease["kernel_id"]: lease for lease in pool["leases"]}
    mine = leases[kid]
    assert mine["here"] is True and mine["execution_state"] in ("idle", "starting") and mine["idle_since"] > 0
    assert mine["actions"] == ["release", "hibernate", "shutdown"]
    assert leases["bobs-kernel"]["here"] is False and leases["bobs-kernel"]["idle_since"] is None
    assert leases["bobs-kernel"]["actions"] == ["release", "hibernate", "shutdown"]  # asked of bob's server
    budgets = {b["user"]: b for b in pool["budgets"]}
    assert set(budgets) == {"alice", "bob"}  # alice's own; bob as a student (a member of the group's budget)
    assert budgets["alice"]["gpu_hours"] == 10 and budgets["alice"]["kind"] == "user"
    assert budgets["bob"]["gpu_hours"] == 4 and budgets["bob"]["scope"] == "students"


@pytest.mark.policy(rules=IDLE)
@pytest.mark.pool_settings(default_user_quota={"memory": "40GiB", "kernels": 2})
async def test_me_says_what_would_start_now_and_when_the_policy_acts(jp_fetch, pool_home, ext):
    kid = await start_kernel(jp_fetch)
    await wait_until(lambda: kid in ext.culler.seen, 30, what="a culling pass over the kernel")
    me = body(await jp_fetch(*API, "me"))
    [k] = me["kernels"]
    nxt = k["next_action"]
    assert nxt["action"] == "hibernate" and nxt["reason"] == "idle"
    assert 9 * 60 < nxt["at"] - me["now"] <= 10 * 60
    profiles = {p["name"]: p for p in me["profiles"]}
    assert profiles["small"]["launcher_name"] == "Python 3 · GPU 10 GiB"
    assert profiles["small"]["starts_now"] is True and profiles["half"]["starts_now"] is True
    assert profiles["whole"]["starts_now"] is False  # a GPU is free, but 10 + 40 GiB would pass her 40 GiB
    other_lease(pool_home, "carol", "carols-kernel", "whole")  # the other GPU is taken now
    await start_kernel(jp_fetch)  # and alice holds her 2 kernels
    me = body(await jp_fetch(*API, "me"))
    assert {p["name"]: p["starts_now"] for p in me["profiles"]} == {"small": False, "half": False, "whole": False}


async def test_shutdown_and_hibernate_on_a_kernel_of_this_server(jp_fetch, pool_home, ext):
    kid = await start_kernel(jp_fetch)
    code, err = await fails(jp_fetch, *API, "kernels", kid, "shutdown", method="POST", body="{}", headers=BOB)
    assert code == 403 and err["reason"] == "not_yours"
    code, err = await fails(jp_fetch, *API, "kernels", kid, "hibernate", method="POST", body='{"now": 1}')
    assert code == 400 and err["reason"] == "unknown_keys"
    assert pool_home.ledger().by_kernel(kid).state == "active"  # nothing changed

    r = await jp_fetch(*API, "kernels", kid, "hibernate", method="POST", body="{}")
    assert r.code == 202 and body(r) == {"action": "hibernate", "kernel_id": kid}
    await wait_until(lambda: pool_home.ledger().by_kernel(kid).state == "hibernated", 30, what="the hibernation")
    code, err = await fails(jp_fetch, *API, "kernels", kid, "hibernate", method="POST", body="{}")
    assert code == 409 and err["reason"] == "not_holding"

    # An admin shuts it down: it ends, and its user is told an admin did it.
    r = await jp_fetch(*API, "kernels", kid, "shutdown", method="POST", body="{}", headers=ROOT)
    assert r.code == 202 and body(r)["action"] == "shutdown"
    km = ext.serverapp.kernel_manager
    await wait_until(lambda: kid not in km, 30, what="the kernel to end")
    recent = body(await jp_fetch(*API, "me"))["recent"]
    released = next(e for e in recent if e["kind"] == "released" and e["kernel_id"] == kid)
    assert released["reason"] == "admin" and "Shut down by an admin (root)" in released["message"]
    assert released["action"] == "shutdown"


async def test_an_admin_asks_another_server_and_that_server_carries_it_out(jp_fetch, pool_home, ext):
    # bob's kernel runs in bob's server: the admin's request goes on the pool's journal.
    other_lease(pool_home, "bob", "bobs-kernel", "small")
    r = await jp_fetch(*API, "kernels", "bobs-kernel", "shutdown", method="POST", body="{}", headers=ROOT)
    assert r.code == 202 and body(r) == {"action": "shutdown", "kernel_id": "bobs-kernel", "requested": True}
    [asked] = pool_home.ledger().journal(kinds=("requested",))
    assert asked.owner == "bob" and asked.reason == "admin" and asked.detail["action"] == "shutdown"
    assert asked.detail["by"] == "root"
    # alice's own kernel in another server of hers: she acts on it from there.
    other_lease(pool_home, "alice", "alices-elsewhere", "small")
    code, err = await fails(jp_fetch, *API, "kernels", "alices-elsewhere", "release", method="POST", body="{}")
    assert code == 409 and err["reason"] == "other_server"
    code, err = await fails(jp_fetch, *API, "kernels", "bobs-kernel", "shutdown", method="POST", body="{}")
    assert code == 403 and err["reason"] == "not_yours"

    # This server is the kernel's own: a request on the journal for its kernel is carried out at its next pass.
    kid = await start_kernel(jp_fetch)
    lease = pool_home.ledger().by_kernel(kid)
    await ext.backend.record("requested", lease_id=lease.id, kernel_id=kid, owner="alice", reason="admin",
                             detail={"action": "release", "by": "root", "name": lease.label})
    await wait_until(lambda: pool_home.ledger().by_kernel(kid).state == "hibernated", 30,
                     what="the requested release (the rule hibernates)")
    entries = pool_home.ledger().journal(kinds=("hibernated",))
    assert entries[0].kernel_id == kid and entries[0].reason == "admin"
    assert "Hibernated by an admin (root)" in entries[0].detail["message"]


async def test_admin_actions_report_unknown_kernels_and_bad_bodies(jp_fetch):
    code, err = await fails(jp_fetch, *API, "kernels", "nope", "shutdown", method="POST", body="{}", headers=ROOT)
    assert code == 404 and err["reason"] == "no_such_kernel"
    code, err = await fails(jp_fetch, *API, "kernels", "nope", "hibernate", method="POST", body="[1]", headers=ROOT)
    assert code == 400 and err["reason"] == "bad_body"
    code, err = await fails(jp_fetch, *API, "kernels", "nope", "shutdown", method="POST", body=json.dumps({"x": 1}),
                            headers=ROOT)
    assert code == 400 and err["reason"] == "unknown_keys"


async def test_a_resume_is_explained_once(jp_fetch, pool_home):
    """The ledger journals a resume and the server records it with what it moved: the user reads it once."""
    kid = await start_kernel(jp_fetch)
    await jp_fetch(*API, "kernels", kid, "hibernate", method="POST", body="{}")
    await wait_until(lambda: pool_home.ledger().by_kernel(kid).state == "hibernated", 30, what="the hibernation")
    await jp_fetch(*API, "kernels", kid, "resume", method="POST", body="{}")
    await wait_until(lambda: pool_home.ledger().by_kernel(kid).state == "active" and not
                     pool_home.ledger().by_kernel(kid).phase, 30, what="the resume")

    async def explained() -> list[dict]:
        return [r for r in body(await jp_fetch(*API, "me"))["recent"] if r["kind"] == "resumed"]

    resumed: list[dict] = []

    async def recorded() -> bool:
        resumed[:] = await explained()
        return any(r["declared"] for r in resumed)

    await wait_until(recorded, 30, what="the server's record of the resume")
    assert len(pool_home.ledger().journal(kinds=("resumed",))) == 2  # the ledger's entry and the server's
    assert len(resumed) == 1 and resumed[0]["declared"] is True and resumed[0]["name"] == ""
    decisions = body(await jp_fetch(*API, "pool", headers=ROOT))["decisions"]
    assert [d["declared"] for d in decisions if d["kind"] == "resumed"] == [True]  # the admin's log, once too


async def test_telemetry_keeps_kernels_hibernated_or_ended_in_the_window_with_what_they_held(jp_fetch, pool_home):
    """The dashboard's plots agree with its table: a whole-GPU kernel holds its GPU's memory, and a kernel
    hibernated or shut down within the window is drawn for the time it held its slice, not dropped."""
    ledger = pool_home.ledger()
    whole = other_lease(pool_home, "bob", "bobs-whole", "whole")
    sleeping = other_lease(pool_home, "bob", "bobs-sleeper", "small")
    ended = other_lease(pool_home, "carol", "carols-ended", "small")
    ledger.hibernate(sleeping.id, 0, "idle")
    ledger.release(ended.id, "shutdown")

    data = body(await jp_fetch(*API, "pool", "telemetry", params={"window": "600"}, headers=ROOT))
    kernels = {k["kernel_id"]: k for k in data["kernels"]}
    assert set(kernels) >= {"bobs-whole", "bobs-sleeper", "carols-ended"}
    w = kernels["bobs-whole"]
    assert w["whole"] and w["slice_memory"] is None and w["state"] == "active"
    assert w["held"] == [[w["held_since"], None, list(whole.gpus)]]  # held until now
    for kid, lease, state in (("bobs-sleeper", sleeping, "hibernated"), ("carols-ended", ended, "ended")):
        k = kernels[kid]
        assert k["state"] == state and k["slice_memory"] == 10 * GiB and k["gpus"] == list(lease.gpus)
        [(since, until, gpus)] = k["held"]  # held from its grant to its hibernation or release, then nothing
        assert since == lease.created and until is not None and until > since and gpus == list(lease.gpus)
    assert data["start"] == pytest.approx(data["now"] - 600)
