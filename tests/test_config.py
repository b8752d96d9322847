"""The admin's configuration: one file read alike everywhere, bad values named plainly."""

import json

import pytest
from traitlets.config import Config

from jupyter_gpu_pool.config import ConfigError, check_profiles_fit, load_settings
from jupyter_gpu_pool.local.pool import build_inventory
from jupyter_gpu_pool.devices.nvml import Discovery
from jupyter_gpu_pool.pool import GPU


def test_settings_come_from_the_pool_config_file(pool_home):
    settings = load_settings()
    assert list(settings.profiles) == ["small", "half", "whole"]
    assert settings.default_profile == "small"
    assert [g.uuid for g in settings.declared] == ["DECLARED-local-0", "DECLARED-local-1"]
    assert settings.config_files == (str(pool_home.config_file),)


def test_a_json_config_works_too(pool_home):
    pool_home.config_file.unlink()
    (pool_home.config_dir / "jupyter_gpu_pool_config.json").write_text(
        json.dumps({"GPUPool": {"profiles": {"tiny": {"slice": "1GiB"}}, "placement": "spread"}}))
    settings = load_settings()
    assert list(settings.profiles) == ["tiny"] and settings.placement == "spread"


def test_the_servers_own_config_wins_over_the_pool_file(pool_home):
    parent = Config({"GPUPool": {"placement": "spread", "default_profile": "half"}})
    settings = load_settings(parent)
    assert settings.placement == "spread" and settings.default_profile == "half"


@pytest.mark.parametrize(
    "setting, value, words",
    [
        ("profiles", {"small": {"slice": "10 parsecs"}}, "GPUPool.profiles: profile 'small'.slice"),
        ("profiles", {}, "GPUPool.profiles: at least one profile"),
        ("default_profile", "huge", "GPUPool.default_profile: 'huge' is not a profile"),
        ("inventory", [{"name": "X"}], "GPUPool.inventory: inventory[0] needs 'memory'"),
        ("user_quotas", {"alice": {"memory": "a lot"}}, "user quota 'alice'.memory"),
        ("group_members", {"students": "alice"}, "must be a list of user names"),
        ("placement", "random", "GPUPool"),
        ("start_queue_timeout", -1.0, "GPUPool.start_queue_timeout must be a number of seconds, 0 or more"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_setting_and_value(pool_home, setting, value, words):
    pool_home.configure(**{setting: value})
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert words in str(err.value)


def test_a_config_file_with_a_syntax_error_names_the_file(pool_home):
    pool_home.config_file.write_text("c.GPUPool.profiles = {\n")
    with pytest.raises(ConfigError, match="cannot read .*jupyter_gpu_pool_config.py"):
        load_settings()


def test_a_profile_bigger_than_every_gpu_is_refused(pool_home):
    pool_home.configure(profiles={"huge": {"slice": "60GiB"}})
    settings = load_settings()
    with pytest.raises(ConfigError, match=r"profiles\['huge'\]: slice 60 GiB is larger than the largest GPU"):
        check_profiles_fit(settings, settings.declared)


def test_detected_gpus_win_in_auto_mode_and_declared_ones_fill_in(pool_home):
    pool_home.configure(gpu_discovery="auto")
    settings = load_settings()
    real = GPU(uuid="GPU-abc", name="NVIDIA H100", memory=80 * 2**30, source="detected")
    found = build_inventory(settings, Discovery(gpus=[real], driver_version="580"))
    assert found.gpus == [real] and not found.declared
    none = build_inventory(settings, Discovery(error="NVML Shared Library Not Found"))
    assert none.declared and "2 declared GPU(s)" in none.note and "NVML Shared Library Not Found" in none.note


def test_nvml_mode_with_no_gpu_says_the_pool_is_empty(pool_home):
    pool_home.configure(gpu_discovery="nvml")
    inv = build_inventory(load_settings(), Discovery(error="NVML unavailable"))
    assert inv.gpus == [] and "the pool is empty" in inv.note
