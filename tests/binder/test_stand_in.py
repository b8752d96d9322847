"""The Binder demo's stand-in for another student answers what an admin asks of its kernels, as
another user's server would (issue 28, item 7): the admin's dashboard then sees the request carried
out instead of a note and nothing. A real ledger (SQLite) on a declared pool; no server needed."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.pool import LocalPool
from jupyter_gpu_pool.server_extension.admin_requests import KIND

BINDER = Path(__file__).resolve().parents[2] / "binder"


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    config = tmp_path / "config"
    config.mkdir()
    ledger = tmp_path / "ledger.sqlite"
    (config / "jupyter_gpu_pool_config.py").write_text(
        "c.GPUPool.gpu_discovery = 'declared'\n"
        "c.GPUPool.inventory = [{'name': 'Demo GPU', 'memory': '40GiB', 'sm_count': 108, 'count': 2}]\n"
        "c.GPUPool.profiles = {'gpu-20g': {'slice': '20GiB', 'isolation': 'soft'}}\n"
        f"c.GPUPool.ledger_path = {str(ledger)!r}\n"
        "c.GPUPool.unix_groups = False\n"
        "c.GPUPool.policy = []\n")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config))
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "0")
    LocalPool(load_settings())  # the GPUs in the ledger, as the demo's server puts them there as it starts
    spec = importlib.util.spec_from_file_location("another_student", BINDER / "another_student.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module, Ledger(ledger)
    module.let_go()


def ask(ledger: Ledger, lease, action: str) -> None:
    """What the admin's server writes for a kernel of another server (admin_requests.ask)."""
    ledger.record(KIND, lease_id=lease.id, kernel_id=lease.kernel_id, owner=lease.owner, reason="admin",
                  detail={"action": action, "by": "root", "name": lease.label, "profile": lease.profile})


def test_the_stand_in_carries_out_an_admins_requests(stand_in):
    module, ledger = stand_in
    assert "holds 4 slice(s)" in module.take_the_pool()
    first, second, third, _ = ledger.leases(owner=module.OWNER)
    ask(ledger, first, "release")
    ask(ledger, second, "shutdown")
    ask(ledger, third, "hibernate")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        states = {lease.id: lease.state for lease in ledger.leases(owner=module.OWNER)}
        if states.get(first.id) == "hibernated" and second.id not in states and states.get(third.id) == "hibernated":
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the stand-in did not answer: {states}")
    on_record = [(e.kind, e.kernel_id, e.reason, e.detail.get("source"))
                 for e in ledger.journal(kinds=("hibernated", "released"), owner=module.OWNER)
                 if e.detail.get("source") == "policy"]
    assert ("hibernated", first.kernel_id, "admin", "policy") in on_record
    assert ("released", second.kernel_id, "admin", "policy") in on_record
    assert ("hibernated", third.kernel_id, "admin", "policy") in on_record
    # Answered once: the next look finds nothing new to do.
    assert module.answer_requests(ledger) == 0
