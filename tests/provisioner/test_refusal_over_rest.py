"""A refusal reaches the frontend through jupyter_server's REST API with the pool's message.

`POST /api/kernels` answers with the refusal's own status (403 quota, 503 pool full).
`POST /api/sessions` (what JupyterLab calls when it opens a notebook) wraps every start error
as a 500 with the error's text as its message (jupyter_server's SessionRootHandler); the text
is the pool's message, not a traceback."""

import json

import pytest
from tornado.httpclient import HTTPClientError


async def start_session(jp_fetch, kernel: str, path: str):
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": kernel}}
    return await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))


async def start_kernel(jp_fetch, kernel: str):
    return await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": kernel}))


async def refusal(call) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as err:
        await call
    return err.value.code, json.loads(err.value.response.body)


async def test_an_exhausted_quota_reaches_the_frontend_with_the_message(pool_home, jp_fetch, jp_root_dir):
    pool_home.configure(default_user_quota={"kernels": 1})
    assert (await start_session(jp_fetch, "gpu-pool-small", "first.ipynb")).code == 201
    code, reply = await refusal(start_kernel(jp_fetch, "gpu-pool-small"))
    assert code == 403 and reply["message"].startswith("GPU quota exceeded")
    assert "first.ipynb" in reply["message"]  # the user's own kernel, by notebook
    assert str(jp_root_dir) not in reply["message"]  # as the user knows it, relative to the server root
    code, reply = await refusal(start_session(jp_fetch, "gpu-pool-small", "second.ipynb"))
    assert code == 500 and reply["message"].startswith("GPU quota exceeded") and "Traceback" not in reply["message"]
    assert len(pool_home.ledger().leases()) == 1


async def test_a_full_pool_reaches_the_frontend_with_the_message(pool_home, jp_fetch):
    for _ in range(2):
        assert (await start_kernel(jp_fetch, "gpu-pool-whole")).code == 201
    code, reply = await refusal(start_kernel(jp_fetch, "gpu-pool-small"))
    assert code == 503 and "The GPU pool is full" in reply["message"]
    code, reply = await refusal(start_session(jp_fetch, "gpu-pool-small", "late.ipynb"))
    assert "The GPU pool is full" in reply["message"]
    assert len(pool_home.ledger().leases()) == 2


async def test_a_refusal_names_what_would_start_now_by_its_launcher_name(pool_home, jp_fetch):
    assert (await start_kernel(jp_fetch, "gpu-pool-whole")).code == 201
    assert (await start_kernel(jp_fetch, "gpu-pool-small")).code == 201  # 30 GiB stay free on the other GPU
    code, reply = await refusal(start_kernel(jp_fetch, "gpu-pool-whole"))
    message = reply["message"]
    assert code == 503 and message.startswith("The GPU pool is full for 'Python 3 · whole GPU' (whole GPU): the "
                                              "most free on one GPU is 30 GiB on GPU")
    assert "'Python 3 · GPU 10 GiB' or 'Python 3 · GPU 20 GiB · 50%' would start now." in message
    assert len(pool_home.ledger().leases()) == 2
