"""Kubernetes API clients for the operator, the agent and the provisioner (``kubernetes_asyncio``).

In a pod, the service account's token; elsewhere, a kubeconfig (``KUBECONFIG``
or ``~/.kube/config``, or the file named in the settings).  Response bodies are
kept out of logs: ``kubernetes_asyncio`` logs every response body at DEBUG,
and the body of a Secret is a connection key.
"""

from __future__ import annotations

import logging
import os

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
    return client.ApiClient(configuration=cfg)


def namespace_of_this_pod(default: str = "default") -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or default
    except OSError:
        return default
