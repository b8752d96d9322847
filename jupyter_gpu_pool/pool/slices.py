"""Slice specifications: how much of a GPU a kernel asks for.

Admins write slices as short text (``"10GiB"``, ``"10GiB,25%"``, ``"whole"``,
``"2 x whole"``); everything else in the project works with the parsed
:class:`SliceSpec`.  Parsing is strict on purpose: a typo in an admin's profile
must stop the server with a message that names the bad text, not quietly hand
out a slice nobody intended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .units import format_size, parse_percent, parse_size

_WHOLE = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?whole\s*$", re.IGNORECASE)

@dataclass(frozen=True)
class SliceSpec:
    """What one kernel holds: memory and SM share on one GPU, or whole GPUs.

    ``memory`` is bytes on one GPU and ``None`` for whole GPUs.  ``sm_percent``
    is ``None`` when the slice reserves no SM share (it time-shares the SMs).
    """

    memory: int | None = None
    sm_percent: int | None = None
    gpu_count: int = 1
    whole: bool = False

    def __post_init__(self) -> None:
        if self.whole:
            if self.memory is not None or self.sm_percent is not None:
                raise ValueError("a whole-GPU slice takes no memory size or SM share")
            if self.gpu_count < 1:
                raise ValueError("a whole-GPU slice needs at least one GPU")
        else:
            if self.memory is None or self.memory <= 0:
                raise ValueError("a slice needs a memory size above zero")
            if self.gpu_count != 1:
                raise ValueError("a partial slice lives on one GPU; use 'N x whole' for several GPUs")
            if self.sm_percent is not None and not 1 <= self.sm_percent <= 100:
                raise ValueError("SM share must be between 1% and 100%")

    @classmethod
    def parse(cls, text: str) -> SliceSpec:
        """Parse ``"10GiB"``, ``"10GiB,25%"``, ``"whole"`` or ``"2 x whole"``."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{text!r} is not a slice: write '10GiB', '10GiB,25%' or 'whole'")
        m = _WHOLE.match(text)
        if m:
            count = int(m.group(1) or 1)
            if count < 1:
                raise ValueError(f"{text!r}: the GPU count must be at least 1")
            return cls(whole=True, gpu_count=count)
        parts = [p for p in text.split(",")]
        if len(parts) > 2:
            raise ValueError(f"{text!r} is not a slice: write memory and an optional SM share, like '10GiB,25%'")
        try:
            memory = parse_size(parts[0])
            sm = parse_percent(parts[1]) if len(parts) == 2 else None
        except ValueError as e:
            raise ValueError(f"slice {text!r}: {e}") from None
        return cls(memory=memory, sm_percent=sm)

    def __str__(self) -> str:
        if self.whole:
            return "whole GPU" if self.gpu_count == 1 else f"{self.gpu_count} whole GPUs"
        text = format_size(self.memory)
        return f"{text} · {self.sm_percent}%" if self.sm_percent is not None else text

    def to_text(self) -> str:
        """The canonical admin text for this slice (round-trips through :meth:`parse`)."""
        if self.whole:
            return "whole" if self.gpu_count == 1 else f"{self.gpu_count} x whole"
        mem = f"{self.memory // 2**20}MiB" if self.memory % 2**30 else f"{self.memory // 2**30}GiB"
        return f"{mem},{self.sm_percent}%" if self.sm_percent is not None else mem

    def memory_on(self, gpu_memory: int) -> int:
        """Bytes this slice takes on a GPU of the given size."""
        return gpu_memory if self.whole else int(self.memory)  # type: ignore[arg-type]

    def sm_on(self) -> int:
        """SM percent this slice reserves on its GPU (a whole GPU reserves all of it)."""
        if self.whole:
            return 100
        return self.sm_percent or 0
