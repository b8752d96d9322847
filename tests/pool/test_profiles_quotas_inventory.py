import pytest

from jupyter_gpu_pool.pool import (
    EXCLUSIVE,
    MPS,
    SOFT,
    Quota,
    Usage,
    build_quota_book,
    parse_inventory,
    parse_profile,
    parse_profiles,
)
from jupyter_gpu_pool.pool.quotas import excesses

GiB = 2**30


def test_isolation_defaults_follow_the_slice():
    assert parse_profile("a", {"slice": "10GiB"}).isolation == SOFT
    assert parse_profile("b", {"slice": "10GiB,25%"}).isolation == MPS
    assert parse_profile("c", "whole").isolation == EXCLUSIVE


def test_display_names_read_like_the_launcher():
    assert parse_profile("a", "10GiB").display_name == "GPU 10 GiB"
    assert parse_profile("b", "20GiB,50%").display_name == "GPU 20 GiB · 50%"
    assert parse_profile("c", "whole").display_name == "whole GPU"
    assert parse_profile("d", {"slice": "10GiB", "display_name": "Teaching"}).display_name == "Teaching"


@pytest.mark.parametrize(
    "name, entry, words",
    [
        ("Bad Name", {"slice": "10GiB"}, "profile name"),
        ("p", {"slcie": "10GiB"}, "unknown key(s) ['slcie']"),
        ("p", {}, "needs a 'slice'"),
        ("p", {"slice": "10 parsecs"}, "profile 'p'.slice"),
        ("p", {"slice": "10GiB", "isolation": "magic"}, "'magic' is not one of mps, soft, exclusive"),
        ("p", {"slice": "whole", "isolation": "soft"}, "whole-GPU slice uses isolation 'exclusive'"),
        ("p", {"slice": "10GiB", "isolation": "exclusive"}, "needs the slice 'whole'"),
        ("p", {"slice": "10GiB,25%", "isolation": "soft"}, "cannot hold an SM share"),
        ("p", {"slice": "10GiB", "display_name": ""}, "must not be empty"),
        ("p", 42, "must be a dict like {'slice': '10GiB'"),
    ],
)
def test_bad_profiles_name_the_profile_and_field(name, entry, words):
    with pytest.raises(ValueError, match="profile") as err:
        parse_profile(name, entry)
    assert words in str(err.value)


def test_profiles_must_be_a_nonempty_dict():
    with pytest.raises(ValueError, match="at least one profile"):
        parse_profiles({})
    with pytest.raises(ValueError, match="must be a dict"):
        parse_profiles(["10GiB"])


def test_declared_inventory_gets_stable_uuids_and_is_marked_declared():
    gpus = parse_inventory([{"name": "A100", "memory": "40GiB", "count": 2}, {"memory": "80GiB", "uuid": "X-1"}])
    assert [g.uuid for g in gpus] == ["DECLARED-local-0", "DECLARED-local-1", "X-1"]
    assert all(g.declared for g in gpus)
    assert gpus[0].label == "GPU 0 · A100 · 40 GiB (declared)"
    assert parse_inventory([{"name": "A100", "memory": "40GiB", "count": 2}]) == gpus[:2]


@pytest.mark.parametrize(
    "entries, words",
    [
        ({"memory": "40GiB"}, "must be a list"),
        ([{"name": "A"}], "inventory[0] needs 'memory'"),
        ([{"memory": "40 furlongs"}], "inventory[0].memory"),
        ([{"memory": "40GiB", "count": 0}], "inventory[0].count"),
        ([{"memory": "40GiB", "sm_count": -1}], "inventory[0].sm_count"),
        ([{"memory": "40GiB", "colour": "red"}], "unknown key(s) ['colour']"),
        ([{"memory": "40GiB", "uuid": "A"}, {"memory": "40GiB", "uuid": "A"}], "declared twice"),
        ([{"memory": "40GiB", "uuid": "A", "count": 2}], "only given with count 1"),
        (["40GiB"], "inventory[0] must be a dict"),
    ],
)
def test_bad_inventory_names_the_entry(entries, words):
    with pytest.raises(ValueError) as err:
        parse_inventory(entries)
    assert words in str(err.value)


def test_quota_book_resolves_users_groups_and_default():
    book = build_quota_book(
        users={"alice": {"memory": "80GiB"}},
        groups={"students": {"memory": "100GiB", "kernels": 10}},
        default_user={"memory": "20GiB", "kernels": 2},
        members={"students": ["bob", "carol"]},
    )
    assert book.user_quota("alice") == Quota(memory=80 * GiB)
    assert book.user_quota("bob") == Quota(memory=20 * GiB, kernels=2)
    assert book.groups_of("bob") == ("students",)
    assert book.groups_of("alice", extra=("staff",)) == ("staff",)
    assert book.limited_groups(("staff", "students")) == ["students"]


@pytest.mark.parametrize(
    "quota, words",
    [
        ({"memory": "lots"}, "user quota 'x'.memory"),
        ({"kernels": -1}, "kernels must be a whole number"),
        ({"kernels": True}, "kernels must be a whole number"),
        ({"sm_percent": "half"}, "not a whole percentage"),
        ({"sm_percent": 0}, "at least 1"),
        ({"gpus": 2}, "unknown key(s) ['gpus']"),
        ("40GiB", "must be a dict"),
    ],
)
def test_bad_quotas_name_the_quota_and_field(quota, words):
    with pytest.raises(ValueError) as err:
        build_quota_book(users={"x": quota}, groups={}, default_user={}, members={})
    assert words in str(err.value)


def test_excesses_report_each_limit_passed_in_order():
    quota = Quota(memory=40 * GiB, sm_percent=100, kernels=2)
    assert excesses(quota, Usage(30 * GiB, 0, 1), Usage(10 * GiB, 0, 1)) == []
    assert excesses(quota, Usage(30 * GiB, 0, 1), Usage(20 * GiB, 0, 1)) == [
        ("GPU memory", "40 GiB", "30 GiB", "20 GiB")]
    assert [e[0] for e in excesses(quota, Usage(0, 0, 2), Usage(10 * GiB, 0, 1))] == ["kernels"]
    assert [e[0] for e in excesses(quota, Usage(0, 75, 1), Usage(GiB, 50, 1))] == ["SM share"]
    assert [e[0] for e in excesses(quota, Usage(30 * GiB, 75, 2), Usage(20 * GiB, 50, 1))] == [
        "kernels", "GPU memory", "SM share"]
