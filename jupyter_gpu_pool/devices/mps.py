"""The pool's NVIDIA MPS control daemon, for profiles with isolation ``mps``.

MPS caps a client's device memory (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and SM
share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) in hardware.  The pool runs its
own daemons, one per GPU (``devices``: the GPU's uuid), each with its own pipe
and log directories, so it never disturbs another MPS setup on the machine.  An
MPS server serves one Unix user at a time: one daemon per GPU lets different
users' MPS kernels share the machine on different GPUs, and the pool places an
MPS slice only on a GPU whose MPS kernels are its owner's.

The daemon binds Unix sockets inside its pipe directory (``<pipe>/control``, ...),
and a socket's path holds at most 107 bytes: a daemon whose pipe directory is
long exits 1 at start, with nothing on stderr (seen on an H100, driver 580, with
pipe directories under a deep Jupyter runtime directory).  So each GPU's pipe
directory is a short name (:func:`pipe_name`) under a short root: the admin's
``GPUPool.mps_pipe_directory`` (checked for length where it is declared), else a
private folder of the pool's own (:func:`own_directory`).

Every call here runs a short subprocess: async callers use a thread.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass

CONTROL = "nvidia-cuda-mps-control"
SOCKET_PATH_MAX = 107  # bytes in a Unix socket's path (sun_path holds 108 with the closing NUL)
PIPE_NAME_LENGTH = 12
LOG_LINES = 8  # of control.log, in the refusal when the daemon does not start


class MPSUnavailable(RuntimeError):
    """MPS was asked for and cannot be had; the message says why and what to do."""


def pipe_name(key: str) -> str:
    """A short, stable folder name for one daemon's pipes (``key``: what tells the daemon apart)."""
    return hashlib.sha256(key.encode()).hexdigest()[:PIPE_NAME_LENGTH]


def own_directory() -> str:
    """The pool's own root for MPS pipes where the admin set none: in the user's login runtime
    directory (``/run/user/<uid>``, where it is theirs), else in ``/tmp``; short whatever
    ``$TMPDIR`` or the Jupyter runtime directory are."""
    uid = os.getuid()
    runtime = f"/run/user/{uid}"
    try:
        st = os.lstat(runtime)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
        return os.path.join(runtime, "jupyter-gpu-pool")
    return f"/tmp/jupyter-gpu-pool-{uid}"


def private_folder(path: str, create: bool = True) -> bool:
    """Make sure ``path`` is a folder of this user's that no one else may enter (mode 0700, not a
    link), creating it so where it is missing (``create``); return whether it exists.  Anything else
    there (a link, a file, another user's folder, a folder open to others: someone may have put a
    socket of theirs in it) is refused, for the admin to remove."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise MPSUnavailable(f"cannot make the MPS pipe folder {path} ({e}); set GPUPool.mps_pipe_directory "
                                 "to a short folder this user may write") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    what = ("a link" if stat.S_ISLNK(st.st_mode) else "not a folder" if not stat.S_ISDIR(st.st_mode)
            else f"another user's (uid {st.st_uid})" if st.st_uid != os.getuid()
            else f"open to other users (mode {stat.S_IMODE(st.st_mode):04o})" if st.st_mode & 0o077 else "")
    if what:
        raise MPSUnavailable(f"the pool's private MPS pipe folder {path} is {what}, so the pool will not use it: "
                             "remove it (the pool makes its own, mode 0700), or set GPUPool.mps_pipe_directory")
    return True


@dataclass
class MPSDaemon:
    pipe_directory: str
    log_directory: str
    devices: str = ""  # the GPU(s) this daemon serves (CUDA_VISIBLE_DEVICES); empty: every GPU
    control: str = CONTROL
    private: bool = False  # the pipe directory and its parent are the pool's own: made 0700, checked before use

    @classmethod
    def of_gpu(cls, gpu_uuid: str, log_directory: str, pipe_root: str = "") -> MPSDaemon:
        """One GPU's daemon: its pipes in a short folder named after its log directory (so a pool, whose
        log directory is its own, has its own daemon per GPU), under ``pipe_root`` (the admin's) or the
        pool's own private folder."""
        root = pipe_root or own_directory()
        return cls(os.path.join(root, pipe_name(log_directory)), log_directory, devices=gpu_uuid,
                   private=not pipe_root)

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

    def _ours(self, create: bool) -> bool:
        """Where the pipe directory is the pool's own: it and its parent are private (made so when
        ``create``); whether they exist."""
        return all(private_folder(p, create) for p in (os.path.dirname(self.pipe_directory), self.pipe_directory))

    def running(self) -> bool:
        """Whether a control daemon answers on our pipe directory."""
        if self.private and not self._ours(create=False):
            return False
        if not os.path.exists(os.path.join(self.pipe_directory, "control")):
            return False
        try:
            return self._ask("get_server_list").returncode == 0
        except (subprocess.TimeoutExpired, MPSUnavailable):
            return False

    def log_tail(self, lines: int = LOG_LINES) -> str:
        """The last lines of the daemon's control.log (where it says why it stopped), or why there are none."""
        path = os.path.join(self.log_directory, "control.log")
        try:
            with open(path, errors="replace") as f:
                tail = [line.rstrip() for line in f.readlines()[-lines:]]
        except OSError as e:
            return f"{path} cannot be read ({e.strerror or e})"
        text = "\n".join(f"  {line}" for line in tail if line.strip())
        return f"the last lines of {path}:\n{text}" if text else f"{path} is empty"

    def start(self, timeout: float = 10.0) -> bool:
        """Start the daemon unless it runs already; return True when this call started it."""
        if self.running():
            return False
        binary = self.binary()
        if self.private:
            self._ours(create=True)
        else:
            os.makedirs(self.pipe_directory, exist_ok=True)
        os.makedirs(self.log_directory, exist_ok=True)
        result = subprocess.run([binary, "-d"], env=self._daemon_env(),
                                capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip()
            raise MPSUnavailable(
                f"the MPS control daemon did not start ({binary} -d exited {result.returncode}"
                f"{': ' + said if said else ', saying nothing'}); {self.log_tail()}"
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.running():
                return True
            time.sleep(0.1)
        raise MPSUnavailable(
            f"the MPS control daemon started but does not answer on {self.pipe_directory}; {self.log_tail()}"
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
