"""A user's Jupyter server never loads the operator: the Kubernetes provisioner and the server extension
with its cluster backend import the shared contract (jupyter_gpu_pool.cluster) only, and no kopf (which
a single-user image need not have)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_server_side_loads_no_operator_module_and_no_kopf():
    code = (
        "import json, sys\n"
        "import jupyter_gpu_pool.kernel_provisioner.kubernetes\n"
        "import jupyter_gpu_pool.server_extension\n"
        "import jupyter_gpu_pool.server_extension.backends.kubernetes\n"
        "import jupyter_gpu_pool.server_extension.backends.adoption\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('jupyter_gpu_pool.') or m == 'kopf'"
        " or m.startswith('kopf.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert "jupyter_gpu_pool.server_extension.backends.kubernetes" in loaded  # the import really happened
    assert [m for m in loaded if m.startswith("jupyter_gpu_pool.operator") or m.split(".")[0] == "kopf"] == []


def test_periodic_jobs_run_on_the_one_loop():
    """The Kubernetes side's periodic jobs (the operator's sweep, the agent's samples, the server's
    heartbeats and cluster reads) run on ``jupyter_gpu_pool.periodic.every``: no hand-written loop that
    sleeps, but for the one list + watch loop (a watch, with its own back-off).  ``sleep(0)`` is no period
    but a turn given to the other tasks (the operator's workers between two passes)."""
    import ast
    from pathlib import Path

    import jupyter_gpu_pool

    root = Path(jupyter_gpu_pool.__file__).parent
    files = [*sorted((root / "cluster").glob("*.py")), *sorted((root / "operator").glob("*.py")),
             *(root / "server_extension" / name for name in ("backends/kubernetes.py", "backends/adoption.py",
                                                           "sleep/cluster.py")),
             root / "kernel_provisioner" / "kubernetes.py"]
    allowed = {("watch.py", "list_and_watch")}
    found = []
    for path in files:
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for loop in (n for n in ast.walk(func) if isinstance(n, ast.While)):
                sleeps = [c for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                          and c.func.attr == "sleep" and not (len(c.args) == 1 and isinstance(c.args[0], ast.Constant)
                                                              and c.args[0].value == 0)]
                if sleeps and (path.name, func.name) not in allowed:
                    found.append(f"{path.relative_to(root)}::{func.name}")
    assert found == []
