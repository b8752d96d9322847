"""Sizes, durations and times as admins write them and users read them, in one place.

Parsing is strict on purpose: a typo in an admin's setting must stop the server with a message that
names the bad text, not quietly mean something nobody intended.  (A general library such as
humanfriendly reads "10" as ten bytes and "1h" in ways of its own; the pool's texts need units and
a few exact forms, so these stay small and ours.)
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime

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


_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m)?"
                       r"\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$", re.IGNORECASE)


def parse_duration(value) -> float | None:
    """Seconds from ``1800``, ``"30m"``, ``"2h"``, ``"1h30m"``, ``"1d"``, ``"45s"``;
    ``None`` or ``"never"`` turn a limit off.  Raises ValueError naming the value."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("never", "none", "off")):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip() and _DURATION.match(value):
        d, h, m, s = (float(g) if g else 0.0 for g in _DURATION.match(value).groups())  # type: ignore[union-attr]
        seconds = d * 86400 + h * 3600 + m * 60 + s
    else:
        raise ValueError(
            f"{value!r} is not a duration: write seconds (1800) or text such as 90s, 30m, 2h, 1h30m, 1d, "
            "or null to turn it off")
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a duration: write a number of seconds or text such as 30m")
    if seconds <= 0:
        raise ValueError(f"{value!r} must be more than zero (write null to turn it off)")
    return seconds


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"  # short test policies: 0.5s, 2.5s
    return format_age(round(seconds))


def format_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


# A deadline closer than this is said to the second: "at 21:10" for 21:10:55 would be most of a minute wrong.
TO_THE_SECOND = 120.0


def format_clock(at: float, now: float | None = None) -> str:
    """A Unix time as the machine's local wall-clock ``HH:MM`` (what a user compares with their clock);
    ``HH:MM:SS`` where ``now`` is given and ``at`` is less than two minutes ahead of it."""
    close = now is not None and at - now < TO_THE_SECOND
    return time.strftime("%H:%M:%S" if close else "%H:%M", time.localtime(at))


def format_rfc3339(at: float) -> str:
    """A Unix time as RFC 3339 UTC (``2024-05-01T12:00:00Z``), as Kubernetes writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def unix_time(value) -> float | None:
    """A moment as Unix seconds: jupyter_server gives a kernel's last activity as a datetime, the pool
    keeps numbers; ``None`` stays ``None``."""
    if value is None:
        return None
    return value.timestamp() if isinstance(value, datetime) else float(value)


def parse_seconds(value, *, zero_allowed: bool) -> float:
    """Seconds for a setting that is always on (an interval, a grace period): a number or text such as
    ``"30s"`` or ``"2m"``; ``zero_allowed`` admits 0.  Raises ValueError saying what is allowed."""
    allowed = "a number of seconds, 0 or more," if zero_allowed else "a number of seconds above 0"
    seconds = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip() and (m := _DURATION.match(value)):
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = d * 86400 + h * 3600 + mi * 60 + s
    if seconds is None or not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_allowed):
        raise ValueError(f"must be {allowed} (or text such as 30s or 2m), not {value!r}")
    return seconds
