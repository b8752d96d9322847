"""A request's arguments as the pool service reads them: each checked for its type and range, and
only those its operation declares (``protocol.OPERATIONS``); a bad one is a :class:`ProtocolError`
(``bad_request``), and nothing is changed."""

from __future__ import annotations

import math
import re

from ..pool import ACTIVE, HELD, HIBERNATED, RELEASED
from ..pool.phases import PHASES
from .protocol import Operation, ProtocolError

STATES = (ACTIVE, HIBERNATED, RELEASED)
KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LARGEST = 2**63 - 1  # what SQLite stores as an integer (and a float holds to well past any time or size)
WORD = re.compile(r"[a-z][a-z_]{0,39}")  # a journal entry's kind, a refusal's reason


class Args:
    """A request's arguments, each checked for its type: a bad one is a :class:`ProtocolError`."""

    def __init__(self, raw, operation: Operation | None = None):
        if not isinstance(raw, dict):
            raise ProtocolError(f"'args' must be an object, not {type(raw).__name__}")
        self.raw = raw
        self.operation = operation

    def get(self, name: str):
        """An argument as it came (its operation checks it)."""
        self._declared(name)
        return self.raw.get(name)

    def _declared(self, name: str) -> None:
        if self.operation is not None and name not in self.operation.args:  # the service's own mistake
            raise AssertionError(f"operation {self.operation.name!r} reads {name!r}, which it does not declare")

    def _get(self, name, kinds, default, required):
        self._declared(name)
        if name not in self.raw or self.raw[name] is None:
            if required:
                raise ProtocolError(f"'{name}' is required")
            return default
        value = self.raw[name]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise ProtocolError(f"'{name}' must be {' or '.join(k.__name__ for k in kinds)}, not {value!r}"[:300])
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(f"'{name}' must be a finite number, not {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and not -LARGEST <= value <= LARGEST:
            raise ProtocolError(f"'{name}' is out of range (at most {LARGEST} either way)")
        if isinstance(value, str) and len(value) > 4096:
            raise ProtocolError(f"'{name}' is too long ({len(value)} characters)")
        return value

    def text(self, name: str, default: str | None = None, required: bool = True) -> str:
        return self._get(name, (str,), default, required and default is None)

    def number(self, name: str, default: float | None = None, required: bool = False) -> float | None:
        value = self._get(name, (int, float), default, required)
        return float(value) if value is not None else None

    def integer(self, name: str, default: int | None = None, required: bool = False) -> int | None:
        return self._get(name, (int,), default, required)

    def flag(self, name: str, default: bool = False) -> bool:
        return self._get(name, (bool,), default, False)

    def texts(self, name: str) -> tuple[str, ...]:
        value = self._get(name, (list,), [], False)
        if not all(isinstance(v, str) and len(v) <= 4096 for v in value) or len(value) > 64:
            raise ProtocolError(f"'{name}' must be a list of at most 64 names")
        return tuple(value)

    def phase(self, name: str, required: bool = True) -> str | None:
        value = self._get(name, (str,), None, required)
        if value is not None and value not in ("", *PHASES):
            raise ProtocolError(f"'{name}': {value!r} is not a phase ({', '.join(PHASES)} or '')"[:300])
        return value

    def word(self, name: str) -> str:
        value = self.text(name)
        if not WORD.fullmatch(value):
            raise ProtocolError(f"'{name}' must be a word of small letters and '_', not {value[:40]!r}")
        return value

    def states(self, name: str) -> tuple[str, ...]:
        value = self.texts(name) or HELD
        unknown = set(value) - set(STATES)
        if unknown:
            raise ProtocolError(f"'{name}': {sorted(unknown)} are not lease states ({', '.join(STATES)})"[:300])
        return value


def candidates(args: Args, name: str = "candidates") -> list[tuple[str, str, float]]:
    """Kernels a caller offers to give back reserved room: [lease id, action, idle since], at most 256."""
    value = args.get(name)
    if not isinstance(value, list) or len(value) > 256 or not all(
            isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and len(c[0]) <= 128
            and c[1] in ("hibernate", "shutdown") and isinstance(c[2], (int, float)) and not isinstance(c[2], bool)
            and math.isfinite(c[2]) for c in value):
        raise ProtocolError(f"'{name}' must be a list of at most 256 [lease id, 'hibernate' or 'shutdown', "
                            "idle since] entries")
    return [(c[0], c[1], float(c[2])) for c in value]


def kernel_id(args: Args) -> str:
    kernel_id = args.text("kernel_id")
    if not KERNEL_ID.fullmatch(kernel_id):
        raise ProtocolError(f"'kernel_id' must be a kernel's id (letters, digits, '-', '_', '.'; at most "
                                     f"128), not {kernel_id[:40]!r}")
    return kernel_id
