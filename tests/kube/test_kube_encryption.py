"""Kernel traffic is encrypted (CurveZMQ): on by default for Kubernetes kernels, whose keys travel in the
kernel's Secret like the HMAC key, and offered for local kernels.  Shown on the wire (a relay between client
and kernel records every byte: code and output never cross it in the clear), by a client without the keys
(the kernel does not answer it), and by the kernel itself (it no longer warns about plain-text TCP)."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import pytest
import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from kernel_helpers import run_code
from kube_helpers import Kube

from jupyter_gpu_pool.cluster.resources import kernel_name, secret_name
from jupyter_gpu_pool.kernel_provisioner.encryption import KernelEncryption, local_launch_kwargs
from jupyter_gpu_pool.kernel_provisioner.local import GPUPoolProvisioner

CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
PLAIN_TCP_WARNING = "Kernel is running over TCP without encryption"


class Relay:
    """TCP relays from 127.0.0.1 to a kernel's five ports, keeping every byte that crosses them."""

    def __init__(self, host: str, ports: dict[str, int]):
        self.host, self.ports = host, ports
        self.seen = bytearray()
        self.local: dict[str, int] = {}
        self.servers: list[asyncio.AbstractServer] = []

    async def start(self) -> Relay:
        for channel, port in self.ports.items():
            server = await asyncio.start_server(lambda r, w, p=port: self._pipe(r, w, p), "127.0.0.1", 0)
            self.servers.append(server)
            self.local[channel] = server.sockets[0].getsockname()[1]
        return self

    async def _pipe(self, reader, writer, port: int) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, port)

        async def copy(src, dst):
            try:
                while data := await src.read(65536):
                    self.seen += data
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def stop(self) -> None:
        for server in self.servers:
            server.close()


async def connection_of(kube: Kube, namespace: str, km) -> dict:
    secret = await kube.core.read_namespaced_secret(secret_name(kernel_name(km.kernel_id)), namespace)
    return json.loads(base64.b64decode(secret.data["connection.json"]))


