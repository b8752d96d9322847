"""The truth after a restart, in real headless Chromium against a real server and real kernels.

A restart: six notebooks open with their GPU kernels (one hibernated), the server stops and starts
again with a quota of one kernel; the page reloads and JupyterLab restores the six tabs, whose kernels
are started at start (policy ``slice_at: start``): one gets its slice, five are refused. At most one
"Error Starting Kernel" dialog shows (JupyterLab's own, once per notebook before), and "What
happened" says that the kernels ended when the server stopped, the hibernated one too.
(Toasts that count their repeats: test_long_session_ui.py.)
The dashboard's plots agree with its table: a whole-GPU kernel drawn at the 40 GiB it holds, and a
kernel hibernated and one shut down kept in the history (their lines at 0 from then on).
Screenshots: ``test-artifacts/browser/``, the ones the docs show copied to ``docs/images/``.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from browser_helpers import assert_accessible, command, shoot, wait_for
from lab_server import DEMO_PROFILES, LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

POLICY = [{"idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None, "slice_at": "start"}]
NOTEBOOKS = [f"restored-{i}.ipynb" for i in range(6)]

# Every dialog the page ever shows, with its title, and the most on screen at once: counted by the
# page itself, so that none shown and closed between two checks is missed.
RECORD_DIALOGS = """() => {
  window.__dialogs = []; window.__maxDialogs = 0;
  const seen = () => {
    const now = document.querySelectorAll('.jp-Dialog');
    window.__maxDialogs = Math.max(window.__maxDialogs, now.length);
    for (const el of now) {
      if (!el.__counted) { el.__counted = {title: ''}; window.__dialogs.push(el.__counted); }
      const header = el.querySelector('.jp-Dialog-header');
      if (header && header.textContent.trim()) { el.__counted.title = header.textContent.trim(); }
    }
  };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
  seen();
}"""
DIALOG_TITLES = "() => window.__dialogs.map(d => d.title)"


def start(lab: LabServer, path: str, kernel: str) -> tuple[int, dict]:
    return lab.api("POST", "api/sessions", {"path": path, "type": "notebook", "name": path,
                                            "kernel": {"name": kernel}})


def test_after_a_restart_restored_tabs_show_one_dialog_and_the_story_says_the_kernels_ended(
        page, artifacts, tmp_path):
    lab = LabServer(tmp_path, pool={"policy": POLICY, "default_user_quota": {"memory": "80GiB", "kernels": 6}},
                    extension={"cull_interval": 1.0})
    lab.notebooks.mkdir(parents=True)
    for name in NOTEBOOKS:
        lab.write_notebook(name, "gpu-pool-gpu-10g", ["x = 42"])
    lab.start()
    try:
        # Six tabs open, each with its GPU kernel (10 GiB each; 60 of the pool's 80 GiB).
        page.goto(lab.lab_url(f"lab/tree/{NOTEBOOKS[0]}", workspace="restored"))
        page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)
        for name in NOTEBOOKS[1:]:
            command(page, "docmanager:open", {"path": name})
        status = page.locator("button.jp-GpuPool-status")
        expect(status).to_have_text("GPU kernels: 6 / 6", timeout=120_000)
        # One of them hibernated: before this fix, the story still said its variables "are kept".
        sleeper = next(k for k in lab.me()["kernels"] if k["name"] == NOTEBOOKS[1])
        code, body = lab.api("POST", f"gpu-pool/api/v1/kernels/{sleeper['kernel_id']}/hibernate", {})
        assert code == 202, body
        wait_for(lambda: any(k["state"] == "hibernated" for k in lab.me()["kernels"]), 60, "the hibernation")
        page.wait_for_timeout(3000)  # the workspace (its six tabs) is saved as it changes

        # The server stops and comes back, now with room for one kernel: five of six restored tabs are refused.
        # Stopped as a service manager or JupyterHub stops it (SIGTERM: jupyter_server shuts its kernels
        # down; a ^C without a terminal, LabServer.stop's, skips its clean-up altogether).
        lab.proc.send_signal(signal.SIGTERM)
        lab.proc.wait(timeout=90)
        lab.stop()
        lab.pool_settings["default_user_quota"] = {"memory": "80GiB", "kernels": 1}
        lab.start()
        me = lab.me()
        ended = {r["kernel_id"]: r for r in me["recent"] if r["kind"] == "released"}
        assert len(ended) == 6 and all(r["reason"] == "server_stopped" and r["with_server"] for r in ended.values())
        assert sleeper["kernel_id"] in ended

        page.add_init_script(f"window.addEventListener('DOMContentLoaded', {RECORD_DIALOGS});")
        page.goto(lab.lab_url("lab/workspaces/restored"))  # the same workspace: its six tabs come back
        expect(page.locator(".jp-NotebookPanel")).to_have_count(6, timeout=120_000)
        expect(status).to_have_text("GPU kernels: 1 / 1", timeout=120_000)
        wait_for(lambda: sum(r["kind"] == "refused" for r in lab.me()["recent"]) >= 5, 90, "five refused starts")
        page.wait_for_timeout(5000)  # any dialog still coming would come now
        titles = page.evaluate(DIALOG_TITLES)
        assert titles == ["Error Starting Kernel"], titles  # one, not five
        assert page.evaluate("() => window.__maxDialogs") == 1
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("you hold 1 GPU kernel, as many as your quota allows")
        shoot(page, artifacts, "30-restored-tabs-one-dialog", small=False)
        dialog.get_by_role("button", name="Ok").click()
        expect(dialog).to_have_count(0)
        page.wait_for_timeout(2000)  # nor a "Select Kernel" for each refused tab after it
        assert page.locator(".jp-Dialog").count() == 0
        assert page.evaluate(DIALOG_TITLES) == ["Error Starting Kernel"]

        # "What happened": the six kernels ended when the server stopped; none is said to be kept.
        command(page, "gpu-pool:open-panel")
        history = page.locator("#jp-gpu-pool-panel .jp-GpuPool-history")
        expect(history).to_be_visible()
        history.locator("details summary").click()
        said = history.locator("li", has_text="Ended when the server stopped; its variables are gone.")
        expect(said).to_have_count(6)
        # The hibernated one too (its refused restart, named since refusals carry the notebook, comes after).
        expect(said.filter(has_text=NOTEBOOKS[1])).to_have_count(1)
        assert_accessible(page, "the story after a restart", include=["#jp-gpu-pool-panel", ".Toastify__toast"])
        said.filter(has_text=NOTEBOOKS[1]).scroll_into_view_if_needed()
        shoot(page, artifacts, "31-restart-story", small=False)
    finally:
        lab.stop()
        lab.copy_log(artifacts / "restart.server.log")


def test_the_dashboards_plots_agree_with_its_table(page, artifacts, tmp_path):
    profiles = {**DEMO_PROFILES, "gpu-whole": {"slice": "whole", "display_name": "GPU whole",
                                               "description": "A whole GPU"}}
    lab = LabServer(tmp_path, pool={"policy": POLICY, "profiles": profiles,
                                    "default_user_quota": {"memory": "80GiB", "kernels": 4}},
                    extension={"cull_interval": 1.0, "telemetry_interval": 1.0})
    lab.start()
    try:
        ids = {}
        for path, kernel in (("sleepy.ipynb", "gpu-pool-gpu-10g"), ("done.ipynb", "gpu-pool-gpu-10g"),
                             ("whole.ipynb", "gpu-pool-gpu-whole")):
            code, body = start(lab, path, kernel)
            assert code == 201, body
            ids[path] = body
        time.sleep(20)  # held for a while: a band the plot can show
        code, body = lab.api("POST", f"gpu-pool/api/v1/kernels/{ids['sleepy.ipynb']['kernel']['id']}/hibernate", {})
        assert code == 202, body
        time.sleep(10)
        code, _ = lab.api("DELETE", f"api/sessions/{ids['done.ipynb']['id']}")
        assert code == 204
        wait_for(lambda: {k["state"] for k in lab.me()["kernels"]} == {"active", "hibernated"}, 60,
                 "one hibernated, one ended")

        page.goto(lab.lab_url("lab", workspace="plots"))
        expect(page.locator("button.jp-GpuPool-status")).to_have_text("GPU mem: 40 / 80 GiB", timeout=120_000)
        command(page, "gpu-pool:open-panel")
        # The dashboard as the main area's only tab: it reads the pool all the same (it once waited for
        # a "shown" that never comes to a tab that was never hidden).
        page.get_by_role("button", name="Open the pool dashboard").click()
        dash = page.locator(".jp-GpuPool-dashboardWidget")
        whole_gpu = next(k["gpus"][0]["uuid"] for k in lab.me()["kernels"] if k["name"] == "whole.ipynb")
        # The table: the whole GPU's 40 of 40 GiB held. Its plot: the same 40 GiB, not 0.
        expect(dash.locator(f'tr[data-gpu="{whole_gpu}"]')).to_contain_text("40 GiB of 40 GiB held", timeout=60_000)
        whole_plots = dash.locator(f'.jp-GpuPool-gpuPlots[data-gpu="{whole_gpu}"]')
        expect(whole_plots.get_by_role("img", name=re.compile(r"memory by kernel \(GiB\): .*whole\.ipynb 40 GiB$"))
               ).to_be_visible(timeout=30_000)
        # The other GPU: nothing held now (its table row), yet both kernels stay in its history, each
        # at 0 from when it hibernated or ended; the legend says which.
        other = dash.locator(f'.jp-GpuPool-gpuPlots:not([data-gpu="{whole_gpu}"])')
        legend = other.locator("figure.jp-GpuPool-chart").first.locator("table.jp-GpuPool-legend tr")
        expect(legend).to_have_count(2, timeout=30_000)
        expect(legend.filter(has_text="sleepy.ipynb (hibernated)")).to_contain_text("–")
        expect(legend.filter(has_text="done.ipynb (ended)")).to_contain_text("–")
        page.wait_for_timeout(4000)  # polls later: still there, the figures unchanged
        expect(legend).to_have_count(2)
        points = other.locator("figure.jp-GpuPool-chart").first.get_attribute("data-points")
        assert int(points) >= 4, points  # each one's take, its drop to 0, and now
        assert_accessible(page, "the dashboard's plots", include=[".jp-GpuPool-dashboardWidget"])
        shoot(page, artifacts, "33-plots-agree-with-table", small=False)
    finally:
        lab.stop()
        lab.copy_log(artifacts / "plots.server.log")
