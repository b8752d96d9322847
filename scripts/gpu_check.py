"""The whole GPU check in one command (``scripts/gpu-check``): see docs/gpu-verification.md.

On a machine with an NVIDIA GPU: installs what is missing (from ``.whl/`` where there is no package
index), runs every ``gpu``-marked test (first those of :data:`FLOW`: the first cell, what a user feels of
a resume, hibernation in the cluster) and the hibernation and sharing benchmarks, each step with its
own time limit (:data:`STEPS`: together at most 8 minutes on one H100), and writes ``report.json``
(the device, driver and CUDA version, each test's outcome and figures, each benchmark figure),
``summary.md`` (the same for docs/gpu-verification.md) and ``log.txt`` under ``--out``.  A step out
of time is stopped and reported as such, with what it measured so far; the report is written
whatever happens.  ``--only PATTERN`` reruns one part within 3 minutes: ``hibernation`` (every size),
``sharing``, ``flows`` (the FLOW step) or one of its parts (``first-cell``, ``resume``, ``cluster``), a test
id (``tests/gpu/test_pool_gpu.py::test_...``) or a fragment of test names.  It never
changes the card's settings (compute mode, clocks, MIG, persistence) nor resets it; the MPS daemons
the tests and benchmarks start are their pool's own, stopped by them, and any left behind are
stopped at the end.

Without a GPU it says so and exits with status 2 at once.  Exit status 1: a test failed or a step
did not finish; 0: everything passed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
GPU_TESTS = ["tests/gpu", "tests/test_mps.py", "tests/server/test_telemetry.py", "tests/kube/test_kube_agent.py"]
# A GPU held only while it is used, and hibernation in the cluster: a step of their own, first, so that what the
# run is for is measured whatever the rest does.  Each of these gpu tests has a CPU twin (its other parameter).
FLOW = "first cell, resume and cluster"
FLOW_TESTS = ["tests/hibernation/test_first_cell_and_resume_feel.py", "tests/kube/test_kube_hibernation_e2e.py"]
# gpu tests the check's 8 minutes do not hold, and why: each runs alone within 3 minutes by its file
# (``--only tests/...py``).  tests/test_gpu_check.py holds every gpu test to be planned or named here.
LEFT_OUT = {
    "tests/planning/test_gpu_recording.py": "the planner's trace of NVML readings (waits for a loop's readings "
                                            "at the telemetry interval): no room in the 8 minutes",
    "tests/service/test_service_hibernation.py": "the pool service's NVML settle on a real GPU (a service process "
                                                 "and a CUDA child): no room in the 8 minutes",
}
# Each part of that step on its own (--only NAME): a fragment of its test's name.
FLOW_PARTS = {"first-cell": "test_a_kernel_holds_no_gpu_until_its_first_cell",
              "resume": "test_what_the_user_feels_of_a_resume",
              "cluster": "test_a_kernel_pods_gpu_memory_goes_to_host_memory"}

# The check's time, in one place: each step's limit in seconds.  Planned from the first run on an H100
# (2026-11-26, driver 580.159.04): install 4.3 s; tests 225 s with the three MPS tests failing at once
# and the busy-loop test failing early (passing, they run kernels: an estimated 35 s more; the tests'
# holdings were cut since: about 13 s less: 247 s); hibernation 1/4/16 GiB in about 150 s, never reaching
# 32 GiB (since: one kernel for every size, one restart per size, the saved state on tmpfs without CRC
# and loaded with mmap: about 8 s per size and 1.4 s per GiB, 110 s for 1/4/16/32, 35 s for 16 alone);
# sharing 4 of 6 figures in 100 s (since: loops start together as soon as all are warm instead of after a
# fixed 10-15 s, and the slice-efficiency runs reuse the rows' kernels: an estimated 70 s).  The FLOW step
# has not run on a GPU yet: 75 s estimated from its CPU twins (1, 9 and 5 s here) with the H100's measured
# costs put in: the first cell about 15 s (a kernel, torch imported in it and in a child, as the soft-cap
# test's 5.8 s twice, nvidia-smi); the resume feel about 32 s (a kernel holding 10 GiB: 10 s to make; 3 s of
# typing twice; two hibernations of 10.5 GiB at the 8.6 GiB test's 5.2 s scaled, 6.5 s each; a restore of
# 2.2 s); the cluster round trip about 25 s (its twin's 5 s of cluster, operator and agent, plus a kernel pod
# importing torch with 4 GiB, 3 s of hibernation, a filler process importing torch, 1.3 s of restore).
# To make room for it, the full run's hibernation benchmark measures 16 GiB only (1, 4 and 16 were measured
# on the H100 on 2026-11-26); ``--only hibernation`` measures every size, 32 GiB too, within its 3 minutes.
# OVERHEAD is the rest: nvidia-smi, the versions (imports torch), the report.
STEPS = {"install": 10.0, FLOW: 85.0, "tests": 260.0, "hibernation benchmark": 45.0, "sharing benchmark": 70.0}
OVERHEAD = 10.0
BUDGET = 480.0  # 8 minutes: a lease is 15 minutes of device time, the machine's start (about 1) included
ONLY_BUDGET = 180.0  # --only: a rerun of one part in the same lease
assert sum(STEPS.values()) + OVERHEAD <= BUDGET
PARTS = {"hibernation": "hibernation benchmark", "sharing": "sharing benchmark", "flows": FLOW}
HIBERNATION_SIZES = {"full": "16", "only": "1,4,16,32"}  # GiB: in the full run, and in --only hibernation
# --only limits above the full run's: every size of the hibernation benchmark (about 110 s), and the first step
# (or one of its parts) with the rerun's whole room, should it have run out of its 85 s
ONLY_LIMITS = {"hibernation benchmark": 160.0, FLOW: 160.0}
assert all(STEPS["install"] + limit + OVERHEAD <= ONLY_BUDGET for limit in ONLY_LIMITS.values())
# Where each test step's plugin writes its outcomes (one file per pytest run; the report reads them all).
RESULTS = {FLOW: "results-flow.jsonl", "tests": "results.jsonl"}
# The hibernation table: the ratio against the load baseline first; regenerating random tensors costs
# almost nothing, so that baseline is only a lower bound for what rebuilding a notebook's state costs.
HIBERNATION_HEADER = ("| GPU memory held | hibernate | resume | (restart + load from disk) / resume | "
                      "restart + load from disk | restart + regenerate (a lower bound) |")

# What the resume-feel test records (record_property), in the report's own table: the run to the first output
# of a cell on a kernel that never slept, after the hint and 3 s of typing, and resumed on the run.
RESUME_FIGURES = ("never_slept_s", "hint_s", "resume_on_run_s", "hint_ratio", "resume_on_run_ratio", "gib",
                  "typing_s", "rounds", "hibernate_s", "restore_s", "hint_awake_at_run")

# What the tests and benchmarks import: module -> the package that provides it.
NEEDED = {"jupyter_server": "jupyter_server", "jupyter_client": "jupyter_client", "ipykernel": "ipykernel",
          "jupyter_events": "jupyter_events", "traitlets": "traitlets", "pynvml": "nvidia-ml-py",
          "psutil": "psutil", "pytest": "pytest", "pytest_asyncio": "pytest-asyncio",
          "pytest_jupyter": "pytest-jupyter[server]", "pytest_timeout": "pytest-timeout",
          "prometheus_client": "prometheus_client", "yaml": "pyyaml", "torch": "torch",
          # the test cluster, the operator and the node agent (the cluster test of FLOW)
          "kubernetes_asyncio": "kubernetes_asyncio", "kopf": "kopf", "aiohttp": "aiohttp",
          "kubernetes_validate": "kubernetes-validate", "celpy": "cel-python", "jsonschema": "jsonschema"}
NO_GPU_EXIT = 2


class Log:
    """Everything the check says, on the terminal and in log.txt."""

    def __init__(self, path: Path):
        self.file = open(path, "w")

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()

    def raw(self, text: str) -> None:
        self.file.write(text)
        self.file.flush()


# -- the device ------------------------------------------------------------------------------------


def probe_device(nvidia_smi: str) -> dict | str:
    """The GPUs ``nvidia-smi`` lists, with the driver and CUDA version; or why there is none (text)."""
    smi = shutil.which(nvidia_smi) if os.sep not in nvidia_smi else (nvidia_smi if os.access(nvidia_smi, os.X_OK)
                                                                      else None)
    if smi is None:
        return f"nvidia-smi was not found ({nvidia_smi}): there is no NVIDIA driver on this machine"
    try:
        query = subprocess.run([smi, "--query-gpu=index,name,uuid,memory.total,driver_version",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
        header = subprocess.run([smi], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed ({e})"
    rows = [[c.strip() for c in line.split(",")] for line in query.stdout.splitlines() if line.strip()]
    if query.returncode != 0 or not rows:
        return f"nvidia-smi found no GPU ({(query.stderr or query.stdout).strip()[:300] or 'no output'})"
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
    gpus = [{"index": int(r[0]), "name": r[1], "uuid": r[2], "memory_mib": int(float(r[3]))} for r in rows]
    return {"gpus": gpus, "name": gpus[0]["name"], "driver": rows[0][4], "cuda": cuda.group(1) if cuda else None}


# -- what must be installed -----------------------------------------------------------------------------


def missing_modules(env: dict) -> list[str]:
    code = ("import importlib.util, json; print(json.dumps([m for m in %r if importlib.util.find_spec(m) is None]))"
            % list(NEEDED))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    return json.loads(out.stdout or "[]")


def has_entry_points(env: dict) -> bool:
    """Whether the project is installed as a distribution (jupyter_client finds the gpu-pool provisioner
    through its entry point, which a checkout on PYTHONPATH lacks)."""
    code = ("from importlib.metadata import entry_points; "
            "print('gpu-pool' in {e.name for e in entry_points(group='jupyter_client.kernel_provisioners')})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    return out.stdout.strip() == "True"


def install(env: dict, site: Path, log: Log, deadline: float) -> str:
    """Install what is missing into ``site`` (put on PYTHONPATH): the wheels in .whl/ where there are
    some (a machine without a package index: scripts/gpu-wheels), else from the index.  Returns what
    was done, in words."""
    missing = missing_modules(env)
    entry = has_entry_points(env)
    if not missing and entry:
        return "nothing to install"
    wheels = sorted(glob.glob(str(REPO / ".whl" / "*.whl")))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(site)]
    if wheels:
        cmd = pip + ["--no-index", "--no-deps", "--upgrade", *wheels]
        what = f"{len(wheels)} wheels from .whl/ (missing: {', '.join(missing) or 'the project entry points'})"
    else:
        packages = sorted({NEEDED[m] for m in missing if m != "torch"})
        if "torch" in missing:
            log("!! PyTorch is missing: install a CUDA build of torch first (pip install torch)")
        cmd = pip + packages + ([str(REPO)] if not entry else [])
        what = f"{', '.join(packages + (['this project'] if not entry else []))} from the package index"
    log(f"   installing {what}")
    timeout = max(min(STEPS["install"], deadline - time.monotonic()), 1.0)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    log.raw(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"installing {what} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    still = missing_modules(env)
    if still:
        raise RuntimeError(f"still missing after the install: {', '.join(still)} (scripts/gpu-wheels gathers the "
                           "wheels; torch must come with the machine)")
    return f"installed {what}"


# -- steps ---------------------------------------------------------------------------------------------------


def stop_tree(pid: int) -> None:
    """Stop a step and everything it started (kernels, workers): TERM, then KILL."""
    try:
        import psutil
    except ImportError:
        os.killpg(pid, signal.SIGKILL)
        return
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_step(name: str, cmd: list[str], env: dict, limit: float, log: Log) -> dict:
    """Run one step with its time limit, its output into the log; what happened, as a dict."""
    log(f"== {name} (at most {limit:.0f} s): {' '.join(cmd)}")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    status = "ok"
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid)
        out, _ = proc.communicate()
        status = "timeout"
    log.raw(out or "")
    elapsed = time.monotonic() - started
    if status == "ok" and proc.returncode != 0:
        status = "failed"
    log(f"== {name}: {status} in {elapsed:.0f} s (exit {proc.returncode})")
    return {"name": name, "command": " ".join(cmd), "status": status, "exit": proc.returncode,
            "seconds": round(elapsed, 1), "limit": round(limit, 1)}


def stop_left_mps(before: set[int], log: Log) -> list[int]:
    """Stop MPS control daemons of this user started during the check that are still running (each
    test and benchmark stops its pool's own; this is the safety net)."""
    try:
        import psutil
    except ImportError:
        return []
    stopped = []
    for p in psutil.process_iter(["pid", "name", "uids"]):
        if p.info["name"] == "nvidia-cuda-mps-control" and p.pid not in before and p.info["uids"].real == os.getuid():
            p.terminate()
            stopped.append(p.pid)
    if stopped:
        log(f"   stopped MPS control daemons left running: {stopped}")
    return stopped


def mps_daemons() -> set[int]:
    try:
        import psutil
    except ImportError:
        return set()
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "nvidia-cuda-mps-control"}


