"""The pool's MPS daemons: where MPS cannot be had, and their pipe folders, short and private wherever
Jupyter's runtime directory is.

A real control daemon binds Unix sockets in its pipe folder, and a socket's path holds at most 107
bytes: on an H100 the pool's daemons failed to start (exit 1, nothing on stderr) where the pipe folder
sat under a deep runtime directory.  The deep-directory tests here run the stand-in control binary of
``tests/mps_standin`` (put first on PATH), which binds its sockets as the real one does, so it fails
on a long path the same way; the ``gpu`` test runs the real one.
"""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from jupyter_gpu_pool.config import MPS_PIPE_DIRECTORY_MAX, ConfigError, load_settings
from jupyter_gpu_pool.devices import mps
from jupyter_gpu_pool.devices.mps import MPSDaemon, MPSUnavailable
from jupyter_gpu_pool.devices.nvml import Discovery
from jupyter_gpu_pool.local.pool import Inventory, LocalPool
from jupyter_gpu_pool.pool import DETECTED, GPU

STANDIN = Path(__file__).parent / "mps_standin"
GiB = 2**30
UUID = "GPU-f31cdc59-3e01-96ca-3247-d80b2f6fa2e4"
LONGEST_SOCKET = "/control_privileged"


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is not None, reason="MPS is installed here")
def test_asking_for_mps_where_there_is_none_says_why_and_what_to_do(tmp_path):
    daemon = MPSDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"))
    assert daemon.running() is False
    with pytest.raises(MPSUnavailable) as err:
        daemon.start()
    assert "nvidia-cuda-mps-control is not on PATH" in str(err.value)
    assert "isolation 'soft'" in str(err.value)
    assert daemon.stop() is False


def test_the_daemon_env_points_at_the_pools_own_directories(tmp_path):
    daemon = MPSDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"))
    assert daemon.env() == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
                            "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}


# -- deep directories, with the stand-in control binary ------------------------------------------------


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("nvidia-cuda-mps-control") == str(STANDIN / "nvidia-cuda-mps-control")


@pytest.fixture
def deep(pool_home, tmp_path, monkeypatch) -> Path:
    """A Jupyter runtime directory far past what a socket path holds (as pytest's basetemp or a long home);
    after ``pool_home``, whose Jupyter directories it replaces."""
    path = tmp_path / ("runtime-" + "r" * 60) / ("deeper-" + "d" * 60)
    path.mkdir(parents=True)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(path))
    return path


@pytest.fixture
def pipes():
    """Pipe folders a test's daemons used, removed at the end (the pool leaves them for its next start)."""
    used: list[str] = []
    yield used
    for path in used:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def detected_pool(pool_home, pipes=None, **settings) -> LocalPool:
    pool_home.configure(**settings)
    gpu = GPU(uuid=UUID, name="Stand-in H100", memory=80 * GiB, index=0, sm_count=132, source=DETECTED)
    pool = LocalPool(load_settings(), Inventory([gpu], Discovery([gpu]), "a stand-in GPU"))
    if pipes is not None:
        pipes.append(pool.mps_daemon(UUID).pipe_directory)
    return pool


def test_the_standin_daemon_fails_on_a_long_pipe_folder_as_the_real_one_did_and_the_refusal_quotes_its_log(
        standin, deep):
    pipe = deep / "gpu_pool" / "mps-pipe" / UUID  # where the pool put its pipes before: 200+ bytes
    daemon = MPSDaemon(str(pipe), str(deep / "mps-log"))
    with pytest.raises(MPSUnavailable) as err:
        daemon.start()
    message = str(err.value)
    assert "-d exited 1, saying nothing" in message  # an empty stderr, as on the H100
    assert f"the last lines of {deep / 'mps-log' / 'control.log'}:" in message
    assert "Failed to create a socket at" in message and "AF_UNIX path too long" in message
    assert not daemon.running()


def test_the_pools_mps_daemon_starts_from_a_deep_runtime_directory_in_a_short_private_folder(
        standin, deep, pool_home, pipes):
    pool = detected_pool(pool_home, pipes)
    lease = pool.allocate(pool.request("k-mps", pool.settings.profile("half")))
    daemon = pool.mps_daemon(UUID)
    try:
        env = pool.mps_env(lease)  # starts the GPU's daemon (the GPU is not declared)
        assert daemon.running()
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        assert pipe == daemon.pipe_directory and len((pipe + LONGEST_SOCKET).encode()) <= mps.SOCKET_PATH_MAX
        assert os.path.dirname(pipe) == mps.own_directory()
        for folder in (pipe, os.path.dirname(pipe)):  # private: the user's, 0700, no link
            st = os.lstat(folder)
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
        assert stat.S_ISSOCK(os.lstat(os.path.join(pipe, "control")).st_mode)
        assert env["CUDA_MPS_LOG_DIRECTORY"].startswith(str(deep))  # logs stay with the pool's runtime files
        assert pool.mps_env(lease) == env and daemon.running()  # the same daemon, not a second one
    finally:
        assert pool.stop_mps() == [UUID]
    assert not daemon.running()


