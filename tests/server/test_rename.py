"""A notebook renamed in JupyterLab: its kernel's name and link follow it, on a real jupyter_server with a
real kernel.  JupyterLab renames the file (PATCH /api/contents) and then the session (PATCH /api/sessions),
which is all the server learns of it; the culler gives the pool the new name at its next pass, so that
every server's view (an admin's dashboard elsewhere) and ``jupyter gpu-pool status`` show it too."""

from __future__ import annotations

import json
import time

import pytest
from server_helpers import ROOT, body, wait_until
from test_api import API

pytestmark = pytest.mark.usefixtures("ext")

NOTEBOOK = {"type": "notebook", "format": "json",
            "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}}


async def kernel_named(jp_fetch, kernel_id: str) -> str:
    me = body(await jp_fetch(*API, "me"))
    return next(k for k in me["kernels"] if k["kernel_id"] == kernel_id)["name"]


# A shutdown on a loaded machine can take longer than the test pool's 2 s holder grace from its claim to its
# release: the pool would reclaim the slice first, and the story would say "reclaimed", not "released".
@pytest.mark.pool_settings(holder_grace=30)
async def test_a_renamed_notebook_gives_its_kernel_the_new_name_and_a_link_that_opens(jp_fetch, pool_home):
    await jp_fetch("api", "contents", "old.ipynb", method="PUT", body=json.dumps(NOTEBOOK))
    session = body(await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "old.ipynb", "name": "old.ipynb", "type": "notebook", "kernel": {"name": "gpu-pool-small"}})))
    kid = session["kernel"]["id"]
    # JupyterLab's "New Console for Notebook": a console session on the same kernel does not rename it
    await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "console-1-x", "name": "Console 1", "type": "console", "kernel": {"id": kid}}))
    assert await kernel_named(jp_fetch, kid) == "old.ipynb"

    # as JupyterLab renames a notebook: the file, then its session
    await jp_fetch("api", "contents", "old.ipynb", method="PATCH", body=json.dumps({"path": "new.ipynb"}))
    await jp_fetch("api", "sessions", session["id"], method="PATCH",
                   body=json.dumps({"path": "new.ipynb", "name": "new.ipynb"}))
    renamed = time.monotonic()
    name = await kernel_named(jp_fetch, kid)
    assert name == "new.ipynb" and time.monotonic() - renamed < 2
    assert (await jp_fetch("api", "contents", name)).code == 200  # the card's link opens the notebook
    # the pool's own record follows at the culler's next pass: what another server's views read
    await wait_until(lambda: pool_home.ledger().snapshot().lease_of_kernel(kid).label == "new.ipynb", 10,
                     what="the lease's label renamed in the ledger")

    # the admin's dashboard: its table and its plots
    lease = next(item for item in body(await jp_fetch(*API, "pool", headers=ROOT))["leases"]
                 if item["kernel_id"] == kid)
    assert lease["label"] == "new.ipynb"
    plotted = next(k for k in body(await jp_fetch(*API, "pool", "telemetry", headers=ROOT))["kernels"]
                   if k["kernel_id"] == kid)
    assert plotted["name"] == "new.ipynb"

    # what happened to it is told under its new name, after its session ended with it
    await jp_fetch(*API, "kernels", kid, "shutdown", method="POST", body="{}")

    async def told() -> list[dict]:
        return [r for r in body(await jp_fetch(*API, "me"))["recent"] if r["kernel_id"] == kid]

    found = await wait_until(told, 30, what="the shutdown on record")
    assert [(r["kind"], r["name"]) for r in found] == [("released", "new.ipynb")]
