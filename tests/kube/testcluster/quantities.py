"""Kubernetes resource quantities (``500m``, ``10Gi``, ``1e3``, ``4``) as exact numbers."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX = {
    "": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?)$")


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity; ``ValueError`` naming it when it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, (int, float)):
        return Fraction(value)
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity")
    number = Fraction(m.group(1))
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2)[1:])
    return number * _SUFFIX[m.group(3) or ""]


_BINARY = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def canonical_quantity(value: str | int | float) -> str:
    """A quantity as a real API server stores it (``resource.Quantity``'s canonical form): a binary
    quantity of at least 1Ki with the largest binary suffix that divides it (``10240Mi`` is ``10Gi``), else
    the largest decimal suffix (or exponent, if it was written with one) that leaves a whole number
    (``1000`` is ``1k``, ``0.5`` is ``500m``), rounded up to nano units."""
    text = str(value).strip()
    exact = parse_quantity(value)
    m = _QUANTITY.match(text)
    suffix = (m.group(3) or "") if m else ""
    exponent_form = bool(m and m.group(2))
    if exact == 0:
        return "0"
    if suffix.endswith("i") and abs(exact) >= 1024 and exact.denominator == 1:
        n, k = int(exact), 0
        while k < len(_BINARY) - 1 and n % 1024 ** (k + 1) == 0:
            k += 1
        return f"{n // 1024 ** k}{_BINARY[k]}"
    for e in range(18, -10, -3):
        scaled = exact / Fraction(10) ** e
        if scaled.denominator == 1:
            break
    else:
        e, scaled = -9, Fraction(-((-exact * 10**9) // 1))  # rounded up to nano units
    number = int(scaled)
    if exponent_form:
        return f"{number}e{e}" if e else str(number)
    return f"{number}{_DECIMAL[e]}"


class QuantityFields:
    """Where the real schemas put a ``Quantity`` in a built-in object: canonicalised there on every write,
    as a real API server's decoding does (so a client that wrote ``10240Mi`` reads back ``10Gi``)."""

    QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"

    def __init__(self, kubernetes_version: str):
        import json
        import os

        import kubernetes_validate

        path = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                            f"v{kubernetes_version}-local-strict", "_definitions.json")
        with open(path) as f:
            self.defs = json.load(f)["$defs"]
        self.by_kind = {(g["group"], g["version"], g["kind"]): name for name, d in self.defs.items()
                        for g in d.get("x-kubernetes-group-version-kind") or []}

    def canonicalize(self, obj: dict) -> dict:
        group, _, version = obj.get("apiVersion", "").rpartition("/")
        name = self.by_kind.get((group, version, obj.get("kind")))
        return self._walk(obj, {"$ref": f"#/$defs/{name}"}) if name else obj

    def _walk(self, value, schema: dict):
        ref = schema.get("$ref", "")
        if ref.endswith("/" + self.QUANTITY):
            return canonical_quantity(value) if isinstance(value, (str, int, float)) and not isinstance(
                value, bool) else value
        if ref:
            schema = self.defs.get(ref.rsplit("/", 1)[-1], {})
        if isinstance(value, dict):
            props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
            return {k: self._walk(v, props[k]) if k in props else
                    self._walk(v, extra) if isinstance(extra, dict) else v for k, v in value.items()}
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [self._walk(v, schema["items"]) for v in value]
        return value
