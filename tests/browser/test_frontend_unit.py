"""The JupyterLab extension's own unit tests (formatting, state -> view, notifications), in CI.

They are TypeScript tests run by Node's test runner (``jlpm test`` in labextension/);
this runs them from pytest so that one ``pytest`` covers the frontend logic too,
and checks that the committed lockfile installs unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LABEXTENSION = Path(__file__).resolve().parents[2] / "labextension"


def _jlpm() -> str | None:
    return shutil.which("jlpm", path=os.path.dirname(sys.executable)) or shutil.which("jlpm")


@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed (the frontend needs Node 20+)")
def test_frontend_unit_tests_pass():
    jlpm = _jlpm()
    assert jlpm, "jlpm not found: it comes with JupyterLab (pip install jupyterlab)"
    # The package's scripts call jlpm (and jupyter) by name, as the extension template's do.
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(jlpm), os.environ.get("PATH", "")])}
    install = subprocess.run([jlpm, "install", "--immutable"], cwd=LABEXTENSION, capture_output=True, text=True,
                             timeout=600, env=env)
    assert install.returncode == 0, f"the lockfile does not install as committed:\n{install.stdout[-3000:]}"
    run = subprocess.run([jlpm, "test"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=600, env=env)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    passed = re.search(r"^# pass (\d+)$", report, re.M)
    failed = re.search(r"^# fail (\d+)$", report, re.M)
    assert passed and failed, report[-3000:]
    assert int(failed.group(1)) == 0
    assert int(passed.group(1)) >= 50, f"only {passed.group(1)} frontend tests ran"


def test_extension_version_is_the_package_version():
    """The wheel ships the labextension of its own version (what `jupyter labextension list` shows)."""
    import json

    import jupyter_gpu_pool

    package = json.loads((LABEXTENSION / "package.json").read_text())
    assert package["version"] == jupyter_gpu_pool.__version__
    assert package["name"] == "jupyter-gpu-pool"
    assert package["jupyterlab"]["outputDir"] == "../jupyter_gpu_pool/labextension"
