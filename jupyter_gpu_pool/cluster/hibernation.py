"""What a sharing backend means for hibernation, and the kinds of a refusal: words the operator (which
admits hibernations) and the Jupyter server (whose policy hibernates or shuts down) share.

A hibernated pod keeps its device-plugin or DRA resources at the scheduler, so its memory is usable by
others only where the node admits more kernels than its GPUs' memory holds, the operator (not the
scheduler) making sure a resume finds it physically free.
"""

from __future__ import annotations

from dataclasses import dataclass

# status.hibernation.reason of a refusal (status.reason HibernationRefused): why nothing moved.
UNSUPPORTED, HOST_MEMORY, NODE_CAP = "Unsupported", "HostMemory", "NodeCap"
LASTING = (UNSUPPORTED, HOST_MEMORY)  # the kernel can never hibernate as it is: the policy shuts it down instead

TIME_SLICING, HAMI, MPS, MIG, WHOLE, DRA = "time-slicing", "hami", "mps", "mig", "whole", "dra"


@dataclass(frozen=True)
class Support:
    """Whether a sharing backend hands a hibernated kernel's memory back, and why (or why not)."""

    hands_back: bool
    why: str


def backend_support(backend: str, *, replicas: int = 1, memory_scaling: float = 1.0) -> Support:
    """What a hibernation gives back under ``backend`` (``replicas``: time-slicing's per GPU;
    ``memory_scaling``: HAMi's deviceMemoryScaling)."""
    if backend == TIME_SLICING:
        if replicas > 1:
            return Support(True, f"time-slicing: each GPU is {replicas} replicas with no memory isolation, so the "
                                 "kernels beside a hibernated one can use the memory it gave back")
        return Support(False, "time-slicing with 1 replica per GPU: the hibernated kernel's pod keeps the only "
                              "replica, so no other kernel can use the memory it would give back")
    if backend == HAMI:
        if memory_scaling > 1:
            return Support(True, f"HAMi with memory scaling {memory_scaling:g}: the node admits more kernels' memory "
                                 "than its GPUs hold, and the operator resumes a kernel only into memory that is "
                                 "physically free")
        return Support(False, "HAMi without memory oversubscription (deviceMemoryScaling 1): the hibernated "
                              "kernel's pod keeps its nvidia.com/gpumem at the scheduler, so no other kernel could "
                              "use the memory it would give back")
    if backend == MPS:
        return Support(False, "MPS: the CUDA driver cannot checkpoint an MPS client, and each replica's memory is "
                              "capped for its pod, so nothing could be handed back")
    if backend == MIG:
        return Support(False, "MIG: the kernel's MIG instance stays its pod's at the scheduler, and the CUDA "
                              "driver cannot checkpoint a process on a MIG instance")
    if backend == WHOLE:
        return Support(False, "whole GPUs: the hibernated kernel's pod keeps its GPU at the scheduler, so no other "
                              "kernel could use the memory it would give back")
    if backend == DRA:
        return Support(False, "DRA: the kernel's ResourceClaim keeps its device (or its share of a GPU's memory) "
                              "allocated, so no other kernel could use the memory it would give back")
    return Support(False, f"the {backend!r} sharing backend is not known to hand memory back")


def never_hands_back(backend: str) -> Support | None:
    """The backend's refusal where no setting of it can hand memory back (what a server can tell from a
    kernel's status.gpu.sharing alone); None where the operator's settings decide."""
    if backend in (TIME_SLICING, HAMI, ""):
        return None
    return backend_support(backend)


def refusal_words(support: Support) -> str:
    return (f"This cluster cannot hibernate kernels: {support.why}. The kernel keeps running; shut it down to give "
            "its GPU back.")
