"""When each lease held its GPUs within the dashboard's window, from the pool's journal: what the
plots draw (dashboard.held_intervals), so that they agree with the table of what is held now."""

from __future__ import annotations

from jupyter_gpu_pool.pool import JournalEntry
from jupyter_gpu_pool.server_extension.rest.dashboard import held_intervals

START = 1000.0


def entry(seq: int, at: float, kind: str, lease: str, gpus=("G0",), **detail) -> JournalEntry:
    return JournalEntry(seq, at, kind, lease, f"k-{lease}", "alice", "", {"gpus": list(gpus), **detail})


def test_holds_from_grants_resumes_hibernations_and_releases():
    entries = [
        entry(1, 1010, "allocated", "a"),
        entry(2, 1100, "hibernated", "a"),
        entry(3, 1200, "resumed", "a", gpus=("G1",)),  # back, on the other GPU, and held now
        entry(4, 1050, "hibernated", "b"),  # granted before the window: held from its start
        entry(5, 1300, "released", "b", gpus=()),  # a hibernated kernel shut down: it held nothing
        entry(6, 1020, "allocated", "c"),
        entry(7, 1090, "reclaimed", "c"),  # its process ended
        entry(8, 1100, "hibernated", "a", source="policy"),  # the server's own entry of the same happening
    ]
    held = held_intervals(entries, {"a": 1200.0, "d": 500.0}, START)
    assert held["a"] == [[1010, 1100, ["G0"]], [1200, None, ["G1"]]]
    assert held["b"] == [[START, 1050, ["G0"]]]
    assert held["c"] == [[1020, 1090, ["G0"]]]
    assert held["d"] == [[START, None, None]]  # held all along: where it is now, the caller says
    assert set(held) == {"a", "b", "c", "d"}


def test_a_grant_whose_lease_is_no_longer_active_ends_with_its_next_entry_only():
    # Granted, then hibernated outside the entries read (a journal read cut short): not drawn as held now.
    held = held_intervals([entry(1, 1010, "allocated", "a")], {}, START)
    assert held == {}
