"""One kernelspec per profile, so that the launcher shows "Python 3 · GPU 10 GiB" with a GPU badge
on the Python logo (the launcher draws a kernelspec's ``logo-svg``): GPU kernels do not look like the
plain kernel."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import tempfile

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from ..pool import Profile

PROVISIONER = "gpu-pool"


def kernelspec_name(prefix: str, profile: Profile) -> str:
    return f"{prefix}-{profile.name}"


def kernel_json(profile: Profile, python: str = sys.executable, provisioner: str = PROVISIONER) -> dict:
    return {
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": profile.launcher_name,
        "language": "python",
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {"provisioner_name": provisioner, "config": {"profile": profile.name}},
            "gpu_pool": {"profile": profile.name, "slice": profile.slice.to_text(), "isolation": profile.isolation},
        },
    }


def _logo_files() -> list[str]:
    try:
        from ipykernel.kernelspec import RESOURCES
    except ImportError:
        return []
    return [os.path.join(RESOURCES, f) for f in os.listdir(RESOURCES) if f.startswith("logo")]


def gpu_logo(python_logo: bytes | None) -> str:
    """The launcher's icon of a GPU kernel: the Python logo with a "GPU" badge (black on NVIDIA green,
    9:1 contrast), or the badge alone where ipykernel's logo is missing."""
    python = (f'<image x="2" y="0" width="46" height="54" href="data:image/svg+xml;base64,'
              f'{base64.b64encode(python_logo).decode()}"/>' if python_logo else "")
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 64 64" role="img">'
            '<title>GPU kernel</title>'
            f'{python}'
            '<rect x="22" y="38" width="41" height="25" rx="5" fill="#76b900" stroke="#fff" stroke-width="1.5"/>'
            '<text x="42.5" y="56.5" text-anchor="middle" font-family="DejaVu Sans, Arial, sans-serif" '
            'font-size="16" font-weight="bold" fill="#000">GPU</text></svg>')


def install(profiles: list[Profile], *, prefix_name: str = "gpu-pool", user: bool = False,
            prefix: str | None = None, python: str = sys.executable,
            provisioner: str = PROVISIONER) -> list[tuple[str, str]]:
    """Install a kernelspec per profile; return (name, directory) for each."""
    ksm = KernelSpecManager()
    installed = []
    for profile in profiles:
        name = kernelspec_name(prefix_name, profile)
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # copied with its mode: a system-wide kernelspec must be readable by every user
            with open(os.path.join(tmp, "kernel.json"), "w") as f:
                json.dump(kernel_json(profile, python, provisioner), f, indent=1, ensure_ascii=False)
            python_logo = None
            for logo in _logo_files():
                if logo.endswith("logo-svg.svg"):
                    with open(logo, "rb") as f:
                        python_logo = f.read()
                    continue
                shutil.copy(logo, tmp)
            with open(os.path.join(tmp, "logo-svg.svg"), "w") as f:
                f.write(gpu_logo(python_logo))
            dest = ksm.install_kernel_spec(tmp, kernel_name=name, user=user, prefix=prefix)
        installed.append((name, dest))
    return installed


def installed_pool_kernelspecs() -> dict[str, dict]:
    """Kernelspecs on this machine that use the gpu-pool provisioner: name -> {resource_dir, spec}."""
    found = {}
    ksm = KernelSpecManager()
    for name, info in ksm.get_all_specs().items():
        meta = info.get("spec", {}).get("metadata", {})
        if meta.get("kernel_provisioner", {}).get("provisioner_name") == PROVISIONER:
            found[name] = info
    return found


def remove(name: str) -> str | None:
    try:
        return KernelSpecManager().remove_kernel_spec(name)
    except NoSuchKernel:
        return None
