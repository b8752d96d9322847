"""A long session stays calm and true, in real headless Chromium against a real server and real kernels.

An hour of a user's activity compressed into minutes on one server (short idle rules): warnings,
a hibernation and a wake, refusals in a row (five of five profiles, then five of one), a shutdown and
a new kernel, a question after a double click, a rename, and the server stopping and starting again.
At every step the page shows at most three of the pool's toasts (counted by the page itself, so
that none between two checks is missed), each toast names the fact it stands for and that fact
holds by the server's own answer (GET me) at that moment, and no toast covers a button of the GPU
panel (element geometry). Whatever needs nobody now (a hibernation, a wake, the queue, a Keep alive)
goes to "What happened" and the notification centre without a toast. And a resume the user asked
for is not followed at once by a new warning.
Screenshots (1400×900 and 1024×700): ``test-artifacts/browser/``.
"""

from __future__ import annotations

import re
import time

import pytest
from browser_helpers import (
    assert_accessible,
    command,
    open_notebook,
    overlap,
    pushed_actions,
    run_cell,
    set_theme,
    shoot,
    toast,
    wait_for,
)
from lab_server import DEMO_PROFILES, LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

IDLE, WARN = 24, 12
PROFILES = {**DEMO_PROFILES,
            "gpu-5g": {"slice": "5GiB", "isolation": "soft", "display_name": "GPU 5 GiB"},
            "gpu-15g": {"slice": "15GiB", "isolation": "soft", "display_name": "GPU 15 GiB"}}
RULE = {"idle_timeout": f"{IDLE}s", "warn": f"{WARN}s", "gpu_idle_timeout": None, "max_hibernated": None,
        "max_snoozes": 1, "snooze": "20s"}
POLICY = [
    {"name": "nap", "match": {"profile": "gpu-10g"}, **RULE, "action": "hibernate"},
    {"name": "short", "match": {"profile": "gpu-5g"}, **RULE, "action": "shutdown"},
    # item 1: a kernel idle long enough before its Resume would be warned at once by an idle clock
    # that counts from its last cell
    {"name": "asked", "match": {"profile": "gpu-15g"}, **RULE, "idle_timeout": "30s", "warn": "10s",
     "action": "hibernate"},
]
QUOTA = {"memory": "80GiB", "kernels": 3}

