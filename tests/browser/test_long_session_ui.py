"""A long session stays true, in real headless Chromium against a real server and real kernels.

Toasts: one per fact, withdrawn when the fact changes ("‘X’ would start now" once the pool filled
up), never shown again once closed or withdrawn, at most three on screen with the rest in
JupyterLab's notification centre, counted on screen over several polls. Then the server stops:
the status bar and the panel say the pool cannot be reached and grey the last figures.
Screenshots (1400×900 and 1024×700, light and dark): ``test-artifacts/browser/``.
"""

from __future__ import annotations

import re

import pytest
from browser_helpers import (
    OtherUser,
    assert_accessible,
    command,
    pushed_actions,
    set_theme,
    shoot,
    toast,
    wait_for,
    wait_in_page,
)
from lab_server import DEMO_PROFILES, LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

# Every toast element the page ever shows (by its notification id, with its text), and the most on
# screen at once: counted by the page itself, so that no toast shown between two checks is missed.
RECORD_TOASTS = """() => {
  window.__toasts = {}; window.__maxOnScreen = 0;
  const seen = () => {
    const now = document.querySelectorAll('.Toastify__toast');
    window.__maxOnScreen = Math.max(window.__maxOnScreen, now.length);
    for (const el of now) {
      const shown = window.__toasts[el.id] || (window.__toasts[el.id] = {text: el.textContent, appeared: 0});
      if (!el.__counted) { el.__counted = true; shown.appeared += 1; }
    }
  };
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true});
  seen();
}"""


def shown(page) -> dict:
    return page.evaluate("() => window.__toasts")


def centre_count(page) -> int:
    """How many notifications JupyterLab's notification centre holds (its status bar item says)."""
    text = page.locator(".jp-Notification-Status").inner_text().strip()
    return int(text) if text.isdigit() else 0


PROFILES = {**DEMO_PROFILES,
            "gpu-5g": {"slice": "5GiB", "isolation": "soft", "display_name": "GPU 5 GiB"},
            "gpu-15g": {"slice": "15GiB", "isolation": "soft", "display_name": "GPU 15 GiB"}}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(
        tmp_path_factory.mktemp("session"),
        # Five profiles: five refused starts of the user are five texts (identical ones share one toast).
        pool={"default_user_quota": {"memory": "40GiB", "kernels": 1}, "profiles": PROFILES},
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0},
    )
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "session.server.log")


def start(lab: LabServer, path: str, kernel: str) -> tuple[int, dict]:
    return lab.api("POST", "api/sessions", {"path": path, "type": "notebook", "name": path,
                                            "kernel": {"name": kernel}})


def test_toasts_one_per_fact_withdrawn_never_reshown_at_most_three(lab, page, artifacts):
    events = pushed_actions(page)
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(lab.lab_url("lab", workspace="session"))
    status = page.locator("button.jp-GpuPool-status")
    expect(status).to_have_text("GPU mem: 0 / 40 GiB", timeout=120_000)
    # The refusals below are pushed as events: the page must listen before they happen.
    wait_in_page(page, lambda: any("/api/events/subscribe" in u for u in sockets), 60, "the event stream")
    page.wait_for_timeout(1000)
    page.evaluate(RECORD_TOASTS)
    bob = OtherUser(lab)
    holders: list[str] = []
    try:
        # 10 GiB left on one GPU: a 20 GiB start is refused, and the 10 GiB profile would start now.
        for _ in range(3):
            bob.hold("gpu-20g", "bobs.ipynb")
        bob.hold("gpu-10g", "bobs-small.ipynb")
        code, _ = start(lab, "big.ipynb", "gpu-pool-gpu-20g")
        assert code >= 400
        wait_in_page(page, lambda: any(e.get("action") == "refused" for e in events), 30,
                     "the refusal's event")
        advice = toast(page, "‘Python 3 · GPU 20 GiB’ could not start")
        expect(advice).to_be_visible(timeout=60_000)
        expect(advice).to_contain_text(re.compile(r"‘Python 3 · GPU 10 GiB’ (or ‘[^’]+’ )?would start now\."))
        # The pool fills up: that advice is false now, so the toast goes (from the centre too).
        bob.hold("gpu-10g", "bobs-last.ipynb")
        expect(advice).to_have_count(0, timeout=30_000)
        assert centre_count(page) == 0
        bob.release_all()

        # The user holds their one kernel; five more starts (of five profiles) are refused: five facts,
        # five toasts, three on screen at most, all five in the notification centre.
        code, body = start(lab, "holder.ipynb", "gpu-pool-gpu-10g")
        assert code == 201, body
        holders.append(body["id"])
        expect(status).to_have_text("GPU kernels: 1 / 1", timeout=30_000)
        for i, profile in enumerate(("gpu-10g", "gpu-20g", "gpu-20g-50", "gpu-5g", "gpu-15g")):
            code, _ = start(lab, f"more-{i}.ipynb", f"gpu-pool-{profile}")
            assert code >= 400
        wait_for(lambda: centre_count(page) == 5, 60, "five notifications in the centre")
        on_screen = page.locator(".Toastify__toast")
        expect(on_screen).to_have_count(3)
        expect(on_screen.first).to_contain_text("You hold 1 of 1 GPU kernels: shut one down first.")
        page.wait_for_timeout(1000)
        shoot(page, artifacts, "20-toasts-at-most-three")

        # Closed by the user: it never comes back, through many polls and events.
        closed_id = on_screen.first.get_attribute("id")
        on_screen.first.get_by_role("button", name="Hide notification").click()
        expect(page.locator(f'[id="{closed_id}"]')).to_have_count(0)
        lab.api("GET", "gpu-pool/api/v1/me")
        page.wait_for_timeout(12_000)  # four polls of GET me
        assert page.locator(f'[id="{closed_id}"]').count() == 0
        record = shown(page)
        # One toast per fact: the withdrawn refusal and three of the five on screen, each once (none
        # reappeared); the other two went to the centre without a toast; never more than three.
        assert len(record) == 4, record
        assert all(t["appeared"] == 1 for t in record.values()), record
        assert page.evaluate("() => window.__maxOnScreen") <= 3
        assert centre_count(page) <= 5
        assert_accessible(page, "the refusal toasts", include=[".Toastify__toast"])
    finally:
        bob.release_all()
        for session_id in holders:
            lab.api("DELETE", f"api/sessions/{session_id}")


