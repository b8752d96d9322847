"""``jupyter gpu-pool simulate`` and ``trace export`` as an admin runs them: one JSON object with what
the issue asks for, the report, a progress bar, and clear errors for bad options (nothing printed
but the error)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from planning_helpers import jupyter, simulate_json

from jupyter_gpu_pool.planning.cli import SimulateApp, TraceExportApp
from jupyter_gpu_pool.planning.costs import HIBERNATE

pytestmark = pytest.mark.usefixtures("pool_home")  # an isolated pool: two declared 40 GiB GPUs


def run_app(app_class, argv: list[str], capsys) -> tuple[int, str, str]:
    """The app in this process, as ``jupyter gpu-pool`` starts it; (exit code, stdout, stderr)."""
    app = app_class()
    code = 0
    try:
        app.initialize(argv)
        app.start()
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_issues_command_prints_one_json_object_with_waits_culls_and_the_fewest_gpus():
    done = jupyter("simulate", "--synthetic", "lab", "--students", "40", "--hours", "3", "--gpus", "1-8",
                   "--slo-wait", "30s", "--json")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1
    result = json.loads(done.stdout)
    [config] = result["configurations"]
    rows = config["results"]
    assert [r["gpus"] for r in rows] == list(range(1, 9))
    for r in rows:
        p95 = r["wait_seconds"]["p95"]
        assert p95 is None or p95 >= 0
        assert isinstance(r["shut_down"], int) and isinstance(r["hibernated"], int)
        assert r["meets_slo"] == (p95 is not None and p95 <= 30)
    # 40 students on slices of 10 GiB of this pool's 40 GiB GPUs (four a GPU) need ten: none of 1-8 will do
    assert not any(r["meets_slo"] for r in rows) and result["fewest_gpus"] is None and config["fewest_gpus"] is None
    assert rows[-1]["wait_seconds"]["p95"] > 30 and rows[0]["wait_seconds"]["p95"] is None
    assert result["workload"]["sessions"] == 40 and result["slo"] == {"wait_seconds": 30.0, "percentile": 95.0}
    more = simulate_json("--synthetic", "lab", "--students", "40", "--hours", "3", "--gpus", "9-11")
    assert [r["meets_slo"] for r in more["configurations"][0]["results"]] == [False, True, True]
    assert more["fewest_gpus"] == 10


def test_a_proposed_policy_is_replayed_beside_the_admins(tmp_path):
    proposed = tmp_path / "strict.json"
    proposed.write_text(json.dumps([{"name": "strict", "idle_timeout": "5m", "gpu_idle_timeout": None, "warn": "1m",
                                     "action": "shutdown"}]))
    result = simulate_json("--synthetic", "lab", "--students", "20", "--hours", "2", "--gpus", "4-5",
                           "--compare-policy", str(proposed))
    base, strict = result["configurations"]
    assert (base["name"], strict["name"]) == ("current", "strict") and strict["policy"][0]["idle_timeout"] == 300
    diff = result["comparison"]["difference"]
    assert [d["gpus"] for d in diff] == [4, 5]
    for d, a, b in zip(diff, base["results"], strict["results"]):
        assert d["shut_down"] == b["shut_down"] - a["shut_down"]
        assert d["hibernated"] == b["hibernated"] - a["hibernated"]
    assert sum(r["shut_down"] for r in strict["results"]) > sum(r["shut_down"] for r in base["results"])


def test_a_progress_bar_on_stderr_when_asked():
    done = jupyter("simulate", "--synthetic", "lab", "--students", "5", "--hours", "1", "--gpus", "2", "--json",
                   "--progress")
    assert done.returncode == 0 and "100%|" in done.stderr and json.loads(done.stdout)


@pytest.mark.parametrize("argv, message", [
    ([], "Give a workload: --trace FILE"),
    (["--synthetic", "moon"], "--synthetic 'moon': the synthetic workloads are 'lab', 'hub' and 'week'"),
    (["--synthetic", "week", "--class-days", "someday"], "--class-days 'someday': write days such as tue,thu"),
    (["--synthetic", "week", "--class-time", "12:00-10:00"], "--class-time '12:00-10:00': write the hours it runs"),
    (["--synthetic", "week", "--research-profile", "huge"], "--research-profile: 'huge' is not a profile"),
    (["--synthetic", "lab", "--gpus", "0-3"], "--gpus '0-3': counts go from 1 to 4096"),
    (["--synthetic", "lab", "--gpus", "two"], "--gpus 'two': write a count (4), a range (1-8) or a list (1,2,4)"),
    (["--synthetic", "lab", "--slo-wait", "soon"], "--slo-wait 'soon': must be a number of seconds"),
    (["--synthetic", "lab", "--hours", "-1"], "--hours '-1': write a number above 0"),
    (["--synthetic", "lab", "--hibernate-cost", "fast"], "--hibernate-cost: hibernate cost 'fast': write fixed "
                                                          f"seconds and seconds per GiB, such as '{HIBERNATE}'"),
    (["--synthetic", "lab", "--profile", "huge"], "--profile: 'huge' is not a profile of configuration 'current'; "
                                                   "its profiles are small, half, whole"),
    (["--synthetic", "lab", "--config", "/nonexistent.py"], "/nonexistent.py: no such file"),
    (["--trace", "/nonexistent.jsonl"], "--trace /nonexistent.jsonl: No such file or directory"),
    (["--synthetic", "lab", "--memory", "6-1GiB"], "--memory '6-1GiB': the range goes from the smaller size"),
    (["--synthetic", "lab", "--think", "a while"], "--think 'a while': must be a number of seconds above 0"),
])
def test_bad_options_get_a_clear_error_and_nothing_else(argv, message, capsys):
    code, out, err = run_app(SimulateApp, [*argv, "--json", "--no-progress"], capsys)
    assert code == 2 and out == "" and message in err, err


def test_each_config_file_is_replayed_on_its_own_inventory(tmp_path, capsys):
    """The admin's pool is two 40 GiB test GPUs; a --config declaring three A100s is planned on A100s
    (--gpus N: N of them), one declaring none on the admin's."""
    a100 = tmp_path / "a100.json"
    a100.write_text(json.dumps({"GPUPool": {"inventory": [{"name": "NVIDIA A100-SXM4-40GB", "memory": "40GiB",
                                                           "count": 3}]}}))
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"GPUPool": {"policy": []}}))
    argv = ["--synthetic", "lab", "--students", "4", "--hours", "1", "--config", str(a100), "--config", str(same),
            "--json", "--no-progress"]
    code, out, err = run_app(SimulateApp, argv, capsys)
    assert code == 0, err
    mine, admins = json.loads(out)["configurations"]
    assert mine["gpu_model"]["name"] == "NVIDIA A100-SXM4-40GB" and [r["gpus"] for r in mine["results"]] == [3]
    assert admins["gpu_model"]["name"] == "Test GPU" and [r["gpus"] for r in admins["results"]] == [2]
    code, out, err = run_app(SimulateApp, [*argv, "--gpus", "5"], capsys)
    assert code == 0, err
    mine, admins = json.loads(out)["configurations"]
    assert (mine["gpu_model"]["name"], mine["results"][0]["gpus"]) == ("NVIDIA A100-SXM4-40GB", 5)
    assert (admins["gpu_model"]["name"], admins["results"][0]["gpus"]) == ("Test GPU", 5)