def test_two_pools_of_one_user_get_a_daemon_each(standin, deep, pool_home, tmp_path, monkeypatch):
    first = detected_pool(pool_home).mps_daemon(UUID)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "other-runtime"))
    second = detected_pool(pool_home).mps_daemon(UUID)
    assert first.pipe_directory != second.pipe_directory and first.log_directory != second.log_directory
    assert os.path.dirname(first.pipe_directory) == os.path.dirname(second.pipe_directory)


def test_a_pipe_folder_that_is_a_link_or_open_to_others_is_refused(standin, deep, pool_home, tmp_path, pipes):
    daemon = detected_pool(pool_home, pipes).mps_daemon(UUID)
    os.makedirs(os.path.dirname(daemon.pipe_directory), mode=0o700, exist_ok=True)
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir()
    os.symlink(elsewhere, daemon.pipe_directory)
    try:
        with pytest.raises(MPSUnavailable, match="is a link, so the pool will not use it: remove it"):
            daemon.start()
        assert list(elsewhere.iterdir()) == []  # nothing was made there
    finally:
        os.unlink(daemon.pipe_directory)
    os.mkdir(daemon.pipe_directory, 0o700)
    os.chmod(daemon.pipe_directory, 0o777)
    try:
        with pytest.raises(MPSUnavailable, match=r"open to other users \(mode 0777\)"):
            daemon.start()
    finally:
        os.rmdir(daemon.pipe_directory)


def test_a_configured_pipe_folder_is_used_with_a_short_name_per_gpu(standin, deep, pool_home, pipes):
    root = tempfile.mkdtemp(prefix="mps-", dir="/tmp")  # short: pytest's own tmp_path may be too long already
    pipes.append(root)
    pool = detected_pool(pool_home, mps_pipe_directory=root)
    daemon = pool.mps_daemon(UUID)
    assert os.path.dirname(daemon.pipe_directory) == root and not daemon.private
    try:
        assert daemon.start() is True and daemon.running()
    finally:
        assert daemon.stop() is True


def test_a_configured_pipe_folder_too_long_for_a_socket_is_refused_at_start_naming_the_setting(pool_home, tmp_path):
    at_most = "/" + "p" * (MPS_PIPE_DIRECTORY_MAX - 1)
    pool_home.configure(mps_pipe_directory=at_most)
    daemon = MPSDaemon.of_gpu(UUID, "/var/log/x", load_settings().mps_pipe_directory)
    assert len((daemon.pipe_directory + LONGEST_SOCKET).encode()) <= mps.SOCKET_PATH_MAX  # the limit fits
    pool_home.configure(mps_pipe_directory=at_most + "p")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith("GPUPool.mps_pipe_directory:")
    assert f"may be at most {MPS_PIPE_DIRECTORY_MAX}" in str(err.value) and "107 bytes" in str(err.value)
    pool_home.configure(mps_pipe_directory="relative/mps")
    with pytest.raises(ConfigError, match="not an absolute path"):
        load_settings()


def test_the_standin_client_says_when_no_daemon_answers(standin, tmp_path):
    done = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", capture_output=True, text=True,
                          env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}, timeout=30)
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr


@pytest.mark.gpu
def test_the_pools_mps_daemon_starts_answers_and_stops(pool_home, pipes):
    """The real control binary, through the pool of the machine's GPUs, from pytest's own runtime directory."""
    pool_home.configure(gpu_discovery="nvml", inventory=[])
    pool = pool_home.pool()
    daemon = pool.mps_daemon(pool.gpus[0].uuid)
    pipes.append(daemon.pipe_directory)
    try:
        assert daemon.start() is True
        assert daemon.running() and daemon.start() is False  # already running: not started twice
    finally:
        assert daemon.stop() is True
    assert not daemon.running()


def test_the_pool_services_default_pipe_folder_fits_the_socket_limit_however_deep_its_socket():
    from traitlets.config import Config

    from jupyter_gpu_pool.config import GPUPool
    from jupyter_gpu_pool.service.app import service_defaults

    beside = service_defaults(Config(), "/run/jupyter-gpu-pool/pool.sock")["mps_pipe_directory"]
    assert beside == "/run/jupyter-gpu-pool/mps-pipe"
    deep = service_defaults(Config(), "/tmp/" + "d" * 120 + "/pool.sock")["mps_pipe_directory"]
    assert deep == "/run/jupyter-gpu-pool/mps-pipe"
    GPUPool(mps_pipe_directory=deep)  # the setting's own check accepts the default
    assert "mps_pipe_directory" not in service_defaults(Config({"GPUPool": {"mps_pipe_directory": "/x"}}), "/s")
