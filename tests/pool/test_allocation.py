"""The pure allocation core: no I/O in ``pool``, and one decision shared by every store."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ledger_helpers import GiB, NO_QUOTA, gpus, request
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local import ledger as local_ledger
from jupyter_gpu_pool.cluster.quotas import read_quotas
from jupyter_gpu_pool.operator import admission
from jupyter_gpu_pool.operator.sharing import Rendering
from jupyter_gpu_pool.pool import (
    ACTIVE,
    PoolExhausted,
    QuotaExceeded,
    build_quota_book,
    parse_profile,
)
from jupyter_gpu_pool.pool import allocation
from jupyter_gpu_pool.pool.allocation import Ask, Grant, Holdings, allocate
from jupyter_gpu_pool.pool.queue import Waiter

BLOCKED = ("sqlite3", "socket", "subprocess", "psutil", "pynvml", "kubernetes_asyncio", "jupyter_server",
           "jupyter_client", "kopf", "aiohttp", "tornado", "zmq")


def test_every_module_of_the_pool_core_imports_with_io_modules_blocked():
    """``pool`` is the pure core: importing any of its modules loads nothing that does I/O."""
    code = textwrap.dedent(f"""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = {BLOCKED!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"the pool core imported {{name}}, which does I/O")
        for name in list(sys.modules):
            if name.split(".")[0] in BLOCKED:
                del sys.modules[name]
        sys.meta_path.insert(0, Block())
        import jupyter_gpu_pool.pool as core
        names = [m.name for m in pkgutil.walk_packages(core.__path__, "jupyter_gpu_pool.pool.")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 14  # every module was imported (allocation, policy, phases, ...)


def test_the_blocker_catches_a_module_that_does_io(tmp_path):
    """The test above can fail: the same blocker stops a module that imports sqlite3."""
    (tmp_path / "leaky.py").write_text("import sqlite3\n")
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError(name)
        sys.modules.pop("sqlite3", None)
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(tmp_path)!r})
        import leaky
    """)
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0


# -- the decision itself ---------------------------------------------------------------------------


def holdings_of(ledger: Ledger) -> Holdings:
    snap = ledger.snapshot()
    return Holdings(leases=tuple(snap.leases), gpus=tuple(snap.gpus), waiters=tuple(snap.waiters))


def test_a_grant_names_the_gpu_and_what_it_counts(ledger):
    profile = parse_profile("p", "10GiB")
    result = allocate(Holdings.of(gpus(40, 40), []), Ask("ann", "k1", profile), NO_QUOTA, now=0)
    assert isinstance(result, Grant)
    assert [g.uuid for g in result.gpus] == ["GPU-0"] and result.memory == 10 * GiB
    assert (result.asked.memory, result.asked.kernels) == (10 * GiB, 1)


def test_a_resume_adds_no_kernel_and_goes_back_to_its_gpu_first():
    profile = parse_profile("p", "10GiB")
    quotas = build_quota_book({}, {}, {"kernels": 1}, {})
    ask = Ask("ann", "k1", profile, new_kernel=False, prefer=("GPU-1",))
    result = allocate(Holdings.of(gpus(40, 40), []), ask, quotas, now=0)
    assert isinstance(result, Grant) and [g.uuid for g in result.gpus] == ["GPU-1"]
    assert result.asked.kernels == 0


def test_quota_is_refused_before_room():
    """Both limits are passed: the quota is what the user can act on, so it is named."""
    quotas = build_quota_book({}, {}, {"memory": "5GiB"}, {})
    result = allocate(Holdings.of(gpus(4), []), Ask("ann", "k1", parse_profile("p", "10GiB")), quotas, now=0)
    assert isinstance(result, QuotaExceeded) and result.resource == "GPU memory"


def test_an_earlier_waiter_that_fits_is_served_first():
    from jupyter_gpu_pool.pool import SliceSpec

    waiter = Waiter("w1", "bob", "kb", None, "p", SliceSpec.parse("30GiB"), "", 0.0, 0.0, position=1)
    holdings = Holdings.of(gpus(40), [], [waiter])
    ask = Ask("ann", "k1", parse_profile("p", "20GiB"))
    assert isinstance(allocate(holdings, ask, NO_QUOTA, now=0), PoolExhausted)  # 30 of 40 GiB are bob's turn
    assert isinstance(allocate(Holdings.of(gpus(40), []), ask, NO_QUOTA, now=0), Grant)  # with nobody waiting
    # the waiter itself asks with its own place: nobody is ahead of it, so it gets its slice
    own = Ask("bob", "kb", parse_profile("p", "30GiB"))
    assert isinstance(allocate(holdings, own, NO_QUOTA, now=0, waiter_id="w1"), Grant)


def test_without_gpus_only_quotas_are_decided():
    """A cluster's scheduler places slices: the decision is the quota, on what the pod will hold."""
    from jupyter_gpu_pool.pool import Usage

    quotas = build_quota_book({}, {}, {"memory": "20GiB"}, {})
    ask = Ask("ann", "k1", parse_profile("p", "10GiB"), asked=Usage(24 * GiB, 0, 1))
    result = allocate(Holdings(), ask, quotas, now=0)
    assert isinstance(result, QuotaExceeded) and "24 GiB" in str(result)
    small = Ask("ann", "k1", parse_profile("p", "10GiB"), asked=Usage(16 * GiB, 0, 1))
    assert allocate(Holdings(), small, quotas, now=0) == Grant(gpus=(), memory=16 * GiB, asked=Usage(16 * GiB, 0, 1))


