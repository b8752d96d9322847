"""A real ``jupyter lab`` process with the pool's extension (the browser tests' ``LabServer``, without a
browser): what its log says, and that it stops at the first SIGTERM whatever starts were refused."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))  # LabServer lives with the browser tests
from lab_server import LabServer  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _kernelspec_like(lab: LabServer, name: str, source: str, change) -> None:
    """A kernelspec ``name`` made from ``source``'s (in the server's data dir), changed by ``change``."""
    spec = json.loads((lab.data_dir / "kernels" / source / "kernel.json").read_text())
    change(spec)
    folder = lab.data_dir / "kernels" / name
    folder.mkdir()
    (folder / "kernel.json").write_text(json.dumps(spec))


def _stop_with_sigterm(lab: LabServer, within: float) -> bool:
    """One SIGTERM, as a service manager sends it; whether the server exited within ``within`` seconds."""
    lab.proc.send_signal(signal.SIGTERM)
    try:
        lab.proc.wait(timeout=within)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_the_first_sigterm_stops_the_server_after_refused_and_failed_starts(tmp_path):
    """A start that fails before any kernel runs (the pool's provisioner refusing a kernelspec's config as it
    is made, a kernelspec whose program is missing) is left among jupyter_client's pending starts; the
    server's shutdown then failed on it ("Kernel does not exist: <id>") and the server ran on until a
    second signal.  The first SIGTERM must stop it, its running kernel shut down with its slice given back."""
    lab = LabServer(tmp_path, pool={}, extension={}, server={
        "KernelSpecManager": {"allowed_kernelspecs": ["gpu-pool-gpu-10g", "misspelt", "missing-program"]}})
    lab.write_config()
    lab.install_kernelspecs()
    _kernelspec_like(lab, "misspelt", "gpu-pool-gpu-10g",
                     lambda spec: spec["metadata"]["kernel_provisioner"]["config"].update(profle="gpu-10g"))
    _kernelspec_like(lab, "missing-program", "gpu-pool-gpu-10g", lambda spec: (
        spec["metadata"].pop("kernel_provisioner"), spec.update(argv=["/nonexistent/python", "{connection_file}"])))
    lab.kernelspecs = False  # installed above, with the two broken ones beside them
    lab.start()
    try:
        status, running = lab.api("POST", "api/kernels", {"name": "gpu-pool-gpu-10g"})
        assert status == 201, running
        status, refused = lab.api("POST", "api/kernels", {"name": "misspelt"})
        assert status == 400 and "unknown keys ['profle']" in refused["message"], refused
        status, failed = lab.api("POST", "api/kernels", {"name": "missing-program"})
        assert status >= 500, failed
        stopped = _stop_with_sigterm(lab, within=60)
    finally:
        lab.stop()  # (a SIGINT where the SIGTERM did not stop it)
    log = lab.log_path.read_text(errors="replace")
    assert stopped, f"the server ran on after SIGTERM:\n{lab.log_tail(30)}"
    assert "Kernel does not exist" not in log, log[-3000:]
    assert "Shutting down 1 kernel" in log, log[-3000:]
    with sqlite3.connect(lab.ledger) as db:
        leases = db.execute("SELECT kernel_id, state, reason FROM leases").fetchall()
    assert leases == [(running["id"], "released", "server_stopped")], leases  # the refused start took nothing


def _wait_for_line(lab: LabServer, pattern: str, timeout: float = 60) -> str:
    """The first line of the server's log that matches ``pattern`` (it is written when its move is done)."""
    import re
    import time

    deadline = time.monotonic() + timeout
    while True:
        for line in lab.log_path.read_text(errors="replace").splitlines():
            if re.search(pattern, line):
                return line
        if time.monotonic() > deadline:
            raise AssertionError(f"no line matching {pattern!r} in the server's log:\n{lab.log_tail(40)}")
        time.sleep(0.2)


def test_the_pools_lines_are_in_the_servers_log_with_time_level_and_name(tmp_path):
    """What docs/hibernation.md promises the admin reads in the server's log (a hibernation, a resume, the
    hibernator's own account of each) is there, formatted as jupyter_server's own lines: time, level and the
    extension's logger name; INFO lines are not dropped, warnings are not printed bare."""
    lab = LabServer(tmp_path, pool={}, extension={})
    lab.start()
    try:
        status, kernel = lab.api("POST", "api/kernels", {"name": "gpu-pool-gpu-10g"})
        assert status == 201, kernel
        kid = kernel["id"]
        api = f"gpu-pool/api/v1/kernels/{kid}"
        status, done = lab.api("POST", f"{api}/release")
        assert status in (200, 202), done
        stamp = r"^\[(?P<level>[DIWEC]) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (?P<name>jupyter_gpu_pool[\w.]*)\] "
        hibernated = _wait_for_line(lab, stamp + r"GPU pool hibernated ")
        status, done = lab.api("POST", f"{api}/resume")
        assert status in (200, 202), done
        resumed = _wait_for_line(lab, stamp + r"GPU pool resumed ")
        moved = _wait_for_line(lab, stamp + rf"kernel {kid} resumed ")  # the hibernator's own line
    finally:
        lab.stop()
    assert hibernated.startswith("[W ") and "jupyter_gpu_pool.server_extension.recorder]" in hibernated, hibernated
    assert resumed.startswith("[I ") and "jupyter_gpu_pool.server_extension.recorder]" in resumed, resumed
    assert moved.startswith("[I ") and "jupyter_gpu_pool.hibernation.hibernator]" in moved, moved
    bare = [line for line in lab.log_path.read_text(errors="replace").splitlines() if line.startswith("GPU pool ")]
    assert bare == [], bare  # nothing through Python's last-resort handler
