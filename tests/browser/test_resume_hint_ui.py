"""Resume before the cell runs, as a user sees it in JupyterLab (real Chromium, real jupyter lab).

A notebook's kernel hibernated; the user comes back to the notebook's tab: JupyterLab sends a hint,
the kernel wakes up while the user reads ("waking up…" on its card, the notebook's toolbar and the
status bar, never a toast), and with no cell run it goes back to sleep, calmly.  Then the user clicks
into a cell and types: the kernel wakes again, and Shift+Enter runs at once on the same variables.

A modelled restore time (``hibernation_declared_restore_cost``, for tests and benchmarks only) makes
the declared resume last long enough to be seen.
"""

from __future__ import annotations

import pytest
from browser_helpers import LARGE, assert_accessible, cell_output, command, open_notebook, run_cell
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

SLEEP_AFTER = 8  # seconds a kernel woken on a hint waits for a cell
POLICY = [{"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
           "action": "hibernate"}]

# Every text the kernel's card state, toolbar indicator and status item show, in order; every toast.
RECORD = """() => {
  window.__seen = []; window.__toasts = [];
  const look = () => {
    for (const el of document.querySelectorAll('.Toastify__toast')) {
      if (!window.__toasts.includes(el.textContent)) { window.__toasts.push(el.textContent); }
    }
    for (const sel of ['.jp-GpuPool-card .jp-GpuPool-stateLabel', '.jp-GpuPool-indicatorText',
                       'button.jp-GpuPool-status']) {
      for (const el of document.querySelectorAll(sel)) {
        const said = sel + ' ' + el.textContent;
        if (window.__seen[window.__seen.length - 1] !== said) { window.__seen.push(said); }
      }
    }
  };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true, characterData: true});
  look();
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(
        tmp_path_factory.mktemp("hint"),
        pool={"policy": POLICY, "hibernation_declared_restore_cost": "4s + 0s/GiB"},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0, "hint_sleep_after": SLEEP_AFTER},
    )
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "resume-hint.server.log")


def lease_state(lab: LabServer, kernel_id: str) -> str:
    return next(k["state"] for k in lab.me()["kernels"] if k["kernel_id"] == kernel_id)


def test_opening_a_sleeping_kernels_notebook_wakes_it_calmly_and_editing_a_cell_wakes_it_for_the_run(
        lab, page, artifacts):
    lab.write_notebook("later.ipynb", "gpu-pool-gpu-10g", ["x = 42", "print(x)"])
    lab.write_notebook("elsewhere.ipynb", "python3", ["1 + 1"])
    open_notebook(page, lab, "later.ipynb", workspace="hint")
    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=120_000)
    run_cell(page, 0)
    expect(page.locator(".jp-Cell").first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    [kernel] = lab.me()["kernels"]
    kernel_id = kernel["kernel_id"]

    # The user goes to another notebook; meanwhile the kernel hibernates (here: released at once).
    command(page, "docmanager:open", {"path": "elsewhere.ipynb"})
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text="elsewhere.ipynb").wait_for()
    status, answer = lab.api("POST", f"gpu-pool/api/v1/kernels/{kernel_id}/release", {})
    assert status == 202 and answer["action"] == "hibernate", answer
    command(page, "gpu-pool:open-panel")
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')
    expect(card.locator(".jp-GpuPool-stateLabel")).to_contain_text("hibernated", timeout=30_000)
    page.evaluate(RECORD)

    # Back to its notebook: the hint wakes it; the card, the toolbar and the status bar say so calmly.
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="later.ipynb").click()
    expect(indicator).to_have_text("waking up…", timeout=10_000)
    expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text("waking up…")
    expect(card.locator(".jp-GpuPool-stateDetail")).to_have_text(
        "Its notebook is open: it takes its GPU slice again before your next cell.")
    expect(page.locator("button.jp-GpuPool-status")).to_contain_text("waking up…")
    page.set_viewport_size(LARGE)
    page.screenshot(path=str(artifacts / "resume-hint-waking.png"))
    assert_accessible(page, "a kernel waking up on a hint")
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=30_000)
    assert lease_state(lab, kernel_id) == "active"

    # No cell: it goes back to sleep after SLEEP_AFTER seconds, with no warning and no toast.
    expect(indicator).to_have_text("hibernated", timeout=(SLEEP_AFTER + 15) * 1000)
    expect(page.locator(".jp-GpuPool-recent li").first).to_contain_text(
        "Back to sleep: woken in advance, but no cell ran; nothing was used (declared: no GPU memory to move).",
        timeout=10_000)
    recent = [(e["kind"], e["reason"]) for e in lab.me()["recent"] if e["kernel_id"] == kernel_id]
    assert ("hibernated", "hint_unused") in recent and ("resumed", "hint") in recent, recent
    assert not [kind for kind, _ in recent if kind == "warned"], recent

    # The user clicks into a cell and types: woken again; Shift+Enter runs on the same variables.
    page.wait_for_timeout(5000)  # (the page sends at most one hint a kernel every 5 s)
    editor = page.locator(".jp-Cell").nth(1).locator(".jp-InputArea-editor")
    editor.click()
    page.keyboard.press("End")
    page.keyboard.type("  # again", delay=80)
    expect(indicator).to_have_text("waking up…", timeout=10_000)
    page.screenshot(path=str(artifacts / "resume-hint-typing.png"))
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=30_000)
    page.keyboard.press("Shift+Enter")
    expect(cell_output(page, 1).first).to_have_text("42", timeout=30_000)
    page.wait_for_timeout((SLEEP_AFTER + 3) * 1000)  # used: it stays awake
    assert lease_state(lab, kernel_id) == "active"
    expect(indicator).to_have_text("GPU 0 (declared)")

    seen = page.evaluate("() => window.__seen")
    assert any(s.endswith("waking up…") and "indicator" in s for s in seen), seen
    assert not [s for s in seen if "resuming" in s], seen  # it never read as a cell waiting on a resume
    assert page.evaluate("() => window.__toasts") == []  # never a notification
    lab.api("DELETE", f"api/kernels/{kernel_id}")
