"""The domain core: slices, GPUs, profiles, quotas, leases, placement, the allocation decision,
the queue's rules, phases, a kernel's GPU residency (its lifecycle, one transition function: ``residency``),
liveness and the idle policy.

Pure Python: nothing here does I/O or imports Jupyter, Kubernetes, NVML, SQLite or psutil (a test
imports every module with those blocked).  The adapters (``local`` for one machine's SQLite
ledger, ``operator`` for a cluster, the planner's virtual pool) read the world into these types
and ask the core what to do.
"""

from .errors import LeaseNotFound, PoolError, PoolExhausted, QuotaExceeded, UnknownProfile
from .gpus import DECLARED, DETECTED, GPU, parse_inventory
from .journal import JournalEntry
from .allocation import LeaseRequest
from .leases import ACTIVE, HELD, HIBERNATED, RELEASED, Holder, Lease
from .placement import BINPACK, PLACEMENTS, SPREAD, GPUUsage
from .profiles import EXCLUSIVE, ISOLATION_MODES, MPS, SOFT, Profile, parse_profile, parse_profiles
from .queue import Waiter
from .quotas import Quota, QuotaBook, Usage, build_quota_book, usage_of
from .slices import SliceSpec, format_size, parse_size
from .snapshot import Snapshot

__all__ = [
    "ACTIVE", "BINPACK", "DECLARED", "DETECTED", "EXCLUSIVE", "GPU", "GPUUsage", "HELD", "HIBERNATED",
    "Holder", "ISOLATION_MODES", "JournalEntry", "Lease", "LeaseNotFound", "LeaseRequest", "MPS",
    "PLACEMENTS", "PoolError", "PoolExhausted", "Profile", "Quota", "QuotaBook", "QuotaExceeded", "RELEASED",
    "SOFT", "SPREAD", "SliceSpec", "Snapshot", "UnknownProfile", "Usage", "Waiter", "build_quota_book",
    "format_size", "parse_inventory", "parse_profile", "parse_profiles", "parse_size", "usage_of",
]
