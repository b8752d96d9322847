"""Helpers of the browser tests: driving JupyterLab, waiting, contrast, axe-core, screenshots, and
slices held by "another user's server" on the same ledger (the test process as their holder)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lab_server import LabServer

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.local.processes import identify
from jupyter_gpu_pool.pool import Lease, LeaseRequest, build_quota_book
from jupyter_gpu_pool.pool.profiles import parse_profile

AXE = Path(__file__).resolve().parents[2] / "labextension" / "node_modules" / "axe-core" / "axe.min.js"
SMALL = {"width": 1024, "height": 700}
LARGE = {"width": 1400, "height": 900}
# The product's own elements, where axe-core judges it (JupyterLab's own widgets are not ours to fix):
# the status item, the panel, the toolbar indicator, the dashboard, the annotated launcher cards, its
# confirm dialogs, and the notifications (the browser tests' servers show no toast but the pool's).
OURS = [".jp-GpuPool-statusItem", "#jp-gpu-pool-panel", ".jp-GpuPool-indicator", ".jp-GpuPool-dashboardWidget",
        ".jp-GpuPool-launcherCard", ".jp-GpuPool-dialog", ".Toastify__toast"]


def open_notebook(page, lab: LabServer, name: str, workspace: str | None = None) -> None:
    """Open the notebook in a workspace of its own, so that no other test's tabs come back."""
    page.goto(lab.lab_url(f"lab/tree/{name}", workspace=workspace or name.replace(".", "-")))
    page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)


def run_cell(page, index: int = 0) -> None:
    page.locator(".jp-Cell").nth(index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def cell_output(page, index: int):
    return page.locator(".jp-Cell").nth(index).locator(".jp-OutputArea-output")


def toast(page, text: str):
    return page.locator(".Toastify__toast", has_text=text)


def command(page, command_id: str, args: dict | None = None) -> None:
    """Run a JupyterLab command (its result, a widget, is not sent back)."""
    page.evaluate("([id, args]) => { void window.jupyterapp.commands.execute(id, args); }", [command_id, args or {}])


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_in_page(page, predicate, timeout: float, what: str):
    """Like wait_for, for conditions on browser events: Playwright delivers them (and ``pushed_actions``
    stamps them) only while it waits, so a wait that sleeps instead would stamp them late."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        page.wait_for_timeout(250)
    return value


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
    command(page, "apputils:change-theme", {"theme": theme})
    light = "true" if "Light" in theme else "false"
    page.locator(f'body[data-jp-theme-light="{light}"]').wait_for(state="attached")
    page.wait_for_timeout(800)


def axe_violations(page, include: list[str] | None = None) -> list[dict]:
    """Serious and critical axe-core violations in the product's own elements (axe-core, the npm
    package from labextension/node_modules, injected into the page)."""
    assert AXE.exists(), f"{AXE} is missing: cd labextension && jlpm install"
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    present = [s for s in (include or OURS) if page.locator(s).count()]
    assert present, "none of the product's elements is on the page"
    result = page.evaluate(
        """async (include) => {
          const r = await axe.run({ include: include.map(s => [s]) }, { resultTypes: ['violations'] });
          return r.violations.map(v => ({ id: v.id, impact: v.impact, help: v.help,
                                          nodes: v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary) }));
        }""",
        present,
    )
    return [v for v in result if v["impact"] in ("serious", "critical")]


def assert_accessible(page, what: str, include: list[str] | None = None) -> None:
    found = axe_violations(page, include)
    assert not found, f"axe-core ({what}): " + json.dumps(found, indent=1)


def overlap(a: dict | None, b: dict | None) -> bool:
    """Whether two bounding boxes (Playwright's) overlap."""
    assert a and b, (a, b)
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def one_line(locator) -> bool:
    """Whether an element's text sits on one line, uncut (no wrap, nothing hidden)."""
    return locator.evaluate("""el => {
        const r = document.createRange(); r.selectNodeContents(el);
        const lines = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
        return lines.size === 1 && el.scrollWidth <= el.clientWidth + 1;
    }""")


def shoot(page, artifacts: Path, name: str, small: bool = True) -> None:
    """Screenshots at 1400×900 and (``small``) 1024×700; each is looked at before it goes in the docs."""
    page.set_viewport_size(LARGE)
    page.wait_for_timeout(700)
    page.screenshot(path=str(artifacts / f"{name}.png"))
    if small:
        page.set_viewport_size(SMALL)
        page.wait_for_timeout(700)
        page.screenshot(path=str(artifacts / f"{name}-1024.png"))
        page.set_viewport_size(LARGE)
        page.wait_for_timeout(300)


def pushed_actions(page) -> list[dict]:
    """kernel-action events JupyterLab receives on its event stream (/api/events/subscribe), each with
    ``received``: when (this clock). Playwright hands frames over only while the test waits on it, so
    wait with ``wait_in_page`` where the time of arrival matters."""
    events: list[dict] = []

    def on_frame(payload) -> None:
        try:
            data = json.loads(payload)
        except (TypeError, ValueError):
            return
        if str(data.get("schema_id", "")).endswith("/events/kernel-action"):
            events.append({**data, "received": time.time()})

    page.on("websocket", lambda ws: "/api/events/subscribe" in ws.url and ws.on("framereceived", on_frame))
    return events


class OtherUser:
    """Slices held by another user's server on the same ledger file: this test process holds them,
    so the pool's reconcile keeps them as long as the test runs (and releases them after)."""

    def __init__(self, lab: LabServer, owner: str = "bob"):
        self.ledger = Ledger(lab.ledger)
        self.owner = owner
        self.profiles = lab.pool_settings["profiles"]
        self.leases: list[Lease] = []

    def hold(self, profile: str, label: str = "") -> Lease:
        holder = identify(os.getpid())
        request = LeaseRequest(owner=self.owner, kernel_id=f"{self.owner}-{len(self.leases)}-{time.time_ns()}",
                               profile=parse_profile(profile, self.profiles[profile]), label=label, manager=holder)
        lease = self.ledger.allocate(request, build_quota_book({}, {}, {}, {}))
        self.ledger.set_holder(lease.id, holder)
        self.leases.append(lease)
        return lease

    def release_all(self) -> None:
        for lease in self.leases:
            self.ledger.release(lease.id, "test done")
        self.leases = []
