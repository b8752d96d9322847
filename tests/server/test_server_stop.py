"""A server that stops ends its kernels, and its users' "What happened" says so: a hibernated kernel's
variables are not kept past the server (its last entry must not be "hibernated ... variables are kept")."""

from __future__ import annotations

import json

from server_helpers import body, start_kernel

from jupyter_gpu_pool.pool import HIBERNATED, RELEASED
from jupyter_gpu_pool.pool import JournalEntry, LeaseRequest, build_quota_book
from jupyter_gpu_pool.pool.leases import Holder
from jupyter_gpu_pool.pool.liveness import (
    KERNEL_AND_SERVER_GONE,
    SERVER_STOPPED,
    Graces,
    dead_reason,
    ended_with_server,
)
from jupyter_gpu_pool.pool.profiles import parse_profile
from jupyter_gpu_pool.server_extension.rest.views import journal_item
from jupyter_gpu_pool.server_extension import messages

ME = ("gpu-pool", "api", "v1", "me")


def lease_of(pool_home, kernel_id: str):
    leases = pool_home.ledger().leases(states=("active", "hibernated", "released"))
    return next(lease for lease in leases if lease.kernel_id == kernel_id)


async def test_stopping_the_server_puts_the_end_of_every_kernel_on_its_users_record(jp_fetch, jp_serverapp, pool_home):
    running = await start_kernel(jp_fetch)
    session = body(await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "long run.ipynb", "name": "long run.ipynb", "type": "notebook",
         "kernel": {"name": "gpu-pool-small"}})))
    sleeping = session["kernel"]["id"]
    pool_home.ledger().hibernate(lease_of(pool_home, sleeping).id, 0, "idle")
    assert lease_of(pool_home, sleeping).state == HIBERNATED

    # What jupyter_server does as it exits (ServerApp._cleanup): the extensions stop, then every kernel.
    await jp_serverapp.cleanup_extensions()
    await jp_serverapp.cleanup_kernels()

    for kid in (running, sleeping):
        lease = lease_of(pool_home, kid)
        assert lease.state == RELEASED and lease.reason == SERVER_STOPPED  # the ledger's own record
    recent = body(await jp_fetch(*ME))["recent"]
    for kid in (running, sleeping):
        latest = next(r for r in recent if r["kernel_id"] == kid)  # newest first
        assert latest["kind"] == "released" and latest["reason"] == SERVER_STOPPED and latest["with_server"]
        assert latest["message"] == messages.SERVER_STOPPED and "variables are gone" in latest["message"]
    assert next(r for r in recent if r["kernel_id"] == sleeping)["name"] == "long run.ipynb"  # for the panel's line
    assert sum(r["kernel_id"] == sleeping for r in recent) == 1  # one entry per kernel: the ledger's own is not shown


async def test_the_next_reconcile_after_a_server_died_says_its_kernels_ended_with_it(jp_fetch, pool_home):
    """A server killed outright (and its kernel with it) never shut its kernel down: the pool's next
    reconcile releases the lease, and its entry names the notebook and says it ended with the server."""
    ledger = pool_home.ledger()
    spec = pool_home.settings["profiles"]["small"]
    gone = Holder(pid=2**22 + 17, start=1.0)  # no such process
    lease = ledger.allocate(LeaseRequest(owner="alice", kernel_id="k-dead", profile=parse_profile("small", spec),
                                         label="notes/run.ipynb", manager=gone), build_quota_book({}, {}, {}, {}))
    ledger.set_holder(lease.id, Holder(pid=2**22 + 18, start=1.0))
    [reclaimed] = ledger.reconcile(lambda pid, start: False)
    assert reclaimed.id == lease.id
    [entry] = ledger.journal(kinds=("reclaimed",))
    item = journal_item(entry)
    assert item["with_server"] and item["name"] == "notes/run.ipynb" and item["reason"] == KERNEL_AND_SERVER_GONE


def test_a_lease_reclaimed_after_its_server_died_is_marked_as_ended_with_the_server(pool_home):
    """A server killed outright never shuts its kernels down; the next reconcile releases their leases
    with a reason that the views mark as ``with_server``."""
    reasons = set()
    for holder in (True, False):  # the server is gone, with or without a kernel process on record
        lease = type("L", (), {"manager_pid": 1, "manager_start": 0.0, "holder_pid": 2 if holder else None,
                              "holder_start": 0.0, "phase": "", "updated": 0.0})()
        reasons.add(dead_reason(lease, lambda pid, start: False, 100.0, Graces()))
    assert all(ended_with_server(r) for r in reasons) and len(reasons) == 2
    for reason in reasons:
        item = journal_item(JournalEntry(1, 1.0, "reclaimed", "l", "k", "alice", reason, {"label": "a.ipynb"}))
        assert item["with_server"] and item["name"] == "a.ipynb"  # the ledger's entry names the notebook
    item = journal_item(JournalEntry(1, 1.0, "reclaimed", "l", "k", "alice",
                                     "kernel process ended and its server did not restart it", {}))
    assert not item["with_server"]
