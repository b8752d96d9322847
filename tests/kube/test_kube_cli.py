"""`jupyter gpu-pool kernelspec install --kubernetes`: one kernelspec per profile on the cluster provisioner."""

import json
import os
import subprocess
import sys


def test_kernelspecs_for_the_cluster_name_the_kubernetes_provisioner(tmp_path):
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_gpu_pool_config.json").write_text(json.dumps(
        {"GPUPool": {"profiles": {"gpu-10g": {"slice": "10GiB"}, "gpu-whole": {"slice": "whole"}}}}))
    out = subprocess.run([sys.executable, "-m", "jupyter_gpu_pool.cli", "kernelspec", "install", "--kubernetes",
                          "--user"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kernels = tmp_path / "data" / "kernels"
    assert sorted(p.name for p in kernels.iterdir()) == ["gpu-pool-kubernetes-gpu-10g", "gpu-pool-kubernetes-gpu-whole"]
    spec = json.loads((kernels / "gpu-pool-kubernetes-gpu-10g" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"] == {"provisioner_name": "gpu-pool-kubernetes",
                                                      "config": {"profile": "gpu-10g"}}
    assert spec["display_name"] == "Python 3 · GPU 10 GiB"
