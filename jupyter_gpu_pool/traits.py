"""Trait types for the admin's settings, validated where they are declared.

Each takes what the admin writes (text, dicts, lists) and keeps the domain value it parses into
(a :class:`~jupyter_gpu_pool.pool.Profile`, a :class:`~jupyter_gpu_pool.pool.Quota`, seconds...).
A bad value is refused when it is set, by a :class:`TraitError` whose message names the setting
(``GPUPool.profiles``), the entry and the field, and says what to write.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from traitlets import TraitError, TraitType

from .pool.units import parse_seconds


def _where(obj, trait: TraitType) -> str:
    return f"{type(obj).__name__}.{trait.name}"


class Parsed(TraitType):
    """A setting kept as the domain value ``parse`` makes of what the admin wrote.

    ``parse`` raises ValueError with a message that names the entry and field; it is shown after
    the setting's name.  A value that is already parsed (``is_parsed(value)``) is kept as it is.  What
    the admin wrote is kept too, in the object's ``written`` dict, so that the settings can be passed
    on as written (the pool service sends them to its clients)."""

    info_text = "a value as the setting's help describes"

    def __init__(self, parse: Callable[[Any], Any], default_value: Any, *,
                 is_parsed: Callable[[Any], bool] = lambda value: False, **kwargs):
        self.parse, self.is_parsed = parse, is_parsed
        super().__init__(default_value=default_value, **kwargs)

    def validate(self, obj, value):
        if self.is_parsed(value):
            return value
        try:
            parsed = self.parse(value)
            obj.__dict__.setdefault("written", {})[self.name] = value
            return parsed
        except ValueError as e:
            text = str(e)
            raise TraitError(f"{_where(obj, self)}{'' if text.startswith(('[', '.')) else ': '}{text}") from None


class Seconds(TraitType):
    """A duration that is always on: a number of seconds or text such as ``"30s"``, ``"2m"``.
    NaN, infinities and negative values are refused (and 0, unless ``zero_allowed``)."""

    info_text = "a number of seconds or text such as 30s or 2m"

    def __init__(self, default_value: float, *, zero_allowed: bool = False, **kwargs):
        self.zero_allowed = zero_allowed
        super().__init__(default_value=default_value, **kwargs)

    def from_string(self, s: str):
        """From the command line: a number, or text such as 30s."""
        try:
            return float(s)
        except ValueError:
            return s

    def validate(self, obj, value) -> float:
        try:
            return parse_seconds(value, zero_allowed=self.zero_allowed)
        except ValueError as e:
            raise TraitError(f"{_where(obj, self)} {e}") from None


class Names(TraitType):
    """A list of names (users, groups).  A single string is refused rather than read as one name:
    ``"alice,bob"`` is a typo for ``["alice", "bob"]``."""

    info_text = "a list of names"

    def __init__(self, default_value=(), **kwargs):
        super().__init__(default_value=list(default_value), **kwargs)

    def from_string(self, s: str):
        """From the command line: a Python list, or one name."""
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError):
            return [s]
        return value if isinstance(value, (list, tuple)) else [s]

    def validate(self, obj, value) -> list[str]:
        if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, str) and v for v in value):
            raise TraitError(f"{_where(obj, self)} must be a list of names such as ['alice', 'bob'], not {value!r}")
        return list(value)


class Count(TraitType):
    """A whole number of at least ``minimum``."""

    info_text = "a whole number"

    def __init__(self, default_value: int, *, minimum: int = 0, **kwargs):
        self.minimum = minimum
        super().__init__(default_value=default_value, **kwargs)

    def from_string(self, s: str):
        try:
            return int(s)
        except ValueError:
            return s

    def validate(self, obj, value) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise TraitError(f"{_where(obj, self)} must be a whole number of at least {self.minimum}, not {value!r}")
        return value
