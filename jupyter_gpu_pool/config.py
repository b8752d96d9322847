"""The admin's configuration, in one place read alike by the provisioner, the server and the CLI.

Admins write ``jupyter_gpu_pool_config.py`` (or ``.json``) in any directory of
Jupyter's config path (``jupyter --paths``), for example
``/etc/jupyter/jupyter_gpu_pool_config.py``::

    c.GPUPool.profiles = {
        "gpu-10g": {"slice": "10GiB"},
        "gpu-20g-50": {"slice": "20GiB,50%", "isolation": "mps"},
    }
    c.GPUPool.default_user_quota = {"memory": "40GiB", "kernels": 4}

The same ``c.GPUPool`` settings may also be given in ``jupyter_server_config.py``
or on the command line of ``jupyter lab``; those win over the pool's own file.
Every setting is validated where it is declared (``traits.py``): the object keeps
the domain values (profiles, quotas, rules, seconds), and a bad value stops with
a message naming the setting, the entry and the field.  :func:`load_settings`
reads the files and checks what spans several settings.
"""

from __future__ import annotations

import datetime as dt
import functools
import getpass
import grp
import os
import time
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jupyter_core.paths import jupyter_config_path, jupyter_data_dir, jupyter_runtime_dir
from traitlets import Bool, Enum, TraitError, Undefined, Unicode, default, validate
from traitlets.config import Config, Configurable
from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

from .pool import (
    BINPACK,
    GPU,
    PLACEMENTS,
    Profile,
    Quota,
    QuotaBook,
    UnknownProfile,
    parse_inventory,
    parse_profiles,
)
from .pool.budgets import Budget, BudgetBook, parse_budgets
from .pool.hibernation import (
    EVICT_OLDEST,
    OVER_CAP,
    HibernationSettings,
    parse_host_memory,
    parse_margin,
    parse_restore_cost,
)
from .pool.fairshare import FIFO, QUEUE_ORDERS, FairShare, parse_weight, parse_weights
from .pool.reservations import Reservation, ReservationError, check_fit, parse_reservations
from .pool.rules import Policy, PolicyError, Rule, check_profile_names, parse_policy
from .pool.quotas import parse_members, parse_quota, parse_quotas
from .pool.sharing import Sharing
from .traits import Parsed, Seconds

CONFIG_FILE = "jupyter_gpu_pool_config"
LOCAL_ONLY = ("ledger_path", "owner", "mps_pipe_directory", "mps_log_directory", "service_socket")

DEFAULT_PROFILES = {
    "gpu-10g": {"slice": "10GiB", "isolation": "soft", "description": "10 GiB of GPU memory, shared SMs"},
    "gpu-20g-50": {
        "slice": "20GiB,50%",
        "isolation": "mps",
        "description": "20 GiB and half the SMs, enforced by NVIDIA MPS",
    },
    "gpu-whole": {"slice": "whole", "description": "one whole GPU"},
}

DEMO_INVENTORY = [{"name": "Demo GPU (declared, not real)", "memory": "40GiB", "sm_count": 108, "count": 2}]
# Written beside the demo inventory: short enough that a warning and a hibernation (declared GPUs: no GPU
# memory to move, the kernel keeps its variables) show within minutes.
DEMO_POLICY = [{"name": "demo", "idle_timeout": "5m", "gpu_idle_timeout": None, "warn": "2m", "snooze": "5m",
                "max_snoozes": 1, "max_hibernated": "1d", "action": "hibernate", "slice_at": "first-cell"}]
# Written by `init` where no demo policy is: the built-in rule, with when a kernel takes its slice said
# explicitly (first-cell: a notebook opened only to read, or restored by a page reload, holds no GPU).
STARTING_POLICY = [{"name": "everyone", "slice_at": "first-cell"}]


class ConfigError(ValueError):
    """A bad admin setting: the message names the setting and the value."""


def _all_of(value, kind: type, empty: bool = False) -> bool:
    """A dict whose values are all ``kind`` (the parsed form of a setting)."""
    return isinstance(value, dict) and (empty or bool(value)) and all(isinstance(v, kind) for v in value.values())


class LedgerPathError(ValueError):
    """A ledger path that cannot hold a shared ledger."""