# -- one decision, every store ----------------------------------------------------------------------


def cluster_kernel(uid: str, owner: str, memory: int, groups=(), sm: int = 0) -> dict:
    return {"metadata": {"name": f"k-{uid}", "namespace": "ns", "uid": uid, "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"owner": owner, "kernelId": uid, "profile": "p"},
            "status": {"phase": "Running", "admitted": {"memory": memory, "smPercent": sm, "gpuCount": 1,
                                                        "groups": list(groups), "at": 1.0}}}


def quota_objects(user_memory: str, group_memory: str, members: list[str]) -> list[dict]:
    return [{"metadata": {"name": "default"}, "spec": {"scope": "default", "memory": user_memory, "kernels": 3}},
            {"metadata": {"name": "students"}, "spec": {"scope": "group", "name": "students", "memory": group_memory,
                                                        "members": members}}]


@pytest.mark.parametrize("asked_gib, expected", [
    (10, "grant"),  # fits both quotas
    (25, "user"),  # ann holds 20 of 40 GiB: 25 more passes her own quota
    (15, "students"),  # the group holds 20 + 30 of 60 GiB: 15 more passes the group's
])
def test_the_ledger_and_the_operator_admission_give_the_same_answer(tmp_path, clock, asked_gib, expected):
    """Same holdings, same request: the local ledger and the operator's admission agree, because
    both call the pool core's one decision."""
    assert local_ledger.allocate is allocation.allocate and admission.allocate is allocation.allocate
    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    ledger.sync_gpus(gpus(80, 80, 80))  # room for everything: only quotas can refuse
    members = ["ann", "bea"]
    quotas = build_quota_book({}, {"students": {"memory": "60GiB"}}, {"memory": "40GiB", "kernels": 3},
                              {"students": members})
    book = read_quotas(quota_objects("40GiB", "60GiB", members))
    assert book.book == quotas
    held = [("ann", 20), ("bea", 30), ("cid", 35)]
    kernels = []
    for i, (owner, gib) in enumerate(held):
        lease = ledger.allocate(request(owner=owner, slice_text=f"{gib}GiB", groups=quotas.groups_of(owner)), quotas)
        assert lease.state == ACTIVE
        kernels.append(cluster_kernel(f"uid-{i}", owner, gib * GiB, quotas.groups_of(owner)))
    ask = request(owner="ann", slice_text=f"{asked_gib}GiB", groups=quotas.groups_of("ann"))
    local_answer = local_error = None
    try:
        local_answer = ledger.allocate(ask, quotas)
    except QuotaExceeded as e:
        local_error = e
    new = cluster_kernel("uid-new", "ann", 0)
    new["status"] = {}
    cluster_error = None
    try:
        admission.admit(new, ask.profile.name, "hami", Rendering({}, {}, asked_gib * GiB, 0, ""), book, kernels,
                        now=ledger.clock())
    except QuotaExceeded as e:
        cluster_error = e
    if expected == "grant":
        assert local_answer is not None and cluster_error is None
    else:
        assert local_error is not None and cluster_error is not None
        assert local_error.scope == cluster_error.scope == expected
        assert (local_error.resource, local_error.limit, local_error.used, local_error.asked) == \
            (cluster_error.resource, cluster_error.limit, cluster_error.used, cluster_error.asked)


@pytest.mark.parametrize("asked_gib, kernels_limit, expected", [
    (15, 3, "grant"),  # ann: 20 GiB running + 25 hibernated (free): 20 + 15 fits 40; the group's 50 + 15 fits 65
    (25, 3, "user"),  # 20 + 25 passes her 40 GiB all the same: the running kernel still counts
    (5, 2, "user"),  # her hibernated kernel is still a kernel: a third passes a limit of 2 kernels
    (20, 3, "students"),  # the group: 20 + 30 running (both hibernated kernels free) + 20 = 70 > 65
])
def test_the_ledger_and_the_operator_agree_on_hibernated_kernels(tmp_path, clock, asked_gib, kernels_limit,
                                                                   expected):
    """Hibernated kernels, the same holdings given to both stores: their memory counts as free and each
    stays a kernel, in the local ledger (state hibernated) and in the operator's admission (a GPUKernel in
    phase Hibernated), with the same answer and the same numbers in a refusal."""
    from jupyter_gpu_pool.pool import HIBERNATED
    from jupyter_gpu_pool.pool.phases import HIBERNATING

    ledger = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    ledger.sync_gpus(gpus(80, 80, 80, 80))
    members = ["ann", "bea"]
    quotas = build_quota_book({}, {"students": {"memory": "65GiB"}},
                              {"memory": "40GiB", "kernels": kernels_limit}, {"students": members})
    objects = quota_objects("40GiB", "65GiB", members)
    objects[0]["spec"]["kernels"] = kernels_limit
    book = read_quotas(objects)
    assert book.book == quotas
    held = [("ann", 25, True), ("ann", 20, False), ("bea", 30, True), ("bea", 30, False)]  # each hibernated in turn
    kernels = []
    for i, (owner, gib, asleep) in enumerate(held):
        lease = ledger.allocate(request(owner=owner, slice_text=f"{gib}GiB", groups=quotas.groups_of(owner)), quotas)
        kernel = cluster_kernel(f"uid-{i}", owner, gib * GiB, quotas.groups_of(owner))
        if asleep:
            ledger.set_phase(lease.id, HIBERNATING, expect="")
            assert ledger.hibernate(lease.id, gib * GiB).state == HIBERNATED
            kernel["status"]["phase"] = "Hibernated"
            kernel["status"]["hibernation"] = {"bytes": gib * GiB, "devices": ["GPU-x"]}
        kernels.append(kernel)
    ask = request(owner="ann", slice_text=f"{asked_gib}GiB", groups=quotas.groups_of("ann"))
    local_answer = local_error = cluster_error = None
    try:
        local_answer = ledger.allocate(ask, quotas)
    except QuotaExceeded as e:
        local_error = e
    new = cluster_kernel("uid-new", "ann", 0)
    new["status"] = {}
    try:
        admission.admit(new, ask.profile.name, "hami", Rendering({}, {}, asked_gib * GiB, 0, ""), book, kernels,
                        now=ledger.clock())
    except QuotaExceeded as e:
        cluster_error = e
    if expected == "grant":
        assert local_answer is not None and cluster_error is None, (local_error, cluster_error)
    else:
        assert local_error is not None and cluster_error is not None, (local_answer, cluster_error)
        assert local_error.scope == cluster_error.scope == expected
        assert (local_error.resource, local_error.limit, local_error.used, local_error.asked) == \
            (cluster_error.resource, cluster_error.limit, cluster_error.used, cluster_error.asked)