# -- the report ----------------------------------------------------------------------------------------------


def read_results(*paths: Path) -> tuple[list[str], dict[str, dict]]:
    """The plugin's JSON lines (one file per test step): the collected test ids, and each test's outcome
    (failed in any phase wins; a setup or teardown failure is an error)."""
    collected: list[str] = []
    results: dict[str, dict] = {}
    for path in paths:
        step_collected, step_results = _read_one(path)
        collected += [t for t in step_collected if t not in collected]
        results.update(step_results)
    return collected, results


def _read_one(path: Path) -> tuple[list[str], dict[str, dict]]:
    collected: list[str] = []
    results: dict[str, dict] = {}
    if not path.exists():
        return collected, results
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut off by a killed run
        if "collected" in record:
            collected = record["collected"]
            continue
        nodeid, outcome = record["nodeid"], record["outcome"]
        if record["when"] in ("setup", "teardown", "collect") and outcome == "failed":
            outcome = "error"
        current = results.get(nodeid)
        if current is None or current["outcome"] == "passed" or outcome in ("failed", "error"):
            props = {**(current or {}).get("properties", {}), **record.get("properties", {})}
            results[nodeid] = {"id": nodeid, "outcome": outcome, "seconds": record.get("duration", 0.0),
                               "properties": props, "message": record.get("message", "")}
    return collected, results


