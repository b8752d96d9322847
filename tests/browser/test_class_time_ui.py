"""Class time in real Chromium, on one real JupyterLab with real kernels (declared GPUs, 2 x 40 GiB):

- the user is a member of "ML 101 lab" (10 GiB, open): the launcher and the status bar say "ML 101 lab:
  10 GiB reserved until HH:MM"; the panel lists it for them, and "Research block" (not theirs) as what is
  kept from them, calmly (no toast);
- with the rest of the pool held by another user, the user's new kernel borrows Research block's unused
  room and its card says so; when a member of Research block waits for room, the kernel is warned with
  the reservation's reason, a warning with a deadline: a toast in the catalogue's words with Release now
  and no Keep alive; at the deadline it hibernates (variables kept) and the toast goes;
- a cell on it then waits in the queue behind the member, and its card and the cell's notice show the
  queue's reason (the user goes first into their own class's room, after Research block's member);
- the admin's dashboard lists both reservations, draws them on the GPU timeline and shows the queue's
  reasons.

The other users are this test process on the same ledger (browser_helpers.OtherUser; the member's wait a
heartbeated place in the queue). Screenshots (1400×900 and 1024×700): ``test-artifacts/browser/``.
"""

from __future__ import annotations

import datetime as dt
import getpass
import re
import threading
import time

import pytest
from browser_helpers import (
    OtherUser,
    assert_accessible,
    cell_output,
    command,
    open_notebook,
    run_cell,
    shoot,
    toast,
    wait_for,
)
from lab_server import LabServer

from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import SliceSpec

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

expect = pytest.importorskip("playwright.sync_api").expect
expect.set_options(timeout=15_000)

GiB = 1024**3
USER = getpass.getuser()  # the personal server's owner: the browser's user, and the pool's admin
WARN = 8  # the rule's warning time: what a kernel giving reserved room back is warned at least
POLICY = [{"name": "lab", "idle_timeout": "600s", "warn": f"{WARN}s", "gpu_idle_timeout": None,
           "max_hibernated": None, "action": "hibernate", "slice_at": "start"}]


def moment(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def clock(t: float) -> str:
    """As the page writes a time of today (Chromium runs in this machine's time zone)."""
    return time.strftime("%H:%M", time.localtime(t))


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts):
    now = time.time()
    server = LabServer(
        tmp_path_factory.mktemp("class-time"),
        pool={
            "policy": POLICY,
            "group_members": {"ml101": [USER], "research": ["bob"]},
            "reservations": [
                # the user's class: open, its room theirs first
                {"name": "ML 101 lab", "groups": ["ml101"], "start": moment(now - 60), "end": moment(now + 7200),
                 "timezone": "UTC", "memory": "10GiB"},
                # someone else's: open a minute past its lead time, so others may borrow what it leaves
                {"name": "Research block", "groups": ["research"], "start": moment(now - 120),
                 "end": moment(now + 7200), "timezone": "UTC", "memory": "40GiB", "lead": "1m"},
            ],
        },
        extension={"cull_interval": 1.0, "telemetry_interval": 1.0},
    )
    server.ends = now + 7200  # type: ignore[attr-defined]
    server.start()
    yield server
    server.stop()
    server.copy_log(artifacts / "class-time.server.log")


class Waiting:
    """A member of Research block waiting in the queue for 20 GiB, as their server's start would: a place in
    the ledger's queue kept alive by its heartbeat until ``leave``."""

    def __init__(self, lab: LabServer):
        self.ledger = Ledger(lab.ledger)
        self.place = self.ledger.enqueue("bob", "bob-waits", "gpu-20g", SliceSpec(memory=20 * GiB),
                                         label="bobs-model.ipynb", groups=("research",))
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        ledger = Ledger(self.ledger.path)  # (a connection of this thread's own)
        while not self._stop.wait(1.0):
            ledger.heartbeat(self.place.id)

    def leave(self) -> None:
        self._stop.set()
        self._beat.join(timeout=10)
        self.ledger.dequeue(self.place.id)


