"""Which pool a process uses: the pool service's, where one is configured (a shared machine), else
a :class:`~jupyter_gpu_pool.local.pool.LocalPool` of its own (the embedded default).

It sits above ``local/`` and ``service/`` (the service's client is built on the local pool's
interface), so that neither imports the other's way round.
"""

from __future__ import annotations

import json
import os
import threading

from traitlets.config import Config

from .config import GPUPool, config_files, load_settings
from .local.pool import LocalPool, Pool


def open_pool(settings: GPUPool) -> Pool:
    """A new pool for ``settings``: through the pool service where ``GPUPool.service_socket`` is set."""
    if settings.service_socket:
        from .service.client import ServiceClient, ServicePool

        return ServicePool(ServiceClient(settings.service_socket))
    return LocalPool(settings)


_cache: dict[str, Pool] = {}
_cache_lock = threading.Lock()


def _cache_key(parent_config: Config | None) -> str:
    files = [(str(p), p.stat().st_mtime) for p in config_files()]
    section = parent_config.get("GPUPool", {}) if parent_config is not None else {}
    env = {k: os.environ.get(k) for k in ("JUPYTER_CONFIG_DIR", "JUPYTER_CONFIG_PATH", "JUPYTERHUB_USER",
                                          "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_GPU_POOL_SOCKET")}
    return json.dumps([files, repr(section), env], sort_keys=True, default=str)


def pool_for(parent_config: Config | None = None) -> Pool:
    """The pool for this process's configuration, built once (NVML discovery is not free) and
    rebuilt when a config file changes."""
    key = _cache_key(parent_config)
    with _cache_lock:
        pool = _cache.get(key)
        if pool is None:
            pool = open_pool(load_settings(parent_config))
            _cache.clear()
            _cache[key] = pool
        return pool


def forget_pools(close: bool = False) -> None:
    """Forget the pools built so far (the next ``pool_for`` builds afresh); ``close`` closes their
    ledgers too.  For a process whose configuration changes under it, such as a test's."""
    with _cache_lock:
        if close:
            for pool in _cache.values():
                pool.ledger.close()
        _cache.clear()
