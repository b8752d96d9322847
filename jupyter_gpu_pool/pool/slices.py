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

# Binary and decimal units, matched case-insensitively.  "G" or "GB" alone are
# accepted as the decimal units they are; admins who mean 2**30 write GiB.
_UNITS = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_WHOLE = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?whole\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


def parse_size(text: str) -> int:
    """Parse ``"10GiB"``-style text into bytes; raise ``ValueError`` naming the text."""
    if not isinstance(text, str):
        raise ValueError(f"a size must be text such as '10GiB', not {text!r}")
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size: write a number and a unit, such as 10GiB or 512MiB")
    number, unit = m.group(1), m.group(2).lower()
    if not unit:
        raise ValueError(f"{text!r} has no unit: write 10GiB, 512MiB, 40GB (GiB = 2**30 bytes)")
    if unit not in _UNITS:
        known = ", ".join(u for u in ("B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"))
        raise ValueError(f"{text!r} has an unknown unit {m.group(2)!r}: use one of {known}")
    value = float(number)
    if value <= 0:
        raise ValueError(f"{text!r} must be more than zero")
    return int(round(value * _UNITS[unit]))


def format_size(n: int | None) -> str:
    """Bytes as short human text (``10 GiB``, ``1.5 GiB``, ``512 MiB``)."""
    if n is None:
        return "unlimited"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            value = n / size
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{n} B"


def parse_percent(text: str | int | float) -> int:
    """Parse an SM share, ``"25%"`` or ``25``, into a whole percent in 1..100."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a percentage")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _PERCENT.match(text) or re.match(r"^\s*([+-]?\d+(?:\.\d+)?)\s*$", text)
        if not m:
            raise ValueError(f"{text!r} is not an SM share: write a percentage such as 25%")
        value = float(m.group(1))
    if value != int(value):
        raise ValueError(f"SM share {text!r} must be a whole percentage")
    if not 1 <= value <= 100:
        raise ValueError(f"SM share {text!r} must be between 1% and 100%")
    return int(value)


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
