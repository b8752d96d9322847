"""A GPU kernel takes its slice at its first cell (the rule's ``slice_at: first-cell``), not at start.

Through a real jupyter_server with the pool extension on the declared test pool (2 x 40 GiB), real
ipykernels started as JupyterLab starts them (``POST /api/sessions``, what a restored tab does), cells
sent over the kernel websocket as JupyterLab sends them, the real ledger and queue.  What the kernel
sees is read in the kernel and in a subprocess it starts, and from the kernel process's own start
environment (``/proc/<pid>/environ``).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from kernel_helpers import wait_until
from server_hibernation_helpers import Server, body, extension_config, texts
from test_declared_hibernation import fill_pool

from jupyter_gpu_pool.config import ConfigError, GPUPool
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED
from jupyter_gpu_pool.pool.rules import PolicyError, parse_policy
from traitlets.config import Config

GiB = 2**30
FIRST_CELL = {"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": "1s",
              "action": "hibernate", "slice_at": "first-cell"}
AT_START = {**FIRST_CELL, "slice_at": "start"}

# What a cell reports of its GPU environment, in the kernel and in a subprocess it starts.
SEEN_VARS = ("CUDA_VISIBLE_DEVICES", "JUPYTER_GPU_POOL_GPUS", "JUPYTER_GPU_POOL_MEMORY_FRACTION",
             "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
REPORT = f"""
import json, os, subprocess, sys
child = subprocess.run([sys.executable, "-c", "import json, os, sys; print(json.dumps({{'env': {{k: os.environ.get(k) for k in {SEEN_VARS!r}}}, 'capped': any(type(f).__name__ == '_TorchCapFinder' for f in sys.meta_path)}}))"],
                       capture_output=True, text=True, check=True)
print("REPORT " + json.dumps({{"env": {{k: os.environ.get(k) for k in {SEEN_VARS!r}}},
                              "capped": any(type(f).__name__ == "_TorchCapFinder" for f in sys.meta_path),
                              "child": json.loads(child.stdout)}}))
"""


def report(got) -> dict:
    line = next(t for t in texts(got) if t.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def start_environment(pid: int) -> dict[str, str]:
    """The environment the kernel process was started with."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}


@pytest.fixture
def jp_server_config(pool_home, request):
    settings = {"policy": [FIRST_CELL], "unix_groups": False}
    marker = request.node.get_closest_marker("pool_settings")
    if marker is not None:
        settings.update(marker.kwargs)
    pool_home.configure(**settings)
    return extension_config()


@pytest.fixture
def server(jp_fetch, ext) -> Server:
    return Server(jp_fetch, ext)


async def open_notebook(jp_fetch, ext, profile: str = "small", path: str = "lab.ipynb") -> tuple[str, int]:
    """``POST /api/sessions`` as JupyterLab does when it opens (or restores) a notebook: (kernel id, pid)."""
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": path, "name": path, "type": "notebook", "kernel": {"name": f"gpu-pool-{profile}"}}))
    kid = body(r)["kernel"]["id"]
    return kid, ext.serverapp.kernel_manager.get_kernel(kid).provisioner.pid


