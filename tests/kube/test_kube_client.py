"""The Kubernetes API client every part uses (cluster/client.py): the environment's proxy settings for the
API server are read once, when the client is made, not again in a thread on every request (aiohttp's
``trust_env``, which kubernetes_asyncio turns on, cost the operator a third of its time in a burst)."""

from __future__ import annotations

import base64
import json

from jupyter_gpu_pool.cluster.client import api_client


async def _client(tmp_path, server: str):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}], "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return await api_client(str(path))


async def test_the_environments_proxy_for_the_api_server_is_read_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://ann%40corp:s3cret@proxy.example:3128")
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", "internal.example")
    api = await _client(tmp_path, "https://api.example:6443")
    try:
        assert api.rest_client.proxy == "http://proxy.example:3128"
        auth = api.rest_client.proxy_headers["Proxy-Authorization"]
        assert base64.b64decode(auth.removeprefix("Basic ")).decode() == "ann@corp:s3cret"
        assert api.rest_client.pool_manager.trust_env is False  # no lookup of the environment per request
    finally:
        await api.close()
    bypassed = await _client(tmp_path, "https://api.internal.example:6443")  # NO_PROXY names it
    try:
        assert bypassed.rest_client.proxy is None and bypassed.rest_client.pool_manager.trust_env is False
    finally:
        await bypassed.close()


async def test_a_client_made_this_way_talks_to_the_api_server(cluster):
    api = await cluster.api()
    try:
        from kubernetes_asyncio import client

        namespaces = await client.CoreV1Api(api).list_namespace()
        assert cluster.namespace in {n.metadata.name for n in namespaces.items}
    finally:
        await api.close()
