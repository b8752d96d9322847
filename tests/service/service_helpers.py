"""Processes of the service tests: the pool service (run by root), users' Jupyter servers (run as each
user), commands run as a user, and the socket spoken to directly as a user."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

from kernel_helpers import free_port

USERS = {"alice": "jupyter-alice", "bob": "jupyter-bob"}


def identity(name: str) -> dict:
    """subprocess arguments that make a child the user, wholly: uid, gid and no supplementary groups of
    root's (a child left in group root could read what only root's group may)."""
    entry = pwd.getpwnam(USERS[name])
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def user_env(lab, name: str, **extra) -> dict:
    home = str(lab.home(name))
    env = {
        "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
        "HOME": home,
        "USER": USERS[name],
        "JUPYTER_CONFIG_DIR": f"{home}/.jupyter",
        "JUPYTER_DATA_DIR": f"{home}/.local/share/jupyter",
        "JUPYTER_RUNTIME_DIR": f"{home}/.local/share/jupyter/runtime",
        "JUPYTER_PATH": str(lab.share),
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_GPU_POOL_SOCKET": lab.socket,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if os.environ.get("PYTHONPATH"):  # the checkout under test (run with PYTHONPATH), not the one installed
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    if os.environ.get("JUPYTER_GPU_POOL_TESTS_NO_IRI"):  # scripts/test: no IRI grammar built at each start
        env["JUPYTER_GPU_POOL_TESTS_NO_IRI"] = os.environ["JUPYTER_GPU_POOL_TESTS_NO_IRI"]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def as_user(lab, name: str, args: list[str], **extra) -> subprocess.CompletedProcess:
    return subprocess.run(args, **identity(name), env=user_env(lab, name, **extra), cwd=str(lab.home(name)),
                          capture_output=True, text=True, timeout=120)


def raw(lab, name: str, lines: list[bytes], timeout: float = 10.0) -> list[dict]:
    """Send ``lines`` on the service's socket as the user (a process of their uid); the replies."""
    code = ("import socket, sys, json\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(float(sys.argv[2]))\n"
            "data = sys.stdin.buffer.read(); s.sendall(data); s.shutdown(socket.SHUT_WR)\n"
            "buf = b''\n"
            "while True:\n"
            "    chunk = s.recv(65536)\n"
            "    if not chunk: break\n"
            "    buf += chunk\n"
            "sys.stdout.write(buf.decode())\n")
    done = subprocess.run([sys.executable, "-c", code, lab.socket, str(timeout)], input=b"".join(lines),
                          **identity(name), env=user_env(lab, name), capture_output=True, timeout=timeout + 30)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]


def http_json(method: str, url: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    """An HTTP request with a Jupyter token; the status and the JSON reply ({"message": text} if not JSON)."""
    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as reply:
            status, text = reply.status, reply.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    try:
        return status, json.loads(text) if text else {}
    except ValueError:
        return status, {"message": text.decode(errors="replace")}


def request(op: str, **args) -> bytes:
    return json.dumps({"id": uuid.uuid4().hex[:6], "op": op, "args": args}).encode() + b"\n"


class PoolServiceProcess:
    """``jupyter gpu-pool serve`` as the admin runs it (root), on the lab's config."""

    def __init__(self, lab, env: dict | None = None):
        self.lab, self.env = lab, env or {}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> PoolServiceProcess:
        log = open(self.lab.root / "service.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyter_gpu_pool.cli", "serve",
                                      f"--config-dir={self.lab.conf}"], stdout=log, stderr=log,
                                     env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited: {(self.lab.root / 'service.log').read_text()[-3000:]}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.lab.socket)
                return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the service did not listen in time")

    def kill(self) -> None:
        """kill -9: no cleanup at all."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


class JupyterServer:
    """A real ``jupyter server`` with the pool's extension, run as the user, talking to the service."""

    def __init__(self, lab, name: str, args: tuple[str, ...] = (), **env):
        self.lab, self.name, self.args, self.env = lab, name, tuple(args), env
        self.token = uuid.uuid4().hex
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> JupyterServer:
        self.port = free_port()
        home = self.lab.home(self.name)
        log = open(self.lab.root / f"{self.name}-server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={home}",
             "--ServerApp.jpserver_extensions={'jupyter_gpu_pool': True}", "--GPUPoolExtension.cull_interval=1",
             *self.args],
            **identity(self.name), env=user_env(self.lab, self.name, **self.env), cwd=str(home), stdout=log,
            stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name}'s server exited: {self.log()[-3000:]}")
            try:
                self.request("GET", "api/status")
                return self
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"{self.name}'s server did not start: {self.log()[-3000:]}")

    def log(self) -> str:
        return (self.lab.root / f"{self.name}-server.log").read_text(errors="replace")

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return http_json(method, f"http://127.0.0.1:{self.port}/{path}", self.token, body)

    def start_kernel(self, profile: str = "small") -> tuple[int, dict]:
        return self.request("POST", "api/kernels", {"name": f"gpu-pool-{profile}"})

    def me(self) -> dict:
        return self.request("GET", "gpu-pool/api/v1/me")[1]

    def stop(self) -> str | None:
        """SIGTERM, as JupyterHub stops a server; killed if it still runs 30 s later, and then what its log
        says last (a server that does not stop is a defect: the lab's teardown fails on it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return f"{self.name}'s server ran on 30 s after SIGTERM (killed): {self.log()[-3000:]}"
        return None


def uid_of(name: str) -> int:
    return pwd.getpwnam(USERS[name]).pw_uid


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.2, what: str = ""):
    """``predicate()`` once it is truthy (its value), polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def ledger_dump(lab) -> list[str]:
    """Every table of the service's ledger, as SQL (read by root, who alone may besides the service)."""
    with sqlite3.connect(f"file:{lab.ledger}?mode=ro", uri=True) as db:
        return list(db.iterdump())


