"""The soft-isolation hook: PyTorch is capped when (and only when) a kernel imports it."""

import json
import os
import subprocess
import sys

import pytest

from jupyter_gpu_pool.kernel_provisioner.environment import SOFTCAP_DIR


def python(code: str, pythonpath: list[str], **env) -> str:
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_GPU_POOL_MEMORY_FRACTION")}
    full.update(env, PYTHONPATH=os.pathsep.join(pythonpath))
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


MODULES = "import sys, json; print(json.dumps(sorted(sys.modules)))"


def test_the_hook_imports_next_to_nothing_at_kernel_start():
    without = set(json.loads(python(MODULES, [])))
    with_hook = set(json.loads(python(MODULES, [SOFTCAP_DIR], JUPYTER_GPU_POOL_MEMORY_FRACTION="0.25")))
    assert with_hook - without <= {"sitecustomize"}


def test_the_hook_is_installed_only_for_soft_slices():
    code = "import sys; print([type(f).__name__ for f in sys.meta_path])"
    assert "_TorchCapFinder" in python(code, [SOFTCAP_DIR], JUPYTER_GPU_POOL_MEMORY_FRACTION="0.25")
    assert "_TorchCapFinder" not in python(code, [SOFTCAP_DIR])


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os; os.environ['SHADOWED_RAN'] = 'yes'\n")
    code = "import os; print(os.environ.get('SHADOWED_RAN'))"
    assert python(code, [SOFTCAP_DIR, str(other)], JUPYTER_GPU_POOL_MEMORY_FRACTION="0.25") == "yes"


def test_importing_other_packages_is_untouched():
    code = "import json, sys; print(json.dumps([1]), type(sys.meta_path[0]).__name__)"
    assert python(code, [SOFTCAP_DIR], JUPYTER_GPU_POOL_MEMORY_FRACTION="0.25") == "[1] _TorchCapFinder"


def test_importing_torch_queues_the_memory_cap_for_cuda_initialisation():
    pytest.importorskip("torch", reason="PyTorch is not installed here (.ci/run installs the CPU wheel)")
    code = (
        "import torch\n"
        "apply = [c for c, _ in torch.cuda._queued_calls if getattr(c, '__name__', '') == 'apply']\n"
        "print(torch._jupyter_gpu_pool_memory_fraction, torch.cuda.is_initialized(), len(apply))"
    )
    # the cap waits for CUDA's lazy init: importing torch alone creates no CUDA context
    assert python(code, [SOFTCAP_DIR], JUPYTER_GPU_POOL_MEMORY_FRACTION="0.25").split() == ["0.25", "False", "1"]
