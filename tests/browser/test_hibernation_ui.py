"""Hibernation and transparent resume on declared GPUs, as a user sees them in JupyterLab.

On a declared GPU a kernel holds no GPU memory, so hibernating it keeps the kernel and its
variables and gives the slice back, and the next cell takes a slice again first: the same state
machine, queue, transparent resume and events as on a real GPU, marked "declared: no GPU memory
to move". A kernel with ``x = 42`` goes idle, is warned, hibernates (its slice shows free in the
pool dashboard), the user runs ``print(x)``, the panel shows it resuming and ``42`` is printed; then
with the pool full meanwhile, the resume waits in the queue with its position shown until a slice
frees up.
"""

from __future__ import annotations

import re

import pytest
from browser_helpers import (
    OtherUser,
    assert_accessible,
    cell_output,
    command,
    open_notebook,
    run_cell,
    set_theme,
    shoot,
    toast,
)
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

IDLE_TIMEOUT, WARN = 24, 12
POLICY = [{
    "name": "lab",
    "match": {"profile": "gpu-10g"},
    "idle_timeout": f"{IDLE_TIMEOUT}s",
    "gpu_idle_timeout": None,
    "warn": f"{WARN}s",
    "max_snoozes": 1,
    "action": "hibernate",
}]

# Every label the card's state line shows, in order, as the page renders them (a resume on a
# declared GPU takes a moment only: a poll may never see it, the page does).
RECORD_STATES = """() => {
  window.__gpuStates = []; window.__gpuDetails = new Set();
  const seen = () => {
    for (const el of document.querySelectorAll('.jp-GpuPool-card .jp-GpuPool-stateLabel')) {
      const last = window.__gpuStates[window.__gpuStates.length - 1];
      if (el.textContent !== last) { window.__gpuStates.push(el.textContent); }
    }
    // What the card threatens beside its state: a stale "hibernated too long" deadline after a resume
    // would show here (the server replaces it only at its next pass).
    for (const el of document.querySelectorAll('.jp-GpuPool-card .jp-GpuPool-stateDetail, .jp-GpuPool-card .jp-GpuPool-countdown')) {
      window.__gpuDetails.add(el.textContent);
    }
  };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
  seen();
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(
        tmp_path_factory.mktemp("hib"),
        pool={"policy": POLICY, "default_user_quota": {"memory": "40GiB", "kernels": 4}},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0},
    )
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "hibernation.server.log")


def gpu_used(lab: LabServer) -> int:
    status, pool = lab.api("GET", "gpu-pool/api/v1/pool")
    assert status == 200, pool
    return sum(g["used_memory"] for g in pool["gpus"])


def test_hibernate_then_resume_transparently_and_through_the_queue(lab, page, artifacts):
    # The resume a cell starts: no hint wakes the kernel first (test_resume_hint_ui.py shows the hint).
    page.route(re.compile(r"/gpu-pool/api/v1/kernels/[^/]+/hint(\?|$)"), lambda route: route.abort())
    lab.write_notebook("sleepy.ipynb", "gpu-pool-gpu-10g", ["x = 42", "print(x)"])
    open_notebook(page, lab, "sleepy.ipynb")
    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=120_000)
    run_cell(page, 0)
    expect(page.locator(".jp-Cell").first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    [kernel] = lab.me()["kernels"]
    kernel_id = kernel["kernel_id"]
    command(page, "gpu-pool:open-panel")
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')
    expect(card.locator(".jp-GpuPool-stateDetail")).to_have_text(
        re.compile(r"^will be hibernated at \d\d:\d\d(:\d\d)? if still idle$"), timeout=30_000)

    # Warned: what hibernation keeps, and that a cell keeps the slice.
    warning = toast(page, "hibernates at")
    expect(warning).to_be_visible(timeout=(IDLE_TIMEOUT + 30) * 1000)
    expect(warning).to_contain_text(re.compile(
        r"sleepy\.ipynb’s kernel hibernates at \d\d:\d\d:\d\d \(idle too long\): variables kept, slice given back\. "
        r"Run a cell or Keep alive to keep it\."))

    # Hibernated: the slice is free in the pool, the kernel and its variables stay.
    expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text(
        "hibernated: GPU slice given back, variables kept (declared: no GPU memory to move)", timeout=60_000)
    # Nothing lost, nothing to do now: the warning goes, and no toast says it hibernated (What happened does).
    expect(warning).to_have_count(0)
    expect(toast(page, "hibernated")).to_have_count(0)
    expect(indicator).to_have_text("hibernated")
    expect(card.locator("button.jp-GpuPool-action")).to_have_text(["Resume", "Shut down"])
    expect(page.locator("button.jp-GpuPool-status")).to_have_text("GPU mem: 0 / 40 GiB")
    assert gpu_used(lab) == 0 and lab.kernel_alive(kernel_id)
    expect(page.locator(".jp-GpuPool-recent li").first).to_contain_text(
        "Hibernated because it was idle too long; its variables are kept (declared: no GPU memory to move). "
        "Rule: lab.")
    assert_accessible(page, "a hibernated card")
    page.wait_for_timeout(1000)
    shoot(page, artifacts, "06-hibernated")
    set_theme(page, "JupyterLab Dark")
    assert_accessible(page, "a hibernated card, dark theme")
    shoot(page, artifacts, "06-hibernated-dark", small=False)
    set_theme(page, "JupyterLab Light")

    # The dashboard shows the slice free and the kernel hibernated.
    command(page, "gpu-pool:open-dashboard")
    dashboard = page.locator(".jp-GpuPool-dashboard")
    expect(dashboard.locator(".jp-GpuPool-gpuTable tbody tr").first).to_contain_text("0 GiB of 40 GiB held")
    expect(dashboard.locator(f'.jp-GpuPool-leaseTable tr[data-kernel-id="{kernel_id}"]')).to_contain_text(
        "hibernated")

    # A cell on the hibernated kernel resumes it (the panel shows it resuming), then runs: 42.
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="sleepy.ipynb").click()
    command(page, "gpu-pool:open-panel")
    page.evaluate(RECORD_STATES)
    run_cell(page, 1)
    expect(cell_output(page, 1).first).to_have_text("42", timeout=60_000)
    expect(card.locator(".jp-GpuPool-stateLabel")).to_contain_text("idle", timeout=30_000)
    states = page.evaluate("() => window.__gpuStates")
    assert any(s.startswith("resuming: taking a GPU slice again (declared: no GPU memory to move)") for s in states), \
        states
    # A resumed card never threatens the hibernated kernel's shutdown (the rule's max_hibernated).
    page.wait_for_timeout(3000)
    details = page.evaluate("() => [...window.__gpuDetails]")
    assert not [d for d in details if "hibernated too long" in d or "shut down at" in d], details
    expect(indicator).to_have_text("GPU 0 (declared)")
    assert gpu_used(lab) == 10 * 1024**3

    # Hibernate at once (Release GPU); fill the pool meanwhile; the next cell waits its turn.
    card.get_by_role("button", name="Release GPU: sleepy.ipynb").click()
    expect(card.locator(".jp-GpuPool-stateLabel")).to_contain_text("hibernated:", timeout=60_000)
    bob = OtherUser(lab)
    try:
        for i in range(4):
            bob.hold("gpu-20g", f"bobs-{i}.ipynb")
        run_cell(page, 1)
        queued = "queued at position 1: waits for a free slice to resume"
        expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text(queued, timeout=30_000)
        expect(card.locator(".jp-GpuPool-stateDetail")).to_contain_text("Your cell runs once a slice frees up")
        expect(indicator).to_have_text("queued #1")
        expect(cell_output(page, 1).first).to_contain_text("position 1 in the queue")
        page.wait_for_timeout(2500)  # still waiting: nothing runs while the pool is full
        expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text(queued)
        assert_accessible(page, "a queued resume")
        shoot(page, artifacts, "07-resume-queued")
        set_theme(page, "JupyterLab Dark")
        assert_accessible(page, "a queued resume, dark theme")
        shoot(page, artifacts, "07-resume-queued-dark", small=False)
        set_theme(page, "JupyterLab Light")
        bob.ledger.release(bob.leases[0].id, "done")
        expect(cell_output(page, 1).first).to_have_text("42", timeout=60_000)
        expect(indicator).to_have_text(re.compile(r"^GPU \d \(declared\)$"), timeout=30_000)
    finally:
        bob.release_all()
        lab.api("DELETE", f"api/kernels/{kernel_id}")
