"""Helpers for tests that drive real kernels (a module of its own: every conftest.py is named conftest)."""

import asyncio
import json
import os
import socket
import time

from jupyter_client.manager import AsyncKernelManager


def slice_at_start(policy: list) -> list:
    """A test's policy, its GPU kernels taking their slice at start as they did before ``slice_at``: each
    rule that does not say otherwise says start, and where every rule matches only some kernels a last
    rule does for the rest (the built-in default takes the slice at the first cell).  Tests of the first
    cell write ``slice_at: first-cell`` in their rules."""
    rules = [rule if "slice_at" in rule else {**rule, "slice_at": "start"} for rule in policy]
    if not any("match" not in rule for rule in rules):
        rules.append({"name": "slice at start", "slice_at": "start"})
    return rules


class CellFailed(AssertionError):
    """The cell ended in an error; the message is its output and traceback (a test fails with it)."""


async def run_code(km: AsyncKernelManager, code: str, timeout: float = 60, ready_timeout: float | None = None) -> str:
    """Execute code in the kernel over ZMQ, as a frontend does (``execute_request``); return its stdout,
    or raise :class:`CellFailed` with the output and traceback.  The one such helper: the benchmarks
    use it too (benchmarks/kernel_run.py)."""
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout if ready_timeout is None else ready_timeout)
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        if reply["content"]["status"] != "ok":
            raise CellFailed("".join(out))
        return "".join(out)
    finally:
        kc.stop_channels()


async def start_answering(manager, kernel_name: str, timeout: float = 60) -> tuple[str, int]:
    """Start a kernel on a bare ``AsyncMultiKernelManager`` and wait until it answers; return its id and
    the pid that answered.  ``start_kernel`` returns once the process is launched: a kernel that lost a
    race for a port jupyter_client picked (another test's process bound it first) dies, and the manager's
    restarter starts it again on new ports, with a new pid.  Reading the pid at launch would name the
    dead process."""
    kid = await manager.start_kernel(kernel_name=kernel_name)
    return kid, await answering(manager, kid, timeout)


async def answering(manager, kid: str, timeout: float = 60) -> int:
    """Wait until the kernel ``kid`` of ``manager`` (a multi-kernel manager: jupyter_server's too) answers
    ``kernel_info``, through a restart after a lost port race (:func:`start_answering`); the pid that answered."""
    deadline = time.monotonic() + timeout
    while True:
        km = manager.get_kernel(kid)
        kc = km.client()  # the connection info of now: new ports after such a restart
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            return km.provisioner.pid
        except (RuntimeError, TimeoutError):
            if time.monotonic() > deadline:
                raise
        finally:
            kc.stop_channels()


async def kernel_env(km: AsyncKernelManager) -> dict:
    text = await run_code(km, "import os, json; print(json.dumps(dict(os.environ)))")
    return json.loads(text)


async def wait_until(predicate, timeout: float = 60.0, interval: float = 0.1, what: str = ""):
    """Await ``predicate()`` (sync or async) until it is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
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


def kernelspec_wrapping(base: str, name: str, before: str) -> str:
    """Install a copy of the installed kernelspec ``base`` named ``name`` whose command runs the shell code
    ``before`` first, then the same kernel (a kernel slow to start, one whose first launch dies...)."""
    import sys

    from jupyter_core.paths import jupyter_data_dir

    with open(os.path.join(jupyter_data_dir(), "kernels", base, "kernel.json")) as f:
        spec = json.load(f)
    spec["argv"] = ["/bin/sh", "-c", f'{before}\nexec "{sys.executable}" -m ipykernel_launcher -f "$0"',
                    "{connection_file}"]
    path = os.path.join(jupyter_data_dir(), "kernels", name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "kernel.json"), "w") as f:
        json.dump(spec, f)
    return name


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