# Every toast the page ever shows (by its notification id: its text and the fact it names), and the
# most on the page at once, a leaving one included: counted by the page itself.
RECORD_TOASTS = """() => {
  window.__toasts = {}; window.__maxOnPage = 0;
  const seen = () => {
    const now = document.querySelectorAll('.Toastify__toast-container .Toastify__toast');
    window.__maxOnPage = Math.max(window.__maxOnPage, now.length);
    for (const el of now) {
      const t = window.__toasts[el.id] || (window.__toasts[el.id] = {text: '', fact: ''});
      t.text = el.textContent; t.fact = el.dataset.gpuPoolFact || t.fact;
    }
  };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                     attributeFilter: ['data-gpu-pool-fact']});
  seen();
}"""
TOASTS_NOW = """() => [...document.querySelectorAll('.Toastify__toast-container .Toastify__toast')]
  .filter(el => !el.className.includes('exit'))
  .map(el => ({id: el.id, text: el.textContent, fact: el.dataset.gpuPoolFact || ''}))"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(tmp_path_factory.mktemp("session"),
                       pool={"policy": POLICY, "profiles": PROFILES, "default_user_quota": QUOTA},
                       extension={"cull_interval": 1.0, "telemetry_interval": 1.0})
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "session.server.log")


def start(lab: LabServer, path: str, kernel: str) -> tuple[int, dict]:
    return lab.api("POST", "api/sessions", {"path": path, "type": "notebook", "name": path,
                                            "kernel": {"name": kernel}})


class Session:
    """What the test knows of the user's session, to judge each toast against the server's answer."""

    def __init__(self, lab: LabServer, page):
        self.lab, self.page = lab, page
        self.names: dict[str, str] = {}  # kernel id -> its notebook, as the test started it
        self.ran: set[str] = set()  # kernels on which a cell ran

    def holds(self, fact: str, text: str, me: dict) -> str | None:
        """None where the toast's fact holds by ``me``; else why not."""
        kind, kernel_id = (fact.split(":") + ["", ""])[:2]
        kernels = {k["kernel_id"]: k for k in me["kernels"]}
        k = kernels.get(kernel_id)
        if kind == "warning":
            deadline = float(fact.split(":")[2])
            w = (k or {}).get("warning")
            if not w or abs(w["deadline"] - deadline) > 1 or w["deadline"] <= me["now"] - 1:
                return f"no such warning now ({w})"
            return None
        if kind in ("culled", "released", "reclaimed"):
            name = self.names.get(kernel_id, "")
            if k is not None:
                return "the kernel is alive"
            if name and any(o["name"] == name for o in me["kernels"]):
                return f"{name} has a new kernel"
            return None
        if kind == "new_kernel":
            return "a cell ran on the new kernel" if kernel_id in self.ran else None
        if kind == "refused":
            held = re.search(r"You hold (\d+) of (\d+) GPU kernels", text)
            if held and int(held.group(1)) != me["usage"]["kernels"]:
                return f"the user holds {me['usage']['kernels']} kernels now"
            starts = re.search(r"‘([^’]+)’ would start now", text)
            if starts and not any(p["launcher_name"] == starts.group(1) and p["starts_now"]
                                  for p in me.get("profiles", [])):
                return f"{starts.group(1)} would not start now"
            return None
        if kind in ("action_failed", "kernel_error"):
            return None
        return f"a toast for {kind}, which needs nobody now"

    def check(self, step: str, panel_open: bool = True, grace: float = 6.0) -> list[dict]:
        """At most three toasts; each names its fact, which holds now (within ``grace``: a poll and
        its rendering); none over a button of the GPU panel."""
        deadline = time.monotonic() + grace
        while True:
            toasts = self.page.evaluate(TOASTS_NOW)
            me = self.lab.me()
            wrong = [(t["text"][:90], t["fact"], self.holds(t["fact"], t["text"], me) if t["fact"] else "no fact")
                     for t in toasts]
            wrong = [w for w in wrong if w[2]]
            if not wrong or time.monotonic() > deadline:
                break
            self.page.wait_for_timeout(500)
        assert not wrong, f"{step}: toasts whose fact does not hold: {wrong}"
        assert len(toasts) <= 3, f"{step}: {len(toasts)} toasts"
        assert self.page.evaluate("() => window.__maxOnPage") <= 3, f"{step}: more than three toasts at once"
        if panel_open:
            self.assert_clear_of_panel(step)
        return toasts

    def assert_clear_of_panel(self, step: str) -> None:
        buttons = [b.bounding_box() for b in self.page.locator("#jp-gpu-pool-panel button").all() if b.is_visible()]
        assert buttons, f"{step}: the panel shows no button"
        for t in self.page.locator(".Toastify__toast-container .Toastify__toast").all():
            box = t.bounding_box()
            if box is None:
                continue
            covered = [b for b in buttons if b and overlap(box, b)]
            assert not covered, f"{step}: a toast over the panel's buttons: {box} {covered}"


def card_of(page, kernel_id: str):
    return page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kernel_id}"]')


def kernel_named(lab: LabServer, name: str) -> dict:
    return wait_for(lambda: next((k for k in lab.me()["kernels"] if k["name"] == name), None), 60,
                    f"{name}'s kernel")


def run_visible_cell(page, index: int) -> None:
    """Run a cell of the notebook in front (other notebooks' cells stay in the page, hidden)."""
    page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def visible_output(page, index: int):
    return page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(index).locator(".jp-OutputArea-output").first


def double_click_asks(page, button, artifacts, name: str) -> None:
    """A button that asks first, double-clicked: the question shows (the second click once closed it)."""
    button.dblclick()
    dialog = page.locator(".jp-Dialog.jp-GpuPool-dialog")
    expect(dialog).to_be_visible()
    page.wait_for_timeout(900)  # past the guard: still there, waiting for an answer
    expect(dialog).to_be_visible()
    shoot(page, artifacts, name, small=False)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)


