"""The protocol's boundary as a property: whatever sequence of requests a student sends, with whatever
arguments (another student's lease, queue place and kernel ids among them), the other student's rows in
the ledger stay as they were and nothing of them comes back."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_helpers import Connection, identity

from jupyter_gpu_pool.service import protocol

pytestmark = pytest.mark.timeout(300)

OPS = sorted(protocol.OPERATIONS)
ARGS = ["lease_id", "kernel_id", "waiter_id", "pid", "profile", "to", "expect", "phase", "host_bytes", "owner",
        "kind", "reason", "message", "detail", "states", "kinds", "limit", "since", "after_seq", "label", "events",
        "same_gpu", "after", "deadline", "candidates", "freeing", "warned"]
# What is bob's and never sent by alice: none of it may reach her.
SECRETS = ["bob-secret-label", "bob-secret-detail", "bob-secret-queue", '"owner": "bob"', '"u": "bob"']
TABLES = {"leases": "owner", "waiters": "owner", "journal": "owner", "trace": "owner", "usage": "owner",
          "lease_groups": "lease_id IN (SELECT id FROM leases WHERE owner='bob') AND 1"}


def _rows_of_bob(lab) -> dict:
    """Every row of bob's in the ledger (but his queue place's heartbeat, which he keeps up himself)."""
    out = {}
    with sqlite3.connect(f"file:{lab.ledger}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        for table, column in TABLES.items():
            where = f"{column}='bob'" if column == "owner" else column
            rows = [dict(r) for r in db.execute(f"SELECT * FROM {table} WHERE {where}")]
            for r in rows:
                r.pop("heartbeat", None)
            out[table] = sorted(rows, key=json.dumps)
    return out


def test_no_request_of_a_student_changes_or_reveals_another_students_rows(lab):
    lab.configure(trace_recording=True, service={"reconcile_interval": 3600})
    lab.service()
    bob, alice = Connection(lab, "bob"), Connection(lab, "alice")
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], **identity("bob"), cwd="/")
    try:
        lease = bob.call("allocate", kernel_id="k-bob", profile="small", label="bob-secret-label")["result"]
        assert bob.call("set_holder", lease_id=lease["id"], pid=kernel.pid)["ok"]
        waiter = bob.call("enqueue", kernel_id="k-bob-q", profile="small", label="bob-secret-queue")["result"]
        assert bob.call("record", kind="noted", kernel_id="k-bob", detail={"note": "bob-secret-detail"})["ok"]
        assert bob.call("trace_record", events=[{"t": time.time(), "e": "busy", "k": "k-bob"}])["ok"]
        mine = alice.call("allocate", kernel_id="k-alice", profile="small")["result"]
        values = st.sampled_from([
            lease["id"], waiter["id"], "k-bob", "k-bob-q", "bob", mine["id"], "k-alice", "alice", "small", "",
            "hibernating", "active", "released", "noted", None, True, 0, 1, -1, kernel.pid, 2**40, 1.5,
            ["bob"], ["active", "released", "hibernated"], [], {"note": "x"}, [1.0, 1],
            [{"t": 1.0, "e": "busy", "k": "k-bob"}], [{"t": 1.0, "e": "busy", "k": "k-bob", "u": "bob"}],
            [[lease["id"], "hibernate", 0.0]], ["k-bob"]])
        requests = st.lists(st.tuples(st.sampled_from(OPS), st.dictionaries(st.sampled_from(ARGS), values,
                                                                            max_size=4)), min_size=1, max_size=6)

        @settings(max_examples=25, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
        @given(requests)
        def alice_tries(sequence):
            assert bob.call("heartbeat", waiter_id=waiter["id"])["result"]  # his place stays live meanwhile
            before = _rows_of_bob(lab)
            for op, args in sequence:
                reply = alice.call(op, **args)
                text = json.dumps(reply)
                assert not [s for s in SECRETS if s in text], (op, args, text[:1000])
                assert not (not reply["ok"] and reply["error"]["status"] >= 500), (op, args, reply)
            assert _rows_of_bob(lab) == before, sequence

        alice_tries()
    finally:
        alice.close()
        bob.close()
        kernel.kill()
        kernel.wait()
