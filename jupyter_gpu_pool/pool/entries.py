"""The admin's entries (a profile, a quota, a declared GPU, a policy rule) as dicts with known keys."""

from __future__ import annotations


def entry(value, where: str, known: set[str] | frozenset[str], example: str, *, noun: str = "key") -> dict:
    """``value`` as a dict whose keys are all ``known``; else a ValueError naming ``where``, what is
    wrong and what to write (``example``)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a dict like {example}, not {value!r}")
    unknown = set(value) - set(known)
    if unknown:
        raise ValueError(f"{where} has unknown {noun}(s) {sorted(map(str, unknown))}; the {noun}s are {sorted(known)}")
    return value
