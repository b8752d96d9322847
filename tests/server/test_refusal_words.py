"""What the server writes of a refused start, a queue, a resume and a Keep alive: words that agree with the
panel, notebooks by name, and a refusal in the server's log as one warning line (it is an expected answer)."""

from __future__ import annotations

import json
import logging

import pytest
from server_helpers import body, execute, wait_until
from tornado.httpclient import HTTPClientError

pytestmark = pytest.mark.usefixtures("ext")

API = ("gpu-pool", "api", "v1")
ONE_GPU = [{"name": "Test GPU", "memory": "40GiB", "count": 1}]


async def start_session(jp_fetch, kernel: str, path: str):
    body_ = {"path": path, "type": "notebook", "name": path, "kernel": {"name": kernel}}
    return await jp_fetch("api", "sessions", method="POST", body=json.dumps(body_))


class ServerLog(logging.Handler):
    """The server's log as a file handler on its logger would write it (every record that passes its filters)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self, record: logging.LogRecord) -> str:
        return self.format(record)  # with its traceback, where it carries one


@pytest.mark.pool_settings(inventory=ONE_GPU)
async def test_a_refused_start_is_one_warning_line_in_the_server_log(jp_fetch, jp_serverapp):
    """No traceback (jupyter_client logs a failed start's exception twice), no request-header dump
    (jupyter_server's request log does that for a 5xx), no "wrote error": one warning line, with the
    notebook and the pool's words; the client still gets the refusal's own status and message."""
    assert (await start_session(jp_fetch, "gpu-pool-whole", "holder.ipynb")).code == 201
    log = ServerLog()
    root = logging.getLogger()
    root.addHandler(log)
    old_level = root.level
    root.setLevel(logging.DEBUG)
    try:
        # as JupyterLab 4 asks: the session's path ends in an id, its name is the notebook's
        jupyterlab = {"path": "work/4f0c2d9e-6b1a", "name": "wanted.ipynb", "type": "notebook",
                      "kernel": {"name": "gpu-pool-small"}}
        for call in (lambda: jp_fetch("api", "sessions", method="POST", body=json.dumps(jupyterlab)),
                     lambda: jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu-pool-small"}))):
            with pytest.raises(HTTPClientError) as err:
                await call()
            assert err.value.code == 503
            reply = json.loads(err.value.response.body)
            assert reply["message"].startswith("The GPU pool is full") and "holder.ipynb (1 whole GPU, slice " \
                "held for" in reply["message"]
    finally:
        root.removeHandler(log)
        root.setLevel(old_level)
    loud = [r for r in log.records if r.levelno >= logging.WARNING]
    texts = [log.text(r) for r in loud]
    assert len(loud) == 2, "\n".join(texts)  # one line per refused start
    sessions, kernels = texts
    assert sessions.startswith("WARNING ServerApp 503 POST ") and "/api/sessions (alice): the GPU pool refused to " \
        "start a kernel for 'work/wanted.ipynb': The GPU pool is full" in sessions
    assert "/api/kernels (alice): the GPU pool refused to start a kernel: The GPU pool is full" in kernels
    everything = "\n".join(log.text(r) for r in log.records)
    assert "Traceback" not in everything and not any(r.exc_info for r in log.records)
    assert '"Host"' not in everything and "User-Agent" not in everything  # no header dump
    assert "wrote error" not in everything and "500 POST" not in everything


@pytest.mark.pool_settings(inventory=ONE_GPU)
async def test_a_refusal_names_the_notebook_and_how_long_each_kernel_held_its_slice(jp_fetch, pool_home):
    """The refusal says "slice held for", not "active for" (the panel says "idle since …" of the same kernel),
    and its journal entry, what "What happened" and the admin's log show, names the notebook, not an id."""
    assert (await start_session(jp_fetch, "gpu-pool-whole", "holder.ipynb")).code == 201
    with pytest.raises(HTTPClientError) as err:
        await start_session(jp_fetch, "gpu-pool-small", "wanted.ipynb")
    message = json.loads(err.value.response.body)["message"]
    assert "holder.ipynb (1 whole GPU, slice held for " in message and "active for" not in message
    refused = pool_home.ledger().journal(kinds=("refused",))
    assert len(refused) == 1 and refused[0].detail["name"] == "wanted.ipynb"
    recent = body(await jp_fetch(*API, "me"))["recent"]
    assert [r["name"] for r in recent if r["kind"] == "refused"] == ["wanted.ipynb"]


async def test_a_resume_says_it_was_the_users_doing(jp_fetch, jp_ws_fetch, pool_home):
    """A resume for the user's own cell or Resume button is recorded as theirs (no policy rule), in words."""
    kid = body(await start_session(jp_fetch, "gpu-pool-small", "mine.ipynb"))["kernel"]["id"]
    for how in ("button", "cell"):
        await jp_fetch(*API, "kernels", kid, "hibernate", method="POST", body="{}")
        await wait_until(lambda: pool_home.ledger().by_kernel(kid).state == "hibernated", 30, what="hibernated")
        if how == "button":
            await jp_fetch(*API, "kernels", kid, "resume", method="POST", body="{}")
        else:
            tab = await execute(jp_ws_fetch, kid, "x = 1")
            while json.loads(await tab.read_message())["header"]["msg_type"] != "execute_reply":
                pass
            tab.close()

        def recorded(count=1 if how == "button" else 2):
            entries = [e for e in pool_home.ledger().journal(kinds=("resumed",)) if e.detail.get("source") == "policy"]
            return len(entries) == count and entries[0]

        entry = await wait_until(recorded, 30, what="the server's record of the resume")
        assert entry.detail["rule"] is None and entry.detail["name"] == "mine.ipynb"
        words = "Resumed at your request" if how == "button" else "Resumed for the cell you ran"
        assert entry.detail["message"].startswith(words), entry.detail["message"]
        assert entry.reason == ("user" if how == "button" else "cell")


@pytest.mark.pool_settings(inventory=ONE_GPU)
async def test_the_queue_names_the_notebook_as_it_is_called_now(jp_fetch, pool_home, ext):
    """A hibernated kernel's resume waiting in the queue: GET me's and GET pool's queue name its notebook as
    the session calls it now (after a rename), and the profile by its display name."""
    kid = body(await start_session(jp_fetch, "gpu-pool-small", "before.ipynb"))["kernel"]["id"]
    await jp_fetch(*API, "kernels", kid, "hibernate", method="POST", body="{}")
    await wait_until(lambda: pool_home.ledger().by_kernel(kid).state == "hibernated", 30, what="hibernated")
    sessions = body(await jp_fetch("api", "sessions"))
    sid = next(s["id"] for s in sessions if s["kernel"]["id"] == kid)
    await jp_fetch("api", "sessions", sid, method="PATCH", body=json.dumps({"path": "after.ipynb"}))
    assert (await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpu-pool-whole"}))).code == 201
    lease = pool_home.ledger().by_kernel(kid)
    place = pool_home.ledger().enqueue("alice", kid, lease.profile, lease.slice, lease_id=lease.id, label=lease.label)
    try:
        me = body(await jp_fetch(*API, "me"))
        entry = next(q for q in me["queue"] if q["kernel_id"] == kid)
        assert entry["name"] == "after.ipynb" and entry["profile_display_name"] == "GPU 10 GiB"
        pool = body(await jp_fetch(*API, "pool", headers={"Authorization": "token root-token"}))
        assert [w["label"] for w in pool["queue"] if w["kernel_id"] == kid] == ["after.ipynb"]
    finally:
        pool_home.ledger().dequeue(place.id)


@pytest.mark.policy(rules=[{"name": "everyone", "slice_at": "first-cell", "idle_timeout": None,
                            "gpu_idle_timeout": None, "max_hibernated": None}])
@pytest.mark.pool_settings(default_user_quota={"kernels": 2})
async def test_a_refusal_names_a_kernel_without_a_notebook_by_its_id_and_one_without_a_gpu_as_such(jp_fetch,
                                                                                                     pool_home):
    """A REST client's session on the server's root folder names no notebook: its kernel is "kernel 1a2b3c4d" in
    a refusal and "" (no name) in the views, never "."; an MPS kernel that has not run a cell holds no GPU
    yet, and a refusal lists it as that, not as "hibernated for 2s"."""
    nameless = body(await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "", "name": "", "type": "notebook", "kernel": {"name": "gpu-pool-small"}})))["kernel"]["id"]
    third = body(await start_session(jp_fetch, "gpu-pool-half", "third.ipynb"))["kernel"]["id"]
    assert pool_home.ledger().by_kernel(third).awaits_first_cell
    assert pool_home.ledger().by_kernel(nameless).label == ""  # not "."
    with pytest.raises(HTTPClientError) as err:
        await start_session(jp_fetch, "gpu-pool-small", "wanted.ipynb")
    message = json.loads(err.value.response.body)["message"]
    assert f"kernel {nameless[:8]} (10 GiB, no GPU yet)" in message, message
    assert "third.ipynb (20 GiB · 50%, no GPU yet)" in message and "hibernated" not in message, message
    assert " . (" not in message and ": . " not in message
    me = body(await jp_fetch(*API, "me"))
    assert {k["kernel_id"]: k["name"] for k in me["kernels"]}[nameless] == ""
    assert {k["kernel_id"]: k["state"] for k in me["kernels"]}[third] == "no_gpu_yet"
    pool = body(await jp_fetch(*API, "pool", headers={"Authorization": "token root-token"}))
    assert {lease["kernel_id"]: lease["state"] for lease in pool["leases"]}[third] == "no_gpu_yet"  # the admin's table
