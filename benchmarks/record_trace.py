"""Record a small activity trace for real: the example of docs/planning.md ("A recorded trace").

    .venv/bin/python benchmarks/record_trace.py [--output jupyter_gpu_pool/planning/examples/lab-recorded.trace.jsonl]

Three users, each with their own real ``jupyter server`` and the pool extension, on one shared pool: one
declared 80 GiB H100 in a real SQLite ledger, under ``planning/examples/lab-recorded.json`` (10 GiB
slices taken at the first cell, hibernated after 20 s idle, warned 5 s before; the culler passes every
2 s).  Each user opens notebooks as JupyterLab does (``POST /api/sessions``) and runs scripted cells
(``time.sleep``) over the kernel websocket with pauses between them: alice also opens a notebook only
to read it, bob leaves his kernel running at the end, a long pause of each gets the kernel hibernated
and its next cell resumes it.  About two minutes; then ``jupyter gpu-pool trace export`` as the
ledger's owner (an admin: everyone's kernels) writes the trace.  Declared GPUs hold no memory, so the
hibernations move nothing (a replay of the trace costs them nothing either).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "jupyter_gpu_pool" / "planning" / "examples" / "lab-recorded.json"
OUTPUT = ROOT / "jupyter_gpu_pool" / "planning" / "examples" / "lab-recorded.trace.jsonl"
KERNEL = "gpu-pool-gpu-10g"
CULL_INTERVAL = 2.0
# Per user: when they come (seconds after the start), then (pause before, cell seconds) for each cell of
# their notebook; "end": shut the kernel down after the last cell (else it is left running).
SCRIPT = {
    "alice": {"at": 0, "read_only": True, "cells": [(2, 3), (8, 1), (30, 2), (5, 1)], "end": True},
    "bob": {"at": 5, "cells": [(10, 5), (4, 2), (12, 1), (28, 4), (6, 1)], "end": False},
    "carol": {"at": 20, "cells": [(3, 8), (40, 2), (3, 1)], "end": True},
}
TAIL = 25.0  # after the last user: bob's kernel left idle is hibernated


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UserServer:
    """One user's jupyter server, its own config directory (its owner), the shared ledger and kernelspecs."""

    def __init__(self, tmp: Path, user: str, settings: dict):
        self.user, self.port, self.token = user, free_port(), uuid.uuid4().hex
        self.config = tmp / f"config-{user}"
        self.config.mkdir()
        (self.config / "jupyter_gpu_pool_config.py").write_text(
            "".join(f"c.GPUPool.{k} = {v!r}\n" for k, v in {**settings, "owner": user}.items()))
        self.env = {**os.environ, "JUPYTER_CONFIG_DIR": str(self.config), "JUPYTER_DATA_DIR": str(tmp / "data"),
                    "JUPYTER_RUNTIME_DIR": str(tmp / f"runtime-{user}"), "JUPYTER_PREFER_ENV_PATH": "0"}
        root = tmp / f"home-{user}"
        root.mkdir()
        self.log = open(tmp / f"server-{user}.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--ServerApp.jpserver_extensions={'jupyter_gpu_pool': True}",
             f"--GPUPoolExtension.cull_interval={CULL_INTERVAL}"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        self.http = AsyncHTTPClient()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def fetch(self, path: str, method: str = "GET", body: dict | None = None) -> dict:
        r = await self.http.fetch(HTTPRequest(self.base + path, method=method, headers={
            "Authorization": f"token {self.token}"}, body=None if body is None else json.dumps(body),
            request_timeout=300))
        return json.loads(r.body) if r.body else {}

    async def ready(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                await self.fetch("/api/status")
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"{self.user}'s server did not start: see {self.log.name}") from None
                await asyncio.sleep(0.3)

    async def open_notebook(self, path: str) -> str:
        """As JupyterLab opens a notebook: a session and its kernel; the kernel id."""
        got = await self.fetch("/api/sessions", "POST", {"path": path, "name": path, "type": "notebook",
                                                         "kernel": {"name": KERNEL}})
        return got["kernel"]["id"]

    async def run(self, kernel_id: str, seconds: float) -> None:
        """One cell over the kernel's websocket, as JupyterLab sends it; back when its reply came."""
        ws = await websocket_connect(HTTPRequest(
            f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels",
            headers={"Authorization": f"token {self.token}"}))
        msg_id = uuid.uuid4().hex
        await ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.user,
                       "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": f"import time; time.sleep({seconds})", "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        try:
            while True:
                raw = await asyncio.wait_for(ws.read_message(), 300)
                if raw is None:
                    raise RuntimeError(f"{self.user}'s kernel websocket closed during a cell")
                msg = json.loads(raw)
                if msg.get("msg_type") == "execute_reply" and msg["parent_header"].get("msg_id") == msg_id:
                    if msg["content"]["status"] != "ok":
                        raise RuntimeError(f"{self.user}'s cell failed: {msg['content']}")
                    return
        finally:
            ws.close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


async def act(server: UserServer, script: dict, start: float) -> None:
    await asyncio.sleep(max(start + script["at"] - time.monotonic(), 0))
    reader = await server.open_notebook("reading.ipynb") if script.get("read_only") else None
    kernel = await server.open_notebook("lab.ipynb")
    for pause, seconds in script["cells"]:
        await asyncio.sleep(pause)
        await server.run(kernel, seconds)
        print(f"{time.monotonic() - start:6.1f} s  {server.user}: a {seconds} s cell ran", flush=True)
    if script["end"]:
        await server.fetch(f"/api/kernels/{kernel}", "DELETE")
    if reader is not None:
        await server.fetch(f"/api/kernels/{reader}", "DELETE")


async def record(output: Path) -> None:
    settings = json.loads(CONFIG.read_text())["GPUPool"]
    tmp = Path(tempfile.mkdtemp(prefix="gpu-pool-record-"))
    ledger = tmp / "ledger.sqlite"
    settings = {**settings, "gpu_discovery": "declared", "ledger_path": str(ledger), "unix_groups": False,
                "group_members": {"students": list(SCRIPT)}}
    (tmp / "data").mkdir()
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp / "data")}
    subprocess.run([sys.executable, "-c", "from jupyter_gpu_pool.kernel_provisioner import kernelspecs; "
                    "from jupyter_gpu_pool.pool.profiles import parse_profile; "
                    f"kernelspecs.install([parse_profile(n, p) for n, p in {settings['profiles']!r}.items()], "
                    "user=True)"], env=env, check=True)
    servers = [UserServer(tmp, user, settings) for user in SCRIPT]
    try:
        await asyncio.gather(*(s.ready() for s in servers))
        start = time.monotonic()
        await asyncio.gather(*(act(s, SCRIPT[s.user], start) for s in servers))
        await asyncio.sleep(TAIL)  # bob's kernel, left idle, is warned and hibernated; the last pass writes
        exe = shutil.which("jupyter", path=os.path.dirname(sys.executable)) or "jupyter"
        done = subprocess.run([exe, "gpu-pool", "trace", "export", "--since", "15m", "--output", str(output)],
                              env=servers[0].env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"trace export failed: {done.stderr}")
    finally:
        for s in servers:
            s.stop()
    lines = output.read_text().splitlines()
    print(f"{output}: {len(lines) - 2} events of {len(SCRIPT)} users ({tmp} holds the servers' logs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where the exported trace goes")
    asyncio.run(record(parser.parse_args().output))


if __name__ == "__main__":
    main()
