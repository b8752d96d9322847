"""A GPU held only while it is used, on a machine: the first cell takes the slice, and what a user feels of a
resume with and without the hint.  Each test runs twice: on a machine of this project's stand-ins (CI; the
stand-in GPUs of hibernation_standin.py, or the declared test pool with the H100's restore cost model) and,
marked ``gpu``, on the GPU machine with real kernels holding real memory (``scripts/gpu-check``).  The code
is the same; only the machine (the ``machine`` fixture: its GPUs, its checkpoint driver, NVML, and what a
cell allocates) differs.

Through a real jupyter_server with the pool extension, real ipykernels started as JupyterLab starts them,
cells over the kernel websocket as JupyterLab sends them, the hint through ``POST …/hint``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass

import pytest
from server_hibernation_helpers import API, Server, body, extension_config
from test_first_cell import open_notebook, start_environment

from jupyter_gpu_pool.devices import nvml
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED

GiB = 2**30
COST = "0.306s + 0.179s/GiB"  # the H100's measured restore line: declared GPUs only (the twin's)
PROFILES = {"small": {"slice": "10GiB", "isolation": "soft"},
            "feel": {"slice": "11GiB", "isolation": "soft"}}  # 10 GiB of tensors and the CUDA context
POLICY = [{"name": "lab", "idle_timeout": None, "gpu_idle_timeout": None, "max_hibernated": None,
           "action": "hibernate", "slice_at": "first-cell"}]
HOLD_GIB = 10  # what the resume-feel kernel holds
TYPING = 3.0  # seconds the user types between the hint and the run
ROUNDS = 1  # of each kind (never slept, hint, resume on run), taking turns


@dataclass
class Machine:
    """Where a test runs: ``standin`` (stand-in GPUs, driver and NVML), ``declared`` (the declared test pool,
    the restore cost model) or ``gpu`` (this machine's GPUs, the real driver and NVML)."""

    kind: str

    @property
    def gpu(self) -> bool:
        return self.kind == "gpu"

    def hold(self, gib: float) -> str:
        """A cell that makes ``x`` hold ``gib`` GiB on the kernel's GPU and prints its checksum."""
        if not self.gpu:
            return f"x = {gib!r}\nprint('checksum', x)"
        return (f"import torch\ntorch.manual_seed(0)\nx = torch.randn(int({gib} * 2**30) // 4, device='cuda')\n"
                "torch.cuda.synchronize()\nprint('checksum', repr(sum(float(c.sum()) for c in x.split(2**27))))")

    @property
    def checksum(self) -> str:
        return ("print('checksum', repr(sum(float(c.sum()) for c in x.split(2**27))))" if self.gpu
                else "print('checksum', x)")


@pytest.fixture
def machine(request, pool_home) -> Machine:
    kind = request.param
    settings = {"policy": POLICY, "unix_groups": False, "profiles": PROFILES}
    if kind == "standin":
        request.getfixturevalue("standin_machine")  # stand-in discovery, driver and NVML
        settings.update(gpu_discovery="nvml", inventory=[])
    elif kind == "gpu":
        settings.update(gpu_discovery="nvml", inventory=[], hibernation_host_memory="none",
                        hibernation_lock_timeout=3.0)
    else:
        settings.update(hibernation_declared_restore_cost=COST)
    pool_home.configure(**settings)
    pool_home.install_kernelspecs()
    yield Machine(kind)
    if kind == "gpu":
        pool_home.pool().stop_mps()


@pytest.fixture
def jp_server_config(machine):
    return extension_config()


@pytest.fixture
def server(jp_fetch, ext) -> Server:
    return Server(jp_fetch, ext)


def held(pid: int) -> int:
    """NVML's reading of the process's GPU memory (0 when it lists none)."""
    return (nvml.memory().of_processes([pid]) or {}).get(pid, 0)


# -- the first cell --------------------------------------------------------------------------------------

# The first cell reports what it sees, in the kernel and in a Python it starts; on a GPU it also uses CUDA,
# tries past its soft cap, and asks nvidia-smi which processes run on which GPU.
FIRST_CELL = """
import json, os, subprocess, sys
seen = {"env": os.environ.get("CUDA_VISIBLE_DEVICES"), "fraction": os.environ.get("JUPYTER_GPU_POOL_MEMORY_FRACTION"),
        "capped": any(type(f).__name__ == "_TorchCapFinder" for f in sys.meta_path)}
child = "import json, os, sys; r = {'env': os.environ.get('CUDA_VISIBLE_DEVICES')}\\n"
if GPU:
    import torch
    x = torch.ones(2**28, device="cuda"); torch.cuda.synchronize()
    seen["cuda"] = {"count": torch.cuda.device_count(), "uuid": str(torch.cuda.get_device_properties(0).uuid),
                    "sum": float(x.sum())}
    try:
        over = torch.empty(int(float(seen["fraction"]) * torch.cuda.mem_get_info()[1]) + 2**30, dtype=torch.uint8,
                           device="cuda")
        seen["over_cap"] = "allocated"
    except torch.cuda.OutOfMemoryError:
        seen["over_cap"] = "refused"
    child += ("import torch; r['count'] = torch.cuda.device_count(); "
              "r['uuid'] = str(torch.cuda.get_device_properties(0).uuid)\\n")
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True).stdout
    seen["apps"] = [line.split(", ") for line in apps.strip().splitlines()]
child += "print(json.dumps(r))"
seen["child"] = json.loads(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                          check=True).stdout)
print("SEEN " + json.dumps(seen))
"""


@pytest.mark.parametrize("machine", ["standin", pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
async def test_a_kernel_holds_no_gpu_until_its_first_cell_which_takes_the_slice_and_sees_only_its_gpu(
        machine, jp_fetch, ext, server, channels, record_property):
    started = time.monotonic()
    kid, pid = await open_notebook(jp_fetch, ext)  # as a restored tab opens it

    lease = server.lease(kid)
    assert (lease.state, lease.gpus, lease.awaits_first_cell) == (HIBERNATED, (), True)
    assert start_environment(pid)["CUDA_VISIBLE_DEVICES"] == ""
    assert held(pid) == 0  # NVML lists nothing of it on any GPU
    assert (await server.me_kernel(kid))["state"] == "no_gpu_yet"

    ch = await channels(kid)
    cell = time.monotonic()
    got = await ch.replies(await ch.execute(f"GPU = {machine.gpu}\n" + FIRST_CELL), timeout=300)
    record_property("first_cell_s", round(time.monotonic() - cell, 2))

    reply = next(c for _ch, k, c in got if k == "execute_reply")
    errors = [c.get("traceback") for _ch, k, c in got if k == "error"]
    assert reply["status"] == "ok", errors
    taken = server.lease(kid)
    assert (taken.state, len(taken.gpus)) == (ACTIVE, 1)
    [gpu] = taken.gpus
    seen = json.loads(next(c["text"] for _ch, k, c in got if k == "stream" and c["text"].startswith("SEEN "))[5:])
    assert seen["env"] == seen["child"]["env"] == gpu  # the kernel and a process it starts see its GPU only
    assert seen["capped"] is True  # the soft cap's hook, armed for the first cell: its fraction of its GPU
    assert float(seen["fraction"]) == pytest.approx(10 * GiB / _memory_of(ext, gpu), abs=1e-6)
    if machine.gpu:
        assert seen["cuda"]["count"] == seen["child"]["count"] == 1
        assert gpu.endswith(seen["cuda"]["uuid"]) and gpu.endswith(seen["child"]["uuid"])
        assert seen["cuda"]["sum"] == 2**28
        assert seen["over_cap"] == "refused"  # the soft cap is in force in the first cell
        assert [str(pid), gpu] in seen["apps"]  # nvidia-smi: the kernel on its GPU
        assert held(pid) >= GiB  # and NVML now lists it
    record_property("seconds", round(time.monotonic() - started, 2))


def _memory_of(ext, uuid_: str) -> int:
    return next(g.memory for g in ext.backend.pool.inventory.gpus if g.uuid == uuid_)


# -- what the user feels of a resume ------------------------------------------------------------------------


async def run_to_first_output(ch, code: str, marker: str, timeout: float = 300) -> tuple[float, list[str]]:
    """Send a cell as JupyterLab does; the seconds from the send to its first output holding ``marker`` (a
    resume notice shown before it does not count), and every text it showed, once it is done."""
    msg_id = uuid.uuid4().hex
    texts: list[str] = []
    first = None
    replied = idle = False
    sent = time.perf_counter()
    await ch.ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "u", "session": uuid.uuid4().hex,
                   "date": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    deadline = time.monotonic() + timeout
    while not (replied and idle):
        raw = await asyncio.wait_for(ch.ws.read_message(), max(deadline - time.monotonic(), 0.01))
        assert raw is not None, "the kernel websocket closed"
        m = json.loads(raw)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        kind = m["header"]["msg_type"]
        text = (m["content"].get("text") if kind == "stream" else
                m["content"].get("data", {}).get("text/plain") if kind in ("display_data", "update_display_data")
                else None)
        if text is not None:
            texts.append(text)
            if first is None and marker in text:
                first = time.perf_counter() - sent
        if kind == "error":
            raise AssertionError(f"the cell failed: {m['content'].get('evalue')}")
        replied = replied or kind == "execute_reply"
        idle = idle or (kind == "status" and m["content"]["execution_state"] == "idle")
    assert first is not None, f"no output with {marker!r}: {texts}"
    return first, texts


@pytest.mark.parametrize("machine", ["declared", pytest.param("gpu", marks=pytest.mark.gpu)], indirect=True)
async def test_what_the_user_feels_of_a_resume_with_the_hint_against_never_slept_and_resume_on_run(
        machine, jp_fetch, ext, server, channels, record_property):
    """A kernel holding 10 GiB (real tensors on a GPU; declared, with the H100's restore cost, on the twin).
    Taking turns, ``ROUNDS`` times: never slept (the user types 3 s, runs a cell); hibernated, then the hint
    (``POST …/hint``, as the page sends it when the user clicks into a cell), 3 s of typing, the run;
    hibernated, then the run alone (resume on run, no hint).  The figure: the run to the cell's first output."""
    kid, _pid = await open_notebook(jp_fetch, ext, profile="feel", path="feel.ipynb")
    ch = await channels(kid)
    _, texts = await run_to_first_output(ch, machine.hold(HOLD_GIB), "checksum")
    checksum = next(t for t in texts if t.startswith("checksum"))
    waits: dict[str, list[float]] = {"never slept": [], "hint": [], "resume on run": []}
    restores: list[float] = []
    hibernations: list[float] = []
    awake_at_run: list[bool] = []  # whether the hinted resume had ended when the cell was sent

    async def hibernate() -> None:
        begun = time.monotonic()
        await server.hibernate(kid)
        hibernations.append(time.monotonic() - begun)
        if machine.gpu:
            assert held(_pid) == 0  # its memory is off the GPU

    for _ in range(ROUNDS):
        await asyncio.sleep(TYPING)  # never slept: the user types, then runs
        wait, texts = await run_to_first_output(ch, machine.checksum, "checksum")
        waits["never slept"].append(wait)
        assert checksum in texts

        await hibernate()
        hinted_at = time.monotonic()
        r = await server.fetch(*API, "kernels", kid, "hint", method="POST", body="{}")
        assert r.code == 202 and body(r)["woken"] is True, body(r)
        await asyncio.sleep(TYPING - (time.monotonic() - hinted_at))  # the user types while it wakes
        awake = server.lease(kid).state == ACTIVE and not server.lease(kid).phase
        awake_at_run.append(awake)
        wait, texts = await run_to_first_output(ch, machine.checksum, "checksum")
        waits["hint"].append(wait)
        assert checksum in texts
        if awake:  # resumed while the user typed: the cell runs at once, with no notice
            assert not any("Resuming" in t for t in texts), texts

        await hibernate()
        wait, texts = await run_to_first_output(ch, machine.checksum, "checksum")
        waits["resume on run"].append(wait)
        assert checksum in texts  # every value intact
        assert any("Resuming" in t for t in texts)  # the user was told to wait
        restores += [e.detail.get("duration", 0.0) for e in ext.backend.pool.ledger.journal()
                     if e.kernel_id == kid and e.kind == "resumed" and "duration" in e.detail][:1]

    median = {kind: statistics.median(w) for kind, w in waits.items()}
    record_property("gib", HOLD_GIB)
    record_property("typing_s", TYPING)
    record_property("rounds", ROUNDS)
    for kind, key in (("never slept", "never_slept_s"), ("hint", "hint_s"), ("resume on run", "resume_on_run_s")):
        record_property(key, round(median[kind], 3))
    record_property("hint_ratio", round(median["hint"] / median["never slept"], 2))
    record_property("resume_on_run_ratio", round(median["resume on run"] / median["never slept"], 2))
    record_property("hibernate_s", round(statistics.median(hibernations), 2))
    if restores:
        record_property("restore_s", round(statistics.median(restores), 2))
    record_property("hint_awake_at_run", all(awake_at_run))
    # The hint pays for the resume while the user types: the run that follows waits less than a resume on run,
    # which waits at least for the restore itself.
    assert max(waits["hint"]) < min(waits["resume on run"]), waits
    if not machine.gpu:
        assert min(waits["resume on run"]) >= 0.306 + 0.179 * 11  # the modelled restore of its 11 GiB slice
        assert all(awake_at_run)  # 2.3 s of modelled restore, within the 3 s of typing
