"""How long a process's event loop keeps an HTTP request waiting: GET each URL every 50 ms, one after
the other, from a process of its own (so that the prober's own work never delays what it measures).

    python benchmarks/loop_probe.py OUT.json URL [URL...]

Until SIGTERM; then writes ``{url: [[unix time, seconds or null], ...]}`` to OUT.json (null: no answer
within 10 s, or an error).  The operator's liveness endpoint is served on its event loop, so the longest
wait for it is the longest the loop was held by one piece of work (to within a sample); an idle process
probed the same way shows what the machine alone adds (a loaded machine delays any process now and then).
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request

INTERVAL = 0.05


def probe(url: str) -> float | None:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()
    except Exception:  # noqa: BLE001 (no answer is a sample too)
        return None
    return time.perf_counter() - started


def main(out: str, urls: list[str]) -> None:
    samples: dict[str, list] = {url: [] for url in urls}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    due = time.monotonic()
    while not stop:
        for url in urls:
            samples[url].append([time.time(), probe(url)])
        due = max(due + INTERVAL, time.monotonic() - INTERVAL)
        time.sleep(max(0.0, due - time.monotonic()))
    with open(out, "w") as f:
        json.dump(samples, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
