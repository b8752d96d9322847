"""The JupyterLab extension in real headless Chromium against a real server and real kernels.

One server (``jupyter lab`` with this package installed) on a declared pool of
two 40 GiB GPUs, a 40 GiB quota and a short policy (warn after 15 s idle, shut
down after 30 s, one 25 s snooze). The tests open a notebook on a GPU profile,
run a cell, and check what the user sees: the status bar, the panel card, the
warning with Keep alive, the kernel surviving, the cull and its explanation, a
quota refusal. Screenshots: ``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

GiB = 1024**3
IDLE_TIMEOUT, WARN, SNOOZE = 30, 15, 25
# Only the 10 GiB profile: the 20 GiB kernels that fill the quota in the refusal test follow the
# built-in default rule (an hour), so no warning of theirs changes what that test sees.
POLICY = [{
    "name": "demo",
    "match": {"profile": "gpu-10g"},
    "idle_timeout": f"{IDLE_TIMEOUT}s",
    "warn": f"{WARN}s",
    "snooze": f"{SNOOZE}s",
    "max_snoozes": 1,
    "action": "shutdown",
}]
CELL = "import os\nx = 41 + 1\nprint('slice', os.environ['JUPYTER_GPU_POOL_SLICE'], x)"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(
        tmp_path_factory.mktemp("lab"),
        pool={"policy": POLICY, "default_user_quota": {"memory": "40GiB", "kernels": 4}},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0},
    )
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "lab.server.log")


def open_notebook(page, lab: LabServer, name: str):
    """Open the notebook in a workspace of its own, so that no other test's tabs come back."""
    page.goto(lab.lab_url(f"lab/tree/{name}", workspace=name.replace(".", "-")))
    page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)


def run_first_cell(page) -> None:
    page.locator(".jp-Cell .jp-InputArea-editor").first.click()
    page.keyboard.press("Shift+Enter")


