"""What the local and the Kubernetes provisioners share lives in ``kernel_provisioner.base``: neither imports
the other, and both check their kernelspec's provisioner config the same way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jupyter_gpu_pool.kernel_provisioner import GPUPoolProvisioner, KernelStartRefused
from jupyter_gpu_pool.kernel_provisioner.base import PoolKernelProvisioner
from jupyter_gpu_pool.kernel_provisioner.kubernetes import GPUPoolKubernetesProvisioner


def _loaded_by(statement: str) -> list[str]:
    code = (f"import json, sys\n{statement}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('jupyter_gpu_pool'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_cluster_kernel_loads_neither_the_local_provisioner_nor_the_local_pool_nor_the_checkpoint_binding():
    loaded = _loaded_by("from jupyter_gpu_pool.kernel_provisioner.kubernetes import GPUPoolKubernetesProvisioner")
    assert "jupyter_gpu_pool.kernel_provisioner.kubernetes" in loaded  # the import really happened
    assert "jupyter_gpu_pool.kernel_provisioner.base" in loaded
    unwanted = [m for m in loaded if m == "jupyter_gpu_pool.kernel_provisioner.local"
                or m.startswith("jupyter_gpu_pool.local") or m.startswith("jupyter_gpu_pool.devices")]
    assert unwanted == []


def test_the_local_provisioner_loads_no_cluster_code_and_the_entry_point_still_names_it():
    loaded = _loaded_by("from jupyter_gpu_pool.kernel_provisioner import GPUPoolProvisioner")
    assert "jupyter_gpu_pool.kernel_provisioner.local" in loaded
    assert [m for m in loaded if m == "jupyter_gpu_pool.kernel_provisioner.kubernetes"
            or m.startswith("jupyter_gpu_pool.cluster")] == []


@pytest.mark.parametrize("cls", [GPUPoolProvisioner, GPUPoolKubernetesProvisioner])
def test_both_provisioners_are_pool_provisioners(cls):
    assert issubclass(cls, PoolKernelProvisioner)


@pytest.mark.parametrize("cls, known", [(GPUPoolProvisioner, "the known key is 'profile'"),
                                        (GPUPoolKubernetesProvisioner, "the known keys are 'profile' and 'image'")])
def test_an_unknown_kernelspec_key_is_refused_naming_the_known_ones(cls, known):
    with pytest.raises(KernelStartRefused) as refusal:
        cls(kernel_id="k-1", kernel_spec=None, parent=None, profle="small")
    assert refusal.value.status_code == 400 and refusal.value.pool_reason == "bad_kernelspec"
    assert str(refusal.value) == (f"The kernelspec's {cls.provisioner_name} provisioner config has unknown keys "
                                  f"['profle']; {known}. Fix the kernelspec (jupyter gpu-pool kernelspec install).")


@pytest.mark.parametrize("cls, key", [(GPUPoolProvisioner, "profile"), (GPUPoolKubernetesProvisioner, "profile"),
                                      (GPUPoolKubernetesProvisioner, "image")])
def test_a_kernelspec_value_that_is_not_a_name_is_refused(cls, key):
    with pytest.raises(KernelStartRefused) as refusal:
        cls(kernel_id="k-1", kernel_spec=None, parent=None, **{key: ["small"]})
    assert refusal.value.status_code == 400
    assert str(refusal.value).startswith(f"The kernelspec's {cls.provisioner_name} {key} must be a name, not "
                                         "['small'].")


@pytest.mark.parametrize("cls, config", [(GPUPoolProvisioner, {"profile": "small"}),
                                         (GPUPoolKubernetesProvisioner, {"profile": "small", "image": "x:1"})])
def test_a_good_kernelspec_config_is_taken(cls, config):
    provisioner = cls(kernel_id="k-1", kernel_spec=None, parent=None, **config)
    assert all(getattr(provisioner, key) == value for key, value in config.items())
