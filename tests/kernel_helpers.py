"""Helpers for tests that drive real kernels (a module of its own: every conftest.py is named conftest)."""

import asyncio
import json
import os

from jupyter_client.manager import AsyncKernelManager


async def run_code(km: AsyncKernelManager, code: str, timeout: float = 60) -> str:
    """Execute code in the kernel over ZMQ; return its stdout."""
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout)
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)
    finally:
        kc.stop_channels()


async def kernel_env(km: AsyncKernelManager) -> dict:
    text = await run_code(km, "import os, json; print(json.dumps(dict(os.environ)))")
    return json.loads(text)


async def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await asyncio.to_thread(predicate)
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        await asyncio.sleep(interval)


def write_kernelspec(data_dir, name: str, argv=None, provisioner_config=None, env=None) -> None:
    import sys

    path = os.path.join(data_dir, "kernels", name)
    os.makedirs(path, exist_ok=True)
    spec = {
        "argv": argv or [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name,
        "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "gpu-pool",
                                            "config": provisioner_config or {}}},
    }
    if env:
        spec["env"] = env
    with open(os.path.join(path, "kernel.json"), "w") as f:
        json.dump(spec, f)
