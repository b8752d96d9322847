"""A stand-in for ANOTHER STUDENT, for section 5 of gpu-demo.ipynb. DEMO ONLY.

On Binder you are the pool's only user, and your quota (30 GiB in 2 kernels; a hibernated kernel
still counts as one) cannot fill two 40 GiB GPUs. ``take_the_pool()`` holds every free slice of the
demo pool as the user "another-student", the way another user's Jupyter server would, each slice
held by this notebook's kernel (a plain Python kernel that takes no slice of its own);
``let_go()`` gives them back, and so does shutting that kernel down (the pool takes back slices
whose holder is gone). It writes the pool's ledger directly, as the project's tests do: do not do
this on a real pool.

Like another user's server, it answers what an admin asks of its kernels from the pool dashboard
(Release, Hibernate, Shut down: ``answer_requests``, once a second while it holds slices): a slice
is hibernated (given back, as a declared GPU's kernel is) or let go, and put on record as done at
an admin's request, so that the admin's dashboard sees the request carried out.
"""

from __future__ import annotations

import os
import threading
import time

from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.processes import identify
from jupyter_gpu_pool.pool import LeaseRequest, PoolError, build_quota_book
from jupyter_gpu_pool.pool.leases import ACTIVE
from jupyter_gpu_pool.pool.units import format_size

OWNER = "another-student"
REQUESTED = "requested"  # the journal's kind of an admin's request (server_extension/admin_requests.py)


def _ledger() -> tuple:
    settings = load_settings()
    return settings, Ledger(settings.ledger_path)


def _free(ledger: Ledger) -> int:
    return sum(u.free_memory for u in ledger.snapshot().gpus)


def take_the_pool() -> str:
    """Hold every free slice: the largest profile first, then the smallest fills what is left."""
    settings, ledger = _ledger()
    holder = identify(os.getpid())
    no_quota = build_quota_book({}, {}, {}, {})
    for profile in sorted(settings.profiles.values(), key=lambda p: -(p.slice.memory or 0)):
        while True:
            n = len(ledger.leases(owner=OWNER)) + 1
            request = LeaseRequest(owner=OWNER, kernel_id=f"{OWNER}-{time.time_ns()}", profile=profile,
                                   label=f"their-notebook-{n}.ipynb", manager=holder)
            try:
                lease = ledger.allocate(request, no_quota, record_refusal=False)
            except PoolError:
                break
            ledger.set_holder(lease.id, holder)
    _keep_answering()
    held = ledger.leases(owner=OWNER)
    return (f"{OWNER} holds {len(held)} slice(s), {format_size(sum(x.memory or 0 for x in held))}; "
            f"free in the pool now: {format_size(_free(ledger))}.")


def let_go(count: int | None = None) -> str:
    """Give back ``count`` of the stand-in's slices (all of them by default)."""
    _, ledger = _ledger()
    held = ledger.leases(owner=OWNER)
    for lease in held[:count]:
        ledger.release(lease.id, "the demo's stand-in let it go")
    return (f"{OWNER} gave back {len(held[:count])} slice(s); "
            f"free in the pool now: {format_size(_free(ledger))}.")


_answered = {"seq": None}  # the last journal entry looked at: requests from before are not ours to answer
_answering: list[threading.Thread] = []


def answer_requests(ledger: Ledger | None = None) -> int:
    """Carry out the admins' requests for the stand-in's slices made since the last call (the first call
    only notes where the journal is); return how many were carried out."""
    ledger = ledger or _ledger()[1]
    entries = sorted(ledger.journal(kinds=(REQUESTED,), owner=OWNER, limit=50), key=lambda e: e.seq)
    if _answered["seq"] is None:
        _answered["seq"] = max((e.seq for e in entries), default=0)
        return 0
    done = 0
    for e in entries:
        if e.seq <= _answered["seq"]:
            continue
        _answered["seq"] = e.seq
        lease = ledger.get(e.lease_id) if e.lease_id else ledger.by_kernel(e.kernel_id or "")
        if lease is None or lease.owner != OWNER or lease.state != ACTIVE or lease.phase:
            continue
        action, by = str(e.detail.get("action")), str(e.detail.get("by") or "an admin")
        if action == "shutdown":
            ledger.release(lease.id, "shut down at an admin's request")
            kind, message = "released", f"Shut down by an admin ({by}): the GPU slice is back in the pool."
        else:  # release or hibernate: a declared GPU's kernel hibernates, keeping its variables
            ledger.hibernate(lease.id, 0, "admin")
            kind, message = "hibernated", (f"Hibernated by an admin ({by}): the GPU slice is back in the pool, "
                                           "your variables are kept.")
            action = "hibernate"
        ledger.record(kind, lease_id=lease.id, kernel_id=lease.kernel_id, owner=OWNER, reason="admin",
                      detail={"source": "policy", "message": message, "action": action, "profile": lease.profile,
                              "name": lease.label, "rule": None, "dry_run": False})
        done += 1
    return done


def _keep_answering() -> None:
    """Answer requests once a second, in this kernel, while the stand-in holds any slice."""
    if _answering and _answering[0].is_alive():
        return
    ledger = _ledger()[1]
    answer_requests(ledger)  # from now on

    def loop() -> None:
        while ledger.leases(owner=OWNER):
            time.sleep(1.0)
            answer_requests(ledger)

    _answering[:] = [threading.Thread(target=loop, name="another-student answers", daemon=True)]
    _answering[0].start()
