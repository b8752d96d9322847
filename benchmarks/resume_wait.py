"""What the user feels of a resume: Shift+Enter to the cell's first output, in real JupyterLab in real
headless Chromium, on a kernel that slept, with and without the resume hint, against one that never slept.

    python3 benchmarks/resume_wait.py [--repeats 5] [--gib 10] [--typing 3] [--json resume_wait.json]

Needs JupyterLab, Python Playwright and Debian's /usr/bin/chromium (as tests/browser), and this
checkout's labextension build (``jlpm build`` in labextension/).  One ``jupyter lab`` on a declared
pool (2 x 40 GiB, no GPU needed; tests/browser/lab_server.py) with a ``--gib`` profile, whose declared
resumes take the H100's measured restore time (``GPUPool.hibernation_declared_restore_cost =
"0.306s + 0.179s/GiB"``: 2.1 s for 10 GiB; set here only, never by default).  Each run opens a
notebook of its own on a fresh kernel, runs ``x = 42``, and then:

- **never slept**: the kernel stays on its slice;
- **hint** (today's JupyterLab extension): the kernel is hibernated (``POST …/release``) and the page
  shows it hibernated;
- **resume on run** (the hint off): the same, with the page's hint requests blocked, as before hints.

Then the user clicks into the empty second cell, types ``print("answer", x)`` for ``--typing``
seconds and presses Shift+Enter.  The figure is the time from that key press to the cell's first
output (``answer 42``; the "Resuming…" notice a resume on run shows first does not count), measured in
the page (``performance.now()`` at the keydown, a MutationObserver on the output).  The three kinds of
run take turns, ``--repeats`` times each; the medians and spreads (min–max) are reported, and the
ratios of the medians to never slept.  Goal: with the hint, at most 1.1x never slept.  The machine,
its CPU count and its load average before and after are printed with the table (and in ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "browser"), str(REPO / "tests")]  # the lab server of the browser tests

from lab_server import CHECKOUT_BUILD, LabServer  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
KINDS = ("never slept", "hint", "resume on run")
CODE = 'print("answer", x)'
HINT_URL = re.compile(r"/gpu-pool/api/v1/kernels/[^/]+/hint(\?|$)")  # (JupyterLab adds a cache-busting query)
COST = "0.306s + 0.179s/GiB"  # the H100's restore line (docs/hibernation.md)
POLICY = [{"name": "bench", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
           "action": "hibernate"}]

# Shift+Enter's time and the first output of the second cell that says "answer", in the page's clock.
WATCH = """(marker) => {
  window.__pressed = null; window.__answered = null;
  document.addEventListener('keydown', e => {
    if (e.key === 'Enter' && e.shiftKey && window.__pressed === null) { window.__pressed = performance.now(); }
  }, true);
  const look = () => {
    if (window.__pressed === null || window.__answered !== null) { return; }
    const cell = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')[1];
    for (const out of cell ? cell.querySelectorAll('.jp-OutputArea-output') : []) {
      if (out.textContent.includes(marker)) { window.__answered = performance.now(); }
    }
  };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists()
            else platform.processor()}


