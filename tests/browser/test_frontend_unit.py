"""The JupyterLab extension's own unit tests and lint, in CI.

The unit tests (formatting, state -> view, notifications, the dashboard's view models, the React
components in jsdom) run with Jest and ``@jupyterlab/testing`` as the extension template sets them
up (``jlpm test`` in labextension/); the lint is the template's ESLint and Prettier (``jlpm
lint:check``). This runs both from pytest so that one ``pytest`` covers the frontend too, and checks
that the committed lockfile installs unchanged.
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


needs_node = pytest.mark.skipif(shutil.which("node") is None,
                                reason="Node.js is not installed (the frontend needs Node 20+)")


@pytest.fixture(scope="module")
def installed() -> tuple[str, dict]:
    """jlpm, and an environment in which the package's scripts find it (and jupyter) by name, as the
    extension template's do; the committed lockfile installed unchanged (once for the unit tests and the lint)."""
    jlpm = _jlpm()
    assert jlpm, "jlpm not found: it comes with JupyterLab (pip install jupyterlab)"
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(jlpm), os.environ.get("PATH", "")])}
    install = subprocess.run([jlpm, "install", "--immutable"], cwd=LABEXTENSION, capture_output=True, text=True,
                             timeout=600, env=env)
    assert install.returncode == 0, f"the lockfile does not install as committed:\n{install.stdout[-3000:]}"
    return jlpm, env


@pytest.mark.timeout(900)
@needs_node
def test_frontend_unit_tests_pass(installed):
    jlpm, env = installed
    run = subprocess.run([jlpm, "test"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=600, env=env)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    totals = re.search(r"^Tests:\s+(?:(\d+) failed, )?(?:\d+ skipped, )?(\d+) passed, (\d+) total$", report, re.M)
    assert totals, report[-3000:]
    failed, passed, total = int(totals.group(1) or 0), int(totals.group(2)), int(totals.group(3))
    assert failed == 0 and passed == total
    assert passed >= 80, f"only {passed} frontend tests ran"


@pytest.mark.timeout(900)
@needs_node
def test_frontend_lint_passes(installed):
    """ESLint (typescript-eslint, the template's rules) and Prettier, as `jlpm lint:check` runs them."""
    jlpm, env = installed
    run = subprocess.run([jlpm, "lint:check"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]


def test_extension_version_is_the_package_version():
    """The wheel ships the labextension of its own version (what `jupyter labextension list` shows)."""
    import json

    import jupyter_gpu_pool

    package = json.loads((LABEXTENSION / "package.json").read_text())
    assert package["version"] == jupyter_gpu_pool.__version__
    assert package["name"] == "jupyter-gpu-pool"
    assert package["jupyterlab"]["outputDir"] == "../jupyter_gpu_pool/labextension"