def toast(page, text: str):
    return page.locator(".Toastify__toast", has_text=text)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_in_page(page, predicate, timeout: float, what: str) -> None:
    """Like wait_for, for conditions on browser events: Playwright delivers them while it waits."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        page.wait_for_timeout(250)


def contrast(page, selector: str) -> float:
    """WCAG contrast ratio of an element's text colour against its (first opaque ancestor's) background."""
    return page.evaluate(
        """(sel) => {
          const el = document.querySelector(sel);
          const rgb = c => (c.match(/[\\d.]+/g) || []).map(Number);
          const lum = ([r, g, b]) => {
            const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
            return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
          };
          let bgEl = el, bg = null;
          while (bgEl) {
            const c = rgb(getComputedStyle(bgEl).backgroundColor);
            if (c.length >= 3 && (c.length === 3 || c[3] > 0.5)) { bg = c; break; }
            bgEl = bgEl.parentElement;
          }
          bg = bg || [255, 255, 255];
          const fg = rgb(getComputedStyle(el).color);
          const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
          return (a + 0.05) / (b + 0.05);
        }""",
        selector,
    )


def set_theme(page, theme: str) -> None:
    page.evaluate("t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme)
    light = "true" if "Light" in theme else "false"
    page.locator(f'body[data-jp-theme-light="{light}"]').wait_for(state="attached")
    page.wait_for_timeout(500)


def pushed_actions(page) -> list[dict]:
    """kernel-action events JupyterLab receives on its event stream (/api/events/subscribe)."""
    events: list[dict] = []

    def on_frame(payload) -> None:
        try:
            data = json.loads(payload)
        except (TypeError, ValueError):
            return
        if str(data.get("schema_id", "")).endswith("/events/kernel-action"):
            events.append(data)

    page.on("websocket", lambda ws: "/api/events/subscribe" in ws.url and ws.on("framereceived", on_frame))
    return events


def test_status_panel_warning_keep_alive_then_cull(lab, page, artifacts):
    events = pushed_actions(page)
    lab.write_notebook("gpu-demo.ipynb", "gpu-pool-gpu-10g", [CELL, "print('still', x)"])
    open_notebook(page, lab, "gpu-demo.ipynb")

    # The notebook's kernel holds a 10 GiB slice: the toolbar says which.
    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text(re.compile(r"^GPU 10 GiB · GPU \d$"), timeout=120_000)
    run_first_cell(page)
    expect(page.locator(".jp-OutputArea-output").first).to_have_text(re.compile(r"slice 10GiB 42"), timeout=60_000)

    me = lab.me()
    assert [k["profile"] for k in me["kernels"]] == ["gpu-10g"]
    kernel_id = me["kernels"][0]["kernel_id"]
    assert me["usage"]["memory"] == 10 * GiB

    # Status bar: use against quota (declared GPUs have no utilization reading, so no "· N%").
    status = page.locator("button.jp-GpuPool-status")
    expect(status).to_have_text("GPU 10/40 GiB")
    expect(status).to_have_class(re.compile(r"\bjp-mod-ok\b"))
    assert contrast(page, "button.jp-GpuPool-status .jp-GpuPool-statusText") >= 4.5

    # Keyboard: the status item is a button; Enter opens the panel.
    status.focus()
    page.keyboard.press("Enter")
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')
    expect(card).to_be_visible()
    expect(card.locator(".jp-GpuPool-cardTitle")).to_have_text("gpu-demo.ipynb")
    expect(card.locator(".jp-GpuPool-profile")).to_have_text("GPU 10 GiB")
    expect(card.locator(".jp-GpuPool-gpu")).to_contain_text("Demo GPU")
    expect(card.locator(".jp-GpuPool-state")).to_contain_text("idle since")
    expect(card.locator(".jp-GpuPool-meter").first).to_contain_text("10 GiB slice")
    expect(card.locator("button.jp-GpuPool-action")).to_have_text(["Keep alive", "Release GPU now", "Shut down"])
    expect(page.get_by_role("meter", name=re.compile(r"^GPU memory: 10 GiB of 40 GiB"))).to_be_visible()
    page.screenshot(path=str(artifacts / "01-running.png"))

    # The warning: a notification with Keep alive, a countdown on the card, the status bar turns.
    warning = toast(page, "shuts down at")
    expect(warning).to_be_visible(timeout=(WARN + 30) * 1000)
    expect(warning).to_contain_text("gpu-demo.ipynb shuts down at")
    expect(warning).to_contain_text("idle too long")
    expect(card.locator(".jp-GpuPool-countdown")).to_contain_text(re.compile(r"shuts down in \d:\d\d"))
    expect(status).to_have_class(re.compile(r"\bjp-mod-warning\b"))
    assert contrast(page, "button.jp-GpuPool-status .jp-GpuPool-statusText") >= 4.5
    assert contrast(page, ".jp-GpuPool-countdownWhy") >= 4.5
    assert contrast(page, "button.jp-GpuPool-action.jp-mod-snooze") >= 4.5
    deadline = lab.me()["kernels"][0]["warning"]["deadline"]
    wait_in_page(page, lambda: any(e["action"] == "warned" and e["kernel_id"] == kernel_id for e in events),
                 timeout=10, what=f"a pushed 'warned' event (got {events})")
    page.wait_for_timeout(1200)  # the toast's slide-in
    page.screenshot(path=str(artifacts / "02-warning.png"))

    # The same in JupyterLab's dark theme: readable, and in the theme's colours.
    set_theme(page, "JupyterLab Dark")
    for selector in ("button.jp-GpuPool-status .jp-GpuPool-statusText", ".jp-GpuPool-countdownWhy",
                     ".jp-GpuPool-cardTitle button", ".jp-GpuPool-state", ".jp-GpuPool-meterText",
                     "button.jp-GpuPool-action.jp-mod-snooze", "button.jp-GpuPool-action.jp-mod-shutdown"):
        assert contrast(page, selector) >= 4.5, selector
    page.screenshot(path=str(artifacts / "02-warning-dark.png"))
    set_theme(page, "JupyterLab Light")

    warning.get_by_role("button", name="Keep alive").click()
    expect(toast(page, "is kept alive")).to_be_visible(timeout=15_000)
    kept = lab.me()["kernels"][0]
    assert kept["warning"] is None
    assert kept["snoozed_until"] > deadline
    expect(card.locator(".jp-GpuPool-countdown")).to_have_count(0, timeout=10_000)
    expect(status).to_have_class(re.compile(r"\bjp-mod-ok\b"), timeout=10_000)
    expect(card.locator(".jp-GpuPool-state")).to_contain_text("kept alive until")
    page.wait_for_timeout(1200)  # the toasts' slide-out and slide-in
    page.screenshot(path=str(artifacts / "03-kept-alive.png"))

    # The kernel survives its old deadline, with its variables.
    wait_for(lambda: time.time() > deadline + 3, timeout=WARN + 30, what="the old deadline to pass")
    assert lab.kernel_alive(kernel_id)
    assert [k["kernel_id"] for k in lab.me()["kernels"]] == [kernel_id]
    page.locator(".jp-Cell").nth(1).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    expect(page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea-output")).to_have_text("still 42", timeout=30_000)

    # Then left alone it is culled, and the user is told what happened and why.
    explained = toast(page, "was shut down to free its GPU slice")
    expect(explained).to_be_visible(timeout=(IDLE_TIMEOUT + SNOOZE + 60) * 1000)
    expect(explained).to_contain_text("gpu-demo.ipynb was shut down to free its GPU slice (idle too long)")
    expect(explained).to_contain_text("Start a kernel again to go on")
    wait_for(lambda: not lab.kernel_alive(kernel_id), timeout=30, what="the kernel to be gone")
    wait_in_page(page, lambda: any(e["action"] == "culled" and e["kernel_id"] == kernel_id for e in events),
                 timeout=10, what=f"a pushed 'culled' event (got {events})")
    assert any(e["action"] == "snoozed" for e in events), events
    me = lab.me()
    assert me["kernels"] == [] and me["usage"]["memory"] == 0
    assert any(r["kind"] == "culled" and r["kernel_id"] == kernel_id for r in me["recent"])
    expect(status).to_have_text("GPU 0/40 GiB", timeout=15_000)
    expect(card).to_have_count(0)
    expect(page.locator(".jp-GpuPool-recent")).to_contain_text("gpu-demo.ipynb")
    expect(indicator).to_have_count(0)
    # JupyterLab itself no longer claims an idle kernel (the extension asked it to look).
    expect(page.locator(".jp-Toolbar-kernelName").first).to_have_text("No Kernel", timeout=15_000)
    page.wait_for_timeout(1200)
    page.screenshot(path=str(artifacts / "04-culled.png"))


def test_quota_refusal_says_what_to_do(lab, page, artifacts):
    # Two 20 GiB kernels fill the 40 GiB quota; the notebook's 10 GiB kernel is then refused.
    holders = []
    for i in range(2):
        status, body = lab.api("POST", "api/sessions", {"path": f"holder-{i}.ipynb", "type": "notebook",
                                                        "name": f"holder-{i}.ipynb",
                                                        "kernel": {"name": "gpu-pool-gpu-20g"}})
        assert status == 201, body
        holders.append(body["id"])
    try:
        lab.write_notebook("one-more.ipynb", "gpu-pool-gpu-10g", [CELL])
        open_notebook(page, lab, "one-more.ipynb")
        refusal = toast(page, "could not start")
        expect(refusal).to_be_visible(timeout=60_000)
        expect(refusal).to_contain_text("A GPU kernel could not start: your GPU quota is used up.")
        expect(refusal).to_contain_text("Release or shut down one of your GPU kernels")
        expect(refusal.get_by_role("button", name="Open GPU panel")).to_be_visible()
        # JupyterLab's own dialog carries the server's full message.
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Error Starting Kernel")
        expect(dialog).to_contain_text("you hold 40 GiB of 40 GiB")
        box = dialog.locator(".jp-Dialog-body pre").first.bounding_box()
        assert box and box["width"] < 1000  # the message wraps inside the dialog instead of running off it
        page.wait_for_timeout(1200)
        expect(page.locator("button.jp-GpuPool-status")).to_have_text("GPU 40/40 GiB")
        expect(page.locator("button.jp-GpuPool-status")).to_have_class(re.compile(r"\bjp-mod-near\b"))
        page.screenshot(path=str(artifacts / "05-refused.png"))

        # The pool's owner (an admin on a personal server) also sees the whole pool.
        dialog.get_by_role("button", name="Ok").click()
        # JupyterLab then offers its kernel selector; stay without a kernel.
        selector = page.locator(".jp-Dialog", has_text="Select Kernel")
        expect(selector).to_be_visible()
        selector.get_by_role("button", name="No Kernel").click()
        expect(page.locator(".jp-Dialog")).to_have_count(0)
        page.locator("button.jp-GpuPool-status").click()
        tab = page.get_by_role("tab", name="Whole pool")
        tab.click()
        expect(tab).to_have_attribute("aria-selected", "true")
        pool_view = page.locator(".jp-GpuPool-pool")
        expect(pool_view.locator(".jp-GpuPool-poolGpu")).to_have_count(2)
        expect(pool_view).to_contain_text("Demo GPU")
        expect(pool_view.locator(".jp-GpuPool-owner")).to_have_count(1)
        expect(pool_view.locator(".jp-GpuPool-owner li")).to_have_count(2)
        expect(pool_view).to_contain_text("holder-0.ipynb · gpu-20g · 20 GiB")
        expect(pool_view.locator(".jp-GpuPool-recent")).to_contain_text("refused")
        page.wait_for_timeout(500)
        page.screenshot(path=str(artifacts / "06-admin-pool.png"))
    finally:
        for session_id in holders:
            lab.api("DELETE", f"api/sessions/{session_id}")


def test_polling_pauses_while_the_tab_is_hidden(lab, page):
    """GET me every few seconds while the tab is visible, none while hidden; never counted as activity."""
    reads: list[tuple[float, str]] = []
    page.on("request", lambda r: "/gpu-pool/api/v1/me" in r.url and reads.append((time.monotonic(), r.url)))
    page.goto(lab.lab_url("lab", workspace="polling"))
    expect(page.locator("button.jp-GpuPool-status")).to_have_text(re.compile(r"^GPU \d+/40 GiB"), timeout=120_000)
    page.wait_for_timeout(7000)
    assert len(reads) >= 3, reads
    assert all("no_track_activity=1" in url for _, url in reads)

    page.evaluate("""() => {
        Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    hidden_at = time.monotonic()
    page.wait_for_timeout(12_000)
    # Lumino's Poll lingers one tick after the tab hides (JupyterLab's own polls do the same), then stops.
    after = [round(t - hidden_at, 2) for t, _ in reads if t > hidden_at]
    assert len(after) <= 1 and all(a < 5.0 for a in after), f"reads {after} s after hiding"

    page.evaluate("""() => {
        Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'visible'});
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    shown_at = time.monotonic()
    wait_in_page(page, lambda: any(t > shown_at for t, _ in reads), timeout=15,
                 what="polling to resume once the tab shows again")


@pytest.mark.parametrize("case", ["extension disabled", "pool misconfigured"])
def test_no_pool_reads_no_gpu_pool(case, tmp_path, page, artifacts):
    if case == "extension disabled":
        server = LabServer(tmp_path, pool={}, extension={},
                           server={"ServerApp": {"jpserver_extensions": {"jupyter_gpu_pool": False}}})
        why = "server extension is not enabled"
    else:
        server = LabServer(tmp_path, pool={"profiles": {"bad": {"slice": "lots"}}},
                           extension={"exit_on_config_error": False}, kernelspecs=False)
        why = "misconfigured"
    server.start()
    try:
        page.goto(server.lab_url("lab", workspace="nopool"))
        status = page.locator("button.jp-GpuPool-status")
        expect(status).to_have_text("no GPU pool", timeout=120_000)
        expect(status).to_have_class(re.compile(r"\bjp-mod-off\b"))
        assert why in status.get_attribute("title")
        status.click()
        panel = page.locator("#jp-gpu-pool-panel")
        expect(panel).to_contain_text(why)
        expect(panel.get_by_role("tab")).to_have_count(0)  # no pool view where there is no pool
        if case == "pool misconfigured":
            page.locator(".jp-LauncherCard").first.wait_for()
            page.wait_for_timeout(500)
            page.screenshot(path=str(artifacts / "07-no-pool.png"))
    finally:
        server.stop()


def test_card_draws_memory_and_utilization_readings(tmp_path, page, artifacts):
    """With readings (on a GPU machine NVML's; here a scripted source, see scripted_telemetry.py) the
    status bar adds utilization, the card's memory bar fills and the sparkline draws."""
    from scripted_telemetry import READINGS_ENV

    readings = tmp_path / "readings.json"
    server = LabServer(
        tmp_path / "lab", pool={},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0,
                   "telemetry_source_class": "scripted_telemetry.FileReadings"},
        env={READINGS_ENV: str(readings),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                          os.environ.get("PYTHONPATH")]))},
    )
    server.start()
    try:
        server.write_notebook("train.ipynb", "gpu-pool-gpu-10g", [CELL])
        open_notebook(page, server, "train.ipynb")
        expect(page.locator(".jp-GpuPool-indicatorButton")).to_be_visible(timeout=120_000)
        page.locator("button.jp-GpuPool-status").click()
        card = page.locator("section.jp-GpuPool-card")
        expect(card).to_be_visible()
        for i, utilization in enumerate([12, 35, 61, 88, 74, 52, 90, 67, 41, 58, 83, 37]):
            readings.write_text(json.dumps({"memory": (3 + (i % 3)) * GiB, "utilization": utilization}))
            page.wait_for_timeout(1000)
        readings.write_text(json.dumps({"memory": 3 * GiB, "utilization": 37}))
        page.wait_for_timeout(2500)
        expect(page.locator("button.jp-GpuPool-status")).to_have_text("GPU 10/40 GiB · 37%")
        memory = card.get_by_role("meter")
        expect(memory).to_have_attribute("aria-valuetext", "3 GiB of 10 GiB")
        expect(memory).to_have_attribute("aria-valuenow", "30")
        expect(card.locator(".jp-GpuPool-spark .jp-GpuPool-meterText")).to_have_text("37%")
        points = card.locator("polyline.jp-GpuPool-sparkLine").get_attribute("points").split()
        assert len(points) >= 8, points
        ys = {float(p.split(",")[1]) for p in points}
        assert len(ys) >= 5  # the line follows the readings, not a flat line
        expect(card.get_by_role("img")).to_have_attribute("aria-label", re.compile(r"37% now; last 5 min: min \d+%"))
        page.wait_for_timeout(500)
        page.screenshot(path=str(artifacts / "08-readings.png"))
    finally:
        server.stop()
