"""A test-only stand-in for the node agent's hibernation moves, so that the operator's side can be tested
end to end without it: it settles Hibernating -> Hibernated and Resuming -> Running, with the agent's
compare-and-set status writes and its status.hibernation record, and moves no memory (the test kubelet's
pods hold none); the tests that use it check the operator's admission, accounting and faults, not the
checkpoint.  Used only where a test is about the operator alone (tests/kube/test_kube_hibernation.py,
and test_kube_server_hibernation.py's queue and refusal cases); the flow with the real agent, operator and server together is
tests/kube/test_kube_hibernation_e2e.py.

Also what a test needs of the agent's readings: a kernel's GPU use (status.usage) and a node's free GPU
memory (the Node annotation ANNOTATION_GPU_FREE)."""

from __future__ import annotations

import asyncio
import json
import time

from kubernetes_asyncio.client.exceptions import ApiException

from jupyter_gpu_pool.cluster.resources import (ANNOTATION_GPU_FREE, GROUP, HIBERNATED, HIBERNATING, KERNELS,
                                                RESUMING, RUNNING, VERSION)

MERGE = "application/merge-patch+json"


class SettlingAgent:
    """Settles the moves the operator admitted, every ``interval`` seconds, while ``paused`` is False."""

    def __init__(self, kube, interval: float = 0.2):
        self.kube = kube
        self.interval = interval
        self.paused = False
        self.settled: list[tuple[str, str]] = []  # (kernel name, phase written)
        self._task: asyncio.Task | None = None

    def start(self) -> SettlingAgent:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            if not self.paused:
                try:
                    for kernel in await self.kube.kernels():
                        await self._settle(kernel)
                except (ApiException, OSError):  # the API server blinks: try again next round
                    pass
            await asyncio.sleep(self.interval)

    async def _settle(self, kernel: dict) -> None:
        st = kernel.get("status") or {}
        now = time.time()
        if st.get("phase") == HIBERNATING:
            moved = int((st.get("usage") or {}).get("memoryUsed") or 0)
            devices = (st.get("hibernation") or {}).get("devices") or (st.get("usage") or {}).get("devices") or []
            changes = {"phase": HIBERNATED, "reason": "", "message": "Hibernated: its GPU memory is in host memory.",
                       "hibernation": {"bytes": moved, "hibernatedAt": now, "checkpointSeconds": 0.01,
                                       "devices": devices}}
        elif st.get("phase") == RESUMING:
            changes = {"phase": RUNNING, "reason": "", "message": "Running again.",
                       "hibernation": {"resumedAt": now, "restoreSeconds": 0.01}}
        else:
            return
        try:
            await self.kube.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, kernel["metadata"]["namespace"], KERNELS, kernel["metadata"]["name"],
                {"metadata": {"resourceVersion": kernel["metadata"]["resourceVersion"]}, "status": changes},
                _content_type=MERGE)
            self.settled.append((kernel["metadata"]["name"], changes["phase"]))
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or changed since it was read: next round
                raise


async def report_usage(kube, name: str, memory_used: int, devices: list[str]) -> None:
    """What the agent writes from NVML: the kernel's GPU memory and where it is."""
    await kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, kube.namespace, KERNELS, name,
        {"status": {"usage": {"memoryUsed": memory_used, "utilization": 0.0, "devices": devices,
                              "sampledAt": time.time()}}}, _content_type=MERGE)


async def report_free(kube, node: str, devices: dict[str, int], sampled_at: float | None = None) -> None:
    """The agent's NVML reading of each GPU's free memory, on its Node."""
    reading = {"devices": devices, "sampledAt": time.time() if sampled_at is None else sampled_at}
    await kube.core.patch_node(node, {"metadata": {"annotations": {ANNOTATION_GPU_FREE: json.dumps(reading)}}})


async def ask(kube, name: str, state: str, reason: str = "idle") -> dict:
    """What the kernel's server writes: spec.desiredState, with the object's resourceVersion (read again and
    retried when another write, such as its server's heartbeat, came between)."""
    for _ in range(20):
        current = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)
        try:
            return await kube.custom.patch_namespaced_custom_object(
                GROUP, VERSION, kube.namespace, KERNELS, name,
                {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                 "spec": {"desiredState": state, "hibernateReason": reason}}, _content_type=MERGE)
        except ApiException as e:
            if e.status != 409:
                raise
    raise AssertionError(f"could not write spec.desiredState of {name}: every try met a newer version")


async def kernel(kube, name: str) -> dict:
    return await kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.namespace, KERNELS, name)


def phase_of(obj: dict) -> str:
    return (obj.get("status") or {}).get("phase", "")


__all__ = ["SettlingAgent", "ask", "kernel", "phase_of", "report_free", "report_usage", "asyncio"]
