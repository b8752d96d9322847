"""The pool's NVIDIA MPS control daemon, for profiles with isolation ``mps``.

MPS caps a client's device memory (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and SM
share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) in hardware.  The pool runs its
own daemons, one per GPU (``devices``: the GPU's uuid), each with its own pipe
and log directories, so it never disturbs another MPS setup on the machine.  An
MPS server serves one Unix user at a time: one daemon per GPU lets different
users' MPS kernels share the machine on different GPUs, and the pool places an
MPS slice only on a GPU whose MPS kernels are its owner's.

Every call here runs a short subprocess: async callers use a thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass

CONTROL = "nvidia-cuda-mps-control"


class MPSUnavailable(RuntimeError):
    """MPS was asked for and cannot be had; the message says why and what to do."""


@dataclass
class MPSDaemon:
    pipe_directory: str
    log_directory: str
    devices: str = ""  # the GPU(s) this daemon serves (CUDA_VISIBLE_DEVICES); empty: every GPU
    control: str = CONTROL

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_directory, "CUDA_MPS_LOG_DIRECTORY": self.log_directory}

    def _daemon_env(self) -> dict[str, str]:
        env = {**os.environ, **self.env()}
        if self.devices:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        return env

    def binary(self) -> str:
        path = shutil.which(self.control)
        if not path:
            raise MPSUnavailable(
                f"NVIDIA MPS is not available here: {self.control} is not on PATH. Install the NVIDIA "
                "driver utilities on this machine, or give the profile isolation 'soft' instead of 'mps'."
            )
        return path

    def _ask(self, command: str, timeout: float = 5.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.binary()], input=command + "\n", env={**os.environ, **self.env()},
            capture_output=True, text=True, timeout=timeout,
        )

    def running(self) -> bool:
        """Whether a control daemon answers on our pipe directory."""
        if not os.path.exists(os.path.join(self.pipe_directory, "control")):
            return False
        try:
            return self._ask("get_server_list").returncode == 0
        except (subprocess.TimeoutExpired, MPSUnavailable):
            return False

    def start(self, timeout: float = 10.0) -> bool:
        """Start the daemon unless it runs already; return True when this call started it."""
        if self.running():
            return False
        binary = self.binary()
        os.makedirs(self.pipe_directory, exist_ok=True)
        os.makedirs(self.log_directory, exist_ok=True)
        result = subprocess.run([binary, "-d"], env=self._daemon_env(),
                                capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise MPSUnavailable(
                f"the MPS control daemon did not start ({binary} -d exited {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()}); see {self.log_directory}/control.log"
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.running():
                return True
            time.sleep(0.1)
        raise MPSUnavailable(
            f"the MPS control daemon started but does not answer on {self.pipe_directory}; "
            f"see {self.log_directory}/control.log"
        )

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the daemon to quit; return True when one was running."""
        if not self.running():
            return False
        self._ask("quit", timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            time.sleep(0.1)
        return True
