"""The pool on a real GPU (run on the GPU test machine: `python3 -m pytest -m gpu tests/gpu`).

Each test configures a pool of the DETECTED GPUs (NVML), installs its
kernelspecs, starts real kernels and measures inside them with PyTorch.
"""

import subprocess

import pytest

from jupyter_gpu_pool.devices.nvml import discover
from kernel_helpers import run_code

pytestmark = pytest.mark.gpu

GiB = 2**30


@pytest.fixture
def gpu_pool(pool_home):
    """A pool of the detected GPUs with MPS and soft profiles sized for these tests."""
    pool_home.configure(
        gpu_discovery="nvml",
        inventory=[],
        profiles={
            "mps2g": {"slice": "2GiB", "isolation": "mps"},
            "mps25": {"slice": "8GiB,25%", "isolation": "mps"},
            "mps100": {"slice": "8GiB,100%", "isolation": "mps"},
            "soft10g": {"slice": "10GiB", "isolation": "soft"},
        },
    )
    pool_home.install_kernelspecs()
    yield pool_home
    pool_home.pool().stop_mps()  # the pool's own daemon; leave the card as we found it


def test_nvml_discovery_finds_the_machines_gpus_by_uuid():
    found = discover()
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    assert found.gpus, found.error
    for gpu in found.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.uuid in listed
        assert gpu.name in listed and gpu.memory > 8 * GiB and gpu.source == "detected"
    assert found.driver_version


async def test_an_mps_slice_of_2gib_allows_1_5gib_and_refuses_2_5gib(gpu_pool, managers):
    km = managers("gpu-pool-mps2g")
    await km.start_kernel()
    out = await run_code(km, "\n".join([
        "import torch",
        "a = torch.empty(int(1.5 * 2**30), dtype=torch.uint8, device='cuda')",
        "print('1.5GiB ok')",
        "try:",
        "    b = torch.empty(2**30, dtype=torch.uint8, device='cuda')",
        "    print('2.5GiB ok')",
        "except RuntimeError as e:",
        "    print('2.5GiB refused:', 'out of memory' in str(e).lower())",
    ]), timeout=180)
    assert "1.5GiB ok" in out and "2.5GiB refused: True" in out


MATMUL_RATE = "\n".join([
    "import torch, time",
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)",
    "for _ in range(5): a @ b",
    "torch.cuda.synchronize(); t = time.perf_counter(); n = 50",
    "for _ in range(n): a @ b",
    "torch.cuda.synchronize(); dt = time.perf_counter() - t",
    "print('TFLOPS', 2 * 8192**3 * n / dt / 1e12)",
])


async def test_an_mps_slice_of_25_percent_runs_at_about_a_quarter_of_the_rate(gpu_pool, managers):
    rates = {}
    for profile in ("mps100", "mps25"):
        km = managers(f"gpu-pool-{profile}")
        await km.start_kernel()
        out = await run_code(km, MATMUL_RATE, timeout=300)
        rates[profile] = float(out.split("TFLOPS")[1])
        await km.shutdown_kernel()
    ratio = rates["mps25"] / rates["mps100"]
    print(f"bf16 matmul: 100% {rates['mps100']:.0f} TFLOP/s, 25% {rates['mps25']:.0f} TFLOP/s, ratio {ratio:.2f}")
    assert 0.15 < ratio < 0.45, rates  # measured on an H100: 232 / 786 = 0.30


async def test_a_soft_slice_caps_pytorch_at_its_memory(gpu_pool, managers):
    km = managers("gpu-pool-soft10g")
    await km.start_kernel()
    out = await run_code(km, "\n".join([
        "import torch",
        "total = torch.cuda.get_device_properties(0).total_memory",
        "a = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda')",
        "print('8GiB ok')",
        "try:",
        "    b = torch.empty(4 * 2**30, dtype=torch.uint8, device='cuda')",
        "    print('12GiB ok')",
        "except torch.OutOfMemoryError as e:",
        "    print('12GiB refused')",
    ]), timeout=180)
    assert "8GiB ok" in out and "12GiB refused" in out