def card_of(page, name: str):
    return page.locator("section.jp-GpuPool-card", has=page.locator(".jp-GpuPool-cardTitle", has_text=name))


def test_class_time_on_the_launcher_the_status_bar_a_borrowed_kernel_the_queue_and_the_dashboard(lab, page, artifacts):
    until = clock(lab.ends)
    carol = OtherUser(lab, owner="carol")
    bob = None
    lab.write_notebook("borrow.ipynb", "gpu-pool-gpu-20g", ["x = 42", "print(x)"])
    try:
        # The pool as the class starts: another user's kernels hold GPU 0 and 10 GiB of GPU 1.
        for profile in ("gpu-20g", "gpu-20g", "gpu-10g"):
            carol.hold(profile, "carols.ipynb")

        # A member sees their room on the launcher and in the status bar, others' in the panel: no toast.
        page.goto(lab.lab_url("lab", workspace="class-launcher"))
        note = page.locator(".jp-GpuPool-launcherReservation")
        expect(note).to_have_text(f"ML 101 lab: 10 GiB reserved until {until}", timeout=120_000)
        status = page.locator(".jp-GpuPool-statusItem")
        expect(status).to_contain_text(f"ML 101 lab: 10 GiB reserved until {until}")
        label = page.locator(".jp-LauncherCard-label p", has_text=re.compile(r"^Python 3 · GPU 10 GiB$"))
        gpu_card = page.locator(".jp-LauncherCard[data-category='Notebook']", has=label)
        assert f"The pool keeps 40 GiB for Research block until {until}" in gpu_card.get_attribute("title")
        command(page, "gpu-pool:open-panel")
        items = page.locator(".jp-GpuPool-reservation")
        expect(items).to_have_count(2)
        expect(items.nth(0)).to_contain_text(f"ML 101 lab: 10 GiB reserved until {until}")
        expect(items.nth(0)).to_contain_text("open, for you")
        expect(items.nth(1)).to_contain_text(f"40 GiB reserved for Research block until {until}")
        expect(page.locator(".Toastify__toast")).to_have_count(0)
        assert_accessible(page, "the launcher with a member's reservation")
        shoot(page, artifacts, "30-class-launcher")

        # A new kernel finds room only in what Research block leaves unused: it borrows it, and says so.
        open_notebook(page, lab, "borrow.ipynb", workspace="class-borrow")
        expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text("GPU 1 (declared)", timeout=120_000)
        run_cell(page, 0)
        expect(page.locator(".jp-Cell").first.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=60_000)
        mine = next(k for k in lab.me()["kernels"] if k["name"] == "borrow.ipynb")
        assert mine["borrowed"] and "Research block" in mine["borrowed"], mine
        command(page, "gpu-pool:open-panel")
        card = card_of(page, "borrow.ipynb")
        expect(card.locator(".jp-GpuPool-borrowed")).to_have_text(
            f"Borrowed from the room reserved for Research block until {until}: it may be hibernated, its variables "
            "kept, with a warning when a member needs the room.")

        # A member of Research block asks for room: the borrowing kernel is warned, a warning with a deadline.
        bob = Waiting(lab)
        warned = toast(page, "reserved for Research block")
        expect(warned).to_contain_text(re.compile(
            r"^borrow\.ipynb’s kernel hibernates at \d\d:\d\d:\d\d, variables kept: its (GPU )?room is reserved for "
            rf"Research block until {until}, and a member needs it\."), timeout=30_000)
        warning = next(k for k in lab.me()["kernels"] if k["name"] == "borrow.ipynb")["warning"]
        assert warning["reason"] == "reserved" and warning["action"] == "hibernate", warning
        assert warning["deadline"] - time.time() > WARN - 4  # at least the rule's warning time, less this test's steps
        expect(warned.get_by_role("button", name="Release now")).to_be_visible()
        expect(warned.get_by_role("button", name="Keep alive")).to_have_count(0)
        expect(card.locator(".jp-GpuPool-countdownWhy")).to_have_text(
            f"Its GPU room is reserved for Research block until {until}, and a member needs it: it gives its GPU "
            "slice back at that time and keeps its variables. Running a cell does not keep the room.")
        expect(card.get_by_role("button", name=re.compile("^Keep alive"))).to_have_count(0)
        expect(page.locator(".Toastify__toast")).to_have_count(1)
        assert_accessible(page, "a borrowed kernel warned for a member")
        shoot(page, artifacts, "31-class-borrowed-warning")

        # At its deadline it hibernates, its variables kept; the warning goes with its fact, no new toast.
        expect(card.locator(".jp-GpuPool-stateLabel")).to_have_text(
            "hibernated: GPU slice given back, variables kept (declared: no GPU memory to move)",
            timeout=(warning["deadline"] - time.time() + 15) * 1000)
        expect(page.locator(".Toastify__toast")).to_have_count(0)

        # A cell on it waits in the queue behind the member, and the card says why it is where it is.
        run_cell(page, 1)
        expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_text("queued #2", timeout=30_000)
        # (the user, a member of ML 101 lab, goes first into that room, after the member waiting for theirs)
        why = "2nd in the queue: going first into the room reserved for ML 101 lab."
        expect(card.locator(".jp-GpuPool-queueWhy")).to_have_text(why)
        expect(cell_output(page, 1).first).to_have_text(  # the cell's own notice says so too
            f"Waiting for a GPU slice to resume this kernel. {why} The cell runs as soon as the kernel has resumed.")
        expect(page.locator(".jp-GpuPool-indicatorButton")).to_have_attribute("title", re.compile(re.escape(why)))
        assert_accessible(page, "a queued kernel with the queue's reason")
        shoot(page, artifacts, "32-class-queue-why")

        # The admin's dashboard: the reservations listed and drawn on the GPU timeline, the queue's reasons.
        command(page, "gpu-pool:open-dashboard")
        rows = page.locator(".jp-GpuPool-reservationTable tbody tr")
        expect(rows).to_have_count(2)
        research = page.locator('tr[data-reservation="Research block"]')
        expect(research).to_contain_text("group research")
        expect(research).to_contain_text("40 GiB")
        expect(research).to_contain_text(f"open until {until}: others may borrow what members leave unused")
        expect(page.locator('tr[data-reservation="ML 101 lab"]')).to_contain_text("group ml101")
        memory_plots = page.locator("figure.jp-GpuPool-chart", has_text="memory by kernel")
        expect(memory_plots).to_have_count(2, timeout=30_000)
        for i in range(2):  # both reservations are on any GPU: each GPU's timeline draws both
            expect(memory_plots.nth(i)).to_have_attribute("data-reservations", "2")
            expect(memory_plots.nth(i).locator(".jp-GpuPool-legendReservation")).to_have_count(2)
        queue = page.locator(".jp-GpuPool-queueTable")
        expect(queue).to_contain_text("1st in the queue: going first into the room reserved for Research block")
        expect(queue).to_contain_text(why.rstrip("."))
        assert_accessible(page, "the dashboard with reservations")
        shoot(page, artifacts, "33-class-dashboard", small=False)
        page.locator(".jp-GpuPool-reservationTable").scroll_into_view_if_needed()
        shoot(page, artifacts, "34-class-dashboard-list", small=False)

        # The member leaves the queue: the cell's resume takes its turn; its variables were kept.
        bob.leave()
        bob = None
        expect(cell_output(page, 1).first).to_have_text("42", timeout=60_000)
        wait_for(lambda: next(k for k in lab.me()["kernels"] if k["name"] == "borrow.ipynb")["state"] == "active",
                 30, "borrow.ipynb active again")
    finally:
        if bob is not None:
            bob.leave()
        carol.release_all()
        for k in lab.me()["kernels"]:
            lab.api("DELETE", f"api/kernels/{k['kernel_id']}")
