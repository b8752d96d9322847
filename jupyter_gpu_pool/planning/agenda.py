"""The replay's agenda: what happens next, in virtual time (one ``heapq``); events at the same time run in
the order of their kinds (users act before a pass looks), then in the order they were put on it."""

from __future__ import annotations

import heapq
import itertools

# The kinds of event, in the order same-time events run.
USER, ASK, TIMEOUT, HIBERNATED, RESTORED, HINT, HINT_END, AFTER_CELL, PASS, SAMPLE, DEADLINE, PHASE = range(12)


class Agenda:
    def __init__(self):
        self.heap: list = []
        self.seq = itertools.count()  # the order things were put on it (shared with the culler's due lists)

    def push(self, at: float, kind: int, item) -> None:
        heapq.heappush(self.heap, (at, kind, next(self.seq), item))
