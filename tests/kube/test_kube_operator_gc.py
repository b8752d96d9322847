"""The operator's start keeps the garbage collector's full collections short and rare (operator/handlers.py
``freeze_what_lasts``): what the process made by then (its imports: kopf, the API client) is out of the
collector's sight, and the youngest generation is collected every ``YOUNG_OBJECTS`` allocations.  In a
process of its own, as the operator's start does it, so this test's process keeps its own collector."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import gc, json
import jupyter_gpu_pool.operator.handlers as handlers
gc.collect()
tracked_before = len(gc.get_objects())
handlers.freeze_what_lasts()
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked_before": tracked_before,
                  "tracked_after": len(gc.get_objects()), "threshold": gc.get_threshold(),
                  "young": handlers.YOUNG_OBJECTS}))
"""


def test_the_operators_start_freezes_its_imports_out_of_full_collections_and_lets_young_objects_die_young():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["frozen"] >= 0.9 * seen["tracked_before"] > 50_000  # kopf's and the client's objects, frozen
    assert seen["tracked_after"] < 0.1 * seen["tracked_before"]  # what a full collection still walks
    assert seen["threshold"][0] == seen["young"] > 700
