"""`jupyter gpu-pool`, run as a user runs it: a real subprocess on the test's config."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from jupyter_gpu_pool.pool import Holder
from kernel_helpers import free_port

CLI = [sys.executable, "-m", "jupyter_gpu_pool.cli"]


def cli(*args, check=True, timeout=120):
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=os.environ)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def hold(pool_home, owner, profile_name, label="", kernel="k"):
    """A lease held by this (live) test process, as a running kernel's would be."""
    from jupyter_gpu_pool.local import processes

    pool = pool_home.pool()
    request = pool.request(kernel, pool.settings.profile(profile_name), label=label)
    request = request.__class__(**{**request.__dict__, "owner": owner, "manager": processes.identify()})
    lease = pool.allocate(request)
    pool.ledger.set_holder(lease.id, processes.identify())
    return lease


def test_status_prints_each_gpu_its_slices_and_the_leases(pool_home):
    lease = hold(pool_home, "alice", "small", label="analysis.ipynb", kernel="kernel-alice-1")
    hold(pool_home, "bob", "whole", kernel="kernel-bob-1")
    out = cli("status").stdout
    assert "2 declared GPU(s) from the inventory" in out
    assert "GPU 0 · Test GPU · 40 GiB (declared)" in out and "GPU 1 · Test GPU · 40 GiB (declared)" in out
    assert "used 10 GiB of 40 GiB" in out and "used 40 GiB of 40 GiB" in out and "exclusive" in out
    row = next(line for line in out.splitlines() if lease.short_id in line)
    for cell in ("alice", "kernel-a", "small", "10 GiB", "soft", "active", "analysis.ipynb"):
        assert cell in row
    assert "Queue: empty" in out


def test_status_lists_kernels_with_no_gpu_yet_apart_from_hibernated_ones(pool_home):
    from jupyter_gpu_pool.local import processes

    pool = pool_home.pool()
    request = pool.request("kernel-alice-2", pool.settings.profile("small"), label="reader.ipynb")
    lease = pool.start_without_slice(request)
    pool.ledger.set_holder(lease.id, processes.identify())
    out = cli("status").stdout
    section = out[out.index("No GPU yet (each takes its slice when its first cell runs):"):]
    row = next(line for line in section.splitlines() if lease.short_id in line)
    assert "reader.ipynb" in row and "small" in row
    assert "Hibernated" not in out


def test_status_json_is_what_the_ledger_holds(pool_home):
    lease = hold(pool_home, "alice", "half")
    data = json.loads(cli("status", "--json").stdout)
    assert [g["uuid"] for g in data["gpus"]] == ["DECLARED-local-0", "DECLARED-local-1"]
    assert all(g["source"] == "declared" for g in data["gpus"])
    [row] = data["leases"]
    assert row["id"] == lease.id and row["sm_percent"] == 50 and row["isolation"] == "mps"
    used = {g["uuid"]: (g["used_memory"], g["used_sm_percent"]) for g in data["gpus"]}
    assert used[lease.gpus[0]] == (20 * 2**30, 50)


def test_status_reclaims_the_leases_of_dead_processes(pool_home):
    pool = pool_home.pool()
    request = pool.request("gone", pool.settings.profile("small"))
    dead = request.__class__(**{**request.__dict__, "manager": Holder(2**22 - 3, 1.0, pool.host)})
    lease = pool.allocate(dead)
    pool.ledger.set_holder(lease.id, Holder(2**22 - 5, 1.0, pool.host))
    assert json.loads(cli("status", "--json").stdout)["leases"] == []