def test_without_gpus_anywhere_the_error_says_what_to_do(pool_home, capsys):
    pool_home.configure(inventory=[])  # declared discovery, nothing declared: the pool is empty
    code, out, err = run_app(SimulateApp, ["--synthetic", "lab", "--json", "--no-progress"], capsys)
    assert code == 2 and out == ""
    assert "configuration 'current' has no GPUs to replay on" in err and "pass --gpus N" in err, err
    assert "declare the inventory in your jupyter_gpu_pool_config.py" in err, err
    code, out, err = run_app(SimulateApp, ["--synthetic", "lab", "--gpus", "5", "--json", "--no-progress"], capsys)
    assert code == 0, err
    assert json.loads(out)["configurations"][0]["gpu_model"]["name"] == "NVIDIA H100 80GB HBM3 (planned)"


def test_a_bad_proposed_policy_names_the_rule_and_field(tmp_path, capsys):
    proposed = tmp_path / "bad.json"
    proposed.write_text(json.dumps([{"name": "oops", "idle_timeout": "soon"}]))
    code, out, err = run_app(SimulateApp, ["--synthetic", "lab", "--compare-policy", str(proposed), "--json",
                                           "--no-progress"], capsys)
    assert code == 2 and out == ""
    assert f"--compare-policy {proposed}: policy[0] ('oops').idle_timeout: 'soon' is not a duration" in err


