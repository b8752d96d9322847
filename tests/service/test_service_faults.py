"""Faults of the pool service: it is down, it is killed and started again, it is fed garbage, clients
stall or flood it.  Nothing is lost, nothing changes on bad input, and nobody waits on anybody else."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from service_helpers import Flood, execute, identity, ledger_dump, probe_waits, raw, request, user_env, wait_for

from jupyter_gpu_pool.service.client import ServiceClient, ServiceUnavailable
from jupyter_gpu_pool.service import protocol
from jupyter_gpu_pool.service.server import MAX_CONNECTIONS

pytestmark = pytest.mark.timeout(300)


CLI_TIMED = """
import sys, time
from jupyter_gpu_pool import cli
started = time.monotonic()
try:
    cli.main(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
print(f"{code} {time.monotonic() - started:.3f}", file=sys.stderr)
"""


def _refused_through_the_users_server_and_the_cli_within_a_second(lab, alice) -> None:
    started = time.monotonic()
    code, refused = alice.start_kernel()  # the provisioner's refusal, over REST from the user's own server
    took = time.monotonic() - started
    assert code == 503 and "pool service is not answering" in refused["message"]
    assert "systemctl status jupyter-gpu-pool" in refused["message"]
    assert took < 1.0, took
    done = lab.run_as("alice", ["jupyter-gpu-pool", "status"])  # the command as users run it
    assert done.returncode == 2 and "systemctl status jupyter-gpu-pool" in done.stderr
    # Its refusal, timed from the command's start past Python's own (which no service makes faster or slower)
    done = lab.run_as("alice", [sys.executable, "-c", CLI_TIMED, "status"])
    code, took = done.stderr.strip().splitlines()[-1].split()
    assert code == "2" and "systemctl status jupyter-gpu-pool" in done.stderr and float(took) < 1.0, done.stderr


def test_with_the_service_down_a_start_is_refused_within_a_second_saying_who_to_ask(lab):
    alice = lab.server("alice")  # the service never started: no socket at all
    _refused_through_the_users_server_and_the_cli_within_a_second(lab, alice)
    service = lab.service()
    assert alice.start_kernel()[0] == 201
    service.kill()  # kill -9 leaves its socket file behind: connecting to it is refused
    _refused_through_the_users_server_and_the_cli_within_a_second(lab, alice)


def test_a_client_is_refused_within_a_second_whether_the_socket_is_gone_or_left_behind(lab):
    service = lab.service()
    assert ServiceClient(lab.socket).call("whoami")["user"] == "root"
    service.kill()  # kill -9 leaves its socket file: connecting to it is refused
    for path in (lab.socket, str(lab.root / "never-there.sock")):
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match="systemctl status jupyter-gpu-pool"):
            ServiceClient(path).call("whoami")
        assert time.monotonic() - started < 1.0


def test_a_stuck_service_is_reported_not_waited_on_for_ever(lab):
    service = lab.service()
    client = ServiceClient(lab.socket, timeout=3.0)
    assert client.call("whoami")["user"] == "root"
    service.proc.send_signal(signal.SIGSTOP)  # alive, its socket open, answering nothing
    try:
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match="no answer within 3 s"):
            client.call("whoami")
        assert time.monotonic() - started < 10  # once, not retried into a second wait
    finally:
        service.proc.send_signal(signal.SIGCONT)
    assert client.call("whoami")["user"] == "root"  # and it is used again once it answers


@pytest.mark.slow
def test_a_service_killed_and_started_again_keeps_every_lease_and_clients_reconnect(lab):
    service = lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201
    kid = kernel["id"]
    assert execute(lab, "alice", kid, "x = 6 * 7") == ""
    before = {k["kernel_id"]: k["lease_id"] for k in alice.me()["kernels"]}
    ledger_before = ledger_dump(lab)
    service.kill()  # kill -9: no goodbye
    code, refused = alice.start_kernel()
    assert code == 503 and "not answering" in refused["message"]
    lab.service()
    time.sleep(2.5)  # past the new service's reconcile (every second here): the live kernel keeps its slice
    [leases] = raw(lab, "alice", [request("leases")])
    assert {x["kernel_id"]: x["id"] for x in leases["result"]} == before  # the same lease, kept on disk
    assert {k["kernel_id"]: k["lease_id"] for k in alice.me()["kernels"]} == before  # the same server reconnects
    assert execute(lab, "alice", kid, "print(x)") == "42\n"  # no kernel lost, nor its variables
    code, second = alice.start_kernel()
    assert code == 201
    [leases] = raw(lab, "alice", [request("leases")])
    assert {x["kernel_id"] for x in leases["result"]} == {kid, second["id"]}
    status, _ = alice.request("DELETE", f"api/kernels/{kid}")  # a shutdown releases through the new service
    assert status == 204
    released = wait_for(lambda: [x for x in raw(lab, "alice", [request("leases", states=["released"])])[0]["result"]
                                 if x["kernel_id"] == kid], what="the lease released")
    assert released[0]["id"] == before[kid] and released[0]["reason"] == "shutdown"
    assert ledger_before != ledger_dump(lab)  # (the dump sees changes: the check below means something)


def test_with_the_service_gone_a_users_server_still_shuts_down_and_the_slice_comes_back_later(lab):
    """A user's server stopped while the service is down (JupyterHub stopping it, say) exits at once: the
    kernel's shutdown never waits on the pool.  The service, back, gives the slice back by itself."""
    lab.configure(holder_grace=1)
    service = lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201
    service.stop()
    _stops_at_once_and_the_service_back_reclaims_the_slice(lab, alice, kernel["id"])


def test_a_server_started_before_the_service_stops_at_once_with_the_service_killed(lab):
    """A user's server started while the service was down (its pool extension could not load) and stopped
    after the service was killed exits at once, saying why its extension has nothing to stop (before: the
    extension's stop raised on what it never built, jupyter_server's shutdown ended there and the server ran
    on until killed)."""
    lab.configure(holder_grace=1)
    alice = lab.server("alice", ("--GPUPoolExtension.service_wait=0",))  # no service yet, and no wait for it
    service = lab.service()
    code, kernel = alice.start_kernel()  # the provisioner asks the service itself
    assert code == 201
    service.kill()  # kill -9: its socket file left behind
    _stops_at_once_and_the_service_back_reclaims_the_slice(lab, alice, kernel["id"])
    assert "the pool service was not answering when this server started" in alice.log()


def test_a_server_started_a_moment_before_the_service_waits_for_it_and_runs_with_its_pool(lab):
    """A machine starting up: JupyterHub spawns a user's server a moment before the pool service answers.  The
    server waits for the service (``service_wait``) and runs with the pool's API and idle policy, not without
    them until it is restarted."""
    lab.configure()
    coming = threading.Timer(2.0, lab.service)  # the service comes up while the server waits for it
    coming.start()
    try:
        alice = lab.server("alice")
    finally:
        coming.join()
    log = alice.log()
    assert "The GPU pool service is not answering" in log and "waits up to 15 s for it" in log, log[-3000:]
    assert "the pool service answered" in log and "not answering when this server started" not in log
    code, me = alice.request("GET", "gpu-pool/api/v1/me")
    assert code == 200 and me["pool"]["enabled"], me
    code, kernel = alice.start_kernel()
    assert code == 201, kernel
    assert [k["kernel_id"] for k in alice.me()["kernels"]] == [kernel["id"]]


def _stops_at_once_and_the_service_back_reclaims_the_slice(lab, alice, kernel_id: str) -> None:
    started = time.monotonic()
    alice.proc.terminate()
    alice.proc.wait(timeout=20)  # before: the kernel's release raised and the server never exited
    assert time.monotonic() - started < 10
    assert "the pool reclaims the slice when it sees the kernel's process gone" in alice.log()
    lab.service()
    released = wait_for(lambda: [x for x in raw(lab, "alice", [request("leases", states=["released"])])[0]["result"]
                                 if x["kernel_id"] == kernel_id], what="the dead kernel's lease released")
    assert released[0]["reason"] != "shutdown"  # reclaimed by the service's reconcile, not by the gone server


ARGS = ["lease_id", "kernel_id", "waiter_id", "pid", "profile", "slice", "to", "expect", "phase", "host_bytes",
        "owner", "kind", "reason", "message", "detail", "states", "kinds", "limit", "since", "label", "last_gpus"]
# Values that are never right for these arguments (no short text: a kernel id or a kind of their own is
# a user's legitimate request), of every JSON type and then some.
VALUES = [None, 1, -1, 0, 2**70, -(2**70), 1.5, 1e308, True, False, "", "x" * 5000, "../../etc/passwd\x00",
          "🙂" * 3, [], [1, "a", None], ["x" * 5000], {}, {"__type__": "Lease"}, {"__type__": "Popen", "args": ["rm"]},
          [[[[[]]]]], {"a": {"b": {"c": []}}}]


def _garbage(rng: random.Random, ops: list[str]) -> bytes:
    kind = rng.randrange(10)
    if kind == 0:  # bytes, anything but a newline
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000))).replace(b"\n", b"") + b"\n"
    if kind == 1:  # a JSON value that is not an object, or an object that is not a request
        return json.dumps(rng.choice([[1, 2], "op", 7, None, {"id": [1], "op": "whoami"}, {"op": 5},
                                      {"op": "__class__"}, {"op": "../x"}, {"op": "whoami", "args": [1]}])).encode() + b"\n"
    if kind == 2:  # nested past any parser's depth
        return b"[" * rng.randrange(1000, 100_000) + b"\n"
    if kind == 3:  # a request cut in the middle of its JSON (still one line)
        line = json.dumps({"id": 1, "op": rng.choice(ops), "args": {"lease_id": "abc"}}).encode()
        return line[: rng.randrange(1, len(line) - 1)] + b"\n"
    if kind == 4:  # invalid UTF-8 inside a JSON string
        return b'{"op": "whoami", "args": {"kernel_id": "\xff\xfe"}}\n'
    op = rng.choice(ops + ["nope", "", "op_whoami", "handle", "_lease"])
    args = {k: rng.choice(VALUES) for k in rng.sample(ARGS, rng.randrange(0, 6))}
    return json.dumps({"id": rng.choice([1, "r", None, 2**40]), "op": op, "args": args}).encode() + b"\n"


