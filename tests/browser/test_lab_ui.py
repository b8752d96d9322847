"""The JupyterLab extension in real headless Chromium against a real server and real kernels.

One server (``jupyter lab`` with this package installed) on a declared pool of two 40 GiB GPUs, a
quota of 40 GiB in 2 kernels and a short policy for the 10 GiB profile (warn after 15 s idle, shut
down after 30 s, one 25 s Keep alive). The tests open notebooks, run cells, and check what the user
reads at the moments that matter: the status bar, the panel's card, the warning and what is left to
do after the last Keep alive, the cull and its explanation (with "Start a new kernel", and no fresh
kernel started behind the user's back), refusals whose advice fits the limit hit, the keyboard, and
axe-core on the product's own elements in the light and the dark theme. Screenshots (1400×900 and
1024×700): ``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from browser_helpers import (
    LARGE,
    SMALL,
    OtherUser,
    assert_accessible,
    cell_output,
    command,
    contrast,
    one_line,
    open_notebook,
    overlap,
    pushed_actions,
    run_cell,
    set_theme,
    shoot,
    toast,
    wait_for,
    wait_in_page,
)
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

GiB = 1024**3
IDLE_TIMEOUT, WARN, SNOOZE = 30, 15, 25
# Only the 10 GiB profile: kernels of other profiles follow the built-in default rule (an hour), so
# no warning of theirs changes what a test sees.
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
        pool={"policy": POLICY, "default_user_quota": {"memory": "40GiB", "kernels": 2}},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0},
    )
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "lab.server.log")


def test_warning_last_keep_alive_then_cull_and_a_new_kernel(lab, page, artifacts):
    events = pushed_actions(page)
    lab.write_notebook("gpu-demo.ipynb", "gpu-pool-gpu-10g", [CELL, "print('still', x)"])
    open_notebook(page, lab, "gpu-demo.ipynb")

    # The notebook's kernel holds a 10 GiB slice: the toolbar says where (the kernel's name says which).
    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=120_000)
    expect(indicator).to_have_attribute("title", re.compile(r"holds no GPU memory, so hibernating it moves nothing"))
    run_cell(page, 0)
    expect(cell_output(page, 0).first).to_have_text(re.compile(r"slice 10GiB 42"), timeout=60_000)

    me = lab.me()
    assert [k["profile"] for k in me["kernels"]] == ["gpu-10g"]
    kernel_id = me["kernels"][0]["kernel_id"]

    # Status bar: "used / limit" with a label, as jupyter-resource-usage writes it.
    status = page.locator("button.jp-GpuPool-status")
    expect(status).to_have_text("GPU mem: 10 / 40 GiB")
    expect(status).to_have_class(re.compile(r"\bjp-mod-ok\b"))

    # Keyboard: the status item is a button; Enter opens the panel.
    status.focus()
    page.keyboard.press("Enter")
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')
    expect(card).to_be_visible()
    expect(card.locator(".jp-GpuPool-cardTitle")).to_have_text("gpu-demo.ipynb")
    expect(card.locator(".jp-GpuPool-profile")).to_have_text("GPU 10 GiB")
    expect(card.locator(".jp-GpuPool-state")).to_contain_text("idle since")
    # An idle card says when the policy will act; no Keep alive while nothing is pending.
    expect(card.locator(".jp-GpuPool-stateDetail")).to_have_text(
        re.compile(r"^will be shut down at \d\d:\d\d(:\d\d)? if still idle: its variables will be lost$"))
    expect(card.locator("button.jp-GpuPool-action")).to_have_text(["Release GPU", "Shut down"])
    expect(card.get_by_role("img", name=re.compile(r"^Memory: 10 GiB slice, no reading \(declared GPU\)$"))).to_be_visible()
    expect(page.get_by_role("meter", name=re.compile(r"^GPU memory: 10 GiB of 40 GiB"))).to_have_attribute(
        "aria-valuenow", "25")

    # The warning: whose kernel, an absolute time, what is lost, what to do; Keep alive on the card too.
    warning = toast(page, "shuts down at")
    expect(warning).to_be_visible(timeout=(WARN + 30) * 1000)
    expect(warning).to_contain_text(re.compile(
        r"gpu-demo\.ipynb’s kernel shuts down at \d\d:\d\d:\d\d \(idle too long\): its variables will be lost\. "
        r"Run a cell or Keep alive to keep it\."))
    expect(warning.get_by_role("button", name="Keep alive")).to_be_visible()
    countdown = card.locator(".jp-GpuPool-countdown")
    # under two minutes away: the time with its seconds
    expect(countdown).to_contain_text(re.compile(r"shuts down in 0:\d\d \(at \d\d:\d\d:\d\d\)"))
    expect(countdown).to_contain_text("Run a cell or Keep alive to keep it.")
    expect(card.locator("button.jp-GpuPool-action")).to_have_text(["Keep alive", "Release GPU", "Shut down"])
    expect(card.locator(".jp-GpuPool-stateDetail")).to_have_count(0)  # no stale line beside the countdown
    expect(status).to_have_class(re.compile(r"\bjp-mod-warning\b"))
    first_deadline = lab.me()["kernels"][0]["warning"]["deadline"]
    wait_in_page(page, lambda: any(e["action"] == "warned" and e["kernel_id"] == kernel_id for e in events),
                 timeout=10, what=f"a pushed 'warned' event (got {events})")
    for selector in ("button.jp-GpuPool-status .jp-GpuPool-statusText", ".jp-GpuPool-countdownWhy",
                     "button.jp-GpuPool-action.jp-mod-snooze"):
        assert contrast(page, selector) >= 4.5, selector
    assert_accessible(page, "a warned card and its notification, light theme")
    page.wait_for_timeout(1200)  # the toast's slide-in

    # At 1024×700: the toolbar keeps where the slice is, "declared" included, in sight (not in its
    # "…" menu); the notification leaves the warned card uncovered; no button's label wraps.
    page.set_viewport_size(SMALL)
    page.wait_for_timeout(1200)
    expect(indicator).to_be_visible()
    expect(indicator).to_have_text("GPU 0 (declared)")
    expect(page.locator(".jp-Toolbar-responsive-popup .jp-GpuPool-indicator")).to_have_count(0)
    expect(warning).to_be_visible()
    assert not overlap(card.bounding_box(), warning.bounding_box()), (card.bounding_box(), warning.bounding_box())
    for button in card.locator("button.jp-GpuPool-action").all():
        assert one_line(button), f"{button.text_content()!r} wraps at 1024 px"
    page.set_viewport_size(LARGE)
    shoot(page, artifacts, "01-warning")

    # The same in JupyterLab's dark theme: readable, and in the theme's colours.
    set_theme(page, "JupyterLab Dark")
    for selector in ("button.jp-GpuPool-status .jp-GpuPool-statusText", ".jp-GpuPool-countdownWhy",
                     ".jp-GpuPool-cardTitle button", ".jp-GpuPool-stateLabel", ".jp-GpuPool-meterText",
                     "button.jp-GpuPool-action.jp-mod-snooze", "button.jp-GpuPool-action.jp-mod-shutdown"):
        assert contrast(page, selector) >= 4.5, selector
    assert_accessible(page, "a warned card and its notification, dark theme")
    shoot(page, artifacts, "01-warning-dark", small=False)
    set_theme(page, "JupyterLab Light")

    # Keep alive spends the only snooze: the next warning says what the user can still do.
    warning.get_by_role("button", name="Keep alive").click()
    expect(countdown).to_have_count(0, timeout=10_000)
    expect(warning).to_have_count(0)  # its fact is over; what was done needs nobody: no toast
    expect(toast(page, "kept alive")).to_have_count(0)
    expect(card.locator(".jp-GpuPool-stateDetail")).to_contain_text(re.compile(r"kept alive until \d\d:\d\d"))
    last = toast(page, "Run a cell to keep it, or save your work.")
    expect(last).to_be_visible(timeout=(SNOOZE + 30) * 1000)
    expect(last).to_contain_text(re.compile(r"gpu-demo\.ipynb’s kernel shuts down at \d\d:\d\d"))
    expect(last.get_by_role("button", name="Keep alive")).to_have_count(0)
    expect(countdown).to_contain_text("Run a cell to keep it, or save your work.")
    expect(card.locator("button.jp-GpuPool-action")).to_have_text(["Release GPU", "Shut down"])
    expect(card.locator(".jp-GpuPool-stateDetail")).to_have_count(0)  # no "kept alive until" beside "shuts down in"
    assert time.time() > first_deadline and lab.kernel_alive(kernel_id)  # it outlived its first deadline
    page.wait_for_timeout(1200)
    shoot(page, artifacts, "02-last-warning")

    # Left alone, it is culled: the user is told plainly that the variables are gone, and offered a new kernel.
    explained = toast(page, "was shut down")
    expect(explained).to_be_visible(timeout=(SNOOZE + 60) * 1000)
    expect(explained).to_contain_text(
        "gpu-demo.ipynb’s kernel was shut down (idle too long): its variables are gone. Start a new kernel")
    expect(explained.get_by_role("button", name="Start a new kernel")).to_be_visible()
    wait_for(lambda: not lab.kernel_alive(kernel_id), timeout=30, what="the kernel to be gone")
    wait_in_page(page, lambda: any(e["action"] == "culled" and e["kernel_id"] == kernel_id for e in events),
                 timeout=10, what=f"a pushed 'culled' event (got {events})")
    expect(status).to_have_text("GPU mem: 0 / 40 GiB", timeout=15_000)
    expect(card).to_have_count(0)
    history = page.locator(".jp-GpuPool-recent li").first
    expect(history).to_contain_text("gpu-demo.ipynb")
    expect(history).to_contain_text("Shut down because it was idle too long; its variables are gone. Rule: demo.")
    expect(indicator).to_have_count(0)
    expect(page.locator(".jp-Toolbar-kernelName").first).to_have_text("No Kernel", timeout=15_000)
    page.wait_for_timeout(1200)
    shoot(page, artifacts, "03-culled")

    # The next Shift+Enter does not start a fresh kernel behind the user's back: JupyterLab asks.
    run_cell(page, 1)
    chooser = page.locator(".jp-Dialog", has_text="Select Kernel")
    expect(chooser).to_be_visible()
    assert [k["id"] for k in lab.api("GET", "api/kernels")[1]] == []
    chooser.get_by_role("button", name="No Kernel").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)

    # "Start a new kernel" starts one of the same kind, and says what it lacks.
    explained.get_by_role("button", name="Start a new kernel").click()
    restarted = toast(page, "A new kernel started for gpu-demo.ipynb")
    expect(restarted).to_contain_text("the variables from before the shutdown are gone")
    expect(restarted.get_by_role("button", name="Run all cells")).to_be_visible()
    expect(indicator).to_have_text("GPU 0 (declared)", timeout=60_000)
    [new] = lab.me()["kernels"]
    assert new["kernel_id"] != kernel_id and new["profile"] == "gpu-10g"
    restarted.get_by_role("button", name="Run all cells").click()
    expect(cell_output(page, 1).first).to_have_text("still 42", timeout=60_000)
    lab.api("DELETE", f"api/kernels/{new['kernel_id']}")


def test_refusals_say_what_fits_the_limit_hit(lab, page, artifacts):
    # Two kernels fill the 2-kernel quota: a third is refused, and a smaller profile would not help.
    holders = []
    for i in range(2):
        status, body = lab.api("POST", "api/sessions", {"path": f"holder-{i}.ipynb", "type": "notebook",
                                                        "name": f"holder-{i}.ipynb",
                                                        "kernel": {"name": "gpu-pool-gpu-20g"}})
        assert status == 201, body
        holders.append(body["id"])
    bob = OtherUser(lab)
    try:
        lab.write_notebook("one-more.ipynb", "gpu-pool-gpu-10g", [CELL])
        open_notebook(page, lab, "one-more.ipynb")
        refusal = toast(page, "could not start")
        expect(refusal).to_be_visible(timeout=60_000)
        expect(refusal).to_contain_text(
            "‘Python 3 · GPU 10 GiB’ could not start: your GPU quota is used up. "
            "You hold 2 of 2 GPU kernels: shut one down first.")
        expect(refusal).not_to_contain_text("smaller")
        expect(refusal.get_by_role("button", name="Open GPU panel")).to_be_visible()
        assert_accessible(page, "a refusal's notification", include=[".Toastify__toast"])
        # JupyterLab's own dialog carries the server's full message; marked as the pool's refusal,
        # it alone wraps its message (the extension's stylesheet changes no other dialog).
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Error Starting Kernel")
        expect(dialog).to_have_class(re.compile(r"\bjp-GpuPool-refusalDialog\b"))
        assert_accessible(page, "the refusal's dialog and notification",
                          include=[".jp-GpuPool-refusalDialog", ".Toastify__toast"])
        expect(dialog).to_contain_text(
            "GPU quota exceeded: you hold 2 GPU kernels, as many as your quota allows, so 'Python 3 · GPU 10 GiB' cannot start.")
        expect(dialog).to_contain_text("holder-0.ipynb (20 GiB, slice held for")
        box = dialog.locator(".jp-Dialog-body pre").first.bounding_box()
        assert box and box["width"] < 1000  # the message wraps inside the dialog instead of running off it
        status = page.locator("button.jp-GpuPool-status")
        expect(status).to_have_text("GPU kernels: 2 / 2")  # the limit reached is the kernel count
        expect(status).to_have_class(re.compile(r"\bjp-mod-near\b"))
        page.wait_for_timeout(1200)
        shoot(page, artifacts, "04-refused-kernels")
        dialog.get_by_role("button", name="Ok").click()
        # One dialog per refusal: no "Select Kernel" after it (the notebook stays without a kernel).
        page.wait_for_timeout(1500)
        expect(page.locator(".jp-Dialog")).to_have_count(0)
        for session_id in holders:
            lab.api("DELETE", f"api/sessions/{session_id}")
        holders = []
        for t in page.locator(".Toastify__toast button[aria-label='Hide notification']").all():
            t.click()

        # The pool: 10 GiB free on one GPU. A 20 GiB start is refused; the 10 GiB profile would start now.
        bob.hold("gpu-20g", "bobs-a.ipynb"), bob.hold("gpu-20g", "bobs-b.ipynb"), bob.hold("gpu-20g", "bobs-c.ipynb")
        bob.hold("gpu-10g", "bobs-d.ipynb")
        lab.write_notebook("big.ipynb", "gpu-pool-gpu-20g", [CELL])
        open_notebook(page, lab, "big.ipynb")
        refusal = toast(page, "‘Python 3 · GPU 20 GiB’ could not start")
        expect(refusal).to_be_visible(timeout=60_000)
        expect(refusal).to_contain_text("no GPU has room for it. ‘Python 3 · GPU 10 GiB’ would start now.")
        expect(refusal).not_to_contain_text("every GPU slice is taken")
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("The GPU pool is full for 'Python 3 · GPU 20 GiB' (20 GiB): the most free "
                                       "on one GPU is 10 GiB on GPU 1")
        expect(dialog).to_contain_text("'Python 3 · GPU 10 GiB' would start now.")
        expect(dialog).not_to_contain_text("bobs-")  # only the user's own kernels, by name
        page.wait_for_timeout(1200)
        shoot(page, artifacts, "05-refused-pool", small=False)

        # Escape closes the dialog; focus goes back where it was.
        page.keyboard.press("Escape")
        page.wait_for_timeout(1500)
        expect(page.locator(".jp-Dialog")).to_have_count(0)
    finally:
        bob.release_all()
        for session_id in holders:
            lab.api("DELETE", f"api/sessions/{session_id}")


def test_keyboard_palette_kernel_menu_and_dialog_focus(lab, page, artifacts):
    lab.write_notebook("keys.ipynb", "gpu-pool-gpu-20g", ["y = 1"])
    open_notebook(page, lab, "keys.ipynb")
    expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text("GPU 0 (declared)", timeout=120_000)
    kernel_id = lab.me()["kernels"][0]["kernel_id"]
    try:
        # The panel from the palette: the keyboard lands in it.
        page.keyboard.press("Control+Shift+C")
        palette = page.locator(".lm-CommandPalette-input")
        expect(palette).to_be_focused()
        palette.fill("GPU Pool Panel")
        page.keyboard.press("Enter")
        panel = page.locator("#jp-gpu-pool-panel")
        expect(panel).to_be_visible()
        page.wait_for_function("() => document.querySelector('#jp-gpu-pool-panel').contains(document.activeElement)")

        # The Kernel menu has the pool's commands for this notebook's kernel, enabled as they apply.
        page.locator(".jp-NotebookPanel .jp-Cell .jp-InputArea-editor").first.click()
        page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
        menu = page.locator(".lm-Menu")
        expect(menu.get_by_text("Release GPU Slice")).to_be_visible()
        expect(menu.locator(".lm-Menu-item", has_text="Release GPU Slice")).not_to_have_attribute(
            "aria-disabled", "true")
        expect(menu.locator(".lm-Menu-item", has_text="Keep GPU Kernel Alive")).to_have_attribute(
            "aria-disabled", "true")  # nothing pending
        expect(menu.locator(".lm-Menu-item", has_text="Resume GPU Kernel")).to_have_attribute(
            "aria-disabled", "true")  # not hibernated
        page.keyboard.press("Escape")
        page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
        expect(page.locator(".lm-Menu").get_by_text("GPU Pool Dashboard")).to_be_visible()
        page.keyboard.press("Escape")

        # A dialog returns the focus to the button that opened it when Escape closes it.
        command(page, "gpu-pool:open-panel")
        shut = page.get_by_role("button", name="Shut down: keys.ipynb")
        shut.click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("Shut down keys.ipynb? Its variables will be lost.")
        expect(dialog).to_have_class(re.compile(r"\bjp-GpuPool-dialog\b"))
        assert_accessible(page, "a confirm dialog", include=[".jp-GpuPool-dialog"])
        page.keyboard.press("Escape")
        expect(dialog).to_have_count(0)
        expect(shut).to_be_focused()
        assert lab.kernel_alive(kernel_id)
    finally:
        lab.api("DELETE", f"api/kernels/{kernel_id}")


def test_launcher_marks_gpu_kernels_and_explains_their_slices(lab, page, artifacts):
    page.goto(lab.lab_url("lab", workspace="launcher"))

    def card(name: str):
        return page.locator(".jp-LauncherCard[data-category='Notebook']",
                            has=page.locator(".jp-LauncherCard-label p", has_text=re.compile(f"^{re.escape(name)}$")))

    gpu = card("Python 3 · GPU 10 GiB")
    expect(gpu).to_have_class(re.compile(r"\bjp-GpuPool-launcherCard\b"), timeout=120_000)
    # The GPU badge is the kernelspec's logo; the plain kernel keeps its own.
    assert gpu.locator("img.jp-Launcher-kernelIcon").get_attribute("src").endswith("logo-svg.svg")
    plain = card("Python 3 (ipykernel)")
    expect(plain).not_to_have_class(re.compile(r"jp-GpuPool-launcherCard"))
    # The tooltip: the admin's description, what the slice means; the GPUs are declared: "(demo)".
    expect(gpu).to_have_attribute("title", re.compile(
        r"^For exploring and small models\nA slice of 10 GiB of GPU memory; the GPU’s compute is shared\.\n"
        r"Demo: the pool’s GPUs are declared"))
    expect(gpu.locator(".jp-GpuPool-launcherDemo")).to_have_text("(demo)")
    expect(plain.locator(".jp-GpuPool-launcherDemo")).to_have_count(0)
    # An SM share: "50%" is a share of the GPU's compute, enforced by MPS.
    mps = card("Python 3 · GPU 20 GiB · 50%")
    expect(mps).to_have_attribute("title", re.compile(
        r"^Half a GPU's compute, guaranteed\nA slice of 20 GiB of GPU memory and 50% of the GPU’s compute "
        r"\(its streaming multiprocessors\), enforced by NVIDIA MPS\.\n"
        r"It cannot hibernate \(NVIDIA MPS\): an idle kernel of this kind is shut down and loses its variables\. "
        r"Save your work\.\nDemo: the pool’s GPUs are declared"))
    expect(mps.locator(".jp-GpuPool-launcherDemo")).to_have_text("(demo)")
    # MPS clients cannot be checkpointed: the card itself says so, the others do not.
    expect(mps.locator(".jp-GpuPool-launcherNote")).to_have_text("cannot hibernate")
    expect(gpu.locator(".jp-GpuPool-launcherNote")).to_have_count(0)
    expect(gpu).not_to_have_attribute("title", re.compile("cannot hibernate"))
    expect(page.locator(".jp-LauncherCard[data-category='Notebook'].jp-GpuPool-launcherCard")).to_have_count(3)
    assert_accessible(page, "the launcher's GPU cards", include=[".jp-GpuPool-launcherCard"])
    set_theme(page, "JupyterLab Dark")
    assert_accessible(page, "the launcher's GPU cards, dark theme", include=[".jp-GpuPool-launcherCard"])
    set_theme(page, "JupyterLab Light")
    page.wait_for_timeout(800)
    page.screenshot(path=str(artifacts / "12-launcher.png"))


def test_details_long_name_busy_release_and_buttons_at_1024(lab, page, artifacts):
    """At 1024×700: a long notebook name ends in an ellipsis on its card (the path its tooltip),
    "Shut down" does not wrap, and Release GPU on a busy kernel says a computation is running."""
    name = "experiment-with-a-long-and-descriptive-notebook-name-2024.ipynb"
    lab.write_notebook(name, "gpu-pool-gpu-20g", ["import time\nfor _ in range(1200):\n    time.sleep(0.1)"])
    page.set_viewport_size(SMALL)
    open_notebook(page, lab, name, workspace="details")
    expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text(re.compile(r"^GPU \d \(declared\)$"),
                                                                      timeout=120_000)
    [kernel] = [k for k in lab.me()["kernels"] if k["name"].endswith(name)]
    try:
        run_cell(page, 0)
        command(page, "gpu-pool:open-panel")
        card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel["kernel_id"]}"]')
        expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text("running", timeout=30_000)
        title = card.locator(".jp-GpuPool-cardTitle button")
        expect(title).to_have_text(name)
        expect(title).to_have_attribute("title", f"Open {name}")
        assert title.evaluate("el => getComputedStyle(el).textOverflow === 'ellipsis' && el.scrollWidth > el.clientWidth")
        box, badge = card.bounding_box(), card.locator(".jp-GpuPool-profile").bounding_box()
        assert badge["x"] + badge["width"] <= box["x"] + box["width"], (badge, box)  # the profile stays on the card
        for button in card.locator("button.jp-GpuPool-action").all():
            assert one_line(button), f"{button.text_content()!r} wraps at 1024 px"

        card.get_by_role("button", name=f"Release GPU: {name}").click()
        dialog = page.locator(".jp-Dialog.jp-GpuPool-dialog")
        expect(dialog).to_contain_text(f"{name} is running a computation now. A busy kernel cannot hibernate")
        assert_accessible(page, "the Release dialog of a busy kernel")
        page.wait_for_timeout(500)
        page.screenshot(path=str(artifacts / "13-release-busy-1024.png"))
        page.keyboard.press("Escape")
        expect(dialog).to_have_count(0)
        assert lab.kernel_alive(kernel["kernel_id"])
    finally:
        lab.api("DELETE", f"api/kernels/{kernel['kernel_id']}")


def test_polling_pauses_while_the_tab_is_hidden(lab, page):
    """GET me every few seconds while the tab is visible, none while hidden; never counted as activity."""
    reads: list[tuple[float, str]] = []
    page.on("request", lambda r: "/gpu-pool/api/v1/me" in r.url and reads.append((time.monotonic(), r.url)))
    page.goto(lab.lab_url("lab", workspace="polling"))
    expect(page.locator("button.jp-GpuPool-status")).to_have_text(re.compile(r"^GPU mem: \d+ / 40 GiB"),
                                                                  timeout=120_000)
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


def test_settings_poll_interval_mute_and_hide_the_status_item(lab, page):
    """The Settings Editor's settings (schema/plugin.json) change what the extension does."""
    url = "lab/api/settings/jupyter-gpu-pool:plugin"
    status, body = lab.api("GET", url)
    assert status == 200 and body["schema"]["properties"]["pollInterval"]["default"] == 3
    status, body = lab.api("PUT", url, {"raw": json.dumps({"hideStatusItem": True, "pollInterval": 1,
                                                           "muteNotifications": True})})
    assert status == 204, body
    bob = OtherUser(lab)
    try:
        reads: list[float] = []
        page.on("request", lambda r: "/gpu-pool/api/v1/me" in r.url and reads.append(time.monotonic()))
        page.goto(lab.lab_url("lab", workspace="settings"))
        page.locator("#jp-gpu-pool-panel").wait_for(state="attached", timeout=120_000)
        page.wait_for_timeout(6000)
        expect(page.locator(".jp-GpuPool-statusItem")).to_be_hidden()
        recent = [t for t in reads if t > reads[-1] - 5]
        assert len(recent) >= 4, f"one read a second expected, got {len(recent)} in 5 s"
        # Muted: a refused start shows JupyterLab's dialog and the panel's history, no toast of the pool's.
        for i in range(4):
            bob.hold("gpu-20g", f"bobs-{i}.ipynb")
        lab.write_notebook("muted.ipynb", "gpu-pool-gpu-10g", [CELL])
        open_notebook(page, lab, "muted.ipynb", workspace="settings")
        expect(page.locator(".jp-Dialog")).to_contain_text("The GPU pool is full", timeout=60_000)
        page.locator(".jp-Dialog").get_by_role("button", name="Ok").click()
        command(page, "gpu-pool:open-panel")
        expect(page.locator(".jp-GpuPool-recent li").first).to_contain_text(
            "Could not start: no GPU has room for it.", timeout=30_000)
        expect(page.locator(".Toastify__toast")).to_have_count(0)
    finally:
        bob.release_all()
        lab.api("PUT", url, {"raw": "{}"})


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
        expect(panel.get_by_role("button", name="Open the pool dashboard")).to_have_count(0)
        if case == "pool misconfigured":
            page.locator(".jp-LauncherCard").first.wait_for()
            page.wait_for_timeout(500)
            page.screenshot(path=str(artifacts / "09-no-pool.png"))
    finally:
        server.stop()