def test_a_resume_the_user_asked_for_is_not_warned_at_once(lab, page):
    """Issue 28, item 1: the idle clock restarts at a resume the user asked for."""
    lab.write_notebook("asked.ipynb", "gpu-pool-gpu-15g", ["x = 15"])
    open_notebook(page, lab, "asked.ipynb")
    expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text(re.compile(r"^GPU \d \(declared\)$"),
                                                                      timeout=120_000)
    run_cell(page, 0)
    expect(page.locator(".jp-Cell").first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    last_cell = time.time()
    kernel_id = kernel_named(lab, "asked.ipynb")["kernel_id"]
    try:
        command(page, "gpu-pool:open-panel")
        card = card_of(page, kernel_id)
        card.get_by_role("button", name="Release GPU: asked.ipynb").click()
        expect(card.locator(".jp-GpuPool-stateLabel")).to_contain_text("hibernated:", timeout=60_000)
        # Idle for longer than the rule's warning leaves, counted from its last cell: then Resume.
        page.wait_for_timeout(max(0.0, last_cell + 22 - time.time()) * 1000)
        card.get_by_role("button", name="Resume: asked.ipynb").click()
        expect(card.locator(".jp-GpuPool-stateLabel")).to_contain_text("idle", timeout=60_000)
        resumed = time.time()
        # No new threat for as long as the rule's idle time minus its warning, from the resume on.
        while time.time() < resumed + 14:
            me = lab.me()
            [k] = [k for k in me["kernels"] if k["kernel_id"] == kernel_id]
            assert k["warning"] is None, f"warned {time.time() - resumed:.0f} s after the resume: {k['warning']}"
            assert k["state"] == "active"
            expect(card.locator(".jp-GpuPool-countdown")).to_have_count(0)
            expect(toast(page, "asked.ipynb’s kernel hibernates")).to_have_count(0)
            page.wait_for_timeout(1000)
    finally:
        lab.api("DELETE", f"api/kernels/{kernel_id}")


def test_the_same_refusal_five_times_is_one_toast_with_a_count(lab, page, artifacts):
    page.goto(lab.lab_url("lab", workspace="repeats"))
    status = page.locator("button.jp-GpuPool-status")
    expect(status).to_have_text(re.compile(r"^GPU mem"), timeout=120_000)
    page.evaluate(RECORD_TOASTS)
    wait_for(lambda: lab.me()["usage"]["kernels"] == 0, 30, "no kernel held")
    sessions = []
    try:
        for i in range(3):  # under the built-in rule (an hour): no warning meanwhile
            code, body = start(lab, f"holder-{i}.ipynb", "gpu-pool-gpu-20g")
            assert code == 201, body
            sessions.append(body["id"])
        expect(status).to_have_text("GPU kernels: 3 / 3", timeout=30_000)
        for i in range(5):
            code, _ = start(lab, f"again-{i}.ipynb", "gpu-pool-gpu-10g")
            assert code >= 400
        refusal = toast(page, "‘Python 3 · GPU 10 GiB’ could not start")
        expect(refusal).to_have_count(1, timeout=30_000)
        expect(refusal).to_contain_text(re.compile(r"shut one down first\. \(5 times\)"), timeout=30_000)
        page.wait_for_timeout(3500)  # a poll later: still one toast, still five
        expect(refusal).to_have_count(1)
        expect(refusal).to_contain_text("(5 times)")
        assert page.evaluate("() => window.__maxOnPage") == 1
        assert_accessible(page, "a counted toast", include=[".Toastify__toast"])
        shoot(page, artifacts, "32-toast-counted")
    finally:
        for session_id in sessions:
            lab.api("DELETE", f"api/sessions/{session_id}")


def test_an_hour_compressed_stays_calm_and_true(lab, page, artifacts):
    events = pushed_actions(page)
    session = Session(lab, page)
    lab.write_notebook("nap.ipynb", "gpu-pool-gpu-10g", ["x = 1", "print('x is', x)"])
    lab.write_notebook("short.ipynb", "gpu-pool-gpu-5g", ["y = 2", "print('y is', y)"])
    open_notebook(page, lab, "nap.ipynb", workspace="hour")
    page.evaluate(RECORD_TOASTS)
    indicator = page.locator(".jp-GpuPool-indicatorButton")
    expect(indicator).to_have_text(re.compile(r"^GPU \d \(declared\)$"), timeout=120_000)
    run_cell(page, 0)
    expect(page.locator(".jp-Cell").first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
    nap = kernel_named(lab, "nap.ipynb")["kernel_id"]
    session.names[nap] = "nap.ipynb"
    command(page, "gpu-pool:open-panel")
    nap_card = card_of(page, nap)
    expect(nap_card).to_be_visible()

    # Item 6: Shut down asks first; a double click shows the question (it once vanished unseen).
    double_click_asks(page, nap_card.get_by_role("button", name="Shut down: nap.ipynb"), artifacts,
                      "40-double-click-shut-down")
    assert lab.kernel_alive(nap)

    # A warning with a deadline: a toast, clear of the panel's buttons.
    warning = toast(page, "nap.ipynb’s kernel hibernates at")
    expect(warning).to_be_visible(timeout=(WARN + 30) * 1000)
    session.check("warned")
    shoot(page, artifacts, "41-warning-clear-of-the-panel")
    # Hibernated: the warning goes, and nothing pops up (What happened says it).
    expect(nap_card.locator(".jp-GpuPool-stateLabel")).to_contain_text("hibernated:", timeout=60_000)
    expect(warning).to_have_count(0, timeout=10_000)
    session.check("hibernated")
    expect(page.locator(".jp-GpuPool-recent li").first).to_contain_text(
        "Hibernated because it was idle too long; its variables are kept")

    # Three kernels fill the quota of three (nap, hibernated, still counts): an MPS one and another.
    code, body = start(lab, "mps.ipynb", "gpu-pool-gpu-20g-50")
    assert code == 201, body
    mps = body["kernel"]["id"]
    session.names[mps] = "mps.ipynb"
    code, filler = start(lab, "filler.ipynb", "gpu-pool-gpu-20g")
    assert code == 201, filler
    session.names[filler["kernel"]["id"]] = "filler.ipynb"
    status = page.locator("button.jp-GpuPool-status")
    expect(status).to_have_text("GPU kernels: 3 / 3", timeout=30_000)

    # Five refused starts of five profiles: five facts, three toasts, the rest in the centre.
    for i, profile in enumerate(("gpu-10g", "gpu-20g", "gpu-20g-50", "gpu-5g", "gpu-15g")):
        code, _ = start(lab, f"more-{i}.ipynb", f"gpu-pool-{profile}")
        assert code >= 400
    refusals = page.locator(".Toastify__toast-container .Toastify__toast", has_text="could not start")
    expect(refusals).to_have_count(3, timeout=30_000)
    expect(refusals.first).to_contain_text("You hold 3 of 3 GPU kernels: shut one down first.")
    session.check("five refusals")
    shoot(page, artifacts, "42-three-toasts-of-five")

    # Item 6 again: Release GPU on an MPS card (it cannot hibernate: it asks first).
    mps_card = card_of(page, mps)
    release = mps_card.get_by_role("button", name="Release GPU: mps.ipynb")
    expect(release).to_have_attribute("title", re.compile(r"a kernel on an NVIDIA MPS slice cannot hibernate\.$"))
    double_click_asks(page, release, artifacts, "43-double-click-release-mps")
    assert lab.kernel_alive(mps)

    # A kernel shut down elsewhere: "You hold 3 of 3 GPU kernels" is false now, so those toasts go.
    lab.api("DELETE", f"api/sessions/{filler['id']}")
    expect(status).to_have_text(re.compile(r"^GPU mem"), timeout=30_000)
    expect(refusals).to_have_count(0, timeout=10_000)
    session.check("the refusals' advice turned false")

    # short.ipynb: warned, then shut down (a loss of state), then a new kernel.
    command(page, "docmanager:open", {"path": "short.ipynb"})
    short_panel = page.locator(".jp-NotebookPanel:visible")
    expect(short_panel.locator(".jp-GpuPool-indicatorButton")).to_have_text(
        re.compile(r"^GPU \d \(declared\)$"), timeout=120_000)
    run_visible_cell(page, 0)
    short = kernel_named(lab, "short.ipynb")["kernel_id"]
    session.names[short] = "short.ipynb"
    session.ran.add(short)
    short_warning = toast(page, "short.ipynb’s kernel shuts down at")
    expect(short_warning).to_be_visible(timeout=(WARN + 30) * 1000)
    session.check("short warned")
    lost = toast(page, "short.ipynb’s kernel was shut down")
    expect(lost).to_be_visible(timeout=(IDLE + 30) * 1000)
    expect(short_warning).to_have_count(0)
    session.check("shut down")
    shoot(page, artifacts, "44-a-loss-of-state")
    # A new kernel: the loss is told, and Run all cells offered; never both at once.
    lost.get_by_role("button", name="Start a new kernel").click()
    prompt = toast(page, "A new kernel started for short.ipynb")
    expect(prompt).to_be_visible(timeout=60_000)
    expect(lost).to_have_count(0)
    new_short = wait_for(lambda: next((k["kernel_id"] for k in lab.me()["kernels"]
                                       if k["name"] == "short.ipynb" and k["kernel_id"] != short), None),
                         60, "short.ipynb's new kernel")
    session.names[new_short] = "short.ipynb"
    session.check("a new kernel")
    prompt.get_by_role("button", name="Run all cells").click()
    session.ran.add(new_short)
    expect(visible_output(page, 1)).to_have_text("y is 2", timeout=60_000)
    expect(prompt).to_have_count(0)
    session.check("cells run again")

    # The wake of a hibernated kernel by a cell: no toast (the cell says it, What happened too).
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="nap.ipynb").click()
    run_visible_cell(page, 1)
    expect(visible_output(page, 1)).to_have_text("x is 1", timeout=60_000)
    session.ran.add(nap)
    expect(nap_card.locator(".jp-GpuPool-stateLabel")).to_contain_text("idle", timeout=30_000)
    session.check("woken by a cell")
    assert not [t for t in page.evaluate("() => Object.values(window.__toasts)")
                if re.search(r"hibernated|resumed|waits for a GPU|kept alive", t["text"])], \
        "a toast for what needed nobody"

    # A rename: the card follows; no toast about it.
    command(page, "docmanager:rename")
    dialog = page.locator(".jp-Dialog")
    dialog.locator("input").fill("renamed.ipynb")
    dialog.get_by_role("button", name="Rename").click()
    expect(nap_card.locator(".jp-GpuPool-cardTitle")).to_contain_text("renamed.ipynb", timeout=15_000)
    session.names[nap] = "renamed.ipynb"
    session.check("renamed")

    # The server stops: the status bar and the panel say the pool cannot be reached, greyed.
    lab.stop()
    expect(status).to_have_text("GPU pool unreachable", timeout=45_000)
    expect(status).to_have_class(re.compile(r"\bjp-mod-lost\b"))
    expect(status).to_have_attribute("title", re.compile(
        r"^The GPU pool cannot be reached: the server has not answered since \d\d:\d\d\. Is Jupyter still running\?"))
    line = page.locator("#jp-gpu-pool-panel .jp-GpuPool-unreachable")
    expect(line).to_contain_text("The GPU pool cannot be reached")
    assert page.locator("#jp-gpu-pool-panel .jp-GpuPool-stale").evaluate(
        "el => getComputedStyle(el).filter") == "grayscale(1)"
    assert_accessible(page, "the pool unreachable", include=[".jp-GpuPool-statusItem", "#jp-gpu-pool-panel"])
    shoot(page, artifacts, "21-server-gone")

    # It starts again: the figures come back; each kernel ended with it, a loss told for each (three
    # toasts at most), none of them shown a second time.
    lab.start()
    expect(status).not_to_have_class(re.compile(r"\bjp-mod-lost\b"), timeout=90_000)
    expect(line).to_have_count(0)
    ended = page.locator(".Toastify__toast-container .Toastify__toast", has_text="ended when the server stopped")
    expect(ended.first).to_be_visible(timeout=30_000)
    session.check("after the restart")
    shoot(page, artifacts, "45-after-the-restart")
    record = page.evaluate("() => window.__toasts")
    assert all(t["fact"] for t in record.values()), record  # each toast named its fact
    assert page.evaluate("() => window.__maxOnPage") <= 3
    assert any(e["action"] == "refused" for e in events)

    # Gone again, in JupyterLab Dark (a theme is a setting the server stores: chosen while it runs).
    # The last test of this module: the server stays stopped.
    set_theme(page, "JupyterLab Dark")
    lab.stop()
    expect(status).to_have_text("GPU pool unreachable", timeout=45_000)
    assert_accessible(page, "the pool unreachable, dark theme",
                      include=[".jp-GpuPool-statusItem", "#jp-gpu-pool-panel"])
    shoot(page, artifacts, "21-server-gone-dark", small=False)
