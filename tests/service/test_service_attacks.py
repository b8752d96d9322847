"""A hostile student on a shared box: bob, a real Unix user, speaks the service's socket by hand to make
the root service kill alice's process, stall her, break the admins' view, take her place in the queue,
read her settings or file entries about her kernels.  Each attack as bob would run it; none works."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest
from service_helpers import Connection, Flood, identity, probe_waits, raw, request, uid_of, user_env, wait_for

from jupyter_gpu_pool.service.operations import JOURNAL_CAPS

pytestmark = pytest.mark.timeout(300)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _on_pid(name: str, pid: int) -> subprocess.Popen | None:
    """A process of ``name``'s on ``pid``: root writes the pid counter (an attacker cycles threads until the
    counter comes round, which takes longer).  None where the machine's other work holds the pid (a
    thread of a busy test worker may have taken it for good): the caller tries with another pid."""
    for _ in range(50):
        if psutil.pid_exists(pid):
            return None
        with open("/proc/sys/kernel/ns_last_pid", "w") as counter:
            counter.write(str(pid - 1))
        proc = subprocess.Popen(SLEEPER, **identity(name), cwd="/")
        if proc.pid == pid:
            return proc
        proc.kill()  # another process of the machine took it first: again
        proc.wait()
    return None


def _dead_kernel_with_victim(bob, name: str) -> tuple[dict, subprocess.Popen]:
    """bob's lease whose registered kernel has died, and a process of ``name``'s on that kernel's pid."""
    for attempt in range(10):
        kernel = subprocess.Popen(SLEEPER, **identity("bob"), cwd="/")
        lease = bob.call("allocate", kernel_id=f"k-bob-{attempt}", profile="small")["result"]
        assert bob.call("set_holder", lease_id=lease["id"], pid=kernel.pid)["ok"]
        kernel.kill()
        kernel.wait()
        victim = _on_pid(name, kernel.pid)  # alice's next process takes his kernel's pid
        if victim is not None:
            return lease, victim
        assert bob.call("release", lease_id=lease["id"], reason="test: try another pid")["ok"]
    raise AssertionError("could not place a process on a dead kernel's pid in 10 tries (the machine is too busy)")


def test_bob_cannot_make_the_service_kill_alices_process_on_his_dead_kernels_pid(lab):
    # bob's budget lasts 6 s of a small slice; the service ends his kernel 1 s after it runs out
    lab.configure(budgets={"bob": {"gpu_hours": 0.25 * 6 / 3600, "period": "day"}}, service={"budget_grace": 1})
    lab.service()
    bob = Connection(lab, "bob")  # his "server": alive, so his lease is not reclaimed, and adopting it
    victim = None
    try:
        lease, victim = _dead_kernel_with_victim(bob, "alice")
        assert psutil.Process(victim.pid).uids().real == uid_of("alice")
        assert bob.call("get", lease_id=lease["id"])["result"]["state"] == "active"  # placed before the budget ran out

        def ended():
            bob.call("adopt", lease_id=lease["id"])  # every second, as the attack does
            found = bob.call("get", lease_id=lease["id"])["result"]
            return found["state"] == "released" and found

        released = wait_for(ended, timeout=60, interval=1.0, what="the service to end bob's kernel")
        assert released["reason"] == "budget: GPU time used up (ended by the pool service)"
        time.sleep(0.5)
        assert victim.poll() is None  # alice's process lives: the service signalled nothing of hers
        assert "no longer the kernel its lease registered" in (lab.root / "service.log").read_text()
    finally:
        bob.close()
        if victim is not None:
            victim.kill()
            victim.wait()


