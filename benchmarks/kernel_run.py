"""Driving real kernels in the benchmarks, written once: the start-to-ready timing (``start_time.py``,
``kubernetes_start.py``) and running a cell (the tests' own ``run_code``, from tests/kernel_helpers.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kernel_helpers import run_code  # noqa: E402  (tests/ is on the path only from here)


async def run(km, code: str, timeout: float = 1800) -> str:
    """Execute ``code`` in the kernel; its stdout (an error raises with the traceback).  A benchmark's
    cells run long (a training loop, a checkpoint of gigabytes): the defaults allow for that."""
    return await run_code(km, code, timeout=timeout, ready_timeout=300)


async def start_to_ready(km, timeout: float = 120) -> float:
    """Seconds from asking ``km`` for its kernel to the kernel's reply to kernel_info, as a frontend
    waits for it.  The kernel is left running: the caller reads what it wants and shuts it down."""
    started = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout)
        return time.perf_counter() - started
    finally:
        kc.stop_channels()
