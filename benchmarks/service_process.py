"""The pool service as the benchmarks run it: ``jupyter gpu-pool serve`` in its own process, on a
configuration of their own (its settings from that directory only, as from /etc/jupyter)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def serve(config: dict) -> tuple[subprocess.Popen, str]:
    """Start the service on ``config`` (``c.GPUPool``/``c.PoolService`` as JSON, the socket chosen here);
    the process and its socket, once it listens."""
    root = tempfile.mkdtemp(prefix="gpu-pool-bench-service-")
    sock = os.path.join(root, "run", "pool.sock")
    with open(os.path.join(root, "jupyter_gpu_pool_config.json"), "w") as f:
        json.dump({**config, "PoolService": {**config.get("PoolService", {}), "socket": sock}}, f)
    service = subprocess.Popen([sys.executable, "-m", "jupyter_gpu_pool.cli", "serve", f"--config-dir={root}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if service.poll() is not None:
            sys.exit(f"the service exited: {service.stderr.read().decode()[-2000:]}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            return service, sock
        except OSError:
            time.sleep(0.1)
    service.kill()
    sys.exit("the service did not listen within 60 s")
