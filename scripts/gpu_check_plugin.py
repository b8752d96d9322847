"""A pytest plugin of ``scripts/gpu-check``: each test's outcome, as it finishes, one JSON line each in
``$GPU_CHECK_RESULTS`` (so that a run cut short by its time limit still reports what ran), with the
figures tests record through ``record_property``."""

from __future__ import annotations

import json
import os


def _write(record: dict) -> None:
    with open(os.environ["GPU_CHECK_RESULTS"], "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def _message(report) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    if report.failed:
        return report.longreprtext[-3000:]
    return ""


def pytest_collection_finish(session) -> None:
    _write({"collected": [item.nodeid for item in session.items]})


def pytest_collectreport(report) -> None:
    if report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "duration": 0.0,
                "properties": {}, "message": report.longreprtext[-3000:]})


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or report.outcome != "passed":
        _write({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                "duration": round(report.duration, 2), "properties": dict(report.user_properties),
                "message": _message(report)})
