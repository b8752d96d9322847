"""What a refused start tells the user to do: advice that fits the limit that was hit, profiles named
as the launcher shows them, and what would start now, judged by the same allocation decision."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger_helpers import GiB, NO_QUOTA, gpus

from jupyter_gpu_pool.pool import Lease, PoolExhausted, QuotaExceeded, build_quota_book
from jupyter_gpu_pool.pool.errors import MPSUserBusy
from jupyter_gpu_pool.pool.allocation import Ask, Holdings, allocate
from jupyter_gpu_pool.pool.profiles import parse_profiles

PROFILES = parse_profiles({
    "gpu-10g": {"slice": "10GiB", "display_name": "GPU 10 GiB"},
    "gpu-20g": {"slice": "20GiB", "display_name": "GPU 20 GiB"},
    "gpu-30g": {"slice": "30GiB", "display_name": "GPU 30 GiB"},
})
ALL = tuple(PROFILES.values())


def held(owner: str, memory_gib: int, gpu: str = "GPU-0", label: str = "") -> Lease:
    return Lease(id=f"L-{owner}-{memory_gib}-{label}", owner=owner, kernel_id=f"k-{owner}-{label}", profile="gpu-10g",
                 isolation="soft", memory=memory_gib * GiB, sm_percent=None, whole=False, gpu_count=1,
                 state="active", gpus=(gpu,), last_gpus=(gpu,), groups=(), label=label, created=0.0, updated=0.0,
                 state_since=0.0)


def ask(profile: str, alternatives=ALL) -> Ask:
    return Ask("alice", "k-new", PROFILES[profile], alternatives=alternatives)


def test_a_kernel_count_limit_is_not_helped_by_a_smaller_profile():
    quotas = build_quota_book({}, {}, {"kernels": 2}, {})
    holdings = Holdings.of(gpus(40, 40), [held("alice", 10, label="a.ipynb"), held("alice", 10, label="b.ipynb")])
    refusal = allocate(holdings, ask("gpu-20g"), quotas, now=100)
    assert isinstance(refusal, QuotaExceeded) and refusal.resource == "kernels"
    text = str(refusal)
    assert text.startswith("GPU quota exceeded: you hold 2 GPU kernels, as many as your quota allows, so 'Python 3 · GPU 20 GiB' "
                           "cannot start.")
    assert "a.ipynb (10 GiB, slice held for 1m" in text and "active" not in text and "b.ipynb" in text
    assert text.endswith("Shut one down (Kernel > Shut Down Kernel, or Shut down in the GPU panel), then start this one.")
    assert "smaller" not in text and "would start now" not in text and refusal.starts_now == ()


def test_a_memory_limit_names_the_profile_that_would_start_now():
    quotas = build_quota_book({}, {}, {"memory": "30GiB"}, {})
    holdings = Holdings.of(gpus(40, 40), [held("alice", 20, label="a.ipynb")])
    refusal = allocate(holdings, ask("gpu-20g"), quotas, now=0)
    assert isinstance(refusal, QuotaExceeded) and refusal.resource == "GPU memory"
    text = str(refusal)
    assert text.startswith("GPU quota exceeded: 'Python 3 · GPU 20 GiB' needs 20 GiB of GPU memory, and you hold "
                           "20 GiB of your 30 GiB.")
    assert "'Python 3 · GPU 10 GiB' would start now. Or shut down a kernel you no longer need." in text
    assert refusal.starts_now == ("Python 3 · GPU 10 GiB",)
    assert refusal.to_dict()["starts_now"] == ["Python 3 · GPU 10 GiB"]


def test_a_memory_limit_with_nothing_smaller_says_to_make_room():
    quotas = build_quota_book({}, {}, {"memory": "20GiB"}, {})
    refusal = allocate(Holdings.of(gpus(40), [held("alice", 20)]), ask("gpu-10g"), quotas, now=0)
    assert isinstance(refusal, QuotaExceeded)
    assert str(refusal).endswith("Shut down a kernel you no longer need to make room in your quota.")
    assert "would start now" not in str(refusal)


def test_a_pool_with_free_memory_is_not_called_full_and_says_what_would_start():
    # 10 GiB free on each GPU: a 20 GiB slice does not fit, a 10 GiB one does.
    holdings = Holdings.of(gpus(40, 40), [held("bob", 30, "GPU-0"), held("carol", 30, "GPU-1")])
    refusal = allocate(holdings, ask("gpu-20g"), NO_QUOTA, now=0)
    assert isinstance(refusal, PoolExhausted)
    text = str(refusal)
    assert text.startswith("The GPU pool is full for 'Python 3 · GPU 20 GiB' (20 GiB): the most free on one GPU is "
                           "10 GiB on GPU")
    assert "every GPU slice is taken" not in text
    assert "'Python 3 · GPU 10 GiB' would start now. Or try again when an idle kernel gives its slice back." in text
    assert "You hold no GPU kernel right now." in text and "bob" not in text and "carol" not in text


def test_a_pool_with_every_slice_taken_says_so_and_suggests_nothing():
    holdings = Holdings.of(gpus(40), [held("bob", 40)])
    refusal = allocate(holdings, ask("gpu-10g"), NO_QUOTA, now=0)
    assert isinstance(refusal, PoolExhausted)
    text = str(refusal)
    assert text.startswith("The GPU pool is full: every GPU slice is taken, so 'Python 3 · GPU 10 GiB' (10 GiB) "
                           "cannot start now.")
    assert "would start now" not in text and refusal.starts_now == ()


def test_a_pool_without_gpus_asks_for_the_admin_and_never_to_try_again():
    refusal = allocate(Holdings.of([], []), ask("gpu-10g"), NO_QUOTA, now=0)
    assert isinstance(refusal, PoolExhausted)
    text = str(refusal)
    assert text == ("'Python 3 · GPU 10 GiB' (10 GiB) cannot start: the pool has no GPUs (none detected, none "
                    "declared). Tell your admin: the pool's GPU inventory is empty.")
    assert "try again" not in text.lower() and "smaller" not in text


def test_suggestions_pass_the_same_quota_as_the_ask():
    # 30 GiB free in the pool but only 10 GiB left in the quota: only the 10 GiB profile would start.
    quotas = build_quota_book({}, {}, {"memory": "20GiB"}, {})
    holdings = Holdings.of(gpus(40), [held("alice", 10)])
    refusal = allocate(holdings, ask("gpu-30g"), quotas, now=0)
    assert isinstance(refusal, QuotaExceeded) and refusal.starts_now == ("Python 3 · GPU 10 GiB",)


def test_without_alternatives_nothing_is_suggested():
    holdings = Holdings.of(gpus(40, 40), [held("bob", 30, "GPU-0"), held("carol", 30, "GPU-1")])
    refusal = allocate(holdings, ask("gpu-20g", alternatives=()), NO_QUOTA, now=0)
    assert isinstance(refusal, PoolExhausted) and refusal.starts_now == ()
    assert "would start now" not in str(refusal)


def test_an_mps_gpu_serving_another_user_names_the_profile_as_the_launcher_does():
    mps = parse_profiles({"gpu-20g-50": {"slice": "20GiB,50%", "isolation": "mps", "display_name": "GPU 20 GiB · 50%"}})
    bobs = replace(held("bob", 20), isolation="mps", sm_percent=50)
    refusal = allocate(Holdings.of(gpus(40), [bobs]), Ask("alice", "k-new", mps["gpu-20g-50"]), NO_QUOTA, now=0)
    assert isinstance(refusal, MPSUserBusy) and refusal.users == ["bob"]
    text = str(refusal)
    assert text.startswith("No GPU can take 'Python 3 · GPU 20 GiB · 50%' now: it runs under NVIDIA MPS")
    assert "gpu-20g-50" not in text and refusal.to_dict()["launcher_name"] == "Python 3 · GPU 20 GiB · 50%"


TEN, TWENTY = "'Python 3 · GPU 10 GiB'", "'Python 3 · GPU 20 GiB'"
SHUT_DOWN = "hut down a kernel you no longer need"
ADMIN = "ask your admin for a larger quota."


# quota (the user's, or group "lab"'s), alice's holdings (GiB each), the profile asked:
# whether it can never fit the quota, and how the message ends.
@pytest.mark.parametrize("user, group, holds, profile, never, ending", [
    # a profile larger than the whole quota, to someone who holds nothing: never "shut down"
    ({"memory": "20GiB"}, None, [], "gpu-30g", True,
     f"more than your whole quota of 20 GiB: it cannot start even with no kernel running. {TEN} or {TWENTY} "
     f"would start now. Or {ADMIN}"),
    # ... nor to someone who holds some: shutting theirs down would not help either
    ({"memory": "20GiB"}, None, [20], "gpu-30g", True,
     f"more than your whole quota of 20 GiB: it cannot start even with no kernel running. Pick a smaller profile, "
     f"or {ADMIN}"),
    # ... and where the kernel count is reached too, the limit that can never be met is the one named
    ({"memory": "20GiB", "kernels": 1}, None, [10], "gpu-30g", True,
     f"it cannot start even with no kernel running. Pick a smaller profile, or {ADMIN}"),
    # a quota of no kernels at all
    ({"kernels": 0}, None, [], "gpu-10g", True,
     f"your quota allows 0 GPU kernels, so {TEN} cannot start. Ask your admin for a GPU quota."),
    # a group's whole quota is too small
    (None, {"memory": "20GiB"}, [], "gpu-30g", True,
     f"more than the 20 GiB that group 'lab' may hold (all its members together): it cannot start even with no "
     f"kernel running. {TEN} or {TWENTY} would start now. Or {ADMIN}"),
    # a profile that fits the quota once something is shut down: the advice says so
    ({"memory": "30GiB"}, None, [20], "gpu-20g", False, f"{TEN} would start now. Or s{SHUT_DOWN}."),
    ({"memory": "20GiB"}, None, [20], "gpu-10g", False, f"S{SHUT_DOWN} to make room in your quota."),
    ({"kernels": 1}, None, [10], "gpu-10g", False,
     "Shut one down (Kernel > Shut Down Kernel, or Shut down in the GPU panel), then start this one."),
    (None, {"memory": "30GiB"}, [20], "gpu-20g", False, f"{TEN} would start now. Or s{SHUT_DOWN}."),
])
def test_the_advice_says_whether_the_profile_can_ever_fit_the_quota(user, group, holds, profile, never, ending):
    quotas = build_quota_book({"alice": user} if user else {}, {"lab": group} if group else {}, {},
                              {"lab": ["alice"]} if group else {})
    holdings = [replace(held("alice", gib, label=f"n{i}.ipynb"), groups=("lab",) if group else ())
                for i, gib in enumerate(holds)]
    ask_ = replace(ask(profile), groups=("lab",) if group else ())
    refusal = allocate(Holdings.of(gpus(40, 40), holdings), ask_, quotas, now=0)
    assert isinstance(refusal, QuotaExceeded) and refusal.scope == ("lab" if group else "user")
    text = str(refusal)
    assert refusal.never_fits is never and refusal.to_dict()["never_fits"] is never
    assert text.endswith(ending)
    if never:
        assert SHUT_DOWN not in text and "Shut one down" not in text and "try again" not in text.lower()
    else:
        assert "admin" not in text
