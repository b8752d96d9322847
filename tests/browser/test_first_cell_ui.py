"""A GPU notebook opened (or restored by a page reload) takes no slice until a cell runs, as a user sees it.

The rule says ``slice_at: first-cell``: opening the notebook starts its kernel holding nothing, the
panel's card and the status bar say "no GPU yet", a reload of the page (a restored tab) still takes
nothing, and the first cell run takes the slice and sees its GPU in ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import pytest
from browser_helpers import assert_accessible, cell_output, command, open_notebook, run_cell, shoot, wait_for
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

POLICY = [{"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "slice_at": "first-cell"}]
NO_GPU_YET = "no GPU yet: takes one when a cell runs"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(tmp_path_factory.mktemp("first-cell"), pool={"policy": POLICY},
                       extension={"cull_interval": 1.0, "telemetry_interval": 1.0})
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "first-cell.server.log")


def gpu_used(lab: LabServer) -> int:
    status, pool = lab.api("GET", "gpu-pool/api/v1/pool")
    assert status == 200, pool
    return sum(g["used_memory"] for g in pool["gpus"])


def test_an_opened_notebook_holds_no_gpu_until_its_first_cell_runs(lab, page, artifacts):
    lab.write_notebook("reader.ipynb", "gpu-pool-gpu-10g", ["import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"])
    open_notebook(page, lab, "reader.ipynb")
    [kernel] = wait_for(lambda: lab.me()["kernels"], 120, "the notebook's kernel")
    kernel_id = kernel["kernel_id"]
    assert kernel["state"] == "no_gpu_yet" and kernel["gpus"] == [] and gpu_used(lab) == 0

    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text("no GPU yet", timeout=60_000)
    command(page, "gpu-pool:open-panel")
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')
    expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text(NO_GPU_YET, timeout=30_000)
    expect(card).not_to_contain_text("hibernated")
    assert_accessible(page, "a card with no GPU yet")
    page.wait_for_timeout(1000)
    shoot(page, artifacts, "first-cell-no-gpu-yet")

    # A reload restores the tab and its kernel session: still nothing taken.
    page.reload()
    page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)
    expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text("no GPU yet", timeout=60_000)
    assert [k["kernel_id"] for k in lab.me()["kernels"]] == [kernel_id] and gpu_used(lab) == 0

    run_cell(page, 0)

    expect(cell_output(page, 0).first).to_have_text("DECLARED-local-0", timeout=60_000)
    expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text("GPU 0 (declared)", timeout=30_000)
    [held] = lab.me()["kernels"]
    assert held["state"] == "active" and [g["uuid"] for g in held["gpus"]] == ["DECLARED-local-0"]
    assert gpu_used(lab) == 10 * 2**30