def execute(lab, name: str, kernel_id: str, code: str, timeout: float = 60.0) -> str:
    """Run ``code`` in one of the user's kernels over ZMQ (its connection file is in their runtime
    directory); its stdout."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(lab.home(name) / ".local" / "share" / "jupyter" / "runtime" /
                                                      f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
        out: list[str] = []
        reply = client.execute_interactive(code, timeout=timeout, output_hook=lambda msg: out.append(
            msg["content"].get("text", "")) if msg["msg_type"] == "stream" else None)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        client.stop_channels()


RELAY = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); replies = s.makefile("rb")
for line in sys.stdin.buffer:
    s.sendall(line)
    sys.stdout.buffer.write(replies.readline()); sys.stdout.buffer.flush()
"""


PROBE = """
import json, socket, sys, time
path, seconds, reads_journal = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "journal"
s = socket.socket(socket.AF_UNIX); s.connect(path); s.settimeout(60); replies = s.makefile("rb")
def ask(op, **args):
    started = time.monotonic()
    s.sendall(json.dumps({"id": 1, "op": op, "args": args}).encode() + b"\\n")
    reply = json.loads(replies.readline())
    assert reply["ok"], reply
    return reply["result"], time.monotonic() - started
waits, i, end = {"whoami": [], "allocate": [], "release": []}, 0, time.monotonic() + seconds
if reads_journal:
    waits["journal"] = []
while time.monotonic() < end:
    waits["whoami"].append(ask("whoami")[1])
    if reads_journal:
        waits["journal"].append(ask("journal", limit=50)[1])
    lease, took = ask("allocate", kernel_id=f"k-{sys.argv[4]}-{i}", profile="small")
    waits["allocate"].append(took)
    waits["release"].append(ask("release", lease_id=lease["id"])[1])
    i += 1
    time.sleep(0.05)
print(json.dumps(waits), flush=True)
"""


def probe_waits(lab, name: str, seconds: float, reads_journal: bool = False) -> dict[str, list[float]]:
    """The user's requests, one after another for ``seconds`` from a process of theirs (who am I, a read
    of their journal if ``reads_journal``, an allocation and its release): how long each answer took, by op."""
    done = subprocess.run([sys.executable, "-c", PROBE, lab.socket, str(seconds),
                           "journal" if reads_journal else "-", name], **identity(name), env=user_env(lab, name),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


FLOOD = """
import json, socket, sys, threading, time
path, conns, allowed = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
lines = [line.encode() for line in json.loads(sys.stdin.readline())]
stop, answered, done = threading.Event(), threading.Semaphore(0), []
def flood():
    s = socket.socket(socket.AF_UNIX); s.connect(path); s.settimeout(120); replies = s.makefile("rb")
    n, waited, size = 0, 0.0, 0
    while not stop.is_set():
        started = time.monotonic()
        s.sendall(lines[n % len(lines)])
        answer = replies.readline()
        waited += time.monotonic() - started
        reply = json.loads(answer)
        assert reply["ok"] or reply["error"]["reason"] in allowed, answer[:300]
        n, size = n + 1, len(answer)
        if n == 1:
            answered.release()
    done.append([n, waited, size])
threads = [threading.Thread(target=flood) for _ in range(conns)]
for t in threads: t.start()
for t in threads: answered.acquire()
print("under way", flush=True)
sys.stdin.read()  # until the test closes it
stop.set()
for t in threads: t.join()
print(json.dumps(done), flush=True)
"""


class Flood:
    """``conns`` connections of the user's, each sending ``lines`` in turn as fast as the service answers them
    (a refusal other than for one of ``allowed`` reasons stops it): under way once each has had an answer,
    until :meth:`stop`, which says what each sent (requests, seconds waited for answers, the last's size)."""

    def __init__(self, lab, name: str, lines: list[bytes], conns: int, allowed: tuple[str, ...] = ()):
        self.proc = subprocess.Popen([sys.executable, "-c", FLOOD, lab.socket, str(conns), *allowed],
                                     **identity(name), env=user_env(lab, name), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.lines = lines

    def __enter__(self) -> Flood:
        try:
            self.proc.stdin.write(json.dumps([line.decode() for line in self.lines]) + "\n")
            self.proc.stdin.flush()
            assert self.proc.stdout.readline() == "under way\n", "the flood did not start"
        except BaseException:
            self.__exit__()
            raise
        return self

    def stop(self) -> list[tuple[int, float, int]]:
        out, _ = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, out[-2000:]
        return [tuple(x) for x in json.loads(out)]

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


class Connection:
    """One connection to the service held open by a process of the user's (the socket's peer, so the
    manager of what it allocates), for requests one at a time: cheaper than a process a request."""

    def __init__(self, lab, name: str):
        self.proc = subprocess.Popen([sys.executable, "-c", RELAY, lab.socket], **identity(name),
                                     env=user_env(lab, name), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pid = self.proc.pid

    def send(self, line: bytes) -> dict:
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the service closed the connection"
        return json.loads(answer)

    def call(self, op: str, **args) -> dict:
        return self.send(request(op, **args))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
