"""Kubernetes API clients for the operator, the agent and the provisioner (``kubernetes_asyncio``).

In a pod, the service account's token; elsewhere, a kubeconfig (``KUBECONFIG``
or ``~/.kube/config``, or the file named in the settings).  Response bodies are
kept out of logs: ``kubernetes_asyncio`` logs every response body at DEBUG,
and the body of a Secret is a connection key.
"""

from __future__ import annotations

import base64
import logging
import os
import urllib.request
from urllib.parse import unquote, urlsplit

import aiohttp
from kubernetes_asyncio import client, config

_SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class _NoBodies(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("response body")


def keep_bodies_out_of_logs() -> None:
    rest = logging.getLogger("kubernetes_asyncio.client.rest")
    if not any(isinstance(f, _NoBodies) for f in rest.filters):
        rest.addFilter(_NoBodies())


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(_SA_TOKEN)


async def api_client(kubeconfig: str = "", context: str = "") -> client.ApiClient:
    """An ApiClient: the kubeconfig if one is named or ``KUBECONFIG`` is set, else in-cluster, else ~/.kube."""
    keep_bodies_out_of_logs()
    cfg = client.Configuration()
    if kubeconfig or os.environ.get("KUBECONFIG") or not in_cluster():
        await config.load_kube_config(config_file=kubeconfig or None, context=context or None,
                                      client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    _read_the_environment_once(api)
    return api


def _read_the_environment_once(api: client.ApiClient) -> None:
    """kubernetes_asyncio's HTTP session trusts the environment, so aiohttp reads its proxy settings and
    ~/.netrc again, each in a thread, for every request: a third of the operator's time in a burst of
    starts.  The environment does not change while a process runs: its proxy for the API server (where the
    kubeconfig names none) is read here once, and the requests then go without looking.  (The API server's
    credentials come from the kubeconfig or the service account, never from a netrc.)"""
    rest = api.rest_client
    if not rest.proxy:
        url = urlsplit(api.configuration.host)
        proxy = urllib.request.getproxies().get(url.scheme)
        if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
            parts = urlsplit(proxy)
            rest.proxy = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()
            if parts.username:
                token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode())
                rest.proxy_headers = {**(rest.proxy_headers or {}), "Proxy-Authorization": f"Basic {token.decode()}"}
    trusting = rest.pool_manager
    connector = trusting.connector
    trusting.detach()  # its connector (and TLS settings) go on in the new session
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)


def namespace_of_this_pod(default: str = "default") -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or default
    except OSError:
        return default