def test_server_stopped_says_the_pool_cannot_be_reached(lab, page, artifacts, tmp_path):
    server = LabServer(tmp_path, pool={"default_user_quota": {"memory": "40GiB", "kernels": 2}},
                       extension={"cull_interval": 1.0})
    server.start()
    try:
        code, body = start(server, "kept.ipynb", "gpu-pool-gpu-10g")
        assert code == 201, body
        page.goto(server.lab_url("lab", workspace="gone"))
        status = page.locator("button.jp-GpuPool-status")
        expect(status).to_have_text("GPU mem: 10 / 40 GiB", timeout=120_000)
        command(page, "gpu-pool:open-panel")
        card = page.locator("section.jp-GpuPool-card")
        expect(card).to_have_count(1)
        server.stop()
        # Two failed polls later: grey, and in words what happened and what to check.
        expect(status).to_have_text("GPU pool unreachable", timeout=45_000)
        expect(status).to_have_class(re.compile(r"\bjp-mod-lost\b"))
        expect(status).to_have_attribute("title", re.compile(
            r"^The GPU pool cannot be reached: the server has not answered since \d\d:\d\d\. "
            r"Is Jupyter still running\?"))
        line = page.locator("#jp-gpu-pool-panel .jp-GpuPool-unreachable")
        expect(line).to_contain_text("The GPU pool cannot be reached")
        expect(page.locator("#jp-gpu-pool-panel .jp-GpuPool-stale .jp-GpuPool-card")).to_have_count(1)
        assert page.locator("#jp-gpu-pool-panel .jp-GpuPool-stale").evaluate(
            "el => getComputedStyle(el).filter") == "grayscale(1)"
        assert_accessible(page, "the pool unreachable", include=[".jp-GpuPool-statusItem", "#jp-gpu-pool-panel"])
        shoot(page, artifacts, "21-server-gone")

        # The server is back: the figures come back, no longer grey (its kernels ended with it).
        server.start()
        expect(status).to_have_text("GPU mem: 0 / 40 GiB", timeout=90_000)
        expect(status).not_to_have_class(re.compile(r"\bjp-mod-lost\b"))
        expect(line).to_have_count(0)
        # The dark theme (a theme is a setting the server stores: chosen while it runs), then gone again.
        set_theme(page, "JupyterLab Dark")
        server.stop()
        expect(status).to_have_text("GPU pool unreachable", timeout=45_000)
        assert_accessible(page, "the pool unreachable, dark theme",
                          include=[".jp-GpuPool-statusItem", "#jp-gpu-pool-panel"])
        shoot(page, artifacts, "21-server-gone-dark", small=False)
    finally:
        server.stop()
        server.copy_log(artifacts / "gone.server.log")
