"""The pool's MPS daemon where MPS cannot be had (this machine has no NVIDIA driver utilities)."""

import shutil

import pytest

from jupyter_gpu_pool.devices.mps import MPSDaemon, MPSUnavailable


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


@pytest.mark.gpu
def test_the_pools_mps_daemon_starts_answers_and_stops(tmp_path):
    daemon = MPSDaemon(str(tmp_path / "pipe"), str(tmp_path / "log"))
    try:
        assert daemon.start() is True
        assert daemon.running() and daemon.start() is False  # already running: not started twice
    finally:
        assert daemon.stop() is True
    assert not daemon.running()
