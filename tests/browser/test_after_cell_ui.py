"""Asleep between cells, as a user sees it in JupyterLab (real Chromium, real jupyter lab).

The kernel's rule says ``hibernate_after_cell``: a few seconds after its cell ends, the kernel gives its
GPU slice back without a warning.  Its card says so calmly ("asleep between cells … It wakes when a cell
runs"), "What happened" says it plainly, no toast announces it, and the next cell runs on the same
variables.
"""

from __future__ import annotations

import pytest
from browser_helpers import LARGE, assert_accessible, cell_output, command, open_notebook, run_cell
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

AFTER = 4  # seconds after each cell
POLICY = [{"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
           "action": "hibernate", "hibernate_after_cell": f"{AFTER}s"}]

TOASTS = """() => {
  window.__toasts = [];
  const look = () => {
    for (const el of document.querySelectorAll('.Toastify__toast')) {
      if (!window.__toasts.includes(el.textContent)) { window.__toasts.push(el.textContent); }
    }
  };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true, characterData: true});
  look();
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(tmp_path_factory.mktemp("after-cell"), pool={"policy": POLICY},
                       extension={"cull_interval": 1.0, "telemetry_interval": 1.0})
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "after-cell.server.log")


def test_a_kernel_asleep_between_cells_is_shown_calmly_and_its_next_cell_runs_on_its_variables(lab, page, artifacts):
    lab.write_notebook("between.ipynb", "gpu-pool-gpu-10g", ["x = 41", "print(x + 1)"])
    open_notebook(page, lab, "between.ipynb", workspace="after-cell")
    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=120_000)
    command(page, "gpu-pool:open-panel")
    page.evaluate(TOASTS)

    run_cell(page, 0)
    expect(page.locator(".jp-Cell").first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    [kernel] = lab.me()["kernels"]
    kernel_id = kernel["kernel_id"]
    assert kernel["sleeps_after_cell"] == AFTER
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')

    # AFTER seconds later: asleep, calmly, on the card and in What happened; no warning came first.
    expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text(
        "asleep between cells: GPU slice given back, variables kept (declared: no GPU memory to move)",
        timeout=(AFTER + 20) * 1000)
    expect(card.locator(".jp-GpuPool-stateDetail")).to_have_text("It wakes when a cell runs.")
    expect(indicator).to_have_text("asleep between cells")  # the toolbar agrees with the card
    expect(page.locator(".jp-GpuPool-recent li").first).to_contain_text("Asleep between cells", timeout=10_000)
    page.set_viewport_size(LARGE)
    page.wait_for_timeout(500)
    page.screenshot(path=str(artifacts / "after-cell-asleep.png"))
    assert_accessible(page, "a kernel asleep between cells")
    recent = [(e["kind"], e["reason"]) for e in lab.me()["recent"] if e["kernel_id"] == kernel_id]
    assert ("hibernated", "after_cell") in recent and not [k for k, _ in recent if k == "warned"], recent

    # The next cell wakes it and runs on the same variables; then it sleeps again.
    run_cell(page, 1)
    expect(cell_output(page, 1).first).to_have_text("42", timeout=60_000)
    expect(card.locator(".jp-GpuPool-stateLabel")).to_contain_text("asleep between cells",
                                                                    timeout=(AFTER + 20) * 1000)
    recent = [(e["kind"], e["reason"]) for e in lab.me()["recent"] if e["kernel_id"] == kernel_id]
    assert recent.count(("hibernated", "after_cell")) == 2, recent
    assert page.evaluate("() => window.__toasts") == []  # never a notification
    lab.api("DELETE", f"api/kernels/{kernel_id}")
