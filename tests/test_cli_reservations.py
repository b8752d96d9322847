"""`jupyter gpu-pool status` shows the admin's reservations, each in its phase (before its lead time,
making room, open), and the queue's order with why each waits where it is: a real subprocess on the test's
config and ledger."""

import datetime as dt
import json
import time

from test_cli import cli

from jupyter_gpu_pool.pool import SliceSpec

GiB = 1024**3


def moment(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M")


def test_status_lists_each_reservation_in_its_phase_and_why_each_waiter_waits_where_it_is(pool_home):
    now = time.time()
    opened, soon = now - 300, now + 300
    day = dt.datetime.fromtimestamp(now + 3 * 86400, dt.timezone.utc).strftime("%a")  # three days ahead
    pool_home.configure(reservations=[
        # open 5 minutes ago, a 10-minute lead: members first, others may borrow 5 minutes from now
        {"name": "ML 101 lab", "users": ["ann"], "groups": ["ml101"], "start": moment(opened),
         "end": moment(opened + 7200), "timezone": "UTC", "memory": "20GiB"},
        # opens in 5 minutes: making its room now
        {"name": "Exam", "users": ["eve"], "start": moment(soon), "end": moment(soon + 3600), "timezone": "UTC",
         "gpus": 1},
        # weekly, next three days ahead: nothing yet
        {"name": "Research block", "groups": ["research"], "days": [day.lower()], "start": "03:00", "end": "04:00",
         "timezone": "UTC", "memory": "10GiB", "lead": "30m"},
    ])
    pool = pool_home.pool()
    ledger = pool.ledger
    ten = SliceSpec(memory=10 * GiB)
    ledger.enqueue("bob", "kernel-bob", "small", ten, label="b.ipynb")
    ledger.enqueue("ann", "kernel-ann", "small", ten, label="a.ipynb")

    out = cli("status").stdout
    section = out[out.index("Reservations:"):]
    rows = {line.split()[0]: line for line in section.splitlines()[2:]}
    assert "ML 101 lab" in section and "ml101, ann" in section
    ml = next(line for line in section.splitlines() if line.strip().startswith("ML 101 lab"))
    assert "20 GiB" in ml and " open " in ml
    assert f"open until {clock(opened + 7200)}: members first; others may borrow from {clock(opened + 600)}" in ml
    exam = rows["Exam"]
    assert "1 GPU" in exam and "making room" in exam and f"opens at {clock(soon)}" in exam
    research = rows["Research"]
    assert f"{day} 03:00-04:00 (UTC)" in research and " before " in research
    assert f"next {day} 03:00-04:00, making room from {day} 02:30" in research

    # the member goes first into her reserved room, and each waiter reads why
    queue = out[out.index("Queue:"):out.index("Reservations:")]
    ann = next(line for line in queue.splitlines() if "ann" in line)
    bob = next(line for line in queue.splitlines() if "bob" in line)
    assert "WHY" in queue
    assert ann.split()[0] == "1" and "going first into the room reserved for ML 101 lab" in ann
    assert bob.split()[0] == "2" and "1 ahead is going first into room reserved for them" in bob

    data = json.loads(cli("status", "--json").stdout)
    phases = {r["name"]: (r["phase"], r["borrowing"], r["lead"]) for r in data["reservations"]}
    assert phases == {"ML 101 lab": ("open", False, 600.0), "Exam": ("making_room", False, 600.0),
                      "Research block": ("before", False, 1800.0)}
    ml = next(r for r in data["reservations"] if r["name"] == "ML 101 lab")
    assert ml["users"] == ["ann"] and ml["groups"] == ["ml101"] and ml["memory"] == 20 * GiB
    assert [w["why"] for w in data["queue"]][0].startswith("1st in the queue: going first")


def test_status_without_reservations_says_nothing_of_them(pool_home):
    out = cli("status").stdout
    assert "Reservations" not in out and "WHY" not in out
    assert json.loads(cli("status", "--json").stdout)["reservations"] == []
