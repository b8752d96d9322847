"""The admin's configuration: one file read alike everywhere, bad values named plainly."""

import json

import pytest
from traitlets.config import Config

from jupyter_gpu_pool.config import ConfigError, check_profiles_fit, load_settings
from jupyter_gpu_pool.local.pool import build_inventory
from jupyter_gpu_pool.devices.nvml import Discovery
from jupyter_gpu_pool.pool import GPU


LAB = {"name": "ML 101 lab", "groups": ["ml101"], "days": ["tue", "thu"], "start": "10:00", "end": "12:00",
       "timezone": "Europe/Paris", "memory": "60GiB"}


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
        ("reservations", [{**LAB, "timezone": "Europe/Atlantis"}],
         "GPUPool.reservations[0] ('ML 101 lab').timezone: 'Europe/Atlantis' is not a time zone"),
        ("reservations", [{**LAB, "end": "09:00"}],
         "GPUPool.reservations[0] ('ML 101 lab').end: the window ends at 09:00, before it starts at 10:00"),
        ("reservations", [LAB, {**LAB, "groups": "research"}],
         "GPUPool.reservations[1] ('ML 101 lab').name: 'ML 101 lab' is used by reservation 0 too"),
        ("queue_order", "random", "GPUPool"),
        ("fair_share_weights", {"ml101": 0}, "GPUPool.fair_share_weights['ml101'] must be a weight above 0"),
        ("fair_share_others_weight", "heavy", "GPUPool.fair_share_others_weight: must be a weight above 0"),
        ("fair_share_half_life", 0, "GPUPool.fair_share_half_life must be a number of seconds above 0"),
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


def test_reservations_and_fair_share_are_read_into_the_pools_sharing(pool_home):
    pool_home.configure(reservations=[LAB], queue_order="fair", fair_share_weights={"ml101": 2, "research": 1},
                        fair_share_half_life="12h", fair_share_aging="10m")
    sharing = load_settings().sharing
    assert [r.name for r in sharing.reservations] == ["ML 101 lab"] and sharing.order == "fair"
    assert (dict(sharing.fair.weights), sharing.fair.half_life, sharing.fair.aging) == (
        {"ml101": 2.0, "research": 1.0}, 43200.0, 600.0)
    assert load_settings().raw_config["reservations"] == [LAB]  # as written, for the pool service's clients


def test_without_sharing_settings_the_queue_is_first_come_first_served(pool_home):
    assert load_settings().sharing.plain


def test_reservations_that_cannot_fit_the_pool_together_are_refused_at_start(pool_home):
    # the pool: two declared 40 GiB GPUs; the class keeps 60 GiB, a research block 40 GiB overlapping it
    research = {**LAB, "name": "Research block", "groups": ["research"], "days": ["tue"], "start": "11:00",
                "end": "13:00", "memory": "40GiB"}
    pool_home.configure(reservations=[LAB, research])
    settings = load_settings()
    with pytest.raises(ConfigError) as err:
        check_profiles_fit(settings, settings.declared)
    assert "GPUPool.reservations[1] ('Research block'): it overlaps 'ML 101 lab'" in str(err.value)
    pool_home.configure(reservations=[LAB, {**research, "start": "12:30"}])
    settings = load_settings()
    check_profiles_fit(settings, settings.declared)  # no overlap: both fit