def check_ledger_path(path: str) -> str:
    """The ledger must be a file every process of the pool opens: not empty, not in memory."""
    path = os.fspath(path)
    if not path.strip():
        raise LedgerPathError("the ledger path is empty; give a file such as /var/lib/jupyter-gpu-pool/ledger.sqlite")
    if path.strip() == ":memory:" or path.startswith("file::memory:"):
        raise LedgerPathError(f"{path!r} is an in-memory database, which no other process can see; give a file "
                              "such as /var/lib/jupyter-gpu-pool/ledger.sqlite")
    return path


def _ledger_path(path) -> str:
    if not isinstance(path, str):
        raise ValueError(f"must be a file path, not {path!r}")
    return os.path.expanduser(check_ledger_path(path))


def _timezone(name) -> str:
    if not isinstance(name, str):
        raise ValueError(f"must be a time zone name such as 'Europe/Paris', not {name!r}")
    if name:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{name!r} is not a time zone this machine knows (write an IANA name such as "
                             "'Europe/Paris', or leave it empty for local time)") from None
    return name


def _owner(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"must be a user name, not {name!r}")
    return name


# A Unix socket's path holds at most 107 bytes, and an MPS daemon binds its sockets (<pipe>/control, ...)
# in a folder of its own under GPUPool.mps_pipe_directory (devices/mps.py: "/" and a 12-character name):
# 64 leaves 30 bytes for the daemon's socket names (the longest known, "/control_privileged", takes 19).
MPS_PIPE_DIRECTORY_MAX = 64


def _mps_pipe_directory(path) -> str:
    if not isinstance(path, str):
        raise ValueError(f"must be a folder path, not {path!r}")
    if not path:
        return path
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        raise ValueError(f"{path!r} is not an absolute path; give one such as /run/jupyter-gpu-pool/mps, or "
                         "leave it empty for the pool's own private folder")
    if len(path.encode()) > MPS_PIPE_DIRECTORY_MAX:
        raise ValueError(f"{path!r} is {len(path.encode())} bytes long, and may be at most {MPS_PIPE_DIRECTORY_MAX}: "
                         "the MPS daemon binds Unix sockets in a folder under it, and a socket's path holds at most "
                         "107 bytes. Give a shorter folder (such as /run/jupyter-gpu-pool/mps), or leave it empty "
                         "for the pool's own private folder")
    return path


def _host_memory(text) -> str:
    parse_host_memory(text)
    return text


