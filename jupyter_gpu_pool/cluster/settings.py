"""A Jupyter server's settings for the cluster (``c.GPUPoolKubernetes.*``): where its kernels go,
who it is, how often it renews heartbeats.  Read by the provisioner and the server extension alike."""

from __future__ import annotations

import os
import socket

from traitlets import TraitError, Unicode, default
from traitlets.config import Config, Configurable

from ..config import ConfigError, read_config
from ..traits import Seconds


class GPUPoolKubernetes(Configurable):
    """Where a server's kernels go in the cluster (``c.GPUPoolKubernetes.*``)."""

    namespace = Unicode("", help="""Namespace of this server's kernels.  Empty: the namespace of this
        server's pod, else the kubeconfig context's, else 'default'.""").tag(config=True)

    kubeconfig = Unicode("", help="""A kubeconfig file.  Empty: in a pod, its service account; elsewhere
        KUBECONFIG or ~/.kube/config.""").tag(config=True)

    server_id = Unicode(help="""This server's identity: its kernels carry it, a restarted server with the same
        id re-adopts them, and each kernel's NetworkPolicy admits only the pod labelled
        jupyter-gpu-pool.readthedocs.io/server=<id>.  Default: JUPYTER_GPU_POOL_SERVER_ID, else the
        JupyterHub user and server name, else the host name.""").tag(config=True)

    @default("server_id")
    def _default_server_id(self) -> str:
        env = os.environ
        if env.get("JUPYTER_GPU_POOL_SERVER_ID"):
            return env["JUPYTER_GPU_POOL_SERVER_ID"]
        if env.get("JUPYTERHUB_USER"):
            return "--".join(p for p in (env["JUPYTERHUB_USER"], env.get("JUPYTERHUB_SERVER_NAME", "")) if p)
        return socket.gethostname()

    server_pod = Unicode(help="This server's pod (JUPYTER_GPU_POOL_SERVER_POD, from the downward API).").tag(
        config=True)

    @default("server_pod")
    def _default_server_pod(self) -> str:
        return os.environ.get("JUPYTER_GPU_POOL_SERVER_POD", "")

    server_pod_uid = Unicode(help="""This server's pod uid (JUPYTER_GPU_POOL_SERVER_POD_UID, from the downward
        API's metadata.uid).  When set and the kernels run in the server's own namespace, they are owned by the
        pod and deleted with it (an owner must be in its dependents' namespace).""").tag(config=True)

    @default("server_pod_uid")
    def _default_server_pod_uid(self) -> str:
        return os.environ.get("JUPYTER_GPU_POOL_SERVER_POD_UID", "")

    server_namespace = Unicode(help="""The namespace of this server's pod, which each kernel's NetworkPolicy
        admits (default: the pod's service-account namespace, else the kernels' namespace).""").tag(config=True)

    @default("server_namespace")
    def _default_server_namespace(self) -> str:
        from .client import namespace_of_this_pod

        return namespace_of_this_pod("")

    image = Unicode("", help="The kernel image to ask for (empty: the operator's kernel_image).").tag(config=True)

    heartbeat_interval = Seconds(30.0, help="""Seconds between heartbeats on this server's kernels; keep it well
        under the operator's heartbeat_timeout.""").tag(config=True)

    refresh_interval = Seconds(10.0, help="""Seconds between two reads of the cluster's quotas, policy and GPU nodes
        by the server extension (its kernels are watched, not re-read).""").tag(config=True)

    launch_timeout = Seconds(300.0, help="""Seconds a kernel launch may take (an image pull on a fresh node can take
        minutes).  Launches the cluster can never satisfy fail long before, with the reason.""").tag(config=True)

    progress_interval = Seconds(15.0, help="""While a launch waits, seconds between two lines in the server's log
        saying what the kernel's pod is doing (pulling its image, being created, on a node that is not
        ready).  The same words are in the GPUKernel's status.message.""").tag(config=True)


def kubernetes_settings(parent_config: Config | None = None) -> GPUPoolKubernetes:
    """The settings from the pool's config file, overridden by the server's own config; a bad value is a
    :class:`ConfigError` naming the setting (an interval of 0 would make the server's loops spin)."""
    config, _ = read_config()
    if parent_config is not None and "GPUPoolKubernetes" in parent_config:
        config.merge(Config({"GPUPoolKubernetes": parent_config.GPUPoolKubernetes}))
    try:
        return GPUPoolKubernetes(config=config)
    except TraitError as e:  # Seconds' messages name the setting; traitlets' own name only the trait
        raise ConfigError(str(e) if str(e).startswith("GPUPoolKubernetes") else f"GPUPoolKubernetes: {e}") from None