async def test_a_restored_notebook_holds_no_slice_and_its_first_cell_takes_one_with_its_environment(
        jp_fetch, ext, server, channels):
    kid, pid = await open_notebook(jp_fetch, ext)

    lease = server.lease(kid)
    assert (lease.state, lease.reason, lease.gpus, lease.awaits_first_cell) == (HIBERNATED, "first_cell", (), True)
    assert lease.label == "lab.ipynb"
    assert all(u.memory == 0 and u.leases == 0 for u in ext.backend.pool.ledger.snapshot().gpus)
    mine = await server.me_kernel(kid)
    assert mine["state"] == "no_gpu_yet" and mine["gpus"] == [] and "resume" not in mine["actions"]
    started = start_environment(pid)
    assert started["CUDA_VISIBLE_DEVICES"] == ""  # a stray CUDA init before the first cell finds no GPU
    assert started["JUPYTER_GPU_POOL_LEASE"] == lease.id and "JUPYTER_GPU_POOL_MEMORY_FRACTION" not in started
    await asyncio.sleep(1.5)  # past the rule's max_hibernated, several culling passes: it is not shut down
    assert kid in ext.serverapp.kernel_manager and server.lease(kid).awaits_first_cell
    metrics = (await jp_fetch("metrics")).body.decode()
    assert 'jupyter_gpu_pool_leases{state="no_gpu_yet"} 1.0' in metrics
    assert "jupyter_gpu_pool_hibernated_kernels 0.0" in metrics  # never hibernated: not counted so

    ch = await channels(kid)
    got = await ch.replies(await ch.execute(REPORT))

    assert next(c for _ch, k, c in got if k == "execute_reply")["status"] == "ok"
    assert any(t.startswith("This kernel takes its GPU slice now") for t in texts(got))
    taken = server.lease(kid)
    assert (taken.state, taken.phase, len(taken.gpus)) == (ACTIVE, "", 1)
    seen = report(got)
    for where in (seen, seen["child"]):
        assert where["env"]["CUDA_VISIBLE_DEVICES"] == taken.gpus[0]
        assert where["env"]["JUPYTER_GPU_POOL_GPUS"] == taken.gpus[0]
        assert where["env"]["JUPYTER_GPU_POOL_MEMORY_FRACTION"] == "0.250000"  # 10 GiB of 40: the soft cap
        assert where["capped"] is True  # PyTorch's cap is armed, in the kernel and in a Python it starts
    assert (await server.me_kernel(kid))["state"] == "active"
    assert ext.serverapp.kernel_manager.get_kernel(kid).provisioner.pid == pid  # the same process
    kinds = [e.kind for e in ext.backend.pool.ledger.journal() if e.kernel_id == kid]
    assert kinds[:2] == ["allocated", "opened"]  # newest first: opened without a slice, then the slice taken

    again = await ch.replies(await ch.execute("print('second')"))
    assert "second\n" in texts(again) and not any("GPU slice" in t for t in texts(again))


