"""GPUs in the pool: detected ones (NVML, identified by UUID) and declared ones.

A declared GPU comes from the admin's inventory: it stands in for hardware on a
machine without a GPU (tests, CI, Binder, a laptop) or describes GPUs that NVML
cannot see.  Every GPU carries its ``source`` so that nothing downstream can
mistake a declared GPU for a real one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from .entries import entry as checked_entry
from .units import format_size, parse_size

DETECTED = "detected"
DECLARED = "declared"


@dataclass(frozen=True)
class GPU:
    uuid: str
    name: str
    memory: int
    index: int = 0
    sm_count: int | None = None
    node: str = "local"
    source: str = DETECTED
    mig: bool = False
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def declared(self) -> bool:
        return self.source == DECLARED

    @property
    def label(self) -> str:
        """``GPU 0 · NVIDIA H100 · 80 GiB (detected)``: what users and admins read."""
        return f"GPU {self.index} · {self.name} · {format_size(self.memory)} ({self.source})"

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}


_INVENTORY_KEYS = {"name", "memory", "sm_count", "uuid", "count", "node"}
_UUID_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


def parse_inventory(entries: list, node: str = "local") -> list[GPU]:
    """Turn the admin's declared inventory into GPUs (``source="declared"``).

    Each entry is ``{"name": "A100", "memory": "40GiB", "sm_count": 108,
    "count": 2, "uuid": "optional"}``.  Declared GPUs without a uuid get a
    stable one (``DECLARED-<node>-<index>``) so that leases survive restarts.
    """
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"the inventory must be a list of GPUs, not {type(entries).__name__}")
    gpus: list[GPU] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"inventory[{i}]"
        checked_entry(entry, where, _INVENTORY_KEYS, "{'name': 'A100', 'memory': '40GiB'}")
        if "memory" not in entry:
            raise ValueError(f"{where} needs 'memory', such as '40GiB'")
        try:
            memory = parse_size(entry["memory"])
        except ValueError as e:
            raise ValueError(f"{where}.memory: {e}") from None
        name = entry.get("name", "Declared GPU")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}.name must be non-empty text")
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"{where}.count must be a whole number of at least 1, not {count!r}")
        sm_count = entry.get("sm_count")
        if sm_count is not None and (not isinstance(sm_count, int) or isinstance(sm_count, bool) or sm_count < 1):
            raise ValueError(f"{where}.sm_count must be a positive whole number, not {sm_count!r}")
        gpu_node = entry.get("node", node)
        uuid = entry.get("uuid")
        if uuid is not None and (count != 1 or not isinstance(uuid, str) or not _UUID_OK.match(uuid)):
            raise ValueError(f"{where}.uuid must be a plain identifier and only given with count 1, not {uuid!r}")
        for _ in range(count):
            index = len(gpus)
            gpu_uuid = uuid or f"DECLARED-{gpu_node}-{index}"
            if gpu_uuid in seen:
                raise ValueError(f"{where}: uuid {gpu_uuid!r} is declared twice")
            seen.add(gpu_uuid)
            gpus.append(
                GPU(
                    uuid=gpu_uuid,
                    name=name,
                    memory=memory,
                    index=index,
                    sm_count=sm_count,
                    node=gpu_node,
                    source=DECLARED,
                )
            )
    return gpus