def test_garbage_on_the_socket_gets_an_error_changes_nothing_and_the_service_serves_on(lab):
    lab.configure(trace_recording=False)  # alice's server would record her kernel's activity: the ledger holds still
    lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201, (kernel, alice.log()[-12000:])
    before = ledger_dump(lab)
    ops = sorted(protocol.OPERATIONS)
    rng = random.Random(20240611)
    for name in ("alice", "bob"):  # a user with a kernel, and one without
        garbage = [_garbage(rng, ops) for _ in range(400)]
        replies = raw(lab, name, garbage, timeout=60)
        assert len(replies) == len(garbage)  # one reply a line, in order, whatever the line
        bad = [(line[:120], r) for line, r in zip(garbage, replies)
               if not isinstance(r.get("ok"), bool) or (not r["ok"] and not r["error"]["message"])]
        assert not bad, bad[:3]
        internal = [(line[:200], r) for line, r in zip(garbage, replies) if not r["ok"] and r["error"]["status"] >= 500]
        assert not internal, internal[:3]  # every refusal is the request's fault, none the service's
    assert ledger_dump(lab) == before
    # A request cut off by its sender hanging up, and frames past the limit: closed, nothing else changes.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(lab.socket)
        s.sendall(b'{"op": "release", "args": {"lease_id": "')
    for size in (2 << 20, 64 << 20):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(lab.socket)
            s.settimeout(30)
            try:
                s.sendall(b"x" * size)
            except OSError:
                pass  # the service closed its end once the frame passed the limit
            answer = s.makefile("rb").readline()
        assert json.loads(answer)["error"]["reason"] == "too_large"
    assert ledger_dump(lab) == before
    [who] = raw(lab, "alice", [request("whoami")])  # and it serves on
    assert who["result"]["user"] == "alice"
    assert alice.start_kernel()[0] == 201