async def through_relay(km, info: dict, code: str) -> tuple[str, bytes]:
    """Run ``code`` with a client whose every channel crosses a relay; its output, and the bytes seen."""
    relay = await Relay(km.ip, {c: info[f"{c}_port"] for c in CHANNELS}).start()
    client = AsyncKernelClient()
    client.load_connection_info({**km.get_connection_info(), "ip": "127.0.0.1",
                                 **{f"{c}_port": relay.local[c] for c in CHANNELS}})
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=30)
        out = []
        reply = await client.execute_interactive(code, timeout=30, output_hook=lambda m: out.append(
            m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
        assert reply["content"]["status"] == "ok"
        return "".join(out), bytes(relay.seen)
    finally:
        client.stop_channels()
        relay.stop()


async def answers(info: dict, timeout: float = 3.0) -> bool:
    """Whether a client with this connection info gets a kernel_info reply."""
    client = AsyncKernelClient()
    client.load_connection_info(info)
    client.start_channels()
    # A send on a channel whose handshake the kernel refused has no peer to go to and would block for
    # good (beyond wait_for_ready's timeout, which cannot interrupt it): give up on it instead.
    client.shell_channel.socket.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
    try:
        await client.wait_for_ready(timeout=timeout)
        return True
    except (RuntimeError, TimeoutError, asyncio.TimeoutError, zmq.Again):
        return False
    finally:
        client.stop_channels()


async def pod_log(kube: Kube, namespace: str, km) -> str:
    return await kube.core.read_namespaced_pod_log(km.provisioner.pod, namespace)


@pytest.mark.slow
async def test_kubernetes_kernels_are_encrypted_by_default(cluster, operator, server_config, kube_sessions, managers):
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        km = managers("gpu-pool-kubernetes-small")
        await km.start_kernel()
        info = await connection_of(kube, cluster.namespace, km)
        assert len(info["curve_publickey"]) == len(info["curve_secretkey"]) == 40  # in the Secret, as the key
        assert km.curve_publickey == info["curve_publickey"].encode()  # and the server's channels use them
        marker = f"secret-{uuid.uuid4().hex}"
        out, wire = await through_relay(km, info, f"print('{marker}'[::-1][::-1])")
        assert out.strip() == marker  # the relay carried a working session...
        assert marker.encode() not in wire and b"execute_request" not in wire  # ...of which it saw nothing
        log = await pod_log(kube, cluster.namespace, km)
        assert "connection.json" in log and PLAIN_TCP_WARNING not in log  # the kernel no longer warns
        [pod] = await kube.pods()
        assert pod["status"]["phase"] == "Running"  # it rewrote its connection file: its copy, not the Secret

        plain = {k: v for k, v in km.get_connection_info().items() if not k.startswith("curve_")}
        assert not await answers(plain)  # the HMAC key alone no longer reaches the kernel
        public, secret = zmq.curve_keypair()
        assert not await answers({**plain, "curve_publickey": public, "curve_secretkey": secret})  # nor other keys
        assert await answers(km.get_connection_info())  # the kernel's own keys do
        assert "still" in await run_code(km, "print('still')")
    finally:
        await kube.close()


async def test_with_encryption_off_the_wire_carries_the_code_in_the_clear(cluster, operator_factory, server_config,
                                                                          kube_sessions, managers):
    """The control: the same relay sees everything when the admin turns encryption off."""
    await operator_factory(cluster, **{"GPUPoolOperator.transport_encryption": False})
    kube = Kube(await cluster.api(), cluster.namespace)
    try:
        km = managers("gpu-pool-kubernetes-small")
        await km.start_kernel()
        info = await connection_of(kube, cluster.namespace, km)
        assert "curve_publickey" not in info and km.curve_publickey is None
        marker = f"secret-{uuid.uuid4().hex}"
        out, wire = await through_relay(km, info, f"print('{marker}')")
        assert out.strip() == marker and marker.encode() in wire
        assert PLAIN_TCP_WARNING in await pod_log(kube, cluster.namespace, km)
    finally:
        await kube.close()


def local_kernel(managers, config=None) -> AsyncKernelManager:
    """A local kernel of the gpu-pool-small kernelspec: the real ``gpu-pool`` provisioner, as a server starts it."""
    return managers("gpu-pool-small", config=config)


async def test_local_kernels_are_encrypted_when_the_admin_turns_it_on(pool_home, managers, tmp_path):
    from traitlets.config import Config

    on = local_kernel(managers, Config({"KernelEncryption": {"local_kernels": True}}))
    stderr = open(tmp_path / "kernel.log", "w")
    try:
        await on.start_kernel(stderr=stderr)
        assert type(on.provisioner) is GPUPoolProvisioner  # the kernelspec's own provisioner, nothing test-made
        with open(on.connection_file) as f:
            written = json.load(f)
        assert len(written["curve_secretkey"]) == 40  # in the connection file, beside the HMAC key
        marker = f"secret-{uuid.uuid4().hex}"
        out, wire = await through_relay(on, {f"{c}_port": getattr(on, f"{c}_port") for c in CHANNELS},
                                        f"print('{marker}')")
        assert out.strip() == marker and marker.encode() not in wire
        plain = {k: v for k, v in on.get_connection_info().items() if not k.startswith("curve_")}
        assert not await answers(plain)  # a client with the HMAC key but not the CurveZMQ keys gets no answer
        await on.restart_kernel()  # the same keys for the next process, as with the HMAC key
        assert on.curve_secretkey == written["curve_secretkey"].encode() and await answers(on.get_connection_info())
    finally:
        await on.shutdown_kernel(now=True)
        stderr.close()
    assert PLAIN_TCP_WARNING not in (tmp_path / "kernel.log").read_text()

    off = local_kernel(managers)  # the default: local kernels as jupyter_client starts them
    stderr = open(tmp_path / "plain.log", "w")
    try:
        await off.start_kernel(stderr=stderr)
        assert type(off.provisioner) is GPUPoolProvisioner and off.curve_publickey is None
        assert await answers({k: v for k, v in off.get_connection_info().items() if not k.startswith("curve_")})
    finally:
        await off.shutdown_kernel(now=True)
        stderr.close()
    assert PLAIN_TCP_WARNING in (tmp_path / "plain.log").read_text()


def test_jupyter_client_is_required_at_a_version_with_curvezmq():
    """CurveZMQ keys in connection files and channels came with jupyter_client 8.9: the package's minimum
    must be at least that (an older one would start every encrypted kernel unreachable)."""
    import re
    import tomllib
    from pathlib import Path

    import jupyter_client
    from jupyter_client.connect import ConnectionFileMixin

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    [dep] = [d for d in pyproject["project"]["dependencies"] if re.match(r"jupyter[_-]client\b", d)]
    minimum = tuple(int(x) for x in re.search(r">=\s*([0-9.]+)", dep).group(1).split("."))
    assert minimum >= (8, 9), dep
    assert "curve_publickey" in ConnectionFileMixin.class_trait_names()  # what the installed one offers
    assert tuple(int(x) for x in jupyter_client.__version__.split(".")[:2]) >= minimum[:2]


def test_the_local_setting_is_read_from_the_pools_config_file(pool_home):
    assert KernelEncryption().local_kernels is False
    (pool_home.config_dir / "jupyter_gpu_pool_config.py").write_text(
        pool_home.config_file.read_text() + "c.KernelEncryption.local_kernels = True\n")
    km = AsyncKernelManager(kernel_name="gpu-pool-small")
    provisioner = GPUPoolProvisioner(kernel_id="k", kernel_spec=km.kernel_spec, parent=km)
    assert local_launch_kwargs(provisioner, {"env": {}}) == {"env": {}, "transport_encryption": "required"}
