"""The GPU check's own tools, on any machine (no GPU needed): ``scripts/gpu-check`` without a GPU, its
report built from a canned run, its pytest plugin under a real pytest, and the sharing benchmark's
``--smoke`` mode on CPU.  What the check finds on a GPU is docs/gpu-verification.md's business."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_the_check_says_so_and_exits_2_at_once(tmp_path):
    started = time.monotonic()
    done = subprocess.run([str(REPO / "scripts" / "gpu-check"), "--out", str(tmp_path),
                           "--nvidia-smi", str(tmp_path / "no-such" / "nvidia-smi")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("No NVIDIA GPU here: nvidia-smi was not found")
    assert "nothing was run" in done.stdout and "docs/gpu-verification.md" in done.stdout
    assert time.monotonic() - started < 30
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is False and "nvidia-smi was not found" in report["device"]["error"]
    assert report["steps"] == [] and report["tests"] == []
    assert "No NVIDIA GPU here" in (tmp_path / "log.txt").read_text()


def canned_results(path: Path) -> None:
    lines = [
        {"collected": ["t.py::test_round_trip", "t.py::test_mps", "t.py::test_skipped", "t.py::test_setup_broke",
                       "t.py::test_never_reached"]},
        {"nodeid": "t.py::test_round_trip", "when": "call", "outcome": "passed", "duration": 12.5,
         "properties": {"hibernate_s": 2.7, "moved_gib": 8.1}, "message": ""},
        {"nodeid": "t.py::test_mps", "when": "call", "outcome": "failed", "duration": 3.0, "properties": {},
         "message": "AssertionError: the lock returned 999"},
        {"nodeid": "t.py::test_skipped", "when": "setup", "outcome": "skipped", "duration": 0.0, "properties": {},
         "message": "no MPS here"},
        {"nodeid": "t.py::test_setup_broke", "when": "setup", "outcome": "failed", "duration": 0.1,
         "properties": {}, "message": "fixture exploded"},
        {"nodeid": "k.py", "when": "collect", "outcome": "failed", "duration": 0.0, "properties": {},
         "message": "ModuleNotFoundError: kopf"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"nodeid": "t.py::cut')  # a killed run


def test_the_report_says_what_each_test_did_and_every_figure(tmp_path):
    gc = gpu_check()
    canned_results(tmp_path / "results.jsonl")
    collected, results = gc.read_results(tmp_path / "results.jsonl")
    steps = [{"name": "install", "status": "ok", "seconds": 3.0, "limit": 15.0},
             {"name": "tests", "status": "timeout", "seconds": 255.2, "limit": 255.0,
              "measured": "5 of 6 tests reported"},
             {"name": "hibernation benchmark", "status": "ok", "seconds": 110.0, "limit": 125.0,
              "measured": "sizes: 4 GiB"}]
    hibernation = {"rows": [{"gib": 4, "hibernate_s": 4.7, "resume_s": 1.1, "restart_load_s": 9.0,
                             "restart_regenerate_s": 5.0, "ratio_load_to_resume": 8.18}]}
    sharing = {"rows": [{"mode": "soft", "loops": 4, "aggregate_steps_s": 900.0, "ratio_to_alone": 2.6}],
               "efficiency": [{"slice": "soft slice", "steps_s": 340.0, "bare_steps_s": 345.0, "efficiency": 0.986}]}
    device = {"name": "NVIDIA H100 80GB HBM3", "driver": "580.95.05", "cuda": "13.0", "gpus": [{"index": 0}]}

    report = gc.build_report(device=device, steps=steps, collected=collected, results=results,
                             benchmarks={"hibernation": hibernation, "sharing": sharing}, started=time.time() - 500,
                             finished=time.time(), environment={"python": "3.12.3", "torch": "2.8.0"})
    gc.write_report(tmp_path, report)

    assert report["ok"] is False  # a failure, an error, a test never reached, a step out of time
    assert report["summary"] == {"passed": 1, "failed": 1, "error": 2, "skipped": 1, "not run": 1}
    outcome = {t["id"]: t["outcome"] for t in report["tests"]}
    assert outcome == {"t.py::test_round_trip": "passed", "t.py::test_mps": "failed", "t.py::test_skipped": "skipped",
                       "t.py::test_setup_broke": "error", "t.py::test_never_reached": "not run", "k.py": "error"}
    assert report["figures"]["tests"] == {"t.py::test_round_trip": {"hibernate_s": 2.7, "moved_gib": 8.1}}
    assert report["figures"]["hibernation"] == hibernation and report["figures"]["sharing"] == sharing
    assert json.loads((tmp_path / "report.json").read_text()) == report
    summary = (tmp_path / "summary.md").read_text()
    assert "NVIDIA H100 80GB HBM3 × 1, driver 580.95.05, CUDA 13.0" in summary
    assert "| tests | timeout | 255.2 | 255.0 | 5 of 6 tests reported |" in summary  # out of time, and how far
    assert gc.HIBERNATION_HEADER.startswith(
        "| GPU memory held | hibernate | resume | (restart + load from disk) / resume | restart + load from disk | "
        "restart + regenerate (a lower bound) |")
    assert gc.HIBERNATION_HEADER in summary and "| 4 GiB | 4.7 s | 1.1 s | 8.18x | 9.0 s | 5.0 s |" in summary
    assert "| soft slice | 340.0 | 345.0 | 0.986x |" in summary
    assert "hibernate_s 2.7, moved_gib 8.1" in summary and "the lock returned 999" in summary


def test_both_test_steps_reach_the_report_with_the_resume_figures_in_a_table_of_their_own(tmp_path):
    """The first step's pytest and the tests step's each write their own file; the report reads both, and
    the resume-feel test's figures (record_property) become the report's resume figures and table."""
    gc = gpu_check()
    feel_id = "tests/hibernation/test_first_cell_and_resume_feel.py::test_what_the_user_feels[gpu]"
    figures = {"gib": 10, "typing_s": 3.0, "rounds": 1, "never_slept_s": 0.011, "hint_s": 0.012,
               "resume_on_run_s": 2.41, "hint_ratio": 1.09, "resume_on_run_ratio": 219.1, "hibernate_s": 6.2,
               "restore_s": 2.05, "hint_awake_at_run": True}
    (tmp_path / gc.RESULTS[gc.FLOW]).write_text("".join(json.dumps(r) + "\n" for r in [
        {"collected": [feel_id, "k.py::test_cluster[gpu]"]},
        {"nodeid": feel_id, "when": "call", "outcome": "passed", "duration": 31.0, "properties": figures,
         "message": ""}]))  # the cluster test never reached: the step ran out of time
    canned_results(tmp_path / gc.RESULTS["tests"])
    collected, results = gc.read_results(*(tmp_path / f for f in gc.RESULTS.values()))
    assert collected[:2] == [feel_id, "k.py::test_cluster[gpu]"] and len(collected) == 7
    assert gc.measured(gc.FLOW, tmp_path) == "1 of 2 tests reported"
    assert gc.measured("tests", tmp_path) == "5 of 5 tests reported"

    report = gc.build_report(device={"name": "GPU", "gpus": [{}]}, steps=[], collected=collected, results=results,
                             benchmarks={}, started=0.0, finished=1.0, environment={})

    outcome = {t["id"]: t["outcome"] for t in report["tests"]}
    assert outcome[feel_id] == "passed" and outcome["k.py::test_cluster[gpu]"] == "not run"
    assert report["figures"]["resume"] == {"test": feel_id, **figures}
    summary = gc.render_markdown(report)
    assert ("What a user feels of a resume (10 GiB held, 3.0 s of typing, 1 round(s); hibernate 6.2 s, restore "
            "2.05 s; awake when the hinted cell was sent: yes)") in summary
    assert "| hibernated, hint, typing, run | 0.012 s | 1.09x |" in summary
    assert "| hibernated, resume on run | 2.41 s | 219.1x |" in summary and "| never slept | 0.011 s | 1x |" in summary


# -- the plan: every part within 8 minutes, one part within 3 ------------------------------------------


def test_the_steps_limits_add_up_to_at_most_8_minutes_declared_in_one_place():
    gc = gpu_check()
    steps, budget = gc.plan(None, Path("/out"))
    assert budget == gc.BUDGET == 480.0
    # what the run is for first: the first cell, the resume a user feels, hibernation in the cluster
    assert [s.name for s in steps] == ["first cell, resume and cluster", "tests", "hibernation benchmark",
                                       "sharing benchmark"]
    assert [s.limit for s in steps] == [gc.STEPS[s.name] for s in steps]  # each step's limit is the table's
    assert gc.STEPS["install"] + sum(s.limit for s in steps) + gc.OVERHEAD <= 8 * 60
    hibernation = next(s for s in steps if s.name == "hibernation benchmark")
    assert hibernation.cmd[hibernation.cmd.index("--sizes") + 1] == "16"  # --only hibernation: every size
    tests = next(s for s in steps if s.name == "tests")
    assert all(t in tests.cmd for t in gc.GPU_TESTS) and "-k" not in tests.cmd
    flow = steps[0]
    assert flow.cmd[-len(gc.FLOW_TESTS):] == gc.FLOW_TESTS and "-m" in flow.cmd and "-k" not in flow.cmd
    assert not set(gc.FLOW_TESTS) & set(gc.GPU_TESTS)  # no test runs twice


FLOW = "first cell, resume and cluster"


@pytest.mark.parametrize("only,step", [("hibernation", "hibernation benchmark"), ("sharing", "sharing benchmark"),
                                       ("flows", FLOW), ("first-cell", FLOW), ("resume", FLOW), ("cluster", FLOW),
                                       ("test_two_kernels", "tests"),
                                       ("tests/gpu/test_pool_gpu.py::test_a_soft_slice_caps_pytorch_at_its_memory",
                                        "tests")])
def test_only_plans_the_one_part_it_names_within_3_minutes(only, step):
    gc = gpu_check()
    [planned], budget = gc.plan(only, Path("/out"))
    assert planned.name == step and budget == gc.ONLY_BUDGET == 180.0
    assert gc.STEPS["install"] + planned.limit + gc.OVERHEAD <= 3 * 60
    if step == "tests":
        assert only in planned.cmd and not any(t in planned.cmd for t in ("benchmarks/hibernation.py",))
    if step == FLOW:  # each part alone, or the step again, with the rerun's whole room (more than in the full run)
        assert planned.limit == 160.0 > gc.STEPS[FLOW]
    if step == "hibernation benchmark":  # every size, 32 GiB too, in the rerun's own 3 minutes
        assert planned.cmd[planned.cmd.index("--sizes") + 1] == "1,4,16,32" and planned.limit > gc.STEPS[step]


@pytest.mark.parametrize("only,selected", [
    ("test_two_kernels", ["tests/gpu/test_hibernation_gpu.py::test_two_kernels_hibernated_at_once_end_consistent"]),
    ("cache_release", ["tests/gpu/test_hibernation_gpu.py::test_the_cache_release_shrinks_what_moves[cache-released]",
                       "tests/gpu/test_hibernation_gpu.py::test_the_cache_release_shrinks_what_moves[cache-kept]"]),
    ("tests/gpu/test_pool_gpu.py::test_a_soft_slice_caps_pytorch_at_its_memory",
     ["tests/gpu/test_pool_gpu.py::test_a_soft_slice_caps_pytorch_at_its_memory"]),
    ("mps_daemon_starts", ["tests/test_mps.py::test_the_pools_mps_daemon_starts_answers_and_stops"]),
    # the parts of the first step, each alone, and all of it: their gpu variants only (the CPU twins run in CI)
    ("first-cell", ["tests/hibernation/test_first_cell_and_resume_feel.py::"
                    "test_a_kernel_holds_no_gpu_until_its_first_cell_which_takes_the_slice_"
                    "and_sees_only_its_gpu[gpu]"]),
    ("resume", ["tests/hibernation/test_first_cell_and_resume_feel.py::"
                "test_what_the_user_feels_of_a_resume_with_the_hint_against_never_slept_and_resume_on_run[gpu]"]),
    ("cluster", ["tests/kube/test_kube_hibernation_e2e.py::"
                 "test_a_kernel_pods_gpu_memory_goes_to_host_memory_for_another_process_and_comes_back_intact[test-gpu]"]),
    ("flows", ["tests/hibernation/test_first_cell_and_resume_feel.py::"
               "test_a_kernel_holds_no_gpu_until_its_first_cell_which_takes_the_slice_and_sees_only_its_gpu[gpu]",
               "tests/hibernation/test_first_cell_and_resume_feel.py::"
               "test_what_the_user_feels_of_a_resume_with_the_hint_against_never_slept_and_resume_on_run[gpu]",
               "tests/kube/test_kube_hibernation_e2e.py::"
               "test_a_kernel_pods_gpu_memory_goes_to_host_memory_for_another_process_and_comes_back_intact[test-gpu]"]),
    ("goes_to_host_memory", ["tests/kube/test_kube_hibernation_e2e.py::"
                             "test_a_kernel_pods_gpu_memory_goes_to_host_memory_for_another_process_and_comes_back_"
                             "intact[test-gpu]"]),  # a name fragment reaches the first step's tests too
])
def test_only_selects_exactly_the_tests_it_names_under_a_real_pytest(tmp_path, only, selected):
    """The plan's own pytest command, collecting only (the gpu tests collect without a GPU): what the check's
    plugin reports as collected is what the run would run."""
    gc = gpu_check()
    [planned], _ = gc.plan(only, Path("/out"), python=sys.executable)
    results = tmp_path / "results.jsonl"
    done = subprocess.run(planned.cmd + ["--collect-only", "-q"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "GPU_CHECK_RESULTS": str(results),
                                            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "scripts"),
                                                                          os.environ.get("PYTHONPATH", "")])})
    collected, _ = gc.read_results(results)
    assert collected == selected, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_every_gpu_test_in_the_tree_is_planned_or_named_as_left_out_with_why():
    """A gpu test added anywhere must reach the GPU machine through the check, or say why it does not."""
    gc = gpu_check()
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "tests"], cwd=REPO, capture_output=True, text=True, timeout=300)
    files = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert files, done.stdout[-2000:] + done.stderr[-2000:]
    planned = gc.GPU_TESTS + gc.FLOW_TESTS
    unplanned = {f for f in files if not any(f == p or f.startswith(p.rstrip("/") + "/") for p in planned)}
    assert unplanned == set(gc.LEFT_OUT), unplanned ^ set(gc.LEFT_OUT)
    assert all(len(why) > 20 for why in gc.LEFT_OUT.values())
    for f in gc.LEFT_OUT:  # each runs alone by its file within 3 minutes
        [step], _ = gc.plan(f, Path("/out"))
        assert f in step.cmd and gc.STEPS["install"] + step.limit + gc.OVERHEAD <= 3 * 60


@pytest.mark.parametrize("only,words", [("", "--only takes"), ("--sizes", "--only takes"),
                                        ("tests/gpu/no_such_test.py::test_x", "no test file")])
def test_only_refuses_what_it_cannot_run(tmp_path, only, words):
    done = subprocess.run([str(REPO / "scripts" / "gpu-check"), "--out", str(tmp_path), f"--only={only}"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2 and words in done.stderr and not (tmp_path / "report.json").exists()


def test_a_step_out_of_time_is_stopped_and_reported_with_what_it_measured(tmp_path):
    gc = gpu_check()
    partial = tmp_path / "hibernation.json"
    code = (f"import json, time; json.dump({{'rows': [{{'gib': 1}}, {{'gib': 4}}]}}, open({str(partial)!r}, 'w')); "
            "print('two sizes', flush=True); time.sleep(60)")
    started = time.monotonic()
    step = gc.run_step("hibernation benchmark", [sys.executable, "-c", code], dict(os.environ), 2.0,
                       gc.Log(tmp_path / "log.txt"))
    assert step["status"] == "timeout" and step["limit"] == 2.0 and time.monotonic() - started < 15
    assert gc.measured("hibernation benchmark", tmp_path) == "sizes: 1 GiB, 4 GiB"
    assert "two sizes" in (tmp_path / "log.txt").read_text()  # its output so far is in the log


def test_a_clean_run_is_ok(tmp_path):
    gc = gpu_check()
    report = gc.build_report(device={"name": "GPU"}, steps=[{"name": "tests", "status": "ok", "seconds": 1.0}],
                             collected=["a"], results={"a": {"id": "a", "outcome": "passed", "seconds": 1.0,
                                                             "properties": {}, "message": ""}},
                             benchmarks={"hibernation": None}, started=0.0, finished=1.0, environment={})
    assert report["ok"] is True and "hibernation" not in report["figures"]


def test_the_plugin_reports_each_test_as_it_finishes_under_a_real_pytest(tmp_path):
    (tmp_path / "test_canned.py").write_text(
        "import pytest\n"
        "def test_ok(record_property):\n    record_property('seconds_moved', 1.5)\n"
        "def test_bad():\n    assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skip():\n    pass\n")
    results = tmp_path / "results.jsonl"
    env = {**os.environ, "GPU_CHECK_RESULTS": str(results),
           "PYTHONPATH": os.pathsep.join([str(REPO / "scripts"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-p", "gpu_check_plugin", "-p", "no:cacheprovider", "-q",
                    "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_canned.py")],
                   cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    collected, found = gpu_check().read_results(results)
    assert [c.split("::")[1] for c in collected] == ["test_ok", "test_bad", "test_skip"]
    by_name = {k.split("::")[1]: v for k, v in found.items()}
    assert by_name["test_ok"]["outcome"] == "passed" and by_name["test_ok"]["properties"] == {"seconds_moved": 1.5}
    assert by_name["test_bad"]["outcome"] == "failed" and "one is not two" in by_name["test_bad"]["message"]
    assert by_name["test_skip"]["outcome"] == "skipped" and "not here" in by_name["test_skip"]["message"]


@pytest.mark.slow
def test_the_sharing_benchmark_runs_in_smoke_mode_on_cpu(tmp_path):
    out = tmp_path / "sharing.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_")}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sharing.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    assert [r["mode"] for r in result["rows"]] == ["alone (exclusive)", "time-sliced", "soft"]
    assert all(r["aggregate_steps_s"] > 0 and r["ratio_to_alone"] > 0 for r in result["rows"])
    assert [r["loops"] for r in result["rows"]] == [1, 2, 2]
    assert result["efficiency"][0]["slice"] == "soft slice" and result["efficiency"][0]["efficiency"] > 0
    assert "| soft | 2 |" in done.stdout
