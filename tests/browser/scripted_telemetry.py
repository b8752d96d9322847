"""Per-process GPU readings for the browser test of the UI's memory bars and sparklines.

This machine has no GPU, so NVML (``NVMLSource``) reports nothing and the cards read "no
reading". To see the UI draw real numbers, the test server is started with
``c.GPUPoolExtension.telemetry_source_class = "scripted_telemetry.FileReadings"``: the
extension's own setting for where readings come from. Everything else is the real server. The
readings come from a JSON file the test rewrites (``{"memory": bytes, "utilization": percent}``)
and are reported for the server's child processes (its kernels), the way NVML reports a
kernel's processes on a GPU machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from jupyter_gpu_pool.devices.telemetry import ProcessReading

READINGS_ENV = "GPU_POOL_TEST_READINGS"


class FileReadings:
    def __init__(self) -> None:
        self.path = Path(os.environ[READINGS_ENV])

    def _current(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):  # not written yet, or caught mid-write
            return {}

    def available(self) -> tuple[bool, str]:
        return True, ""

    def read(self, gpu_uuids: set[str]) -> dict[str, dict[int, ProcessReading]]:
        data = self._current()
        if data.get("memory") is None:
            return {uuid: {} for uuid in gpu_uuids}
        reading = ProcessReading(int(data["memory"]), float(data.get("utilization", 0.0)))
        pids = [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]
        return {uuid: {pid: reading for pid in pids} for uuid in gpu_uuids}

    def device_utilization(self, gpu_uuids: set[str]) -> dict[str, float]:
        data = self._current()
        return {uuid: float(data["utilization"]) for uuid in gpu_uuids} if "utilization" in data else {}
