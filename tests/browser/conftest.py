"""Browser tests: real headless Chromium (Debian's /usr/bin/chromium) driving a real JupyterLab.

Playwright's sync API runs its own event loop, so pytest-jupyter's autouse loop
and in-process server cleanup are turned off here: these tests start
``jupyter lab`` as a subprocess (lab_server.py) and never use the in-process
server. Screenshots go to ``test-artifacts/browser/`` (git-ignored).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lab_server import CHECKOUT_BUILD

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
VIEWPORT = {"width": 1400, "height": 860}


@pytest.fixture
def jp_asyncio_loop():
    """No event loop of pytest-jupyter's here: Playwright's sync API brings its own."""
    yield None


@pytest.fixture
def jp_server_cleanup():
    """No in-process jupyter_server to clean up: the server is a subprocess."""
    yield


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """test-artifacts/browser/, emptied first so that every file in it comes from this run."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.iterdir():
        if old.is_file():
            old.unlink()
    return ARTIFACTS


def check_installed_build() -> None:
    """The server loads this checkout's build of the labextension (lab_server links it ahead of the
    environment's); without one, the environment's installed bundle."""
    installed = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyter-gpu-pool" / "package.json"
    if not (CHECKOUT_BUILD / "package.json").exists() and not installed.exists():
        pytest.fail(f"no build of the JupyterLab extension in this checkout nor in {sys.prefix}: "
                    "pip install -e . (needs Node.js), or jlpm build in labextension/")


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium per test module (Debian's build; Playwright downloads no browser)."""
    check_installed_build()
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Python Playwright is not installed (pip install playwright; never `playwright install`)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, request, artifacts):
    """A fresh browser context and page; on failure a screenshot named after the test is kept."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.console_messages = console  # type: ignore[attr-defined]
    yield page
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        try:
            page.screenshot(path=str(artifacts / f"FAILED-{request.node.name}.png"))
        except Exception:  # the page may be gone; the failure itself is what matters
            pass
        (artifacts / f"FAILED-{request.node.name}.console.txt").write_text("\n".join(console))
    context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