class GPUPool(Configurable):
    """Settings of the GPU pool on this machine."""

    profiles = Parsed(
        parse_profiles, DEFAULT_PROFILES, is_parsed=lambda v: _all_of(v, Profile),
        help="""Slices users may pick, by name.  Each value is a dict with 'slice' ("10GiB",
        "10GiB,25%", "whole", "2 x whole"), optional 'isolation' ("soft", "mps" or "exclusive"; by
        default "exclusive" for whole GPUs, "mps" when an SM share is given, else "soft"),
        'display_name' and 'description'.  One kernelspec is installed per profile.""",
    ).tag(config=True)

    default_profile = Unicode(
        "",
        help="Profile for a kernelspec that names the gpu-pool provisioner but no profile "
        "(empty: the first profile).",
    ).tag(config=True)

    gpu_discovery = Enum(
        ["auto", "nvml", "declared"],
        default_value="auto",
        help="""Where the pool's GPUs come from.  'auto': the GPUs NVML detects, or the declared
        inventory where NVML finds none; 'nvml': detected GPUs only; 'declared': the declared
        inventory only (tests, CI, Binder, a machine without a GPU).""",
    ).tag(config=True)

    inventory = Parsed(
        parse_inventory, [], is_parsed=lambda v: isinstance(v, list) and all(isinstance(g, GPU) for g in v),
        help="""Declared GPUs, for machines where NVML detects none: a list of dicts such as
        {"name": "A100", "memory": "40GiB", "sm_count": 108, "count": 2}.  Declared GPUs are
        marked as such everywhere; their slices hold no real memory.""",
    ).tag(config=True)

    placement = Enum(
        list(PLACEMENTS),
        default_value=BINPACK,
        help="""Which GPU a slice goes on: 'binpack' fills the fullest GPU that fits (keeps GPUs free
        for big slices), 'spread' takes the emptiest (less contention between kernels).""",
    ).tag(config=True)

    ledger_path = Parsed(
        _ledger_path, Undefined,
        help="""The SQLite file of leases.  Every Jupyter server sharing the GPUs must use the same
        file on a local disk (not NFS).  On a multi-user machine set a shared path such as
        /var/lib/jupyter-gpu-pool/ledger.sqlite, writable by every user of the pool.""",
    ).tag(config=True)

    @default("ledger_path")
    def _default_ledger_path(self) -> str:
        return os.path.join(jupyter_data_dir(), "gpu_pool", "ledger.sqlite")


    default_user_quota = Parsed(
        lambda v: parse_quota(v, "default user quota"), {}, is_parsed=lambda v: isinstance(v, Quota),
        help="""Quota of every user without an entry in user_quotas: {"memory": "40GiB",
        "sm_percent": 200, "kernels": 4}.  Any field may be left out (no limit).""",
    ).tag(config=True)

    user_quotas = Parsed(
        lambda v: parse_quotas(v, "user quota"), {}, is_parsed=lambda v: _all_of(v, Quota, empty=True),
        help='Per-user quotas, by user name: {"alice": {"memory": "80GiB", "kernels": 8}}.',
    ).tag(config=True)

    group_quotas = Parsed(
        lambda v: parse_quotas(v, "group quota"), {}, is_parsed=lambda v: _all_of(v, Quota, empty=True),
        help="""Per-group quotas: the combined holdings of all members of the group may not pass
        them.  {"students": {"memory": "160GiB"}}.""",
    ).tag(config=True)

    group_members = Parsed(
        parse_members, {}, is_parsed=lambda v: _all_of(v, frozenset, empty=True),
        help='Group membership for quotas: {"students": ["alice", "bob"]}.',
    ).tag(config=True)

    unix_groups = Bool(
        True, help="Also count the Unix groups of the user running the server as their groups."
    ).tag(config=True)

    owner = Parsed(
        _owner, Undefined,
        help="The user name leases are held under: JUPYTERHUB_USER under JupyterHub, else the login name.",
    ).tag(config=True)

    @default("owner")
    def _default_owner(self) -> str:
        return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


    start_queue_timeout = Seconds(
        0.0, zero_allowed=True,
        help="""Seconds a kernel start may wait in the queue when the pool is full (0: refuse at
        once with a message).  Keep it under the kernel launch timeout of your frontend (60 s).""",
    ).tag(config=True)

    holder_grace = Seconds(
        30.0, zero_allowed=True,
        help="""Seconds a lease is kept after its kernel process died, so that the server's kernel
        restarter can reuse it; after that the slice is reclaimed.""",
    ).tag(config=True)

    mps_pipe_directory = Parsed(
        _mps_pipe_directory, "",
        help=f"""Where the pool's MPS control daemons keep their pipes: one short folder per GPU under it
        (CUDA_MPS_PIPE_DIRECTORY).  The daemon binds Unix sockets in that folder, and a socket's path holds
        at most 107 bytes, so this folder may be at most {MPS_PIPE_DIRECTORY_MAX} bytes long.  Empty (the
        default): a private folder (mode 0700) of the pool's own in /run/user/<uid>, else in /tmp.""",
    ).tag(config=True)

    mps_log_directory = Unicode(
        help="CUDA_MPS_LOG_DIRECTORY of the pool's MPS control daemon.",
    ).tag(config=True)

    @default("mps_log_directory")
    def _default_mps_log(self) -> str:
        return os.path.join(jupyter_runtime_dir(), "gpu_pool", "mps-log")

    policy = Parsed(
        lambda v: parse_policy(v).rules, [], is_parsed=lambda v: isinstance(v, tuple) and all(isinstance(r, Rule) for r in v),
        help="""The idle policy: an ordered list of rules, the first whose 'match' fits a kernel governs
        it; a kernel no rule matches follows the built-in default rule.  Each rule is a dict:
        {"name": "students", "match": {"group": "students"}, "idle_timeout": "30m",
        "gpu_idle_timeout": "20m", "gpu_idle_threshold": 5, "max_busy": null, "max_age": "8h",
        "max_hibernated": "1d", "warn": "5m", "snooze": "30m", "max_snoozes": 2,
        "action": "hibernate", "pressure_factor": 0.5, "over_memory_grace": "2m", "slice_at": "first-cell"}.
        'match' keys: user, group, profile, kernelspec (names or glob patterns).  Durations are
        seconds or text (90s, 30m, 2h, 1d); null turns a limit off.  slice_at: when a kernel takes its
        GPU slice, at its first cell ("first-cell", the default: it starts holding none) or when it
        starts ("start").  See docs/server-extension.md and docs/admin.md.""",
    ).tag(config=True)

    policy_dry_run = Bool(
        False,
        help="""Decide and report (journal, events, the admin's pool view) without warning users or
        acting on their kernels: to try a policy out.""",
    ).tag(config=True)

    hibernation_host_memory = Parsed(
        _host_memory, "50%",
        help="""Host RAM that hibernated kernels may hold on this machine, all users together: a size
        ("64GiB") or a share of the machine's RAM ("50%"); "none" for no cap.  A hibernated kernel
        holds in RAM what it had reserved on the GPU.  See hibernation_over_cap for what happens past it.""",
    ).tag(config=True)

    hibernation_over_cap = Enum(
        list(OVER_CAP),
        default_value=EVICT_OLDEST,
        help="""When a hibernation would pass hibernation_host_memory: 'evict_oldest' warns the owners
        of the kernels hibernated longest and shuts them down after hibernation_eviction_warning
        seconds to make room (the new kernel keeps running on its GPU until then); 'shutdown' shuts the
        new kernel down instead of hibernating it; 'keep_running' leaves it running on its GPU.""",
    ).tag(config=True)

    hibernation_eviction_warning = Seconds(
        300.0,
        help="Seconds between the warning and the shutdown of a hibernated kernel evicted to make room in host RAM.",
    ).tag(config=True)

    hibernation_lock_timeout = Seconds(
        10.0,
        help="""Seconds a hibernation waits for a kernel's submitted GPU work to finish before it gives
        up and leaves the kernel running, untouched (the release of the framework's cache, which waits
        for that work too, gets 5 s more for the kernel to answer).""",
    ).tag(config=True)

    hibernation_release_cache = Bool(
        True,
        help="""Before a checkpoint, empty the cached GPU memory of PyTorch and CuPy in the kernel (a
        silent execute): the checkpoint moves what a process has reserved, not only what it uses.""",
    ).tag(config=True)

    hibernation_resume_margin = Parsed(
        parse_margin, "1GiB", is_parsed=lambda v: isinstance(v, int) and not isinstance(v, bool),
        help="""GPU memory a resume needs free on its GPU beyond the size of its checkpoint, as the
        driver counts it (NVML), before it restores: a restore that runs out of GPU memory can leave the
        kernel stuck in the checkpointed state for good.  Soft slices are not enforced, so a neighbour
        may hold more than its slice; until the memory is free the resume waits in the queue, and its
        user sees why ("waiting for 5 GiB of GPU memory to be free on GPU 0").  A size ("1GiB"), or 0.""",
    ).tag(config=True)

    hibernation_checkpoint_before_kill = Bool(
        True,
        help="""Before killing a kernel whose memory was restored by a resume, lock and checkpoint it again
        (waiting hibernation_lock_timeout for its GPU work, and at most hibernation_shutdown_timeout in
        all): killing a just-restored process hung a host on one driver (595, open kernel module), and
        this was its reporter's workaround.  It makes such a shutdown take about as long as a
        hibernation of the kernel.""",
    ).tag(config=True)

    hibernation_shutdown_timeout = Seconds(
        60.0,
        help="""Seconds the checkpoint before a kill (hibernation_checkpoint_before_kill) may take; the
        kill goes ahead when they are up, so a shutdown never hangs on the driver.""",
    ).tag(config=True)

    hibernation_declared_restore_cost = Unicode(
        "",
        help="""For benchmarks and their tests only, never in service: on declared GPUs (which hold no GPU
        memory, so a resume takes no time), make each resume's restore take a modelled time, seconds plus
        seconds per GiB of the kernel's declared slice, such as '0.306s + 0.179s/GiB' (the least-squares line
        through hand-measured H100 restores of 1-32 GiB; the 2026-11-26 run's fit 0.345s + 0.206s/GiB).
        Default '': no delay.  No effect on real GPUs.""",
    ).tag(config=True)

    @validate("hibernation_declared_restore_cost")
    def _check_restore_cost(self, proposal):
        try:
            parse_restore_cost(proposal["value"])
        except ValueError as e:
            raise TraitError(f"GPUPool.hibernation_declared_restore_cost: {e}") from None
        return proposal["value"]

    budgets = Parsed(
        parse_budgets, {}, is_parsed=lambda v: _all_of(v, Budget, empty=True),
        help="""GPU-hour budgets, by user or group name: {"students": {"gpu_hours": 10, "period": "week"}}.
        A slice costs its share of its GPU per hour while it is active (the larger of its memory and SM
        share; hibernated time is free).  A group's budget applies to each member on their own unless it
        has "shared": true; a user's own entry replaces their groups' member budgets.  Periods: "day",
        "week" (from Monday) or "month", in budget_timezone.  A start or resume past the budget is refused
        with the reset time; running kernels are warned at 90% and acted on at 100% under the policy's
        action.""",
    ).tag(config=True)

    budget_timezone = Parsed(
        _timezone, "",
        help="""The time zone budget periods are counted in (an IANA name such as "Europe/Paris"); empty:
        this machine's local time.""",
    ).tag(config=True)

    reservations = Parsed(
        parse_reservations, [], is_parsed=lambda v: isinstance(v, tuple) and all(isinstance(r, Reservation) for r in v),
        help="""Room of the pool kept for a group (or some users) in a window of time, such as a class's lab:
        a list of dicts, each {"name": "ML 101 lab", "groups": ["ml101"], "users": ["teacher"],
        "days": ["tue", "thu"], "start": "10:00", "end": "12:00", "timezone": "Europe/Paris",
        "memory": "160GiB", "gpus": 2, "models": ["*H100*"], "lead": "10m"}.  Weekly with 'days' (mon ...
        sun) and times of day, or once without 'days' and with dates ("2025-03-04 10:00"), in the named
        time zone.  'memory' (in all) and/or 'gpus' (whole GPUs) on the GPUs whose name matches 'models'
        (glob patterns; any GPU if left out).  From 'lead' before the window (default 10 minutes) non-members
        are no longer admitted into that room and their kernels there are hibernated, warned with the
        reason; during the window members are admitted first, and non-members may borrow what members leave
        unused until a member needs it.  A reservation that cannot fit the pool, alone or with another at
        the same time, stops the pool with a message naming it.  See docs/admin.md.""",
    ).tag(config=True)

    queue_order = Enum(
        list(QUEUE_ORDERS), default_value=FIFO,
        help="""The order of the queue when more wait than fit: 'fifo', first come, first served; 'fair',
        by fair share: the group that used less of the pool lately than its weight's share goes first
        (fair_share_weights, fair_share_half_life), arrival order within a group, and waiting raises a
        waiter (fair_share_aging), so no one waits forever.  Quotas and budgets bound everyone either way.""",
    ).tag(config=True)

    fair_share_weights = Parsed(
        parse_weights, {}, is_parsed=lambda v: _all_of(v, float, empty=True),
        help="""Each group's weight in a fair queue: {"ml101": 2, "research": 1}.  A user counts in the first
        of their groups given here (in this order); users in none count together, with
        fair_share_others_weight.""",
    ).tag(config=True)

    fair_share_others_weight = Parsed(
        parse_weight, 1.0,
        is_parsed=lambda v: isinstance(v, float) and 0 < v < 1e9,
        help="The weight in a fair queue of the users in no group of fair_share_weights, all together.",
    ).tag(config=True)

    fair_share_half_life = Seconds(
        86400.0,
        help="""How fast a group's use is forgotten in a fair queue: GPU memory held an hour ago counts half
        as much as now when this is 1h.  Seconds or text such as 12h or 7d (default 1d).""",
    ).tag(config=True)

    fair_share_aging = Seconds(
        1800.0,
        help="""How fast waiting raises a waiter in a fair queue: each this long in the queue counts as much
        as a whole share of use less (default 30m).  A waiter goes ahead of everyone who comes more than this
        times (all the weights over the least weight) after it, so no one waits forever.""",
    ).tag(config=True)

    trace_recording = Bool(
        True,
        help="""Record what each GPU kernel does, for the capacity planner (``jupyter gpu-pool simulate``): its
        lease, busy and idle times, coarse GPU readings, its user's snoozes and the policy's warnings and
        actions; never code, output or notebook names.  Admins export everyone's trace, users their own
        (``jupyter gpu-pool trace export``).  See docs/planning.md.""",
    ).tag(config=True)

    trace_retention = Seconds(
        30 * 86400.0,
        help="How long the activity trace is kept: seconds or text such as 30d or 12h (older events are deleted).",
    ).tag(config=True)

    trace_sample_interval = Seconds(
        60.0,
        help="""Seconds between two GPU readings of a kernel written to the activity trace.  A reading that
        crosses one of the policy's GPU-idle thresholds, or starts or stops holding GPU memory, is written at
        once, so that a replay sees what the policy saw.""",
    ).tag(config=True)

    service_socket = Unicode(
        help="""The pool service's socket (jupyter gpu-pool serve): when set, this server's kernels take their
        slices through the service, which alone keeps the ledger and reads the admin's settings, and knows
        each caller from the kernel (docs/teaching-lab.md).  Default: JUPYTER_GPU_POOL_SOCKET; empty: this
        process keeps the ledger itself (one user's machine).""",
    ).tag(config=True)

    @default("service_socket")
    def _default_service_socket(self) -> str:
        return os.environ.get("JUPYTER_GPU_POOL_SOCKET", "")

    # -- the settings as the pool uses them ----------------------------------------------------

    config_files: tuple[str, ...] = ()  # the files read, lowest priority first (set by load_settings)

    @property
    def raw_config(self) -> dict:
        """The admin's settings as written, for a client of the pool service to build the same settings
        from (what is this machine's own, the ledger's path, the owner, the service, stays here)."""
        out = {}
        for name in self.class_trait_names(config=True):
            if name in LOCAL_ONLY:
                continue
            value = getattr(self, name)  # a default is parsed (and its written form kept) on first read
            out[name] = self.__dict__.get("written", {}).get(name, value)
        return out

    @property
    def declared(self) -> list[GPU]:
        """The declared inventory's GPUs."""
        return self.inventory

    @functools.cached_property
    def quotas(self) -> QuotaBook:
        return QuotaBook(users=self.user_quotas, groups=self.group_quotas, default_user=self.default_user_quota,
                         members=self.group_members)

    @functools.cached_property
    def budget_book(self) -> BudgetBook:
        zone = ZoneInfo(self.budget_timezone) if self.budget_timezone else dt.datetime.now().astimezone().tzinfo
        return BudgetBook(self.budgets, zone)

    @functools.cached_property
    def idle_policy(self) -> Policy:
        """The rules with the dry-run switch: what the culler follows."""
        return Policy(rules=self.policy, dry_run=self.policy_dry_run)

    @functools.cached_property
    def sharing(self) -> Sharing:
        """The reservations and the queue's order, as the allocation decision takes them."""
        return Sharing(reservations=self.reservations, order=self.queue_order,
                       fair=FairShare(weights=self.fair_share_weights, half_life=self.fair_share_half_life,
                                      aging=self.fair_share_aging, others_weight=self.fair_share_others_weight))

    @property
    def hibernation(self) -> HibernationSettings:
        return HibernationSettings(host_memory=self.hibernation_host_memory, over_cap=self.hibernation_over_cap,
                                   eviction_warning=self.hibernation_eviction_warning,
                                   lock_timeout=self.hibernation_lock_timeout,
                                   release_cache=self.hibernation_release_cache,
                                   resume_margin=self.hibernation_resume_margin,
                                   checkpoint_before_kill=self.hibernation_checkpoint_before_kill,
                                   shutdown_timeout=self.hibernation_shutdown_timeout,
                                   declared_restore_cost=self.hibernation_declared_restore_cost)

    def profile(self, name: str | None) -> Profile:
        name = name or self.default_profile
        if name not in self.profiles:
            raise UnknownProfile(name, list(self.profiles))
        return self.profiles[name]

    def groups_of(self, user: str) -> tuple[str, ...]:
        extra = unix_groups_of(user) if self.unix_groups else ()
        return self.quotas.groups_of(user, extra)

    def check(self) -> GPUPool:
        """What spans several settings: the default profile and the policy's profile names exist, and no
        quota asks for more SM share per kernel than a kernel can hold."""
        if not self.default_profile:
            self.default_profile = next(iter(self.profiles))
        if self.default_profile not in self.profiles:
            raise ConfigError(f"GPUPool.default_profile: {self.default_profile!r} is not a profile; the profiles are "
                              f"{', '.join(self.profiles)}")
        try:
            check_profile_names(self.policy, tuple(self.profiles))
        except PolicyError as e:
            raise ConfigError(f"GPUPool.policy{e}" if str(e).startswith("[") else f"GPUPool.policy: {e}") from None
        most = 100 * max(p.slice.gpu_count if p.slice.whole else 1 for p in self.profiles.values())
        for setting, quotas in (("default_user_quota", {"": self.default_user_quota}),
                                ("user_quotas", self.user_quotas), ("group_quotas", self.group_quotas)):
            for who, quota in quotas.items():
                if quota.sm_percent is not None and quota.kernels and quota.sm_percent > most * quota.kernels:
                    entry = f"[{who!r}]" if who else ""
                    raise ConfigError(
                        f"GPUPool.{setting}{entry}.sm_percent: {quota.sm_percent}% can never be reached by "
                        f"{quota.kernels} kernel(s) of at most {most}% each; lower it to {most * quota.kernels}% "
                        "or allow more kernels")
        return self