@pytest.mark.slow
def test_bobs_reads_of_his_largest_journal_from_many_connections_cost_alice_nothing(lab):
    lab.configure(trace_recording=False)
    lab.service()
    bob = Connection(lab, "bob")
    try:  # the most he may keep, of the costliest kind to read: entries of the largest detail made of the
        # most JSON values that fit (a list of 4000 lists), until the bytes run out, then a refusal
        entry = {"x": [[0]] * ((JOURNAL_CAPS.entry_bytes - 7) // 4)}
        size, stored = len(json.dumps(entry, separators=(",", ":"))), len(json.dumps(entry))
        assert size <= JOURNAL_CAPS.entry_bytes
        assert bob.call("record", kind="noted", detail={"x": "y" * (JOURNAL_CAPS.entry_bytes - 7)})["error"][
            "reason"] == "bad_request"  # one byte more than an entry may be
        kept = 0
        while (reply := bob.call("record", kind="noted", detail=entry))["ok"]:
            kept += 1
        assert reply["error"]["reason"] == "too_many" and "the most one user may keep" in reply["error"]["message"]
        assert kept == (JOURNAL_CAPS.bytes - size) // stored + 1  # (kept as JSON with spaces: larger)
    finally:
        bob.close()
    with Flood(lab, "bob", [request("journal", limit=10000)], conns=6) as readers:
        waits = probe_waits(lab, "alice", 8.0, reads_journal=True)
        reads = readers.stop()
    assert len(reads) == 6 and sum(n for n, _, _ in reads) >= 6
    assert min(size for _, _, size in reads) > 0.7 * JOURNAL_CAPS.bytes  # each read his whole journal
    assert len(waits["allocate"]) >= 5  # alice was served all along
    slowest = {op: max(w) for op, w in waits.items()}
    assert all(w < 1.0 for w in slowest.values()), slowest


def test_a_journal_entry_posing_as_a_type_is_shown_to_the_admin_as_the_data_it_is(lab):
    from jupyter_gpu_pool.service.client import ServiceClient, ServicePool

    lab.service()
    poison = {"__type__": "NotAType", "lease": {"__type__": "Lease", "id": "x"}, "list": [{"__type__": "GPU"}]}
    [recorded] = raw(lab, "bob", [request("record", kind="noted", reason="poison", detail=poison)])
    assert recorded["ok"], recorded
    admin = ServicePool(ServiceClient(lab.socket))  # root: an admin, as the admins' pool view reads it
    try:
        entries = admin.ledger.journal(owner="bob", kinds=("noted",))
        assert [(e.owner, e.reason, e.detail) for e in entries] == [("bob", "poison", poison)]
        assert any(e.owner == "bob" for e in admin.ledger.journal())  # and the whole journal reads too
    finally:
        admin.ledger.close()


def test_a_frame_that_names_a_key_twice_is_refused_as_malformed_and_changes_nothing(lab):
    """json keeps the last of two equal keys, so {"op": "get", "op": "release"} would release what a reader of
    its first key takes for a read: a strict protocol refuses the frame, at any depth, and acts on nothing."""
    lab.service()
    bob = Connection(lab, "bob")
    try:
        mine = bob.call("allocate", kernel_id="k-bob", profile="small")["result"]
        lease = json.dumps(mine["id"])
        frames = [b'{"id": 1, "op": "whoami", "op": "release", "args": {"lease_id": %s}}\n' % lease.encode(),
                  b'{"id": 2, "op": "release", "args": {"lease_id": "nobody", "lease_id": %s}}\n' % lease.encode(),
                  b'{"id": 3, "op": "record", "args": {"kind": "noted", "detail": {"a": 1, "a": 2}}}\n']
        replies = [bob.send(frame) for frame in frames]
        assert [(r["id"], r["ok"], r["error"]["reason"]) for r in replies] == [
            (None, False, "bad_request")] * 3, replies
        assert ["'op' twice" in replies[0]["error"]["message"], "'lease_id' twice" in replies[1]["error"]["message"],
                "'a' twice" in replies[2]["error"]["message"]] == [True] * 3, replies
        assert bob.call("get", lease_id=mine["id"])["result"]["state"] == "active"  # nothing was released
        assert bob.call("journal", kinds=["noted"])["result"] == []  # nor recorded
        assert bob.call("whoami")["ok"]  # and the connection serves on
    finally:
        bob.close()


def test_bob_cannot_take_over_alices_queue_place_once_she_missed_a_heartbeat(lab):
    lab.configure(service={"reconcile_interval": 3600})  # nothing prunes her place while this runs
    lab.service()
    alice, bob = Connection(lab, "alice"), Connection(lab, "bob")
    try:
        waiter = alice.call("enqueue", kernel_id="k-alice", profile="small", label="secret.ipynb")["result"]

        def heartbeat() -> float:
            with sqlite3.connect(f"file:{lab.ledger}?mode=ro", uri=True) as db:
                return db.execute("SELECT heartbeat FROM waiters WHERE id=?", (waiter["id"],)).fetchone()[0]

        # Her place missed its heartbeat (not yet pruned): its last one put 16 s back, past the ledger's 15 s,
        # by root in the ledger (as 16 s of waiting would leave it)
        db = sqlite3.connect(lab.ledger)
        with db:
            db.execute("UPDATE waiters SET heartbeat = heartbeat - 16 WHERE id=?", (waiter["id"],))
        db.close()
        before = heartbeat()
        assert all(w["id"] != waiter["id"] for w in alice.call("waiters")["result"])
        taken = bob.call("heartbeat", waiter_id=waiter["id"])
        unknown = bob.call("heartbeat", waiter_id="no-such-place")
        assert taken["ok"] and taken["result"] is None  # answered as a place that does not exist is
        assert {k: v for k, v in taken.items() if k != "id"} == {k: v for k, v in unknown.items() if k != "id"}
        assert "k-alice" not in json.dumps(taken) and "secret" not in json.dumps(taken)
        assert bob.call("dequeue", waiter_id=waiter["id"])["ok"]
        assert heartbeat() == before  # not revived by him, not deleted by him
        mine = alice.call("heartbeat", waiter_id=waiter["id"])["result"]
        assert mine["id"] == waiter["id"] and mine["label"] == "secret.ipynb"  # still hers
    finally:
        alice.close()
        bob.close()


def test_settings_show_a_user_their_own_entries_and_the_pools_defaults_and_an_admin_all(lab):
    lab.configure(user_quotas={"alice": {"kernels": 3}, "bob": {"kernels": 2}},
                  group_quotas={"ta": {"kernels": 9}, "students": {"kernels": 8}},
                  group_members={"ta": ["alice"], "students": ["alice", "bob"]},
                  budgets={"alice": {"gpu_hours": 7, "period": "week"}, "students": {"gpu_hours": 5},
                           "ta": {"gpu_hours": 6}},
                  default_user_quota={"kernels": 1},
                  policy=[{"name": "alice-late", "match": {"user": "alice"}, "idle_timeout": "2h"},
                          {"name": "ta-late", "match": {"group": "ta"}, "idle_timeout": "2h"},
                          {"name": "everyone", "idle_timeout": "1h"}])
    lab.service()
    [mine] = raw(lab, "bob", [request("settings")])
    config = mine["result"]["config"]
    assert config["user_quotas"] == {"bob": {"kernels": 2}}
    assert set(config["group_quotas"]) == {"students"} and config["group_members"] == {"students": ["bob"]}
    assert set(config["budgets"]) == {"students"} and config["default_user_quota"] == {"kernels": 1}
    assert [rule["name"] for rule in config["policy"]] == ["everyone"]  # the rules that may be his
    assert "alice" not in json.dumps(config) and "ta" not in config["group_quotas"]
    admin = subprocess.run([sys.executable, "-c", "import json, sys\nfrom jupyter_gpu_pool.service.client import "
                            "ServiceClient\nprint(json.dumps(ServiceClient(sys.argv[1]).call('settings')['config']))",
                            lab.socket], capture_output=True, text=True, timeout=60)
    everything = json.loads(admin.stdout)
    assert len(everything["policy"]) == 3 and set(everything["user_quotas"]) == {"alice", "bob"} and set(everything["budgets"]) == {"alice", "students",
                                                                                                "ta"}
    # and bob's own server still works from his part: his quota is his own
    bob = lab.server("bob")
    assert bob.me()["quota"]["kernels"] == 2
    assert [bob.start_kernel()[0] for _ in range(3)] == [201, 201, 403]


def test_bob_can_neither_file_entries_about_alices_kernel_nor_tell_her_leases_from_none(lab):
    lab.configure(trace_recording=True)
    lab.service()
    alice, bob = Connection(lab, "alice"), Connection(lab, "bob")
    try:
        hers = alice.call("allocate", kernel_id="k-alice", profile="small")["result"]
        mine = bob.call("allocate", kernel_id="k-bob", profile="small")["result"]
        now = time.time()
        refused = [bob.call("record", kind="noted", kernel_id="k-alice", detail={"by": "bob"}),
                   bob.call("record", kind="noted", lease_id=mine["id"], kernel_id="k-alice"),
                   bob.call("trace_record", events=[{"t": now, "e": "busy", "k": "k-alice"}])]
        assert [r["error"]["reason"] for r in refused] == ["not_yours", "bad_request", "not_yours"], refused
        assert bob.call("record", kind="noted", kernel_id="k-bob")["ok"]  # his own, as ever
        assert bob.call("trace_record", events=[{"t": now, "e": "busy", "k": "k-bob"}])["result"] == 1
        entries = alice.call("journal", kinds=["noted"])["result"]
        assert entries == []
        with sqlite3.connect(f"file:{lab.ledger}?mode=ro", uri=True) as db:
            assert db.execute("SELECT count(*) FROM journal WHERE kernel_id='k-alice' AND owner='bob'").fetchone() == (0,)
            assert db.execute("SELECT count(*) FROM trace WHERE kernel_id='k-alice'").fetchone() == (0,)
        # her lease and no lease at all are answered alike
        for op, args in [("get", {}), ("stop", {}), ("adopt", {}), ("mps_env", {}), ("set_holder", {"pid": bob.pid}),
                         ("set_phase", {"to": "hibernating"}), ("hibernate", {"host_bytes": 0}), ("resume", {}),
                         ("release", {}), ("reserve_host_bytes", {"host_bytes": 1}), ("enqueue", {"kernel_id": "k-b2"})]:
            theirs = bob.call(op, lease_id=hers["id"], **args)
            none = bob.call(op, lease_id="0" * len(hers["id"]), **args)
            theirs.pop("id"), none.pop("id")
            assert json.dumps(theirs).replace(hers["id"], "?") == json.dumps(none).replace("0" * len(hers["id"]),
                                                                                        "?"), (op, theirs, none)
        assert alice.call("get", lease_id=hers["id"])["result"]["state"] == "active"
        # numbers no ledger holds: a clear refusal, no failure
        huge = 10**399
        replies = [bob.call("journal", since=huge), bob.call("journal", after_seq=huge),
                   bob.call("set_phase", lease_id=mine["id"], to="hibernating", deadline=huge),
                   bob.call("hibernate", lease_id=mine["id"], host_bytes=huge),
                   bob.call("reserve_host_bytes", lease_id=mine["id"], host_bytes=huge),
                   bob.call("spenders", since=huge), bob.call("trace_export", since=huge),
                   bob.call("trace_export", after=[huge, 1]), bob.call("trace_export", after=[1.0, huge]),
                   bob.call("journal", since=-huge)]
        assert [r["error"]["reason"] for r in replies] == ["bad_request"] * len(replies), replies
        assert all("out of range" in r["error"]["message"] or "'after'" in r["error"]["message"] for r in replies)
        assert bob.call("get", lease_id=mine["id"])["result"]["phase"] == ""  # nothing changed
    finally:
        alice.close()
        bob.close()
    log = (lab.root / "service.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_the_service_ends_a_proven_kernel_and_its_children_and_nothing_unproven(unix_users):
    """The helper budget enforcement ends kernels with: the registered process (pid, start time, owner's
    uid) and its descendants; a wrong start time or another owner's uid, and nothing is signalled."""
    from jupyter_gpu_pool.service.kernels import end_kernel

    parent = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              "print(child.pid, flush=True)\ntime.sleep(600)\n")
    kernel = subprocess.Popen([sys.executable, "-c", parent], **identity("alice"), cwd="/", stdout=subprocess.PIPE,
                              text=True)
    try:
        child = psutil.Process(int(kernel.stdout.readline()))
        start = psutil.Process(kernel.pid).create_time()
        assert end_kernel(kernel.pid, start + 1.0, uid_of("alice"), grace=1) == []  # not the registered one
        assert end_kernel(kernel.pid, start, uid_of("bob"), grace=1) == []  # not the owner's
        assert end_kernel(kernel.pid, start, 0, grace=1) == []  # root's: never
        assert kernel.poll() is None and child.is_running()
        assert end_kernel(kernel.pid, start, uid_of("alice"), grace=1) == [kernel.pid, child.pid]
        assert kernel.wait(timeout=10) is not None
        child.wait(timeout=10)
    finally:
        kernel.kill()
        kernel.wait()
