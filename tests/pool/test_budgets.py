"""GPU-hour budgets: the accounting (pure), the ledger's intervals, and refusals past the budget."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from ledger_helpers import GiB, NO_QUOTA, gpus, request
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import ACTIVE, Lease
from jupyter_gpu_pool.pool.budgets import (
    Budget,
    BudgetBook,
    BudgetExceeded,
    Interval,
    Scope,
    Standing,
    hours_spent,
    parse_budgets,
    period_bounds,
    scopes,
    share_of,
)

PARIS = ZoneInfo("Europe/Paris")
# Wednesday 2026-11-18 15:00 in Paris
WEDNESDAY = dt.datetime(2026, 11, 18, 15, 0, tzinfo=PARIS).timestamp()


def lease(memory_gib=10, sm=None, whole=False, count=1) -> Lease:
    return Lease(id="l", owner="ann", kernel_id="k", profile="p", isolation="soft", memory=memory_gib * GiB,
                 sm_percent=sm, whole=whole, gpu_count=count, state=ACTIVE, gpus=("G",), last_gpus=("G",),
                 groups=(), label="", created=0, updated=0, state_since=0)


@pytest.mark.parametrize("period, start, end", [
    ("day", dt.datetime(2026, 11, 18, tzinfo=PARIS), dt.datetime(2026, 11, 19, tzinfo=PARIS)),
    ("week", dt.datetime(2026, 11, 16, tzinfo=PARIS), dt.datetime(2026, 11, 23, tzinfo=PARIS)),  # from Monday
    ("month", dt.datetime(2026, 11, 1, tzinfo=PARIS), dt.datetime(2026, 12, 1, tzinfo=PARIS)),
])
def test_periods_are_calendar_periods_in_the_pools_time_zone(period, start, end):
    assert period_bounds(WEDNESDAY, period, PARIS) == (start.timestamp(), end.timestamp())


@pytest.mark.parametrize("slice_lease, gpu_gib, share", [
    (lease(10), 80, 0.125),  # memory share
    (lease(10, sm=50), 80, 0.5),  # the SM share is larger
    (lease(80), 80, 1.0),
    (lease(whole=True), 80, 1.0),
    (lease(whole=True, count=2), 80, 2.0),
])
def test_a_slice_costs_the_larger_of_its_memory_and_sm_share_per_hour(slice_lease, gpu_gib, share):
    assert share_of(slice_lease, gpu_gib * GiB) == share


def test_hours_count_only_active_time_within_the_period():
    start, now = 1000.0, 1000.0 + 4 * 3600
    intervals = [
        Interval(0.5, start - 3600, start + 3600),  # began before the period: only its last hour counts
        Interval(1.0, start + 7200, start + 9000),  # half an hour at a whole GPU, then hibernated
        Interval(0.25, start + 10800, None),  # still active: counted up to now
    ]
    assert hours_spent(intervals, start, now) == pytest.approx(0.5 * 1 + 1.0 * 0.5 + 0.25 * 1)


def test_a_users_own_budget_replaces_their_groups_member_budget_and_shared_ones_apply_on_top():
    budgets = parse_budgets({"students": {"gpu_hours": 10}, "ann": {"gpu_hours": 40, "period": "month"},
                             "lab": {"gpu_hours": 100, "shared": True}})
    assert [(s.name, s.kind) for s in scopes(budgets, "bob", ("students", "lab"))] == [
        ("students", "member"), ("lab", "shared")]
    assert [(s.name, s.kind) for s in scopes(budgets, "ann", ("students", "lab"))] == [
        ("ann", "user"), ("lab", "shared")]
    assert scopes(budgets, "carl", ("staff",)) == []


@pytest.mark.parametrize("entries, words", [
    ({"students": {"gpu_hours": -1}}, "gpu_hours must be a number of hours of 0 or more"),
    ({"students": {"gpu_hours": float("nan")}}, "gpu_hours must be a number"),
    ({"students": {"gpu_hours": 10, "period": "fortnight"}}, "period: 'fortnight' is not one of day, week, month"),
    ({"students": {"hours": 10}}, "unknown key(s) ['hours']"),
    ({"students": 10}, "must be a dict like"),
])
def test_bad_budgets_name_the_entry_and_field(entries, words):
    with pytest.raises(ValueError) as err:
        parse_budgets(entries)
    assert words in str(err.value)


def test_the_tightest_budget_is_the_one_with_the_least_left_and_says_when_it_runs_out():
    book = BudgetBook(parse_budgets({"students": {"gpu_hours": 10}, "lab": {"gpu_hours": 12, "shared": True}}), PARIS)
    spent = {"students": 6.0, "lab": 11.0}
    s = book.standing("bob", ("students", "lab"), lambda scope, start: spent[scope.name], lambda scope: 0.5,
                      WEDNESDAY)
    assert (s.scope.name, s.left) == ("lab", 1.0)
    assert s.reaches(1.0) == pytest.approx(WEDNESDAY + 2 * 3600)  # 1 h left at 0.5 GPU-h per hour
    assert s.reaches(0.9) == pytest.approx(WEDNESDAY - 0.2 / 0.5 * 3600)  # past 90% already: when it was
    idle = Standing(Scope("students", "member", Budget(10)), 6.0, 0.0, WEDNESDAY + 86400, WEDNESDAY)
    assert idle.reaches(1.0) is None  # nothing active: it never runs out


def test_a_refusal_past_the_budget_gives_the_reset_time():
    s = Standing(Scope("students", "member", Budget(10)), 10.2, 0.0, period_bounds(WEDNESDAY, "week", PARIS)[1],
                 WEDNESDAY)
    err = BudgetExceeded(owner="bob", profile="gpu-10g", standing=s, holdings=[], now=WEDNESDAY,
                         launcher_name="Python 3 · GPU 10 GiB")
    assert "budget of 10 GPU-hours per week is spent (10.2 h used)" in str(err)
    assert "the kernel 'Python 3 · GPU 10 GiB' cannot start or resume" in str(err)  # the name the user clicked
    assert "gpu-10g" not in str(err) and err.to_dict()["launcher_name"] == "Python 3 · GPU 10 GiB"
    local = dt.datetime.fromtimestamp(s.period_end)  # users read the machine's clock
    assert f"resets on {local:%a %d %b} at {local:%H:%M}" in str(err) and err.to_dict()["resets_at"] == s.period_end


# -- the ledger keeps the intervals and refuses past the budget --------------------------------------


@pytest.fixture
def book():
    return BudgetBook(parse_budgets({"ann": {"gpu_hours": 1, "period": "day"}}), dt.timezone.utc)


def test_the_ledger_counts_active_time_only_and_refuses_a_start_once_the_budget_is_spent(tmp_path, clock, book):
    ledger = Ledger(tmp_path / "l.sqlite", clock=clock)
    ledger.sync_gpus(gpus(40))
    clock.now = 1_000_000 * 86400.0 + 3600  # an hour into a (UTC) day
    first = ledger.allocate(request(owner="ann", slice_text="20GiB"), NO_QUOTA, budgets=book)  # half the GPU
    clock.advance(3600)
    assert ledger.budget_standing("ann", (), book).spent == pytest.approx(0.5)
    ledger.hibernate(first.id, host_bytes=0)
    clock.advance(7200)  # hibernated time is free
    assert ledger.budget_standing("ann", (), book).spent == pytest.approx(0.5)
    ledger.resume(first.id, NO_QUOTA, budgets=book)
    clock.advance(3600)
    standing = ledger.budget_standing("ann", (), book)
    assert standing.spent == pytest.approx(1.0) and standing.exhausted and standing.rate == pytest.approx(0.5)
    with pytest.raises(BudgetExceeded) as refused:
        ledger.allocate(request(owner="ann", slice_text="10GiB"), NO_QUOTA, budgets=book)
    assert "GPU time used up" in str(refused.value) and len(ledger.leases(owner="ann")) == 1
    ledger.hibernate(first.id, host_bytes=0)
    with pytest.raises(BudgetExceeded):
        ledger.resume(first.id, NO_QUOTA, budgets=book)  # a resume is refused too
    assert ledger.allocate(request(owner="bob", slice_text="10GiB"), NO_QUOTA, budgets=book).state == ACTIVE
    clock.advance(86400)  # the next day: a fresh budget
    assert ledger.resume(first.id, NO_QUOTA, budgets=book).state == ACTIVE


def test_once_spent_the_time_it_ran_out_holds_still_pass_after_pass():
    """The policy's deadline must not move while the budget overruns: the same past time each pass."""
    scope = Scope("ann", "user", Budget(1.0))
    first = Standing(scope, 1.1, 0.5, WEDNESDAY + 86400, WEDNESDAY)
    later = Standing(scope, 1.1 + 0.5 * 60 / 3600, 0.5, WEDNESDAY + 86400, WEDNESDAY + 60)
    assert first.reaches(1.0) == pytest.approx(later.reaches(1.0)) == pytest.approx(WEDNESDAY - 0.1 / 0.5 * 3600)
