"""How often each user may hint (``POST kernels/{id}/hint``): at most ``per_minute`` hints in any 60 s.

A hint is a guess sent by the UI as the user opens a notebook or starts typing in it; the
labextension debounces them, so a user's flood is a broken or hostile client: the rest of the
minute's hints are answered 429 with ``Retry-After`` (:class:`HintLimiter`), before any lookup.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW = 60.0  # seconds


class HintLimiter:
    """A sliding window per user: ``allow`` says whether one more hint may go now, or how long to wait."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute, self.clock = per_minute, clock
        self._sent: dict[str, deque[float]] = {}

    def allow(self, user: str) -> float | None:
        """None (and the hint counted) if ``user`` may hint now, else the seconds until they may."""
        now = self.clock()
        sent = self._sent.setdefault(user, deque())
        while sent and sent[0] <= now - WINDOW:
            sent.popleft()
        if len(sent) >= self.per_minute:
            return max(sent[0] + WINDOW - now, 0.0)
        sent.append(now)
        if len(self._sent) > 10_000:  # users who stopped hinting long ago: forget them
            self._sent = {u: q for u, q in self._sent.items() if q and q[-1] > now - WINDOW}
        return None


def retry_after(seconds: float) -> str:
    """The ``Retry-After`` header's value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
