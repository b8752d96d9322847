"""slice_at first-cell on a shared box: alice's server (her own uid) starts a notebook's kernel through
the pool service holding no slice, and its first cell takes one through the service; bob cannot open a
slice-less lease under her kernel's id.  Real Unix users, a real service on its socket, real servers and
kernels, cells sent over the kernel websocket as JupyterLab sends them."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid

import pytest
from service_helpers import raw, request, wait_for
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.timeout(240)

FIRST_CELL = {"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "slice_at": "first-cell"}
REPORT = ("import json, os, subprocess, sys\n"
          "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"CUDA_VISIBLE_DEVICES\"])'],"
          " capture_output=True, text=True, check=True).stdout.strip()\n"
          "print('REPORT ' + json.dumps({'env': os.environ['CUDA_VISIBLE_DEVICES'], 'child': child}))")


def lease_row(lab, kernel_id: str) -> dict:
    """The kernel's lease and its allocations, as the service's ledger holds them (root reads it)."""
    with sqlite3.connect(f"file:{lab.ledger}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        row = dict(db.execute("SELECT * FROM leases WHERE kernel_id=?", (kernel_id,)).fetchone())
        row["allocations"] = [r["gpu_uuid"] for r in db.execute("SELECT gpu_uuid FROM allocations WHERE lease_id=?",
                                                                 (row["id"],))]
        return row


async def run_cell(server, kernel_id: str, code: str, timeout: float = 90.0) -> list[str]:
    """Send one cell on the kernel's websocket (the JSON protocol); the text it printed, once it replied and
    went idle (its output comes on iopub, which the websocket may deliver after the shell's reply)."""
    ws = await websocket_connect(f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?token={server.token}")
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "alice", "session": uuid.uuid4().hex,
              "date": "", "version": "5.3"}
    ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                                 "content": {"code": code, "silent": False, "store_history": True,
                                             "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
                                 "buffers": []}))
    out: list[str] = []
    replied = idle = False
    try:
        while True:
            m = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out.append(m["content"]["text"])
            elif m["msg_type"] == "error":
                out.append(m["content"]["evalue"])
            elif m["msg_type"] == "execute_reply":
                replied = True
            elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True  # (iopub: its output before it; the reply, on shell, may come before or after)
            if replied and idle:
                return out
    finally:
        ws.close()


def test_a_notebook_opened_through_the_service_holds_nothing_until_its_first_cell_takes_a_slice(lab):
    lab.configure(policy=[FIRST_CELL])
    lab.service()
    alice = lab.server("alice")
    code, session = alice.request("POST", "api/sessions", {"path": "lab.ipynb", "type": "notebook",
                                                           "kernel": {"name": "gpu-pool-small"}})
    assert code == 201, (session, alice.log()[-6000:])
    kid = session["kernel"]["id"]

    row = lease_row(lab, kid)
    assert (row["owner"], row["state"], row["reason"], row["allocations"]) == ("alice", "hibernated", "first_cell", []), alice.log()[-5000:]
    mine = next(k for k in alice.me()["kernels"] if k["kernel_id"] == kid)
    assert mine["state"] == "no_gpu_yet" and mine["gpus"] == []

    # bob cannot open (or take over) a lease under alice's kernel id, nor resume hers
    replies = raw(lab, "bob", [request("start_without_slice", kernel_id=kid, profile="small"),
                               request("resume", lease_id=row["id"])])
    assert [r["ok"] for r in replies] == [False, False]
    assert replies[0]["error"]["reason"] == "not_yours"
    assert lease_row(lab, kid)["state"] == "hibernated"

    out = asyncio.run(run_cell(alice, kid, REPORT))

    taken = wait_for(lambda: (r := lease_row(lab, kid))["state"] == "active" and r, what="the slice taken")
    assert len(taken["allocations"]) == 1 and taken["phase"] == ""
    report = json.loads(next(line for line in "".join(out).splitlines() if line.startswith("REPORT "))[7:])
    assert report == {"env": taken["allocations"][0], "child": taken["allocations"][0]}, out
    assert next(k for k in alice.me()["kernels"] if k["kernel_id"] == kid)["state"] == "active"


def test_a_slice_less_kernel_counts_as_one_of_the_users_kernels_at_the_service(lab):
    lab.configure(policy=[FIRST_CELL], default_user_quota={"kernels": 1})
    lab.service()
    [first, second] = raw(lab, "alice", [request("start_without_slice", kernel_id="k-alice-1", profile="small"),
                                         request("start_without_slice", kernel_id="k-alice-2", profile="small")])
    assert first["ok"] and first["result"]["state"] == "hibernated" and first["result"]["reason"] == "first_cell"
    assert first["result"]["owner"] == "alice"  # the service's word for who she is, not hers
    assert not second["ok"] and second["error"]["reason"] == "quota_exceeded"