def test_a_stalled_client_holds_up_nobody(lab):
    lab.service()
    stuck = []
    for _ in range(20):  # half a request each, then nothing
        s = socket.socket(socket.AF_UNIX)
        s.connect(lab.socket)
        s.sendall(b'{"op": "whoami", "args": {')
        stuck.append(s)
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(lab.socket)  # and one that never reads its replies
    silent.sendall(request("journal", limit=10_000) * 2000)
    try:
        started = time.monotonic()
        replies = raw(lab, "bob", [request("whoami"), request("snapshot")])
        assert [r["ok"] for r in replies] == [True, True]
        assert time.monotonic() - started < 30  # answered while the others hang (no wait for their timeouts)
    finally:
        for s in [*stuck, silent]:
            s.close()


def test_one_users_flood_of_connections_locks_nobody_else_out(lab):
    lab.service()
    code = ("import socket, sys, json, time\n"
            "conns = []\n"
            f"for _ in range({MAX_CONNECTIONS + 8}):\n"
            "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); conns.append(s)\n"
            "s.sendall(b'{\"id\": 1, \"op\": \"whoami\"}\\n'); s.settimeout(20)\n"
            "print(s.makefile('rb').readline().decode(), flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n")
    flood = subprocess.Popen([sys.executable, "-c", code, lab.socket, "30"], **identity("bob"),
                             env=user_env(lab, "bob"), stdout=subprocess.PIPE, text=True)
    try:
        over = json.loads(flood.stdout.readline())
        assert over["error"]["reason"] == "too_many"  # his own connection past the cap is refused
        [who] = raw(lab, "alice", [request("whoami")])  # alice is served meanwhile
        assert who["result"]["user"] == "alice"
    finally:
        flood.kill()
        flood.wait()
    [who] = raw(lab, "bob", [request("whoami")])  # and bob once his flood is gone
    assert who["ok"]