async def test_an_mps_kernels_first_cell_sees_the_mps_variables(jp_fetch, ext, server, channels):
    kid, pid = await open_notebook(jp_fetch, ext, profile="half", path="mps.ipynb")
    assert server.lease(kid).awaits_first_cell
    assert not any(k.startswith("CUDA_MPS_") for k in start_environment(pid))

    ch = await channels(kid)
    seen = report(await ch.replies(await ch.execute(REPORT)))

    taken = server.lease(kid)
    assert taken.state == ACTIVE
    for where in (seen["env"], seen["child"]["env"]):
        assert where["CUDA_VISIBLE_DEVICES"] == taken.gpus[0]
        assert where["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert where["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert where["CUDA_MPS_PIPE_DIRECTORY"] == ext.backend.pool.mps_env(taken)["CUDA_MPS_PIPE_DIRECTORY"]


async def test_a_first_cell_on_a_full_pool_waits_with_its_place_shown_and_runs_when_a_slice_frees(
        jp_fetch, ext, server, channels):
    kid, _ = await open_notebook(jp_fetch, ext)
    blockers = fill_pool(ext.backend.pool)
    ch = await channels(kid)

    seen: list = []
    cell = asyncio.ensure_future(ch.replies(await ch.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"),
                                            timeout=120, seen=seen))
    await wait_until(lambda: server.lease(kid).phase == "queued", what="queued")
    me = await server.me()
    mine = next(k for k in me["kernels"] if k["kernel_id"] == kid)
    assert mine["state"] == "queued" and mine["queue_position"] == 1
    await wait_until(lambda: any("first cell: position 1 in the queue" in t for t in texts(seen)),
                     what="the place shown")
    assert not cell.done()

    ext.backend.pool.ledger.release(blockers[1].id)
    got = await asyncio.wait_for(cell, 120)

    assert next(c for _ch, k, c in got if k == "execute_reply")["status"] == "ok"
    assert f"{blockers[1].gpus[0]}\n" in texts(got)  # the freed GPU, visible to the cell that waited for it
    assert server.lease(kid).state == ACTIVE and ext.backend.pool.ledger.waiters() == []


@pytest.mark.pool_settings(policy=[FIRST_CELL], default_user_quota={"memory": "5GiB", "kernels": 4})
async def test_a_refused_first_cell_says_why_in_the_pools_words_and_the_kernel_holds_nothing(
        jp_fetch, ext, server, channels):
    kid, _ = await open_notebook(jp_fetch, ext)
    assert server.lease(kid).awaits_first_cell  # a kernel holding nothing starts under any memory quota
    ch = await channels(kid)

    got = await ch.replies(await ch.execute("print('ran')"))

    reply = next(c for _ch, k, c in got if k == "execute_reply")
    assert reply["status"] == "error" and "ran\n" not in texts(got)
    error = next(c for _ch, k, c in got if k == "error")["evalue"]
    assert error.startswith("This cell did not run: the kernel could not take its GPU slice.")
    refusal = next(e for e in ext.backend.pool.ledger.journal() if e.kernel_id == kid and e.kind == "refused")
    assert refusal.reason == "quota_exceeded" and refusal.detail["message"] in error  # the pool's own words
    assert refusal.detail["action"] == "first_cell"  # the kernel's ask for its first slice, not a resume
    assert "Cannot resume" not in error
    lease = server.lease(kid)
    assert lease.awaits_first_cell and lease.phase == "" and (await server.me_kernel(kid))["state"] == "no_gpu_yet"


@pytest.mark.pool_settings(policy=[FIRST_CELL], default_user_quota={"kernels": 1})
async def test_a_kernel_holding_nothing_still_counts_as_a_kernel(jp_fetch, ext, server):
    await open_notebook(jp_fetch, ext)
    with pytest.raises(Exception) as refused:
        await open_notebook(jp_fetch, ext, path="second.ipynb")
    assert refused.value.code == 403
    assert "kernel" in body(refused.value.response)["message"].lower()


@pytest.mark.pool_settings(policy=[AT_START])
async def test_slice_at_start_keeps_taking_the_slice_when_the_kernel_starts(jp_fetch, ext, server, channels):
    kid, pid = await open_notebook(jp_fetch, ext)

    lease = server.lease(kid)
    assert lease.state == ACTIVE and len(lease.gpus) == 1 and not lease.awaits_first_cell
    assert start_environment(pid)["CUDA_VISIBLE_DEVICES"] == lease.gpus[0]
    assert (await server.me_kernel(kid))["state"] == "active"
    ch = await channels(kid)
    got = await ch.replies(await ch.execute("print('ran')"))
    assert "ran\n" in texts(got) and not any("GPU slice" in t for t in texts(got))


@pytest.mark.pool_settings(policy=[{"name": "mps at start", "match": {"profile": "half"}, "slice_at": "start"},
                                   FIRST_CELL])
async def test_the_first_rule_that_matches_decides_when_a_kernel_takes_its_slice(jp_fetch, ext, server):
    small, _ = await open_notebook(jp_fetch, ext)
    half, _ = await open_notebook(jp_fetch, ext, profile="half", path="mps.ipynb")
    assert server.lease(small).awaits_first_cell
    assert server.lease(half).state == ACTIVE and len(server.lease(half).gpus) == 1


def test_a_bad_slice_at_is_refused_with_the_rule_and_the_choices_named():
    with pytest.raises(PolicyError, match=r"\[0\] \('lab'\)\.slice_at: 'later' is not one of first-cell, start"):
        parse_policy([{"name": "lab", "slice_at": "later"}])
    with pytest.raises(PolicyError, match=r"slice_at: True is not one of"):
        parse_policy([{"slice_at": True}])
    assert parse_policy([{"slice_at": "start"}]).rules[0].slice_at == "start"
    assert parse_policy([{}]).rules[0].slice_at == "first-cell"  # the default
    with pytest.raises(Exception, match="slice_at"):
        GPUPool(config=Config({"GPUPool": {"policy": [{"slice_at": "sometimes"}]}}))


async def test_a_kernel_without_the_server_extension_takes_its_slice_at_start(pool_home, managers):
    """Nothing but the extension's websockets would take a slice at a first cell: a kernel started by a
    bare kernel manager (nbconvert, a script) takes it at start whatever the rule says."""
    pool_home.configure(policy=[FIRST_CELL])
    km = managers("gpu-pool-small")
    await km.start_kernel()
    lease = pool_home.ledger().by_kernel(km.kernel_id)
    assert lease.state == ACTIVE and len(lease.gpus) == 1
    assert start_environment(km.provisioner.pid)["CUDA_VISIBLE_DEVICES"] == lease.gpus[0]


async def test_a_restart_before_the_first_cell_keeps_holding_nothing_and_the_cell_after_takes_the_slice(
        jp_fetch, ext, server, channels):
    kid, pid = await open_notebook(jp_fetch, ext)
    lease_id = server.lease(kid).id

    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")

    new_pid = ext.serverapp.kernel_manager.get_kernel(kid).provisioner.pid
    assert new_pid != pid and start_environment(new_pid)["CUDA_VISIBLE_DEVICES"] == ""
    lease = server.lease(kid)
    assert lease.id == lease_id and lease.awaits_first_cell  # the same lease, still holding nothing
    ch = await channels(kid)
    got = await ch.replies(await ch.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"))
    assert f"{server.lease(kid).gpus[0]}\n" in texts(got) and server.lease(kid).state == ACTIVE


async def test_a_first_slice_whose_environment_cannot_be_set_is_given_back_and_the_cell_says_why(
        jp_fetch, ext, server, channels, tmp_path, monkeypatch):
    """The kernel's own startup code made os.environ unwritable: the slice cannot be put in force, so it
    goes back to the pool and the kernel holds nothing, as before; the cell did not run."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-frozen.py").write_text(
        "import os\nclass Frozen(dict):\n    def update(self, *a, **k):\n        raise RuntimeError('environment is frozen')\n"
        "os.environ = Frozen(os.environ)\n")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # the kernel inherits the server's environment
    kid, _ = await open_notebook(jp_fetch, ext)
    ch = await channels(kid)

    got = await ch.replies(await ch.execute("print('ran')"))

    assert next(c for _ch, k, c in got if k == "execute_reply")["status"] == "error" and "ran\n" not in texts(got)
    error = next(c for _ch, k, c in got if k == "error")["evalue"]
    assert "could not be given the slice's environment" in error and "environment is frozen" in error
    lease = server.lease(kid)
    assert lease.awaits_first_cell and lease.phase == "" and lease.gpus == ()
    assert all(u.memory == 0 for u in ext.backend.pool.ledger.snapshot().gpus)  # the slice went back


async def test_a_hint_never_gives_a_kernel_its_first_slice(jp_fetch, ext, server):
    """Focusing a restored tab is no cell: its kernel keeps holding nothing until one runs."""
    kid, _pid = await open_notebook(jp_fetch, ext)
    r = await jp_fetch("gpu-pool", "api", "v1", "kernels", kid, "hint", method="POST", body="{}")
    answer = body(r)
    assert r.code == 200 and answer["woken"] is False and answer["reason"] == "no_gpu_yet", answer
    await asyncio.sleep(0.5)
    lease = server.lease(kid)
    assert lease.awaits_first_cell and lease.phase == "" and lease.gpus == ()


@pytest.mark.pool_settings(policy=[{**FIRST_CELL, "idle_timeout": "2s", "warn": "1s", "max_hibernated": None}])
async def test_a_first_cell_long_after_the_notebook_opened_is_not_warned_as_it_takes_its_slice(
        jp_fetch, ext, server, channels, monkeypatch):
    """The first cell is its user's ask: the kernel is not judged idle for the time it was open before it.  A
    loaded run once warned a first cell 60 ms after its slice was taken (and withdrew the warning a moment later):
    a culling pass came between the end of the slice's move (the lease active, no phase) and the hook's record
    of it, which restarts the idle clock.  Here that record is held back until a pass has run."""
    kid, _ = await open_notebook(jp_fetch, ext)
    ch = await channels(kid)
    await asyncio.sleep(3.5)  # open longer than the idle time: it holds nothing, so it is not judged
    hook = ext.hibernator
    taken, go_on = asyncio.Event(), asyncio.Event()
    record = hook._record_resume

    async def late(task, kernel_id: str, reason: str) -> None:
        await asyncio.wait([task])
        taken.set()  # the slice is taken and the move over; its record (and the clock's restart) not yet
        await go_on.wait()
        await record(task, kernel_id, reason)

    monkeypatch.setattr(hook, "_record_resume", late)
    sent = await ch.execute("x = 1")
    await asyncio.wait_for(taken.wait(), 30)
    lease = server.lease(kid)
    assert (lease.state, lease.phase) == (ACTIVE, "")
    await ext.culler.pass_once()  # a culling pass comes first
    go_on.set()
    got = await ch.replies(sent)
    await ext.culler.pass_once()  # and one once the cell has run

    assert next(c for _ch, k, c in got if k == "execute_reply")["status"] == "ok"
    assert [e.kind for e in ext.backend.pool.ledger.journal() if e.kernel_id == kid and e.kind == "warned"] == []