def test_a_report_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where the plan extra is not installed
    code, out, err = run_app(SimulateApp, ["--synthetic", "lab", "--report", str(tmp_path / "r"), "--no-progress"],
                             capsys)
    assert code == 2 and out == "" and "pip install 'jupyter-gpu-pool[plan]'" in err
    assert not (tmp_path / "r").exists()


def test_trace_export_refuses_a_bad_since(capsys):
    code, out, err = run_app(TraceExportApp, ["--since", "last tuesday"], capsys)
    assert code == 2 and out == "" and "--since 'last tuesday': write how far back, such as 7d" in err


def test_the_report_is_a_page_with_its_plots_and_tables(tmp_path):
    examples = Path(__file__).resolve().parents[2] / "jupyter_gpu_pool" / "planning" / "examples"
    done = jupyter("simulate", "--synthetic", "lab", "--students", "16", "--hours", "1", "--gpus", "3-5",
                   "--config", str(examples / "lab-slices-cull.json"),
                   "--config", str(examples / "lab-slices-hibernate.json"), "--report", str(tmp_path / "plan"))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "plan" / "index.html").read_text()
    for image in ("p95-wait.png", "occupancy.png", "waits.png", "side-by-side.png"):
        png = (tmp_path / "plan" / image).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000 and f"src='{image}'" in page
    assert "lab-slices-cull" in page and "lab-slices-hibernate against lab-slices-cull" in page
    assert page.count("Fewest GPUs meeting the goal: <b>4</b>") == 2  # 16 students x 10 GiB, four a 40 GiB GPU
    assert done.stdout.count("fewest GPUs meeting the goal: 4") == 2


def test_the_synthetic_users_behaviour_can_be_set_from_the_command_line(capsys):
    base = ["--synthetic", "lab", "--students", "10", "--hours", "1", "--gpus", "3", "--json", "--no-progress"]
    results = {}
    for name, extra in (("default", []), ("long cells", ["--cell", "2m", "--think", "20s"]),
                        ("over its slice", ["--memory", "12-16GiB"])):
        code, out, err = run_app(SimulateApp, [*base, *extra], capsys)
        assert code == 0, err
        results[name] = json.loads(out)["configurations"][0]["results"][0]
    assert results["long cells"]["gpu_hours"]["busy"] > 3 * results["default"]["gpu_hours"]["busy"]
    # kernels holding more than their 10 GiB soft slice are released by the policy's over-memory rule
    assert results["over its slice"]["hibernated"] >= 10 and results["default"]["hibernated"] == 0


@pytest.mark.browser
def test_the_report_renders_in_a_browser_with_every_plot(tmp_path):
    """Debian's Chromium opens the page: every plot loads; a screenshot is kept in test-artifacts/planning/."""
    from playwright.sync_api import sync_playwright

    done = jupyter("simulate", "--synthetic", "lab", "--students", "16", "--hours", "1", "--gpus", "3-5",
                   "--compare-policy", str(_policy(tmp_path)), "--report", str(tmp_path / "plan"), "--no-progress")
    assert done.returncode == 0, done.stderr
    shots = Path(__file__).resolve().parents[2] / "test-artifacts" / "planning"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto((tmp_path / "plan" / "index.html").as_uri())
        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) == 4 and all(w > 500 for w in widths), widths
        assert page.locator("tr.met").count() >= 2  # the GPU counts meeting the goal are marked, in each table
        page.screenshot(path=str(shots / "report.png"), full_page=True)
        browser.close()


def _policy(tmp_path) -> Path:
    path = tmp_path / "hibernate.json"
    path.write_text(json.dumps([{"name": "lab", "idle_timeout": "10m", "gpu_idle_timeout": None, "warn": "2m",
                                 "action": "hibernate"}]))
    return path
