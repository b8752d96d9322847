"""The ledger under real concurrency: separate OS processes on one SQLite file,
and holders that are real processes which really die."""

import multiprocessing as mp
import random
import signal
import subprocess
import sys
import time

from ledger_helpers import NO_QUOTA, gpus, request
from jupyter_gpu_pool.local import processes
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import PoolError


def _worker(path: str, seed: int, rounds: int, out) -> None:
    """Allocate and release at random; after every allocation check no GPU is over-committed."""
    rng = random.Random(seed)
    ledger = Ledger(path, busy_timeout=60)
    held, granted, refused, violations = [], 0, 0, []
    for _ in range(rounds):
        if held and rng.random() < 0.45:
            ledger.release(held.pop(rng.randrange(len(held))))
            continue
        try:
            lease = ledger.allocate(request(owner=f"u{seed % 4}", slice_text=rng.choice(
                ["5GiB", "10GiB", "10GiB,25%", "20GiB", "1GiB,50%", "whole"])), NO_QUOTA)
            held.append(lease.id)
            granted += 1
            violations += ledger.overcommitted()
        except PoolError:
            refused += 1
    for lease_id in held:
        ledger.release(lease_id)
    out.put((granted, refused, violations))


def test_many_processes_allocating_at_once_never_overcommit(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    ledger = Ledger(path)
    ledger.sync_gpus(gpus(40, 40, 24))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(path, seed, 40, out)) for seed in range(16)]
    for w in workers:
        w.start()
    results = [out.get(timeout=240) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    granted = sum(r[0] for r in results)
    refused = sum(r[1] for r in results)
    assert granted > 100 and refused > 0  # the pool really was contended
    assert [v for r in results for v in r[2]] == []
    assert ledger.overcommitted() == [] and ledger.leases() == []


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_killed_kernel_and_server_are_reclaimed_by_pid_and_start_time(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.sync_gpus(gpus(40))
    server, kernel = _sleeper(), _sleeper()
    try:
        lease = ledger.allocate(request(manager=processes.identify(server.pid)), NO_QUOTA)
        ledger.set_holder(lease.id, processes.identify(kernel.pid))
        assert ledger.reconcile(processes.is_alive) == []
        kernel.send_signal(signal.SIGKILL)
        server.send_signal(signal.SIGKILL)
        kernel.wait(), server.wait()
        reclaimed = ledger.reconcile(processes.is_alive)
        assert [r.id for r in reclaimed] == [lease.id]
        assert reclaimed[0].reason == "kernel process and its server are gone"
    finally:
        for p in (server, kernel):
            p.kill()


def test_a_reused_pid_is_not_mistaken_for_the_holder():
    me = processes.identify()
    assert processes.is_alive(me.pid, me.start)
    assert not processes.is_alive(me.pid, me.start - 1000)  # same pid, another process's start time
    gone = _sleeper()
    ident = processes.identify(gone.pid)
    gone.kill()
    gone.wait()
    assert not processes.is_alive(ident.pid, ident.start)


def test_readers_are_not_blocked_by_a_writer(tmp_path):
    """WAL: a snapshot read returns while another connection holds the write lock."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.sync_gpus(gpus(40))
    writer = Ledger(path)
    conn = writer.db.connection()
    conn.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        snap = ledger.snapshot()
        assert len(snap.gpus) == 1
        assert time.monotonic() - started < 1.0
    finally:
        conn.execute("ROLLBACK")