def build_report(*, device: dict, steps: list[dict], collected: list[str], results: dict[str, dict],
                 benchmarks: dict[str, dict | None], started: float, finished: float, environment: dict,
                 budget: float = BUDGET) -> dict:
    tests = [results.get(t) or {"id": t, "outcome": "not run", "seconds": 0.0, "properties": {},
                                "message": "the test step ended before this test ran"} for t in collected]
    tests += [r for t, r in results.items() if t not in collected]  # collection errors
    summary = {k: sum(1 for t in tests if t["outcome"] == k) for k in ("passed", "failed", "error", "skipped",
                                                                       "not run")}
    figures = {"tests": {t["id"]: t["properties"] for t in tests if t["properties"]}}
    feel = next((t for t in tests if "hint_s" in t["properties"]), None)
    if feel is not None:  # what a user feels of a resume, on its own: the run's headline figures
        figures["resume"] = {"test": feel["id"], **{k: feel["properties"][k] for k in RESUME_FIGURES
                                                     if k in feel["properties"]}}
    figures.update({name: data for name, data in benchmarks.items() if data is not None})
    ok = (all(s["status"] == "ok" for s in steps) and summary["failed"] == summary["error"] == summary["not run"] == 0
          and summary["passed"] > 0)
    return {"ok": ok, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
            "seconds": round(finished - started, 1), "budget_seconds": budget, "device": device,
            "environment": environment, "steps": steps, "summary": summary, "tests": tests, "figures": figures}


