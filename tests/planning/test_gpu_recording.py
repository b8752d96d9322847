"""On a real GPU (the GPU test machine: ``python3 -m pytest -m gpu tests/planning``): the activity trace
records what NVML reads of a kernel, the memory it holds and its use of the GPU crossing the policy's
threshold, as the replay needs them for GPU-idle rules and hibernation costs."""

from __future__ import annotations

import pytest
from server_helpers import execute, start_kernel, wait_until

from jupyter_gpu_pool.devices.telemetry import NVMLSource

GiB = 2**30
LOOP = """import time, torch
held = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')
a = torch.randn(4096, 4096, device='cuda')
t = time.time()
while time.time() - t < 8:
    a = (a @ a).tanh()
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.usefixtures("ext")
@pytest.mark.pool_settings(gpu_discovery="nvml", inventory=[], profiles={"soft8g": {"slice": "8GiB"}})
@pytest.mark.extension(telemetry_source_class=NVMLSource, telemetry_interval=0.5)
@pytest.mark.policy(rules=[{"idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None}])
async def test_the_trace_records_what_nvml_reads_of_a_kernel_on_a_real_gpu(jp_fetch, jp_ws_fetch, pool_home):
    pool_home.install_kernelspecs()
    kid = await start_kernel(jp_fetch, "gpu-pool-soft8g")
    ws = await execute(jp_ws_fetch, kid, LOOP)

    def readings():
        events, _ = pool_home.ledger().trace_export(limit=100_000)
        return [(e.data.get("mem"), e.data.get("util")) for e in events if e.kind == "gpu" and e.kernel_id == kid]

    await wait_until(lambda: any(m and m >= 2 * GiB and u is not None and u >= 5 for m, u in readings()), 180,
                     what="a reading of the loop: 2 GiB held, the GPU in use")
    await wait_until(lambda: (r := readings()) and r[-1][0] >= 2 * GiB and r[-1][1] is not None and r[-1][1] < 5, 180,
                     what="the reading once the loop is done: memory held, the GPU idle")
    ws.close()
    await jp_fetch("api", "kernels", kid, method="DELETE")
