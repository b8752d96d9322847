"""Profiles: the admin-named slices users pick from ("Python 3 · GPU 10 GiB").

Users choose a profile by name and never send raw resource numbers.  A profile
binds a slice to an isolation mode, which decides how the slice is held on one
machine (docs/architecture.md, "Measured hardware facts"):

- ``mps``: NVIDIA MPS caps memory and SM share in hardware; cannot hibernate.
- ``soft``: the GPU is shared, frameworks are capped at start and a watchdog
  acts on a kernel over its slice; can hibernate.
- ``exclusive``: whole GPUs; can hibernate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .entries import entry as checked_entry
from .slices import SliceSpec

MPS = "mps"
SOFT = "soft"
EXCLUSIVE = "exclusive"
ISOLATION_MODES = (MPS, SOFT, EXCLUSIVE)

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_KEYS = {"slice", "isolation", "display_name", "description"}


@dataclass(frozen=True)
class Profile:
    name: str
    slice: SliceSpec
    isolation: str
    display_name: str
    description: str = ""

    @property
    def launcher_name(self) -> str:
        """The name users click in JupyterLab's launcher: the display name of this profile's kernelspec."""
        return f"Python 3 · {self.display_name}"

    @property
    def hibernation_possible(self) -> bool:
        """Whether this isolation mode allows a checkpoint at all (MPS clients refuse: 801)."""
        return self.isolation != MPS

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "slice": self.slice.to_text(),
            "slice_label": str(self.slice),
            "memory": self.slice.memory,
            "sm_percent": self.slice.sm_percent,
            "gpu_count": self.slice.gpu_count,
            "whole": self.slice.whole,
            "isolation": self.isolation,
            "display_name": self.display_name,
            "launcher_name": self.launcher_name,
            "description": self.description,
        }


def default_display_name(spec: SliceSpec) -> str:
    """``GPU 10 GiB``, ``GPU 20 GiB · 50%``, ``whole GPU``: the part after "Python 3 · "."""
    return str(spec) if spec.whole else f"GPU {spec}"


def parse_profile(name: str, entry) -> Profile:
    """Parse one profile; every error names the profile and the bad field."""
    where = f"profile {name!r}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"{where}: a profile name is lower-case letters, digits, '.', '_' or '-' "
            "(it becomes part of a kernelspec name)"
        )
    if isinstance(entry, str):
        entry = {"slice": entry}
    entry = checked_entry(entry, where, _KEYS, "{'slice': '10GiB', 'isolation': 'soft'} (or just '10GiB')")
    if "slice" not in entry:
        raise ValueError(f"{where} needs a 'slice', such as '10GiB', '10GiB,25%' or 'whole'")
    try:
        spec = SliceSpec.parse(entry["slice"])
    except ValueError as e:
        raise ValueError(f"{where}.slice: {e}") from None
    if spec.whole:
        default_isolation = EXCLUSIVE
    else:
        default_isolation = MPS if spec.sm_percent is not None else SOFT
    isolation = entry.get("isolation", default_isolation)
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"{where}.isolation: {isolation!r} is not one of {', '.join(ISOLATION_MODES)}")
    if spec.whole and isolation != EXCLUSIVE:
        raise ValueError(f"{where}: a whole-GPU slice uses isolation 'exclusive', not {isolation!r}")
    if not spec.whole and isolation == EXCLUSIVE:
        raise ValueError(f"{where}: isolation 'exclusive' needs the slice 'whole', not {entry['slice']!r}")
    if isolation == SOFT and spec.sm_percent is not None:
        raise ValueError(
            f"{where}: isolation 'soft' cannot hold an SM share ({spec.sm_percent}%); "
            "use isolation 'mps' or drop the percentage"
        )
    display = entry.get("display_name", default_display_name(spec))
    description = entry.get("description", "")
    for key, value in (("display_name", display), ("description", description)):
        if not isinstance(value, str):
            raise ValueError(f"{where}.{key} must be text, not {value!r}")
    if not display.strip():
        raise ValueError(f"{where}.display_name must not be empty")
    return Profile(name=name, slice=spec, isolation=isolation, display_name=display, description=description)


def parse_profiles(entries) -> dict[str, Profile]:
    if not isinstance(entries, dict):
        raise ValueError(f"profiles must be a dict of name to profile, not {type(entries).__name__}")
    if not entries:
        raise ValueError("at least one profile is needed, for example {'gpu-10g': {'slice': '10GiB'}}")
    return {name: parse_profile(name, entry) for name, entry in entries.items()}