@pytest.mark.slow
def test_one_users_flood_of_writes_holds_up_nobody_elses_requests(lab):
    """bob writes to the ledger as fast as several connections allow (the largest trace batches and
    journal entries a request may carry); alice's who-am-I, allocations and releases are each answered
    within 2 s all the while, though bob's writes together keep the ledger busy far longer."""
    lab.service()
    events = [{"t": time.time(), "e": "busy", "k": "k-flood"} for _ in range(1000)]  # the most one request may carry
    lines = [request("trace_record", events=events), request("record", kind="noted", detail={"x": "y" * 16000})]
    with Flood(lab, "bob", lines, conns=32, allowed=("too_many",)) as flood:  # (the journal's caps, once reached)
        waits = probe_waits(lab, "alice", 8.0)
        flooded = flood.stop()
    assert len(flooded) == 32
    assert len(waits["allocate"]) >= 3  # alice was served all along, not once at the end
    slowest = {op: max(w) for op, w in waits.items()}
    assert all(w < 2.0 for w in slowest.values()), slowest
    writes, waited = sum(n for n, _, _ in flooded), sum(w for _, w, _ in flooded)
    assert writes >= 50 and waited > 10 * 2.0, (writes, waited)  # bob's writes would have kept her waiting long


HOLDER_PROBE = """
import json, socket, sys, time
def connect():
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(60); return s, s.makefile("rb")
(a, a_replies), (w, w_replies) = connect(), connect()
a.sendall(b'{"id": 1, "op": "allocate", "args": {"kernel_id": "k-alice-1", "profile": "small"}}\\n')
time.sleep(0.3)  # the allocation waits on the ledger's lock by now
asked = time.monotonic()
w.sendall(b'{"id": 2, "op": "whoami"}\\n')
who = json.loads(w_replies.readline())
print(json.dumps({"whoami": time.monotonic() - asked, "who": who}), flush=True)
lease = json.loads(a_replies.readline())
print(json.dumps({"at": time.time(), "lease": lease}), flush=True)
"""


def test_the_service_never_sleeps_on_the_ledgers_lock_whoever_holds_it(lab):
    """SQLite's write lock held from outside the service's turns (here root's own connection; a thread of a
    request whose client hung up could too): alice's allocation waits for it, in a thread, while her
    who-am-I on another connection is answered at once (the loop once slept in SQLite's busy handler)."""
    import sqlite3

    lab.service()
    holder = sqlite3.connect(lab.ledger, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    probe = subprocess.Popen([sys.executable, "-c", HOLDER_PROBE, lab.socket], **identity("alice"),
                             env=user_env(lab, "alice"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answered = json.loads(probe.stdout.readline() or "null")  # her who-am-I, while the lock is held
    finally:
        released = time.time()
        holder.execute("ROLLBACK")
        holder.close()
    out, err = probe.communicate(timeout=60)
    assert probe.returncode == 0 and answered, err[-3000:]
    assert answered["who"]["result"]["user"] == "alice" and answered["whoami"] < 1.0, answered
    seen = json.loads(out)
    assert seen["lease"]["ok"] and seen["lease"]["result"]["kernel_id"] == "k-alice-1", seen
    assert seen["at"] >= released  # it did wait for the lock (then took the slice)
