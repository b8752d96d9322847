"""binder/ builds a working demo: the environment Binder (repo2docker) would build, made here in a fresh venv.

What repo2docker does with binder/, done the same way on this machine: take the repository as a
clone has it (tracked and unignored files only: no node_modules, no built extension), a fresh
Python environment with Node.js on the PATH (repo2docker's base environment brings Node 20 and
JupyterLab 4), ``pip install -r binder/requirements.txt``, then ``binder/postBuild`` from the
repository root. Then start ``jupyter lab`` there and check that the server runs with both
extensions enabled, the declared demo pool, its policy and kernelspecs, and the demo notebook; then
run the tour's cells as the tour says: a hibernation and a transparent resume with the variables
kept, and a resume that waits in the queue while the stand-in for another student holds the pool.
Slow (a clean frontend build): deselect with ``-m "not binder"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kernel_helpers import free_port

pytestmark = [pytest.mark.binder, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
GiB = 1024**3


def run(cmd, *, cwd, env, timeout=1200, what=""):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{what or cmd} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out.stdout + out.stderr


def clone_like_copy(dest: Path) -> Path:
    """The working tree as a fresh clone has it: tracked and unignored files, nothing built."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.is_file():  # deleted in the working tree but still in the index
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


class Server:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def get(self, path: str, raw: bool = False):
        req = urllib.request.Request(f"{self.url}/{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return body.decode() if raw else json.loads(body)

    def call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(f"{self.url}/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            data = r.read()
            return r.status, (json.loads(data) if data else None)


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory):
    """repo2docker's steps for binder/, in a fresh venv; yields (repo, venv, env)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (repo2docker's base environment brings Node 20)")
    node_major = int(subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
                     .lstrip("v").split(".")[0])
    assert node_major >= 20, f"the extension builds with Node 20 (repo2docker's); found Node {node_major}"
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime
    assert sys.version_info >= (3, 11)

    tmp = tmp_path_factory.mktemp("binder")
    repo = clone_like_copy(tmp / "repo")
    assert not (repo / "labextension" / "node_modules").exists()
    assert not (repo / "jupyter_gpu_pool" / "labextension").exists()
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "VIRTUAL_ENV", "PYTHON"))}
    env.update({
        "PATH": os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", "")]),
        "HOME": str(home),  # the demo user's own home, as in the Binder image
        # download caches only (a build from scratch either way): keep repeated runs reasonable
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        "YARN_CACHE_FOLDER": str(Path.home() / ".cache" / "jupyter-gpu-pool-tests" / "yarn"),
    })
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], cwd=repo, env=env,
        what="pip install -r binder/requirements.txt")
    log = run(["bash", "binder/postBuild"], cwd=repo, env=env, timeout=1800, what="binder/postBuild")
    (tmp / "postBuild.log").write_text(log)
    yield repo, venv, env


@pytest.fixture(scope="module")
def binder_server(binder_env):
    repo, venv, env = binder_env
    token, port = secrets.token_hex(16), free_port()
    cmd = [str(venv / "bin" / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = repo.parent / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", token)
    server.log_path = log_path
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, f"jupyter lab exited:\n{log_path.read_text()[-4000:]}"
        try:
            server.get("api/status")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            assert time.monotonic() < deadline, f"jupyter lab did not answer:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.5)
    yield server
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_the_extension_is_enabled_by_installing_the_package(binder_env):
    repo, venv, env = binder_env
    labext = run([venv / "bin" / "jupyter", "labextension", "list"], cwd=repo, env=env)
    line = next((ln for ln in labext.splitlines() if "jupyter-gpu-pool" in ln), "")
    assert re.search(r"jupyter-gpu-pool v\d+\.\d+\.\d+\S* .*enabled.*OK", line), labext
    assert str(venv) in labext  # installed into the environment by the wheel, not linked from a checkout
    server_ext = run([venv / "bin" / "jupyter", "server", "extension", "list"], cwd=repo, env=env)
    assert re.search(r"jupyter_gpu_pool .*enabled", server_ext), server_ext
    profiles = run([venv / "bin" / "jupyter", "gpu-pool", "profiles"], cwd=repo, env=env)
    assert "gpu-10g" in profiles and "gpu-20g" in profiles


def test_server_starts_with_the_extension_and_the_demo_pool(binder_server):
    server = binder_server
    # JupyterLab's page loads the prebuilt extension, and serves its bundle.
    page = server.get("lab", raw=True)
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    ext = next(e for e in config["federated_extensions"] if e["name"] == "jupyter-gpu-pool")
    assert "jupyter-gpu-pool" not in config.get("disabled_extensions", [])
    bundle = server.get(f"lab/extensions/jupyter-gpu-pool/{ext['load']}", raw=True)
    assert "jupyter-gpu-pool" in bundle

    # The server extension answers with the declared demo pool and its quota.
    me = server.get("gpu-pool/api/v1/me")
    assert me["pool"]["enabled"] is True
    assert me["pool"]["declared"] is True and me["pool"]["gpus"] == 2
    assert me["pool"]["memory_total"] == 80 * GiB
    assert me["quota"] == {"memory": 30 * GiB, "sm_percent": None, "kernels": 2}
    pool = server.get("gpu-pool/api/v1/pool")  # the owner of a personal server is the pool's admin
    rule = pool["policy"]["rules"][0]
    assert (rule["name"], rule["idle_timeout"], rule["warn"], rule["action"]) == ("binder-demo", 180, 90, "hibernate")
    specs = server.get("api/kernelspecs")["kernelspecs"]
    assert {"gpu-pool-gpu-10g", "gpu-pool-gpu-20g"} <= set(specs)


def test_demo_notebook_runs_on_a_slice_and_says_it_needs_no_gpu(binder_server):
    server = binder_server
    nb = server.get("api/contents/binder/gpu-demo.ipynb")["content"]
    assert "needs no GPU" in "".join(nb["cells"][0]["source"])
    kernel_name = nb["metadata"]["kernelspec"]["name"]
    assert kernel_name in server.get("api/kernelspecs")["kernelspecs"]
    status, session = server.call("POST", "api/sessions", {"path": "binder/gpu-demo.ipynb", "type": "notebook",
                                                          "name": "gpu-demo.ipynb", "kernel": {"name": kernel_name}})
    assert status == 201, session
    try:
        kernels = server.get("gpu-pool/api/v1/me")["kernels"]
        assert [(k["kernel_id"], k["profile"], k["state"]) for k in kernels] == \
            [(session["kernel"]["id"], "gpu-10g", "active")]
        assert kernels[0]["name"].endswith("gpu-demo.ipynb")
        assert kernels[0]["gpus"][0]["source"] == "declared"
    finally:
        server.call("DELETE", f"api/sessions/{session['id']}")
    assert server.get("gpu-pool/api/v1/me")["kernels"] == []


class Kernel:
    """A kernel's websocket as JupyterLab opens it (the server's JSON protocol): cells run through the
    server, so a cell on a hibernated kernel resumes it as a notebook's would."""

    def __init__(self, ws):
        self.ws = ws

    @classmethod
    async def open(cls, server: Server, kernel_id: str) -> "Kernel":
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = server.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        return cls(await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"})))

    async def run(self, code: str, timeout: float = 120) -> str:
        """Run a cell; its output (streams, results, errors) once it has finished."""
        msg_id = uuid.uuid4().hex
        await self.ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "demo", "session": msg_id,
                       "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "buffers": [], "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        out: list[str] = []
        replied = idle = False
        deadline = time.monotonic() + timeout
        while not (replied and idle):
            raw = await asyncio.wait_for(self.ws.read_message(), max(deadline - time.monotonic(), 0.01))
            assert raw is not None, "the kernel websocket closed"
            m = json.loads(raw)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = m["header"]["msg_type"], m["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data", "update_display_data"):
                out.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                out.append("\n".join(content["traceback"]))
            replied = replied or kind == "execute_reply"
            idle = idle or (kind == "status" and content["execution_state"] == "idle")
        return "\n".join(out)


def code_cells(server: Server, path: str) -> dict[str, str]:
    """A notebook's code cells by id, as the tour has them."""
    cells = server.get(f"api/contents/{path}")["content"]["cells"]
    return {c["id"]: "".join(c["source"]) for c in cells if c["cell_type"] == "code"}


async def wait_state(server: Server, kernel_id: str, state: str, timeout: float = 60, *,
                     execution_state: str | None = None) -> dict:
    """Until GET me shows the kernel in ``state`` (and ``execution_state``, where given); else what it shows,
    what happened to it (its recent list) and the server log's end."""
    deadline = time.monotonic() + timeout
    while True:
        me = server.get("gpu-pool/api/v1/me")
        found = next((k for k in me["kernels"] if k["kernel_id"] == kernel_id), None)
        if found and found["state"] == state and execution_state in (None, found.get("execution_state")):
            return found
        if time.monotonic() > deadline:
            recent = [(e["kind"], e["reason"], e.get("message")) for e in me.get("recent", [])
                      if e["kernel_id"] == kernel_id]
            raise AssertionError(f"the kernel is {found and (found['state'], found.get('execution_state'))}, not "
                                 f"{state}; what happened, newest first: {recent}\nserver log:\n"
                                 f"{server.log_path.read_text()[-4000:]}")
        await asyncio.sleep(0.3)


async def release(server: Server, kernel_id: str) -> None:
    """Release GPU as its card's button does: once the card shows the kernel idle (its cell's end has reached
    the server), and accepted as a hibernation."""
    await wait_state(server, kernel_id, "active", execution_state="idle")
    assert server.call("POST", f"gpu-pool/api/v1/kernels/{kernel_id}/release", {})[1]["action"] == "hibernate"


def test_the_tour_hibernates_resumes_and_queues_as_it_says(binder_server):
    """Sections 2, 4 and 5 of gpu-demo.ipynb, as written: the variables survive a hibernation (Release
    GPU; the policy's 3 idle minutes do the same), and with the stand-in for another student holding
    the pool, the resume waits at position 1 until the stand-in lets a slice go."""
    server = binder_server
    demo, student = code_cells(server, "binder/gpu-demo.ipynb"), code_cells(server, "binder/another-student.ipynb")
    sessions = []

    def start(path: str, kernel: str) -> str:
        status, session = server.call("POST", "api/sessions", {"path": path, "type": "notebook",
                                                              "name": path.split("/")[-1], "kernel": {"name": kernel}})
        assert status == 201, session
        sessions.append(session["id"])
        return session["kernel"]["id"]

    async def tour() -> None:
        kid = start("binder/gpu-demo.ipynb", "gpu-pool-gpu-10g")
        nb = await Kernel.open(server, kid)
        assert "JUPYTER_GPU_POOL_SLICE" in await nb.run(demo["c2"])
        assert "x = 42" in await nb.run(demo["c4"])

        # Section 4: hibernated, the slice is back in the pool; the next cell resumes it, x kept.
        await release(server, kid)
        await wait_state(server, kid, "hibernated")
        assert server.get("gpu-pool/api/v1/me")["usage"]["memory"] == 0
        out = await nb.run(demo["c7"])
        assert re.search(r"x = 42, set at [\d:]+, still here at", out), out
        await wait_state(server, kid, "active")

        # Section 5: hibernate, the stand-in takes the pool, the cell waits its turn.
        await release(server, kid)
        await wait_state(server, kid, "hibernated")
        other = await Kernel.open(server, start("binder/another-student.ipynb", "python3"))
        taken = await other.run(student["s1"])
        assert "another-student holds 4 slice(s), 80 GiB; free in the pool now: 0 B." in taken, taken
        cell = asyncio.ensure_future(nb.run(demo["c7"], timeout=180))
        queued = await wait_state(server, kid, "queued")
        assert queued["queue_position"] == 1
        await asyncio.sleep(2)
        assert not cell.done()  # nothing runs while the pool is full
        assert "gave back 1 slice(s)" in await other.run(student["s3"])
        out = await asyncio.wait_for(cell, 120)
        assert "position 1 in the queue" in out and re.search(r"x = 42, set at [\d:]+, still here at", out), out
        await wait_state(server, kid, "active")
        assert "free in the pool now: 70 GiB" in await other.run(student["s5"])

    try:
        asyncio.run(tour())
    finally:
        for session_id in sessions:
            server.call("DELETE", f"api/sessions/{session_id}")
