"""A GPU kernel started over the REST API with no browser attached (a script, a hub's API), in real
headless Chromium against a real server and a real kernel: its card in the GPU panel shows the kernel's
own state, idle, and not "starting" for ever; the page opens no connection to the kernel to get there.
Declared GPUs.  Screenshot: ``test-artifacts/browser/``.
"""

from __future__ import annotations

import re

import pytest
from browser_helpers import command, shoot
from lab_server import LabServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    server = LabServer(tmp_path_factory.mktemp("rest-kernel"), pool={}, extension={"cull_interval": 5.0})
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "rest-kernel.server.log")


def test_a_kernel_started_over_rest_shows_idle_on_its_card_not_starting(lab, page, artifacts):
    status, kernel = lab.api("POST", "api/kernels", {"name": "gpu-pool-gpu-10g"})
    assert status == 201, kernel
    kid = kernel["id"]
    assert kernel["execution_state"] == "starting"  # jupyter_server's word until a client talks to it

    page.goto(lab.lab_url("lab", workspace="rest-kernel"))
    expect(page.locator("button.jp-GpuPool-status")).to_be_visible(timeout=120_000)
    command(page, "gpu-pool:open-panel")
    card = page.locator(f'section.jp-GpuPool-card[data-kernel-id="{kid}"]')
    label = card.locator(".jp-GpuPool-stateLabel")
    expect(label).to_have_text(re.compile(r"^idle"), timeout=30_000)
    page.wait_for_timeout(4000)  # a poll later: it stays idle
    expect(label).to_have_text(re.compile(r"^idle"))
    shoot(page, artifacts, "rest-kernel-card")

    status, now = lab.api("GET", f"api/kernels/{kid}")
    assert status == 200 and now["execution_state"] == "idle"
    assert now["connections"] == 0  # no browser attached: the page never opened the kernel
