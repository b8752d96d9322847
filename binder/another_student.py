"""A stand-in for ANOTHER STUDENT, for section 5 of gpu-demo.ipynb. DEMO ONLY.

On Binder you are the pool's only user, and your quota (30 GiB in 2 kernels; a hibernated kernel
still counts as one) cannot fill two 40 GiB GPUs. ``take_the_pool()`` holds every free slice of the
demo pool as the user "another-student", the way another user's Jupyter server would, each slice
held by this notebook's kernel (a plain Python kernel that takes no slice of its own);
``let_go()`` gives them back, and so does shutting that kernel down (the pool takes back slices
whose holder is gone). It writes the pool's ledger directly, as the project's tests do: do not do
this on a real pool.
"""

from __future__ import annotations

import os
import time

from jupyter_gpu_pool.config import load_settings
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.processes import identify
from jupyter_gpu_pool.pool import LeaseRequest, PoolError, build_quota_book
from jupyter_gpu_pool.pool.units import format_size

OWNER = "another-student"


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
