"""The admins' pool dashboard in real Chromium, and a card with GPU readings.

Two real servers share one ledger, as two users' servers of one machine do: the admin's (the
owner of a personal server is the pool's admin) and bob's. This machine has no GPU, so the
admin's server reads its kernels' GPU memory and utilization from the scripted telemetry source
(``scripted_telemetry.py``, the extension's ``telemetry_source_class``), at the telemetry boundary
only. The dashboard draws each GPU's memory and utilization over time with each kernel's share
stacked, lists every lease with its actions, and the admin shuts down, releases and hibernates bob's
kernels, which bob's own server carries out and explains to bob.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from browser_helpers import (
    SMALL,
    assert_accessible,
    command,
    one_line,
    open_notebook,
    run_cell,
    set_theme,
    shoot,
    toast,
    wait_for,
)
from lab_server import LabServer
from scripted_telemetry import READINGS_ENV

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

GiB = 1024**3
BUDGETS = {"root": {"gpu_hours": 10}, "bob": {"gpu_hours": 5}}

# Every text a lease row says of an admin's request, in order, as the page renders them (another
# server may carry it out within a second: a poll alone could miss the pending state).
RECORD_REQUESTS = """() => {
  window.__asked = [];
  const seen = () => {
    for (const el of document.querySelectorAll('.jp-GpuPool-leaseTable .jp-GpuPool-asked')) {
      const text = el.closest('tr').dataset.kernelId + ' ' + el.textContent;
      if (!window.__asked.includes(text)) { window.__asked.push(text); }
    }
  };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
  seen();
}"""
ASKED = "() => window.__asked"

# Pixels of a plot in its kernels' colours: the plot was drawn from the readings.
PLOT_PIXELS = """(figure) => {
  const palette = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
                   '#9c755f', '#bab0ac'].map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
  const canvas = figure.querySelector('canvas');
  if (!canvas) { return 0; }
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] > 0 && palette.some(([r, g, b]) =>
        Math.abs(data[i] - r) < 40 && Math.abs(data[i + 1] - g) < 40 && Math.abs(data[i + 2] - b) < 40)) { n++; }
  }
  return n;
}"""


@pytest.fixture(scope="module")
def servers(tmp_path_factory, artifacts):
    root = tmp_path_factory.mktemp("dash")
    readings = root / "readings.json"
    admin = LabServer(
        root / "admin", pool={"budgets": BUDGETS},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0,
                   "telemetry_source_class": "scripted_telemetry.FileReadings"},
        env={READINGS_ENV: str(readings),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))},
    )
    bob = LabServer(root / "bob", pool={"owner": "bob", "ledger_path": str(admin.ledger), "budgets": BUDGETS},
                    extension={"cull_interval": 1.0, "telemetry_interval": 1.0})
    admin.start()
    bob.start()
    yield admin, bob, readings
    for server, name in ((bob, "bob"), (admin, "admin")):
        server.stop()
        server.copy_log(artifacts / f"dashboard-{name}.server.log")


def test_card_readings_and_the_admin_dashboard(servers, page, artifacts):
    admin, bob, readings = servers
    # bob's kernel, in bob's own server, on the same ledger.
    status, session = bob.api("POST", "api/sessions", {"path": "bob-model.ipynb", "type": "notebook",
                                                       "name": "bob-model.ipynb", "kernel": {"name": "gpu-pool-gpu-20g"}})
    assert status == 201, session
    bobs_kernel = session["kernel"]["id"]

    admin.write_notebook("train.ipynb", "gpu-pool-gpu-10g", ["import time\nx = 1"])
    open_notebook(page, admin, "train.ipynb")
    expect(page.locator(".jp-GpuPool-indicatorButton")).to_be_visible(timeout=120_000)
    run_cell(page, 0)
    command(page, "gpu-pool:open-panel")
    card = page.locator("section.jp-GpuPool-card")
    expect(card).to_be_visible()
    for i, utilization in enumerate([12, 35, 61, 88, 74, 52, 90, 67, 41, 58, 83, 37]):
        readings.write_text(json.dumps({"memory": (3 + (i % 3)) * GiB, "utilization": utilization}))
        page.wait_for_timeout(1000)
    readings.write_text(json.dumps({"memory": 3 * GiB, "utilization": 37}))
    page.wait_for_timeout(2500)

    # The card and the status bar with readings; GPU time against the budget.
    status = page.locator("button.jp-GpuPool-status")
    expect(status.locator(".jp-GpuPool-statusText.jp-mod-full")).to_have_text(re.compile(
        r"^GPU mem: 10 / 40 GiB · 37% · GPU time this week: [\d.]+ of 10 h$"))
    expect(status.locator(".jp-GpuPool-statusText.jp-mod-short")).to_be_hidden()
    memory = card.get_by_role("meter")
    expect(memory).to_have_attribute("aria-valuetext", "3 GiB of 10 GiB")
    expect(memory).to_have_attribute("aria-valuenow", "30")
    expect(card.locator(".jp-GpuPool-spark .jp-GpuPool-meterText")).to_have_text("37%")
    points = card.locator("polyline.jp-GpuPool-sparkLine").get_attribute("points").split()
    assert len(points) >= 8 and len({float(p.split(",")[1]) for p in points}) >= 5, points
    expect(card.get_by_role("img", name=re.compile(r"37% now; last 5 min: min \d+%"))).to_be_visible()
    expect(page.locator(".jp-GpuPool-quota")).to_contain_text(re.compile(r"GPU time this week\s*[\d.]+ of 10 h"))
    # At 1024 px JupyterLab's status bar has no room for all of it: the budget, in the same words.
    page.set_viewport_size(SMALL)
    short = status.locator(".jp-GpuPool-statusText.jp-mod-short")
    expect(short).to_have_text(re.compile(r"^GPU time this week: [\d.]+ of 10 h$"))
    expect(status.locator(".jp-GpuPool-statusText.jp-mod-full")).to_be_hidden()
    assert one_line(short)  # whole, on one line, and clear of the bar's right-hand items
    box, right = status.bounding_box(), page.locator(".jp-StatusBar-Right").first.bounding_box()
    assert box["x"] + box["width"] <= right["x"], (box, right)
    assert "GPU mem: 10 / 40 GiB" in status.get_attribute("title") + status.get_attribute("aria-label")
    shoot(page, artifacts, "08-readings")  # and at 1024 px: the status bar's budget in words still fits

    # The dashboard, from the panel's button.
    card.page.get_by_role("button", name="Open the pool dashboard").click()
    dashboard = page.locator(".jp-GpuPool-dashboard")
    expect(dashboard.locator(".jp-GpuPool-gpuTable tbody tr")).to_have_count(2)
    expect(dashboard.locator(".jp-GpuPool-gpuTable")).to_contain_text("37%")  # the GPU's own reading
    leases = dashboard.locator(".jp-GpuPool-leaseTable tbody tr")
    expect(leases).to_have_count(2)
    # Profiles as the launcher names them (the id is the cell's tooltip).
    expect(leases.nth(0)).to_contain_text(re.compile(r"^bob\s*bob-model\.ipynb\s*Python 3 · GPU 20 GiB \(20 GiB\)"))
    expect(leases.nth(1)).to_contain_text(re.compile(r"^root\s*train\.ipynb\s*Python 3 · GPU 10 GiB \(10 GiB\)"))
    expect(leases.nth(0).locator("td").nth(2)).to_have_attribute("title", "gpu-20g")

    # Each GPU's plots: the admin's kernel from its readings (stacked), bob's from its slice.
    plots = dashboard.locator(".jp-GpuPool-gpuPlots")
    expect(plots).to_have_count(2)
    mine = dashboard.locator(".jp-GpuPool-gpuPlots", has_text="root · train.ipynb")
    memory_plot = mine.locator("figure.jp-GpuPool-chart").nth(0)
    util_plot = mine.locator("figure.jp-GpuPool-chart").nth(1)
    expect(memory_plot.locator(".jp-GpuPool-legend")).to_contain_text(re.compile(r"root · train\.ipynb\s*3 GiB"))
    expect(util_plot.locator(".jp-GpuPool-legend")).to_contain_text(re.compile(r"root · train\.ipynb\s*37%"))
    assert int(util_plot.get_attribute("data-points")) >= 8
    wait_for(lambda: util_plot.evaluate(PLOT_PIXELS) > 200, timeout=15, what="the utilization plot to be drawn")
    expect(util_plot.get_by_role("img")).to_have_attribute("aria-label", re.compile(r"root · train\.ipynb 37%"))
    expect(dashboard.locator(".jp-GpuPool-gpuPlots", has_text="bob · bob-model.ipynb").locator(
        ".jp-GpuPool-legend").first).to_contain_text(re.compile(r"bob · bob-model\.ipynb\s*20 GiB"))
    assert_accessible(page, "the dashboard, light theme")
    page.wait_for_timeout(800)
    shoot(page, artifacts, "10-dashboard")
    set_theme(page, "JupyterLab Dark")
    assert_accessible(page, "the dashboard, dark theme")
    shoot(page, artifacts, "10-dashboard-dark", small=False)
    set_theme(page, "JupyterLab Light")

    # At 1400 px with both sidebars open (the file browser, the GPU panel): the profile wraps at most
    # once, its slice under it, and no action is cut or needs a sideways scroll.
    assert page.locator("#jp-gpu-pool-panel").is_visible() and page.locator(".jp-FileBrowser").is_visible()
    lease_table = dashboard.locator(".jp-GpuPool-tableScroll")
    assert lease_table.evaluate("el => el.scrollWidth <= el.clientWidth + 1"), "the lease table scrolls sideways"
    for row in leases.all():
        name = row.locator("td.jp-GpuPool-profileCell")
        lines = name.evaluate("""el => { const r = document.createRange(); r.selectNodeContents(el.firstChild);
            return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; }""")
        assert lines <= 2, f"the profile wraps over {lines} lines"
        for button in row.locator("button.jp-GpuPool-action").all():
            assert one_line(button), f"{button.text_content()!r} wraps"
            box, area = button.bounding_box(), dashboard.bounding_box()
            assert box["x"] + box["width"] <= area["x"] + area["width"], f"{button.text_content()!r} is cut"
    leases.first.scroll_into_view_if_needed()
    shoot(page, artifacts, "15-lease-table-both-sidebars", small=False)

    # An admin's action on another user's lease: bob's own server carries it out and tells bob; the
    # row says it is asked, until it is.
    page.evaluate(RECORD_REQUESTS)
    shut = dashboard.get_by_role("button", name="Shut down: bob-model.ipynb of bob")
    expect(shut).to_have_attribute("title", re.compile(r"another Jupyter server"))
    shut.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Shut down bob’s bob-model.ipynb now?")
    dialog.get_by_role("button", name="Shut down").click()
    wait_for(lambda: not bob.kernel_alive(bobs_kernel), timeout=60, what="bob's server to shut his kernel down")
    expect(leases).to_have_count(1, timeout=30_000)
    asked = page.evaluate(ASKED)
    assert any(re.fullmatch(rf"{bobs_kernel} Shut down asked at \d\d:\d\d:\d\d: waiting for its own server, "
                            r"which acts at its next pass…", a) for a in asked), asked
    expect(toast(page, "bob’s bob-model.ipynb")).to_have_count(0)  # what was done is no toast
    told = bob.me()["recent"]
    assert any(r["kind"] == "released" and r["reason"] == "admin" and "by an admin (root)" in r["message"]
               for r in told), told

    # The decision log: a table, filtered as the admin types; the tabs follow the arrow keys.
    tab = page.get_by_role("tab", name="GPUs and kernels")
    tab.focus()
    page.keyboard.press("ArrowRight")
    log_tab = page.get_by_role("tab", name="Decision log")
    expect(log_tab).to_be_focused()
    expect(log_tab).to_have_attribute("aria-selected", "true")
    rows = dashboard.locator(".jp-GpuPool-logTable tbody tr")
    expect(rows.first).to_be_visible()
    dashboard.get_by_role("searchbox").fill("admin")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(re.compile(r"bob\s*bob-model\.ipynb\s*Python 3 · GPU 20 GiB\s*released"))
    assert_accessible(page, "the decision log")
    shoot(page, artifacts, "11-decision-log", small=False)
    page.keyboard.press("Shift+Tab")  # back to the tabs
    page.get_by_role("tab", name="Decision log").focus()
    page.keyboard.press("End")
    expect(page.get_by_role("tab", name="GPU time")).to_be_focused()
    budgets = dashboard.locator(".jp-GpuPool-budgetTable tbody tr")
    expect(budgets).to_have_count(2)
    expect(budgets.first).to_contain_text(re.compile(r"^(bob|root)\s*own\s*[\d.]+ h of (5|10) h this week"))

    # Release and Hibernate on another user's leases: asked of bob's server, which carries them out.
    kernels = {}
    for nb, profile in (("bob-release.ipynb", "gpu-10g"), ("bob-hibernate.ipynb", "gpu-10g"),
                        ("bob-mps.ipynb", "gpu-20g-50")):
        status, session = bob.api("POST", "api/sessions", {"path": nb, "type": "notebook", "name": nb,
                                                           "kernel": {"name": f"gpu-pool-{profile}"}})
        assert status == 201, session
        kernels[nb] = session["kernel"]["id"]
    page.get_by_role("tab", name="GPUs and kernels").click()
    expect(leases).to_have_count(4, timeout=30_000)

    def bobs_state(nb: str) -> str:
        return next((k["state"] for k in bob.me()["kernels"] if k["kernel_id"] == kernels[nb]), "gone")

    row = dashboard.locator(f'.jp-GpuPool-leaseTable tr[data-kernel-id="{kernels["bob-release.ipynb"]}"]')
    release = row.get_by_role("button", name="Release: bob-release.ipynb of bob")
    expect(release).to_have_attribute("title", re.compile(r"hibernate where it can.*another Jupyter server"))
    release.click()
    dialog = page.locator(".jp-Dialog.jp-GpuPool-dialog")
    expect(dialog).to_contain_text("Give the GPU slice of bob’s bob-release.ipynb back now? It hibernates where")
    assert_accessible(page, "an admin's confirm dialog over the lease table",
                      include=[".jp-GpuPool-dialog", ".jp-GpuPool-dashboardWidget"])
    page.wait_for_timeout(500)
    shoot(page, artifacts, "14-admin-confirm", small=False)
    dialog.get_by_role("button", name="Release").click()
    wait_for(lambda: bobs_state("bob-release.ipynb") == "hibernated", timeout=60,
             what="bob's server to hibernate the released kernel (its rule hibernates)")
    expect(row.locator("td").nth(4)).to_have_text("hibernated", timeout=30_000)  # the request is done: gone
    assert any(a.startswith(f"{kernels['bob-release.ipynb']} Release asked at") for a in page.evaluate(ASKED))

    row = dashboard.locator(f'.jp-GpuPool-leaseTable tr[data-kernel-id="{kernels["bob-hibernate.ipynb"]}"]')
    row.get_by_role("button", name="Hibernate: bob-hibernate.ipynb of bob").click()
    expect(dialog).to_contain_text("Hibernate bob’s bob-hibernate.ipynb now? Its GPU slice goes back to the pool")
    dialog.get_by_role("button", name="Hibernate").click()
    wait_for(lambda: bobs_state("bob-hibernate.ipynb") == "hibernated", timeout=60,
             what="bob's server to hibernate his kernel")
    expect(row.locator("td").nth(4)).to_have_text("hibernated", timeout=30_000)
    expect(row.locator("button.jp-GpuPool-action")).to_have_text(["Shut down"])  # all that is left to do

    # Refused by bob's server (an MPS kernel cannot hibernate): the row and a toast say why.
    row = dashboard.locator(f'.jp-GpuPool-leaseTable tr[data-kernel-id="{kernels["bob-mps.ipynb"]}"]')
    row.get_by_role("button", name="Hibernate: bob-mps.ipynb of bob").click()
    dialog.get_by_role("button", name="Hibernate").click()
    refused = row.locator(".jp-GpuPool-asked.jp-mod-refused")
    expect(refused).to_have_text(re.compile(r"^Hibernate asked at \d\d:\d\d:\d\d, not carried out: Not hibernated: "
                                            r"it cannot hibernate"), timeout=30_000)
    expect(toast(page, "not carried out")).to_be_visible()
    assert bobs_state("bob-mps.ipynb") == "active"
    shoot(page, artifacts, "16-admin-request-refused", small=False)
    told = [(r["kind"], r["reason"], r["kernel_id"]) for r in bob.me()["recent"]]
    for nb in ("bob-release.ipynb", "bob-hibernate.ipynb"):
        assert ("hibernated", "admin", kernels[nb]) in told, told
    for kernel_id in kernels.values():
        bob.api("DELETE", f"api/kernels/{kernel_id}")

    # The dashboard comes back with the layout.
    page.wait_for_timeout(1500)  # the layout is saved a moment after it changes
    page.reload()
    expect(page.locator(".jp-GpuPool-dashboard .jp-GpuPool-gpuTable tbody tr")).to_have_count(2, timeout=120_000)