def unix_groups_of(user: str) -> tuple[str, ...]:
    try:
        import pwd

        gid = pwd.getpwnam(user).pw_gid
        return tuple(sorted(grp.getgrgid(g).gr_name for g in os.getgrouplist(user, gid)))
    except (KeyError, OSError):
        return ()


def config_files(paths: list[str] | None = None) -> list[Path]:
    """The pool's config files present on Jupyter's config path, lowest priority first."""
    found = []
    for directory in reversed(paths if paths is not None else jupyter_config_path()):
        for ext in (".py", ".json"):
            path = Path(directory) / f"{CONFIG_FILE}{ext}"
            if path.is_file():
                found.append(path)
    return found


def read_config(paths: list[str] | None = None) -> tuple[Config, list[Path]]:
    config = Config()
    files = config_files(paths)
    for path in files:
        loader_cls = PyFileConfigLoader if path.suffix == ".py" else JSONFileConfigLoader
        try:
            config.merge(loader_cls(path.name, path=str(path.parent)).load_config())
        except Exception as e:  # a syntax error in the admin's file: name the file
            raise ConfigError(f"cannot read {path}: {e}") from e
    return config, files


def load_settings(parent_config: Config | None = None, paths: list[str] | None = None) -> GPUPool:
    """Read the pool's config files, apply ``parent_config`` on top, validate, return the settings."""
    config, files = read_config(paths)
    if parent_config is not None and "GPUPool" in parent_config:
        config.merge(Config({"GPUPool": parent_config.GPUPool}))
    try:
        pool = GPUPool(config=config)
    except TraitError as e:  # our trait types' messages name the setting; traitlets' own name the trait
        raise ConfigError(str(e) if str(e).startswith("GPUPool") else f"GPUPool: {e}") from None
    pool.config_files = tuple(str(f) for f in files)
    return pool.check()


def check_profiles_fit(settings: GPUPool, gpus: list[GPU]) -> None:
    """Every profile must fit on some GPU of the pool; say which does not."""
    if not gpus:
        return
    for profile in settings.profiles.values():
        spec = profile.slice
        if spec.whole:
            if spec.gpu_count > len(gpus):
                raise ConfigError(
                    f"GPUPool.profiles[{profile.name!r}]: asks for {spec.gpu_count} whole GPUs "
                    f"but the pool has {len(gpus)}"
                )
        elif spec.memory > max(g.memory for g in gpus):  # type: ignore[operator]
            biggest = max(gpus, key=lambda g: g.memory)
            raise ConfigError(
                f"GPUPool.profiles[{profile.name!r}]: slice {spec} is larger than the largest GPU "
                f"of the pool ({biggest.label})"
            )
    check_reservations_fit(settings, gpus)


def check_reservations_fit(settings: GPUPool, gpus: list[GPU], now: float | None = None) -> None:
    """Every reservation fits the pool's GPUs of its models, alone and with those it overlaps; say which does not."""
    try:
        check_fit(settings.reservations, gpus, time.time() if now is None else now)
    except ReservationError as e:
        raise ConfigError(f"GPUPool.reservations{e}") from None
