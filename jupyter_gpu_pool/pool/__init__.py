"""The domain core: slices, GPUs, profiles, quotas, leases, the ledger, placement.

Pure Python: nothing here imports Jupyter, Kubernetes or NVML, and nothing does
I/O beyond the ledger's SQLite file.  The edges (devices, provisioners, server
extension, operator) translate the world into these types.
"""

from .errors import LeaseNotFound, PoolError, PoolExhausted, QuotaExceeded, UnknownProfile
from .gpus import DECLARED, DETECTED, GPU, parse_inventory
from .leases import ACTIVE, HELD, HIBERNATED, RELEASED, Holder, Lease, LeaseRequest
from .ledger import JournalEntry, Ledger, Snapshot, Waiter
from .placement import BINPACK, PLACEMENTS, SPREAD, GPUUsage
from .profiles import EXCLUSIVE, ISOLATION_MODES, MPS, SOFT, Profile, parse_profile, parse_profiles
from .quotas import Quota, QuotaBook, Usage, build_quota_book
from .slices import SliceSpec, format_size, parse_size

__all__ = [
    "ACTIVE", "BINPACK", "DECLARED", "DETECTED", "EXCLUSIVE", "GPU", "GPUUsage", "HELD", "HIBERNATED",
    "Holder", "ISOLATION_MODES", "JournalEntry", "Lease", "LeaseNotFound", "LeaseRequest", "Ledger", "MPS",
    "PLACEMENTS", "PoolError", "PoolExhausted", "Profile", "Quota", "QuotaBook", "QuotaExceeded", "RELEASED",
    "SOFT", "SPREAD", "SliceSpec", "Snapshot", "UnknownProfile", "Usage", "Waiter", "build_quota_book",
    "format_size", "parse_inventory", "parse_profile", "parse_profiles", "parse_size",
]