def test_profiles_lists_what_users_may_pick(pool_home):
    out = cli("profiles").stdout.splitlines()
    assert out[0].split()[:4] == ["PROFILE", "DISPLAY", "NAME", "SLICE"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert "(default)" in rows["small"] and "GPU 10 GiB" in rows["small"] and "soft" in rows["small"]
    assert rows["half"].split()[-3:] == ["20GiB,50%", "mps", "no"]  # MPS clients cannot hibernate


def test_kernelspec_install_writes_one_kernelspec_per_profile(pool_home, tmp_path):
    out = cli("kernelspec", "install", f"--prefix={tmp_path}", "--name=lab").stdout
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    assert sorted(os.listdir(kernels)) == ["lab-half", "lab-small", "lab-whole"]
    spec = json.loads((kernels / "lab-half" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 · GPU 20 GiB · 50%"
    assert spec["metadata"]["kernel_provisioner"] == {"provisioner_name": "gpu-pool", "config": {"profile": "half"}}
    assert "installed kernelspec lab-small" in out
    assert (kernels / "lab-half").stat().st_mode & 0o755 == 0o755  # a system-wide kernelspec every user can read
    # The launcher draws logo-svg: the Python logo with a GPU badge, so a GPU kernel does not look like the plain one.
    logo = (kernels / "lab-half" / "logo-svg.svg").read_text()
    assert logo.startswith("<svg") and ">GPU</text>" in logo and 'href="data:image/svg+xml;base64,' in logo
    assert (kernels / "lab-half" / "logo-64x64.png").exists()


def test_kernelspec_install_for_the_user(pool_home, jp_data_dir):
    cli("kernelspec", "install", "--user")
    assert {"gpu-pool-small", "gpu-pool-half", "gpu-pool-whole"} <= set(os.listdir(jp_data_dir / "kernels"))


def test_a_bad_config_is_reported_with_the_setting_and_exit_2(pool_home):
    pool_home.configure(profiles={"small": {"slice": "10 GiBs"}})
    out = cli("status", check=False)
    assert out.returncode == 2
    assert "Bad GPU pool configuration: GPUPool.profiles: profile 'small'.slice" in out.stderr
    assert "Traceback" not in out.stderr


def test_init_writes_a_demo_inventory_where_no_gpu_is_found(jp_environ, tmp_path):
    out = cli("init", f"--dir={tmp_path}").stdout
    body = json.loads((tmp_path / "jupyter_gpu_pool_config.json").read_text())
    assert body["GPUPool"]["inventory"][0]["name"].startswith("Demo GPU (declared")
    assert body["GPUPool"]["policy"][0]["action"] == "hibernate"  # declared GPUs hibernate: the demo shows it
    assert body["GPUPool"]["policy"][0]["slice_at"] == "first-cell"  # said explicitly: the default for new configs
    assert "no GPU detected by NVML" in out and "demo inventory (not real GPUs)" in out
    again = cli("init", f"--dir={tmp_path}", check=False)
    assert again.returncode == 2 and "exists" in again.stderr


def test_init_without_a_demo_writes_when_kernels_take_their_slice(tmp_path):
    """A machine with GPUs gets no demo policy, but its starting config still says slice_at explicitly, so
    an admin sees the choice (and writes "start" to keep kernels taking their slice when they start)."""
    from jupyter_gpu_pool.cli import write_initial_config
    from jupyter_gpu_pool.config import GPUPool
    from traitlets.config import Config

    body = json.loads(open(write_initial_config(str(tmp_path), demo=False)).read())
    assert body["GPUPool"]["policy"] == [{"name": "everyone", "slice_at": "first-cell"}]
    settings = GPUPool(config=Config(body)).check()
    assert settings.idle_policy.rule_for("alice", (), "gpu-small", "").slice_at == "first-cell"


def test_lab_sets_up_a_demo_pool_and_starts_jupyterlab(jp_environ, jp_config_dir, tmp_path):
    """The README's first command, minus the venv: no config and no GPU -> a declared demo pool."""
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "lab", f"--pool-config-dir={jp_config_dir}", "--user-kernelspecs", "--no-browser",
         f"--port={port}", "--ServerApp.token=t0k", f"--ServerApp.root_dir={tmp_path}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        specs = None
        while time.monotonic() < deadline and specs is None:
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs?token=t0k", timeout=5) as r:
                    specs = json.load(r)
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
        assert specs is not None, "JupyterLab did not answer"
        names = set(specs["kernelspecs"])
        assert {"gpu-pool-gpu-10g", "gpu-pool-gpu-20g-50", "gpu-pool-gpu-whole"} <= names
        assert specs["kernelspecs"]["gpu-pool-gpu-10g"]["spec"]["display_name"] == "Python 3 · GPU 10 GiB"
    finally:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines = out.splitlines()
    text = "\n".join(lines)
    assert "No GPU pool config found: wrote" in text
    assert "NO GPU DETECTED: the pool runs on a DECLARED DEMO INVENTORY" in text
    assert "2 declared GPU(s) from the inventory" in text
    body = json.loads((jp_config_dir / "jupyter_gpu_pool_config.json").read_text())
    assert body["GPUPool"]["inventory"][0]["count"] == 2


def _terminal_says(port: int, token: str, command: str, end: str, timeout: float = 60) -> str:
    """Open a JupyterLab terminal (jupyter_server's terminals API and its websocket, as the Terminal tab
    does), type ``command`` and read what it prints until ``end``."""
    import asyncio

    from tornado.websocket import websocket_connect

    made = urllib.request.Request(f"http://127.0.0.1:{port}/api/terminals", data=b"{}", method="POST",
                                  headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(made, timeout=30) as reply:
        name = json.load(reply)["name"]

    async def talk() -> str:
        ws = await websocket_connect(f"ws://127.0.0.1:{port}/terminals/websocket/{name}?token={token}")
        await ws.write_message(json.dumps(["stdin", command + "\r"]))
        seen = ""
        while end not in seen:
            message = await asyncio.wait_for(ws.read_message(), timeout)
            assert message is not None, f"the terminal closed: {seen[-2000:]}"
            kind, *rest = json.loads(message)
            if kind == "stdout":
                seen += rest[0]
        ws.close()
        return seen

    return asyncio.run(talk())


def test_the_labs_terminals_find_the_environments_jupyter_first(jp_environ, jp_config_dir, tmp_path):
    """The README: `jupyter gpu-pool status` in a terminal of ./scripts/lab's JupyterLab.  scripts/lab runs
    .venv/bin/jupyter without activating the environment, and a server whose output is not a terminal gives
    its terminals login shells, whose profile sets PATH afresh: neither may lose the environment's bin."""
    port = free_port()
    venv_bin = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                 if os.path.realpath(p) != os.path.realpath(venv_bin)),
           "SHELL": "/bin/bash"}
    proc = subprocess.Popen(
        [os.path.join(venv_bin, "jupyter"), "gpu-pool", "lab", f"--pool-config-dir={jp_config_dir}",
         "--user-kernelspecs", "--no-browser", f"--port={port}", "--ServerApp.token=t0k",
         f"--ServerApp.root_dir={tmp_path}", *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # output not a terminal
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=t0k", timeout=5):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "JupyterLab did not answer"
                time.sleep(0.5)
        said = _terminal_says(port, "t0k", "command -v jupyter; jupyter gpu-pool status; echo END$((40+2))",
                              "END42")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    assert "command not found" not in said, said
    assert os.path.join(venv_bin, "jupyter") in said, said  # the environment's own, first on PATH
    assert "declared" in said, said  # `jupyter gpu-pool status` showed this lab's pool


@pytest.mark.parametrize("args", [[], ["kernelspec"]])
def test_usage_is_printed_for_a_missing_subcommand(args):
    out = cli(*args, check=False)
    assert out.returncode == 2 and ("Subcommands" in out.stdout or "Usage" in out.stdout)
