"""The admin's hibernation settings in c.GPUPool: defaults, and bad values named with what to write."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from jupyter_gpu_pool.config import ConfigError, load_settings

GiB = 2**30


def settings(**pool):
    return load_settings(Config({"GPUPool": pool}), paths=[])


def test_defaults_cap_hibernation_at_half_the_ram_and_evict_the_oldest():
    h = settings().hibernation
    assert (h.host_memory, h.over_cap, h.eviction_warning, h.lock_timeout, h.release_cache) == (
        "50%", "evict_oldest", 300.0, 10.0, True)
    assert h.cap_bytes(64 * GiB) == 32 * GiB


def test_admin_values_arrive_validated():
    h = settings(hibernation_host_memory="96GiB", hibernation_over_cap="keep_running",
                 hibernation_eviction_warning=60, hibernation_lock_timeout=2.5,
                 hibernation_release_cache=False).hibernation
    assert (h.cap_bytes(1), h.over_cap, h.eviction_warning, h.lock_timeout, h.release_cache) == (
        96 * GiB, "keep_running", 60.0, 2.5, False)


@pytest.mark.parametrize("pool,words", [
    ({"hibernation_host_memory": "96"}, "GPUPool.hibernation_host_memory: '96' has no unit"),
    ({"hibernation_host_memory": "150%"}, "GPUPool.hibernation_host_memory: '150%': a share of the machine's RAM"),
    ({"hibernation_lock_timeout": 0}, "GPUPool.hibernation_lock_timeout must be a number of seconds above 0"),
    ({"hibernation_eviction_warning": -5}, "GPUPool.hibernation_eviction_warning must be a number of seconds"),
    ({"hibernation_over_cap": "evict"}, "hibernation_over_cap"),
])
def test_a_bad_setting_stops_with_its_name_and_value(pool, words):
    with pytest.raises(ConfigError) as err:
        settings(**pool)
    assert words in str(err.value)