def one_run(browser, lab: LabServer, kind: str, n: int, typing: float) -> dict:
    name = f"run-{n}-{kind.replace(' ', '-')}.ipynb"
    lab.write_notebook(name, "gpu-pool-bench", ["x = 42", ""])
    # No service worker: JupyterLab's would carry requests past page.route (the hint blocked below).
    context = browser.new_context(viewport={"width": 1400, "height": 860}, service_workers="block")
    context.set_default_timeout(120_000)
    page = context.new_page()
    blocked: list[str] = []
    if kind == "resume on run":  # the hint off: as JupyterLab was before it
        page.route(HINT_URL, lambda route: (blocked.append(route.request.url), route.abort()))
    hints: list[str] = []
    page.on("request", lambda r: HINT_URL.search(r.url) and hints.append(r.url))
    kernel_id = None
    try:
        page.goto(lab.lab_url(f"lab/tree/{name}", workspace=f"w{n}-{kind.replace(' ', '-')}"))
        page.locator(".jp-NotebookPanel").first.wait_for()
        indicator = page.locator(".jp-GpuPool-indicatorButton")
        indicator.filter(has_text="GPU").wait_for()
        page.locator(".jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-Cell").nth(0).locator(".jp-InputPrompt", has_text="[1]:").wait_for()
        kernel_id = next(k["kernel_id"] for k in lab.me()["kernels"] if k["name"].endswith(name))
        if kind != "never slept":
            status, answer = lab.api("POST", f"gpu-pool/api/v1/kernels/{kernel_id}/release", {})
            assert status == 202 and answer["action"] == "hibernate", answer
            indicator.filter(has_text="hibernated").wait_for()
        page.wait_for_timeout(6000)  # the user reads a while; the page's hint interval (5 s) has passed
        page.evaluate(WATCH, "answer 42")
        editor = page.locator(".jp-Cell").nth(1).locator(".jp-InputArea-editor")
        started = time.monotonic()
        editor.click()
        page.keyboard.type(CODE, delay=typing * 1000 / len(CODE))
        typed = time.monotonic() - started
        state = next(k["state"] for k in lab.me()["kernels"] if k["kernel_id"] == kernel_id)
        pressed = time.time()
        page.keyboard.press("Shift+Enter")
        page.wait_for_function("() => window.__answered !== null", timeout=120_000)
        wait = page.evaluate("() => (window.__answered - window.__pressed) / 1000")
        resumes = [e for e in lab.me()["recent"] if e["kernel_id"] == kernel_id and e["kind"] == "resumed"]
        resumed = [e["reason"] for e in resumes]
        assert resumed == ([] if kind == "never slept" else ["hint"] if kind == "hint" else ["cell"]), (kind, resumed)
        return {"kind": kind, "wait": wait, "typed": typed, "state_at_run": state, "resumed_by": resumed,
                # seconds from the end of the resume to Shift+Enter (negative: it ended after)
                "resumed_to_run": round(pressed - resumes[0]["at"], 3) if resumes else None,
                "hints_sent": len(hints), "hints_blocked": len(blocked)}
    finally:
        context.close()
        if kernel_id:
            lab.api("DELETE", f"api/kernels/{kernel_id}")


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}–{max(values):.3f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each kind (default 5)")
    parser.add_argument("--gib", type=float, default=10, help="the kernel's declared slice in GiB (default 10)")
    parser.add_argument("--typing", type=float, default=3.0, help="seconds the user types (default 3)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"needs {CHROMIUM} (apt-get install chromium)", file=sys.stderr)
        return 2
    if not (CHECKOUT_BUILD / "package.json").exists():
        print("needs this checkout's labextension build: cd labextension && jlpm build", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="gpu-pool-resume-wait-"))
    lab = LabServer(root, pool={"policy": POLICY, "hibernation_declared_restore_cost": COST,
                                "profiles": {"bench": {"slice": f"{args.gib:g}GiB", "isolation": "soft"}}},
                    extension={"cull_interval": 5.0, "telemetry_interval": 5.0})
    load_before = os.getloadavg()
    lab.start()
    runs: list[dict] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            one_run(browser, lab, "never slept", 0, args.typing)  # warm-up: JupyterLab's first load
            for n in range(1, args.repeats + 1):
                for kind in KINDS[n % 3:] + KINDS[:n % 3]:  # take turns, so load drifts hit each kind alike
                    run = one_run(browser, lab, kind, n, args.typing)
                    runs.append(run)
                    ended = ("" if run["resumed_to_run"] is None
                             else f"; resumed {run['resumed_to_run']:+.2f} s before Shift+Enter")
                    print(f"  {kind:14s} {run['wait']:.3f} s  (typed {run['typed']:.1f} s; kernel "
                          f"{run['state_at_run']} at Shift+Enter{ended}; hints {run['hints_sent']})", flush=True)
            browser.close()
    finally:
        lab.stop()
    load_after = os.getloadavg()
    waits = {kind: [r["wait"] for r in runs if r["kind"] == kind] for kind in KINDS}
    base = statistics.median(waits["never slept"])
    summary = {kind: {"median": statistics.median(w), "min": min(w), "max": max(w),
                      "ratio": statistics.median(w) / base} for kind, w in waits.items()}
    restore = 0.306 + 0.179 * args.gib
    print(f"\n{args.gib:g} GiB kernel (modelled restore {restore:.2f} s), {args.typing:g} s of typing, "
          f"{args.repeats} runs of each; Shift+Enter to the cell's first output:\n")
    print("| kernel | median | spread (min–max) | median / never slept |")
    print("|---|---|---|---|")
    for kind in KINDS:
        s = summary[kind]
        print(f"| {kind} | {s['median']:.3f} s | {spread(waits[kind])} | **{s['ratio']:.2f}×** |")
    info = machine()
    print(f"\nmachine: {info['cpu']}, {info['cpus']} CPUs, {info['platform']}; load average (1, 5, 15 min) "
          f"before {', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}")
    goal = summary["hint"]["ratio"] <= 1.1
    print(f"goal (hint ≤ 1.1× never slept): {'met' if goal else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"gib": args.gib, "typing": args.typing, "repeats": args.repeats,
                                               "restore_model": COST, "runs": runs, "summary": summary,
                                               "machine": info, "load_before": load_before,
                                               "load_after": load_after}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
