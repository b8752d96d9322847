"""Faults of the pool service: it is down, it is killed and started again, it is fed garbage, a client
stalls.  Nothing is lost and nobody waits on anybody else."""

from __future__ import annotations

import json
import random
import socket
import time

import pytest
from service_helpers import raw, request

pytestmark = pytest.mark.timeout(240)


def test_with_the_service_down_a_start_is_refused_at_once_saying_who_to_ask(lab):
    alice = lab.server("alice")  # the service never started
    started = time.monotonic()
    code, refused = alice.start_kernel()
    took = time.monotonic() - started
    assert code == 503 and "pool service is not answering" in refused["message"]
    assert "systemctl status jupyter-gpu-pool" in refused["message"]
    assert took < 3.0  # the kernel start itself answers in well under a second of pool time; HTTP round trip aside


def test_a_service_killed_and_started_again_keeps_every_lease_and_clients_reconnect(lab):
    service = lab.service()
    alice = lab.server("alice")
    code, kernel = alice.start_kernel()
    assert code == 201
    kid = kernel["id"]
    before = {k["kernel_id"]: k["lease_id"] for k in alice.me()["kernels"]}
    service.kill()  # kill -9: no goodbye
    code, refused = alice.start_kernel()
    assert code == 503 and "not answering" in refused["message"]
    lab.service()
    time.sleep(2.5)  # past a reconcile of the new service (every second here): the live kernel keeps its slice
    assert {k["kernel_id"]: k["lease_id"] for k in alice.me()["kernels"]} == before  # the same server reconnects
    code, second = alice.start_kernel()
    assert code == 201
    status, out = alice.request("GET", f"api/kernels/{kid}")
    assert status == 200 and out["id"] == kid  # no kernel lost
    [leases] = raw(lab, "alice", [request("leases")])
    assert {x["kernel_id"] for x in leases["result"]} == {kid, second["id"]}


def _ledger_state(lab) -> list:
    [snap] = raw(lab, "alice", [request("leases")])
    return sorted((x["id"], x["state"], x["phase"], tuple(x["gpus"])) for x in snap["result"])


def test_garbage_on_the_socket_gets_an_error_changes_nothing_and_the_service_serves_on(lab):
    lab.service()
    alice = lab.server("alice")
    assert alice.start_kernel()[0] == 201
    before = _ledger_state(lab)
    rng = random.Random(1234)
    garbage = [
        b"not json\n", b"[1, 2]\n", b"{}\n", b'{"op": 5}\n', b'{"op": "__class__"}\n', b'{"op": "allocate"}\n',
        b'{"op": "release", "args": {"lease_id": 5}}\n', b'{"op": "release", "args": []}\n',
        b'{"op": "set_phase", "args": {"lease_id": "x", "to": "melting"}}\n',
        b'{"op": "hibernate", "args": {"lease_id": "x", "host_bytes": -1}}\n',
        b'{"op": "journal", "args": {"limit": 1e999}}\n', b'{"id": {"a": 1}, "op": "whoami"}\n',
        b"[" * 50_000 + b"\n", b'{"op": "record", "args": {"kind": "x", "detail": "' + b"a" * 100 + b'"}}\n',
        bytes(rng.randrange(256) for _ in range(2000)).replace(b"\n", b"") + b"\n",
    ] + [json.dumps({"op": rng.choice(["allocate", "release", "stop", "set_holder", "enqueue", "resume"]),
                     "args": {k: rng.choice([None, 1, -1, "", "x" * 5000, [], {}, True, 1.5])
                              for k in rng.sample(["lease_id", "kernel_id", "pid", "profile", "slice", "to"], 3)}})
             .encode() + b"\n" for _ in range(60)]
    replies = raw(lab, "alice", garbage)
    assert len(replies) == len(garbage)
    assert all(r["ok"] is False and r["error"]["message"] for r in replies)
    assert {r["error"]["reason"] for r in replies} <= {"bad_request", "no_such_lease", "not_yours", "lease_not_found",
                                                        "unknown_profile", "no_such_kernel"}
    assert _ledger_state(lab) == before
    # a truncated message (the peer hangs up mid-line) and a frame over the limit: closed, nothing else changes
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(lab.socket)
        s.sendall(b'{"op": "release", "args": {"lease_id": "')
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(lab.socket)
        s.settimeout(10)
        try:
            s.sendall(b"x" * (2 << 20))
        except OSError:
            pass
        answer = s.makefile("rb").readline()
    assert json.loads(answer)["error"]["reason"] == "too_large"
    assert _ledger_state(lab) == before
    [who] = raw(lab, "alice", [request("whoami")])  # and it serves on
    assert who["result"]["user"] == "alice"


def test_a_stalled_client_holds_up_nobody(lab):
    lab.service()
    with socket.socket(socket.AF_UNIX) as stuck:
        stuck.connect(lab.socket)
        stuck.sendall(b'{"op": "whoami", "args": {')  # half a request, then nothing
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(lab.socket)  # and one that never reads its replies
        silent.sendall(request("journal") * 200)
        started = time.monotonic()
        replies = raw(lab, "bob", [request("whoami"), request("snapshot")])
        assert time.monotonic() - started < 10 and [r["ok"] for r in replies] == [True, True]
        silent.close()
