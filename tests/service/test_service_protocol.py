"""The service's wire format and argument checks, and where it reads its settings (no users needed)."""

from __future__ import annotations

import os

import pytest

from jupyter_gpu_pool.pool import GPU, JournalEntry, Lease, SliceSpec, Snapshot, Waiter
from jupyter_gpu_pool.pool.budgets import Budget, Scope, Standing
from jupyter_gpu_pool.pool.placement import GPUUsage
from jupyter_gpu_pool.service import protocol
from jupyter_gpu_pool.service.arguments import Args
from jupyter_gpu_pool.service.client import _rebuild

LEASE = Lease(id="l1", owner="ann", kernel_id="k1", profile="small", isolation="soft", memory=2**30, sm_percent=None,
              whole=False, gpu_count=1, state="active", gpus=("G0",), last_gpus=("G0",), groups=("students",),
              label="a.ipynb", created=1.0, updated=2.0, state_since=1.0, holder_pid=42, holder_start=3.5)


@pytest.mark.parametrize("value", [
    LEASE,
    Snapshot(at=1.0, gpus=[GPUUsage(GPU("G0", "X", 2**30), 2**29, 10, False, 1)], leases=[LEASE],
             waiters=[Waiter("w", "ann", "k", None, "small", SliceSpec.parse("10GiB,25%"), "", 1.0, 2.0, 1)]),
    JournalEntry(1, 2.0, "allocated", "l1", "k1", "ann", "", {"gpus": ["G0"]}),
    Standing(Scope("students", "member", Budget(10.0)), 2.5, 0.25, 100.0, 50.0, 0.0),
    [LEASE, None, {"a": (1, 2)}],
])
def test_domain_values_survive_the_wire(value):
    line = protocol.dumps({"result": value})
    back = protocol.decode(protocol.loads(line))["result"]
    expected = protocol.decode(protocol.encode(value))
    assert back == expected
    if isinstance(value, (Lease, Snapshot, JournalEntry, Standing)):
        assert back == value  # tuples come back as tuples, dataclasses as themselves


@pytest.mark.parametrize("line, words", [
    (b"nope", "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (b"7", "a message is a JSON object"),
])
def test_a_line_that_is_not_a_message_says_so(line, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        protocol.loads(line)


def test_an_unknown_type_in_a_message_is_refused():
    with pytest.raises(protocol.ProtocolError, match="unknown type 'Popen'"):
        protocol.decode({"__type__": "Popen", "args": ["rm"]})


@pytest.mark.parametrize("raw, call, words", [
    ({}, lambda a: a.text("lease_id"), "'lease_id' is required"),
    ({"lease_id": 5}, lambda a: a.text("lease_id"), "must be str"),
    ({"pid": True}, lambda a: a.integer("pid"), "must be int"),
    ({"deadline": float("nan")}, lambda a: a.number("deadline"), "finite"),
    ({"to": "melting"}, lambda a: a.phase("to"), "not a phase"),
    ({"label": "x" * 5000}, lambda a: a.text("label"), "too long"),
    ({"kinds": [1]}, lambda a: a.texts("kinds"), "list of at most 64 names"),
    ({"kind": "DROP TABLE leases"}, lambda a: a.word("kind"), "small letters"),
    ({"kind": ""}, lambda a: a.word("kind"), "small letters"),
    ({"states": ["gone"]}, lambda a: a.states("states"), "not lease states"),
])
def test_each_argument_is_checked_for_its_type(raw, call, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        call(Args(raw))


def test_each_operation_is_declared_once_and_served_and_sent_as_declared():
    from jupyter_gpu_pool.service.client import ServiceClient
    from jupyter_gpu_pool.service.operations import Operations

    served = {name[3:] for name in dir(Operations) if name.startswith("op_")}
    assert served == set(protocol.OPERATIONS)  # a handler for each declared operation, none undeclared
    client = ServiceClient("/nonexistent/pool.sock")
    with pytest.raises(ValueError, match="no operation 'nope'"):
        client.call("nope")
    with pytest.raises(ValueError, match="no operation 'release' taking \\['lease_id', 'owner'\\]"):
        client.call("release", lease_id="l", owner="bob")  # refused before anything is sent
    with pytest.raises(AssertionError, match="reads 'owner', which it does not declare"):
        Args({"owner": "bob"}, protocol.OPERATIONS["release"]).text("owner")


def test_a_refusal_comes_back_as_the_pools_own_exception():
    from jupyter_gpu_pool.pool import LeaseNotFound, QuotaExceeded
    from jupyter_gpu_pool.pool.phases import PhaseConflict

    err = _rebuild({"reason": "quota_exceeded", "message": "GPU quota exceeded: 50% of 40%",
                    "detail": {"scope": "user", "resource": "SM share"}})
    assert isinstance(err, QuotaExceeded) and str(err) == "GPU quota exceeded: 50% of 40%" and err.scope == "user"
    assert isinstance(_rebuild({"reason": "lease_not_found", "message": "No GPU lease 'x' is held"}), LeaseNotFound)
    conflict = _rebuild({"reason": "phase_conflict", "detail": {"lease_id": "l", "expected": "", "found": "stopping",
                                                                 "state": "active"}})
    assert isinstance(conflict, PhaseConflict) and conflict.found == "stopping"


def test_the_service_reads_the_admins_locations_only(monkeypatch, tmp_path):
    from jupyter_gpu_pool.service.app import system_config_paths

    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "also-mine"))
    paths = system_config_paths()
    assert "/etc/jupyter" in paths and all(not p.startswith(str(tmp_path)) for p in paths)
    assert not any(p.startswith(os.path.expanduser("~")) for p in paths if os.path.expanduser("~") != "/")
