"""CurveZMQ transport encryption for local gpu-pool kernels (``c.KernelEncryption.local_kernels``).

jupyter_client (8.9 and newer) encrypts a kernel's ZMQ traffic when its kernel manager provisions
CurveZMQ keys: the ``LocalProvisioner`` makes a key pair, writes it into the kernel's connection file
beside the HMAC key, and every channel of the manager's clients then speaks CurveZMQ to the kernel
(ipykernel 7.3 and newer serve their sockets as CurveZMQ servers; an older kernel, which ignores the
keys, cannot be reached).  This setting turns that on for the kernels of the ``gpu-pool`` provisioner
whatever their kernelspec declares, by asking for ``transport_encryption='required'`` at launch.

Kubernetes kernels are encrypted by the operator instead (``GPUPoolOperator.transport_encryption``,
on by default: the keys travel in the kernel's Secret).
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool
from traitlets.config import Config, Configurable

from ..config import read_config


class KernelEncryption(Configurable):
    """Encryption of local kernels' traffic (``c.KernelEncryption.*``)."""

    local_kernels = Bool(False, help="""Encrypt the ZMQ traffic between this server and its local gpu-pool
        kernels with CurveZMQ (a key pair per kernel, in its connection file, kept across restarts).  Needs
        ipykernel 7.3 or newer in the kernels' environment.  Off by default: a local kernel listens on this
        machine's loopback, where its HMAC key already stops others from talking to it; turn it on where other
        users of the machine must not read a kernel's traffic either.""").tag(config=True)


def encryption_settings(parent_config: Config | None = None) -> KernelEncryption:
    """The setting from the pool's config file, overridden by the server's own config."""
    config, _ = read_config()
    if parent_config is not None and "KernelEncryption" in parent_config:
        config.merge(Config({"KernelEncryption": parent_config.KernelEncryption}))
    return KernelEncryption(config=config)


def local_launch_kwargs(provisioner: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``pre_launch`` keyword arguments for a local gpu-pool kernel: with ``transport_encryption``
    'required' when ``KernelEncryption.local_kernels`` is on (jupyter_client's ``LocalProvisioner``
    then provisions the keys).  Idempotent; an explicit ``transport_encryption`` is kept."""
    parent = provisioner.parent
    if "transport_encryption" in kwargs or not encryption_settings(parent.config if parent else None).local_kernels:
        return kwargs
    return {**kwargs, "transport_encryption": "required"}