def render_markdown(report: dict) -> str:
    """The report as the "Last run" section of docs/gpu-verification.md."""
    d, s = report["device"], report["summary"]
    lines = [f"- **When**: {report['started']}, {report['seconds']:.0f} s of the {report['budget_seconds']:.0f} s "
             "budget",
             f"- **Device**: {d.get('name')} × {len(d.get('gpus', []))}, driver {d.get('driver')}, "
             f"CUDA {d.get('cuda')}; Python {report['environment'].get('python')}, "
             f"PyTorch {report['environment'].get('torch')}",
             f"- **Tests**: {s['passed']} passed, {s['failed']} failed, {s['error']} errors, {s['skipped']} skipped, "
             f"{s['not run']} not run",
             "", "| step | status | seconds | limit | measured |", "|---|---|---|---|---|"]
    lines += [f"| {st['name']} | {st['status']} | {st['seconds']} | {st.get('limit', '')} | {st.get('measured', '')} |"
              for st in report["steps"]]
    lines += ["", "| test | outcome | seconds | figures |", "|---|---|---|---|"]
    for t in report["tests"]:
        props = ", ".join(f"{k} {v}" for k, v in t["properties"].items())
        lines.append(f"| `{t['id']}` | {t['outcome']} | {t['seconds']} | {props} |")
    feel = report["figures"].get("resume")
    if feel and "hint_s" in feel:
        lines += ["", f"What a user feels of a resume ({feel.get('gib')} GiB held, {feel.get('typing_s')} s of typing, "
                      f"{feel.get('rounds')} round(s); hibernate {feel.get('hibernate_s')} s, restore "
                      f"{feel.get('restore_s')} s; awake when the hinted cell was sent: "
                      f"{'yes' if feel.get('hint_awake_at_run') else 'no'}):", "",
                  "| kernel | run to first output | against never slept |", "|---|---|---|",
                  f"| never slept | {feel.get('never_slept_s')} s | 1x |",
                  f"| hibernated, hint, typing, run | {feel.get('hint_s')} s | {feel.get('hint_ratio')}x |",
                  f"| hibernated, resume on run | {feel.get('resume_on_run_s')} s | "
                  f"{feel.get('resume_on_run_ratio')}x |"]
    hib = report["figures"].get("hibernation")
    if hib and hib.get("rows"):
        lines += ["", HIBERNATION_HEADER, "|---|---|---|---|---|---|"]
        lines += [f"| {r['gib']} GiB | {r['hibernate_s']} s | {r['resume_s']} s | {r['ratio_load_to_resume']}x | "
                  f"{r['restart_load_s']} s | {r['restart_regenerate_s']} s |" for r in hib["rows"]]
    share = report["figures"].get("sharing")
    if share and share.get("rows"):
        lines += ["", "| mode | loops | aggregate steps/s | against one alone |", "|---|---|---|---|"]
        lines += [f"| {r['mode']} | {r['loops']} | {r['aggregate_steps_s']} | {r['ratio_to_alone']}x |"
                  for r in share["rows"]]
        lines += ["", "| one loop alone in | steps/s | bare process | slice efficiency |", "|---|---|---|---|"]
        lines += [f"| {e['slice']} | {e['steps_s']} | {e['bare_steps_s']} | {e['efficiency']}x |"
                  for e in share.get("efficiency", [])]
    failed = [t for t in report["tests"] if t["outcome"] in ("failed", "error")]
    for t in failed:
        lines += ["", f"**{t['id']}** ({t['outcome']}):", "", "```", t["message"].strip()[-1500:], "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "summary.md").write_text(render_markdown(report))


def load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def versions(env: dict) -> dict:
    code = ("import json, sys\ntry:\n import torch; t = torch.__version__; c = torch.version.cuda\n"
            "except Exception as e:\n t, c = f'unavailable ({e})', None\n"
            "print(json.dumps({'python': sys.version.split()[0], 'torch': t, 'torch_cuda': c}))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        return {**json.loads(out.stdout), "platform": platform.platform()}
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return {"python": sys.version.split()[0], "platform": platform.platform()}


# -- the plan ----------------------------------------------------------------------------------------------


class Step(NamedTuple):
    name: str
    cmd: list[str]
    limit: float  # seconds


def plan(only: str | None, out: Path, python: str = sys.executable) -> tuple[list[Step], float]:
    """The steps after the install, each with its time limit, and the budget they run in: every part
    within :data:`BUDGET`, or the one part ``only`` names within :data:`ONLY_BUDGET` (a name of
    :data:`PARTS` or :data:`FLOW_PARTS`, a test id or file, else a fragment of test names for ``pytest -k``)."""
    # (not k8s: a gpu test's real-cluster twin needs KUBECONFIG, which the GPU machine has not)
    tests = [python, "-m", "pytest", "-m", "gpu and not k8s", "-p", "gpu_check_plugin", "-p", "no:cacheprovider",
             "--continue-on-collection-errors", "-rA", "-v"]

    def hibernation(sizes: str) -> list[str]:
        return [python, "benchmarks/hibernation.py", "--sizes", sizes, "--json", str(out / "hibernation.json")]

    full = {FLOW: tests + FLOW_TESTS, "tests": tests + GPU_TESTS,
            "hibernation benchmark": hibernation(HIBERNATION_SIZES["full"]),
            "sharing benchmark": [python, "benchmarks/sharing.py", "--seconds", "4",
                                  "--json", str(out / "sharing.json")]}
    if only is None:
        return [Step(name, cmd, STEPS[name]) for name, cmd in full.items()], BUDGET
    pattern = only.strip()
    room = ONLY_BUDGET - STEPS["install"] - OVERHEAD
    if pattern in PARTS:
        name = PARTS[pattern]
        cmd = hibernation(HIBERNATION_SIZES["only"]) if name == "hibernation benchmark" else full[name]
        return [Step(name, cmd, min(ONLY_LIMITS.get(name, STEPS[name]), room))], ONLY_BUDGET
    if pattern in FLOW_PARTS:
        return [Step(FLOW, tests + ["-k", FLOW_PARTS[pattern]] + FLOW_TESTS, min(ONLY_LIMITS[FLOW], room))], ONLY_BUDGET
    if not pattern or pattern.startswith("-"):
        raise ValueError(f"--only takes {', '.join([*PARTS, *FLOW_PARTS])}, a test id or a fragment of test names, "
                         f"not {only!r}")
    if "::" in pattern or pattern.endswith(".py"):
        if not (REPO / pattern.split("::")[0]).is_file():
            raise ValueError(f"--only {pattern}: there is no test file {pattern.split('::')[0]} in this checkout")
        cmd = tests + [pattern]
    else:
        cmd = tests + ["-k", pattern] + GPU_TESTS + FLOW_TESTS
    return [Step("tests", cmd, min(STEPS["tests"], room))], ONLY_BUDGET


def measured(name: str, out: Path) -> str:
    """What a step measured, in words (for a step cut short: what it got to)."""
    if name in RESULTS:
        collected, results = read_results(out / RESULTS[name])
        return f"{len(results)} of {len(collected)} tests reported"
    data = load_json(out / ("hibernation.json" if name.startswith("hibernation") else "sharing.json")) or {}
    if name.startswith("hibernation"):
        return "sizes: " + (", ".join(f"{r['gib']} GiB" for r in data.get("rows", [])) or "none")
    got = [r["mode"] for r in data.get("rows", [])] + [e["slice"] for e in data.get("efficiency", [])]
    return "figures: " + ("; ".join(got) or "none")


# -- the check ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "gpu-check"), help="where the report and log go (gpu-check/)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to ask for the GPUs")
    parser.add_argument("--only", metavar="PATTERN", default=None,
                        help="rerun one part within 3 minutes: hibernation, sharing, flows (first-cell, resume, "
                             "cluster: each alone), a test id, or a fragment of test names (pytest -k)")
    args = parser.parse_args(argv)
    started, t0 = time.time(), time.monotonic()
    out = Path(args.out)
    try:
        steps_planned, budget = plan(args.only, out)
    except ValueError as e:
        parser.error(str(e))
    deadline = t0 + budget
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "log.txt")

    device = probe_device(args.nvidia_smi)
    if isinstance(device, str):
        log(f"No NVIDIA GPU here: {device}. scripts/gpu-check runs the gpu tests and benchmarks on a machine "
            "with an NVIDIA GPU and its driver (docs/gpu-verification.md); nothing was run.")
        write_report(out, build_report(device={"error": device}, steps=[], collected=[], results={},
                                       benchmarks={}, started=started, finished=time.time(),
                                       environment={"python": sys.version.split()[0]}, budget=budget))
        return NO_GPU_EXIT
    log(f"GPU check: {device['name']} x {len(device['gpus'])}, driver {device['driver']}, CUDA {device['cuda']}; "
        f"budget {budget:.0f} s" + (f", only {args.only}" if args.only else "") + ": "
        + ", ".join(f"{s.name} {s.limit:.0f} s" for s in [Step("install", [], STEPS["install"]), *steps_planned]))

    site = Path("/tmp/gpu-check-site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(REPO / "scripts"), str(site)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                         else []))}
    steps: list[dict] = []
    for stale in (*RESULTS.values(), "hibernation.json", "sharing.json"):
        (out / stale).unlink(missing_ok=True)
    mps_before = mps_daemons()
    environment: dict = {"python": sys.version.split()[0]}
    try:
        begun = time.monotonic()
        try:
            what = install(env, site, log, deadline)
            steps.append({"name": "install", "command": what, "status": "ok", "exit": 0,
                          "seconds": round(time.monotonic() - begun, 1), "limit": STEPS["install"]})
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"!! {e}")
            steps.append({"name": "install", "command": "", "status": "failed", "exit": None,
                          "seconds": round(time.monotonic() - begun, 1), "limit": STEPS["install"]})
        environment = versions(env)
        log(f"   Python {environment.get('python')}, PyTorch {environment.get('torch')} "
            f"(CUDA {environment.get('torch_cuda')})")
        for step in steps_planned:
            left = deadline - time.monotonic() - 5
            if left < 20 or steps[0]["status"] != "ok":
                why = "the install failed" if steps[0]["status"] != "ok" else "no time left in the budget"
                log(f"== {step.name}: skipped ({why})")
                steps.append({"name": step.name, "command": " ".join(step.cmd), "status": "skipped", "exit": None,
                              "seconds": 0.0, "limit": 0.0, "measured": "nothing"})
                continue
            results_file = out / RESULTS.get(step.name, "results.jsonl")
            done = run_step(step.name, step.cmd, {**env, "GPU_CHECK_RESULTS": str(results_file)},
                            min(step.limit, left), log)
            done["measured"] = measured(step.name, out)
            if done["status"] == "timeout":
                log(f"   {step.name} ran out of its {done['limit']:.0f} s; it measured {done['measured']}")
            steps.append(done)
    finally:
        stop_left_mps(mps_before, log)
        collected, results = read_results(*(out / f for f in RESULTS.values()))
        # (a benchmark not run this time has no file: each was removed before the steps)
        report = build_report(device=device, steps=steps, collected=collected, results=results,
                              benchmarks={"hibernation": load_json(out / "hibernation.json"),
                                          "sharing": load_json(out / "sharing.json")},
                              started=started, finished=time.time(), environment=environment, budget=budget)
        write_report(out, report)
    s = report["summary"]
    done_words = ", ".join(f"{st['name']} {st['status']}" for st in steps)
    log(f"GPU check {'PASSED' if report['ok'] else 'NOT PASSED'} in {report['seconds']:.0f} s: {s['passed']} passed, "
        f"{s['failed']} failed, {s['error']} errors, {s['skipped']} skipped, {s['not run']} not run; "
        f"steps: {done_words}. Report: {out / 'report.json'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
