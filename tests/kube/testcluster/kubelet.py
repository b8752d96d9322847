"""A kubelet for the test cluster: runs a scheduled pod's container as a local process.

What it does, in a real kubelet's order: mount the pod's volumes (Secret,
ConfigMap, emptyDir: files written with their ``defaultMode`` / ``items[].mode``
into a directory of its own; a missing Secret is a ``FailedMount`` event and a
retry), give the pod an address, "pull" the image, start the container with
its ``env`` (``value``, ``fieldRef`` for the pod's name, namespace, uid, node and
IP, ``secretKeyRef``, ``configMapKeyRef``) and ``$(VAR)`` expansion in command
and args, and report ``containerStatuses``, phase and conditions.  It honours
``restartPolicy`` (``Never``: the pod ends ``Succeeded`` / ``Failed`` with the
exit code; otherwise restarts with back-off as ``CrashLoopBackOff``), stops a
deleted pod with SIGTERM, then SIGKILL after its grace period, and serves the
container's output as the pod's log.

Where it differs from a real node (each difference is on purpose, and small):

- No container runtime: the image is never pulled.  An image matching one of
  the cluster's ``images`` patterns "pulls" (at once, or, for ``slow_images``,
  after the given seconds with the ``Pulling`` / ``Pulled`` events a real
  pull posts); any other fails with ``ErrImagePull`` then ``ImagePullBackOff``,
  as a missing image does.
- A node listed with ``"kubelet": false`` has a kubelet that never runs:
  its Node says ``Ready: Unknown`` and pods bound to it stay as the scheduler
  left them (a node that died after a pod was placed on it).  The
  command runs from this machine's Python environment: ``PATH`` starts with the
  directory of the Python running the cluster, so ``python`` is that Python.
- One host network: every pod gets its own loopback address ``127.A.B.n`` (A, B
  picked at random per cluster, so concurrent clusters do not meet), but pods
  share the host's network namespace.  To give a pod the effect of its own
  namespace, where binding the wildcard address means binding the pod's address,
  the container's ``PYTHONPATH`` gets ``podnet/`` first, whose ``sitecustomize``
  turns binds to ``0.0.0.0`` / ``*`` (sockets and ZeroMQ) into binds to the pod's
  address (from ``TESTCLUSTER_POD_IP``, which this kubelet adds).  Python
  containers only.  Nothing enforces NetworkPolicies.
- Mount paths are directories of the kubelet's, so a mount path that appears in
  the command, args or env values is rewritten to that directory.
- ``securityContext`` (``runAsUser``, ``runAsNonRoot``, ``fsGroup``,
  capabilities) is not applied: the process runs as the test's own user (tests
  often run as root, for whom file modes do not stop writes).  So that a
  container writing to a ``readOnly`` mount is still caught, the kubelet
  fingerprints the files of every read-only mount (inode, mtime, size) and kills
  a container that changed one, reporting ``reason: ReadOnlyMountWritten``.
- No cgroups, no resource limits, no probes: a container is ready once its
  process runs.  ``HOME`` is a fresh directory per pod.
- Processes get ``PR_SET_PDEATHSIG`` so that they die with the cluster process.
- A container's process is not its pid namespace's PID 1, so a SIGTERM it has no handler for ends it at
  once, where in a real container it does nothing (the kernel ignores a signal's default action for PID 1:
  a kernel pod whose command is ``python -m ipykernel_launcher`` takes its whole grace period and is then
  killed, exit code 137).  With ``pid1`` (``--pid1``), the kubelet stops a container as a real node does
  for a PID 1: SIGTERM only where the process handles it (its ``SigCgt`` in ``/proc``), else nothing until
  the grace period is over, then SIGKILL.  Off by default, so that tests stay quick.
- Pods on hollow nodes (``hollow.py``) are the hollow kubelet's, not this one's.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import fnmatch
import logging
import os
import random
import re
import shutil
import signal
import sys
from pathlib import Path

from .errors import ApiError
from .events import record_event
from .store import Store, now_rfc3339

log = logging.getLogger("testcluster.kubelet")

PODNET = str(Path(__file__).parent / "podnet")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables expand, ``$$`` is a literal ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, text)


def _pdeathsig() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def handles(pid: int, signum: int) -> bool:
    """Whether a process has a handler for a signal (its ``SigCgt`` mask in ``/proc/<pid>/status``)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next((line.split()[1] for line in status if line.startswith("SigCgt:")), "0")
    except OSError:
        return False
    return bool(int(caught, 16) >> (signum - 1) & 1)


class ContainerConfigError(Exception):
    pass


class Kubelet:
    def __init__(self, store: Store, state_dir: Path, images: list[str], node_ip: str = "127.0.0.1",
                 slow_images: dict[str, float] | None = None, dead_nodes: set[str] | None = None,
                 hollow_nodes: set[str] | None = None, pid1: bool = False):
        self.store = store
        self.state_dir = state_dir
        self.images = images
        self.slow_images = slow_images or {}  # image pattern -> seconds a pull takes
        self.dead_nodes = dead_nodes or set()  # nodes whose kubelet never runs anything
        self.hollow_nodes = hollow_nodes or set()  # nodes whose pods the hollow kubelet marks running
        self.pid1 = pid1  # a container's process ignores a SIGTERM it has no handler for, as a PID 1 does
        self.node_ip = node_ip
        self.pods_kind = store.kind("", "v1", "pods")
        self.runners: dict[str, PodRunner] = {}
        rng = random.Random()
        self._net = [rng.randrange(100, 250), rng.randrange(0, 256), 0]
        store.log_reader = self.read_log

    def allocate_ip(self) -> str:
        a, b, n = self._net
        n += 1
        if n > 254:
            b, n = (b + 1) % 256, 1
        self._net = [a, b, n]
        return f"127.{a}.{b}.{n}"

    def pullable(self, image: str) -> bool:
        return any(fnmatch.fnmatchcase(image, pattern) for pattern in self.images)

    def pull_seconds(self, image: str) -> float:
        return next((s for pattern, s in self.slow_images.items() if fnmatch.fnmatchcase(image, pattern)), 0.0)

    def read_log(self, pod: dict, query) -> str:
        path = self.state_dir / "pods" / pod["metadata"]["uid"] / "container.log"
        if not path.exists():
            raise ApiError(400, "BadRequest", f'container "{pod["spec"]["containers"][0]["name"]}" in pod '
                           f'"{pod["metadata"]["name"]}" is waiting to start')
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        if query.get("tailLines"):
            lines = lines[-int(query["tailLines"]):]
        return "".join(lines)

    async def run(self) -> None:
        watcher = self.store.watch(self.pods_kind, None, None, None, None, False)
        try:
            while True:
                event = await watcher.queue.get()
                pod = event["object"]
                uid = pod["metadata"]["uid"]
                runner = self.runners.get(uid)
                if event["type"] == "DELETED":
                    if runner:
                        runner.removed()
                    continue
                node = pod["spec"].get("nodeName")
                if not node or node in self.dead_nodes or node in self.hollow_nodes:
                    continue
                if runner is None:
                    runner = self.runners[uid] = PodRunner(self, pod)
                    runner.task = asyncio.create_task(runner.run())
                    runner.task.add_done_callback(lambda _t, u=uid: self.runners.pop(u, None))
                else:
                    runner.update(pod)
        finally:
            self.store.unwatch(watcher)

    async def stop(self) -> None:
        """Every pod's processes killed, and waited for (a run of a reused cluster ends: none outlives it)."""
        runners = list(self.runners.values())
        await cancel([r.task for r in runners if r.task is not None])  # each kills its container's processes
        for runner in runners:
            runner.signal(signal.SIGKILL)
            if runner.proc is not None:
                await runner.proc.wait()


async def cancel(tasks: list[asyncio.Task]) -> None:
    """Cancel the tasks and wait for their end.  Python 3.11's wait_for loses a cancellation that comes as the
    event it waits for does (a pod's end wakes the controllers just as they are stopped): cancelled again until
    they are done."""
    while pending := [t for t in tasks if not t.done()]:
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=0.1)


class PodRunner:
    def __init__(self, kubelet: Kubelet, pod: dict):
        self.kubelet = kubelet
        self.store = kubelet.store
        self.pod = pod
        self.changed = asyncio.Event()
        self.gone = False
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None
        self.dir = kubelet.state_dir / "pods" / pod["metadata"]["uid"]
        self.conditions: dict[str, dict] = {}
        self.restarts = 0
        self.readonly: dict[str, tuple] = {}

    # -- state from the API -----------------------------------------------------------------------

    def update(self, pod: dict) -> None:
        self.pod = pod
        self.changed.set()

    def removed(self) -> None:
        """The object is gone (force-deleted): stop the process at once."""
        self.gone = True
        self.signal(signal.SIGKILL)
        self.changed.set()

    @property
    def deleting(self) -> bool:
        return self.gone or bool(self.pod["metadata"].get("deletionTimestamp"))

    async def pause(self, seconds: float) -> bool:
        """Sleep, waking early on a change to the pod; True when the pod is being deleted."""
        self.changed.clear()
        if not self.deleting:
            try:
                await asyncio.wait_for(self.changed.wait(), seconds)
            except asyncio.TimeoutError:
                pass
        return self.deleting

    # -- status ---------------------------------------------------------------------------------

    @property
    def container(self) -> dict:
        return self.pod["spec"]["containers"][0]

    def _status(self, **fields) -> None:
        meta = self.pod["metadata"]
        fields["conditions"] = list(self.conditions.values())
        try:
            self.pod = self.store.patch(self.kubelet.pods_kind, meta["namespace"], meta["name"],
                                        "application/merge-patch+json", {"status": fields}, "status", validate=False)
        except ApiError:
            self.gone = True

    def _condition(self, type_: str, status: bool, reason: str | None = None) -> None:
        cond = {"type": type_, "status": "True" if status else "False", "lastTransitionTime": now_rfc3339()}
        if reason:
            cond["reason"] = reason
        old = self.conditions.get(type_)
        if old and old["status"] == cond["status"]:
            return
        self.conditions[type_] = cond

    def _container_status(self, state: dict, ready: bool = False) -> list[dict]:
        c = self.container
        return [{"name": c["name"], "image": c.get("image", ""), "imageID": f"testcluster://{c.get('image', '')}",
                 "ready": ready, "started": "running" in state, "restartCount": self.restarts, "state": state,
                 "containerID": f"testcluster://{self.pod['metadata']['uid']}/{self.restarts}"}]

    def _waiting(self, reason: str, message: str) -> None:
        self._status(phase="Pending", containerStatuses=self._container_status(
            {"waiting": {"reason": reason, "message": message}}))

    def event(self, type_: str, reason: str, message: str) -> None:
        record_event(self.store, self.pod, type_, reason, message, "kubelet")

    # -- the pod's life -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            if self.pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            if len(self.pod["spec"].get("containers", [])) != 1:
                self._waiting("CreateContainerError", "the test kubelet runs pods of exactly one container")
                await self._until_deleted()
                return
            mounts = await self._mount()
            if mounts is None:
                return
            ip = self.kubelet.allocate_ip()
            self._condition("PodScheduled", True)
            self._condition("Initialized", True)
            self._condition("Ready", False, "ContainersNotReady")
            self._condition("ContainersReady", False, "ContainersNotReady")
            self._status(phase="Pending", podIP=ip, podIPs=[{"ip": ip}], hostIP=self.kubelet.node_ip,
                         hostIPs=[{"ip": self.kubelet.node_ip}], startTime=now_rfc3339(),
                         containerStatuses=self._container_status({"waiting": {"reason": "ContainerCreating"}}))
            if not await self._pull():
                return
            await self._run_container(mounts, ip)
        except asyncio.CancelledError:
            self.signal(signal.SIGKILL)
            raise
        except Exception:  # a bug here must show, not hang a test
            log.exception("pod %s failed in the kubelet", self.pod["metadata"]["name"])
            raise
        finally:
            if self.deleting:
                await self._stop()
                if not self.gone:
                    self.store.finish_pod_deletion(self.pod)

    async def _until_deleted(self) -> None:
        while not await self.pause(3600):
            pass

    async def _mount(self) -> dict[str, tuple[str, bool]] | None:
        """Materialize the volumes; {mountPath: (local dir or file, readOnly)}, or None if deleted first."""
        while True:
            try:
                volumes = self._write_volumes()
                break
            except ContainerConfigError as e:
                self._waiting("ContainerCreating", str(e))
                self.event("Warning", "FailedMount", str(e))
                if await self.pause(1.0):
                    return None
        mounts = {}
        for m in self.container.get("volumeMounts") or []:
            local = volumes[m["name"]]
            if m.get("subPath"):
                local = os.path.join(local, m["subPath"])
            mounts[m["mountPath"]] = (local, bool(m.get("readOnly")))
            if m.get("readOnly"):
                self.readonly.update(self._fingerprint(local))
        return mounts

    def _secret(self, name: str) -> dict:
        try:
            return self.store.get(self.store.kind("", "v1", "secrets"), self.pod["metadata"]["namespace"], name)
        except ApiError:
            raise ContainerConfigError(f'secret "{name}" not found') from None

    def _configmap(self, name: str) -> dict:
        try:
            return self.store.get(self.store.kind("", "v1", "configmaps"), self.pod["metadata"]["namespace"], name)
        except ApiError:
            raise ContainerConfigError(f'configmap "{name}" not found') from None

    def _write_volumes(self) -> dict[str, str]:
        volumes = {}
        for vol in self.pod["spec"].get("volumes") or []:
            where = self.dir / "volumes" / vol["name"]
            if "secret" in vol or "configMap" in vol:
                src = vol.get("secret") or vol.get("configMap")
                try:
                    if "secret" in vol:
                        data = {k: base64.b64decode(v) for k, v in (self._secret(src["secretName"]).get("data")
                                                                      or {}).items()}
                    else:
                        data = {k: v.encode() for k, v in (self._configmap(src["name"]).get("data") or {}).items()}
                except ContainerConfigError as e:
                    raise ContainerConfigError(f'MountVolume.SetUp failed for volume "{vol["name"]}" : {e}') from None
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                if where.exists():
                    shutil.rmtree(where)
                where.mkdir(parents=True)
                for item in items:
                    if item["key"] not in data:
                        raise ContainerConfigError(f'MountVolume.SetUp failed for volume "{vol["name"]}" : '
                                                   f'key "{item["key"]}" not found')
                    path = where / item["path"]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data[item["key"]])
                    os.chmod(path, item.get("mode", src.get("defaultMode", 0o644)))
            elif "emptyDir" in vol:
                where.mkdir(parents=True, exist_ok=True)
            else:
                raise ContainerConfigError(f'volume "{vol["name"]}": the test kubelet mounts only secret, '
                                           "configMap and emptyDir volumes")
            volumes[vol["name"]] = str(where)
        return volumes

    @staticmethod
    def _fingerprint(path: str) -> dict[str, tuple]:
        found = {}
        for root, _, files in os.walk(path):
            for f in files:
                p = os.path.join(root, f)
                st = os.stat(p)
                found[p] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return found

    async def _pull(self) -> bool:
        image = self.container.get("image", "")
        if self.kubelet.pullable(image):
            seconds = self.kubelet.pull_seconds(image)
            if not seconds:
                self.event("Normal", "Pulled", f'Container image "{image}" already present on machine')
                return True
            self.event("Normal", "Pulling", f'Pulling image "{image}"')
            done = asyncio.get_running_loop().time() + seconds
            while (left := done - asyncio.get_running_loop().time()) > 0:
                if await self.pause(left):
                    return False
            self.event("Normal", "Pulled", f'Successfully pulled image "{image}" in {seconds:g}s')
            return True
        message = (f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack '
                   f'image "{image}": failed to resolve reference "{image}": not found')
        self._waiting("ErrImagePull", message)
        self.event("Warning", "Failed", message)
        backoff = 2.0
        while not await self.pause(backoff):
            self._waiting("ImagePullBackOff", f'Back-off pulling image "{image}"')
            self.event("Normal", "BackOff", f'Back-off pulling image "{image}"')
            backoff = min(backoff * 2, 30)
        return False

    def _env(self, ip: str) -> dict[str, str]:
        pod, c = self.pod, self.container
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                  "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": pod["spec"]["nodeName"],
                  "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                  "status.podIP": ip, "status.hostIP": self.kubelet.node_ip}
        env: dict[str, str] = {}
        for source in c.get("envFrom") or []:
            if "secretRef" in source:
                data = {k: base64.b64decode(v).decode() for k, v in
                        (self._secret(source["secretRef"]["name"]).get("data") or {}).items()}
            else:
                data = self._configmap(source["configMapRef"]["name"]).get("data") or {}
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for e in c.get("env") or []:
            if "valueFrom" not in e:
                env[e["name"]] = expand(e.get("value", ""), env)
                continue
            ref = e["valueFrom"]
            if "fieldRef" in ref:
                path = ref["fieldRef"]["fieldPath"]
                if path not in fields:
                    raise ContainerConfigError(f"the test kubelet cannot resolve fieldRef {path!r}")
                env[e["name"]] = fields[path]
            elif "secretKeyRef" in ref:
                data = self._secret(ref["secretKeyRef"]["name"]).get("data") or {}
                if ref["secretKeyRef"]["key"] not in data:
                    raise ContainerConfigError(f'couldn\'t find key {ref["secretKeyRef"]["key"]} in Secret')
                env[e["name"]] = base64.b64decode(data[ref["secretKeyRef"]["key"]]).decode()
            elif "configMapKeyRef" in ref:
                data = self._configmap(ref["configMapKeyRef"]["name"]).get("data") or {}
                env[e["name"]] = data.get(ref["configMapKeyRef"]["key"], "")
            else:
                raise ContainerConfigError(f"the test kubelet cannot resolve env {e['name']!r}")
        return env

    def _argv(self, env: dict[str, str], mounts: dict[str, tuple[str, bool]]) -> list[str]:
        c = self.container
        if not c.get("command"):
            raise ContainerConfigError("the test kubelet has no image entrypoint: give the container a command")
        argv = [expand(a, env) for a in list(c["command"]) + list(c.get("args") or [])]
        return [self._local_paths(a, mounts) for a in argv]

    @staticmethod
    def _local_paths(text: str, mounts: dict[str, tuple[str, bool]]) -> str:
        for mount_path in sorted(mounts, key=len, reverse=True):
            pattern = re.compile(r"(?<![\w.-])" + re.escape(mount_path.rstrip("/")) + r"(?=/|$|[^\w.-])")
            text = pattern.sub(lambda _m, local=mounts[mount_path][0]: local, text)
        return text

    async def _run_container(self, mounts: dict[str, tuple[str, bool]], ip: str) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        backoff = 1.0
        while True:
            try:
                env = self._env(ip)
                argv = self._argv(env, mounts)
            except ContainerConfigError as e:
                self._waiting("CreateContainerConfigError", str(e))
                self.event("Warning", "Failed", f"Error: {e}")
                if await self.pause(1.0):
                    return
                continue
            code, reason, message, started = await self._start_and_wait(argv, env, mounts, ip)
            finished = now_rfc3339()
            terminated = {"exitCode": code, "reason": reason, "startedAt": started or finished,
                          "finishedAt": finished}
            if message:
                terminated["message"] = message
            self._condition("Ready", False, "PodCompleted" if code == 0 else "ContainersNotReady")
            self._condition("ContainersReady", False, "PodCompleted" if code == 0 else "ContainersNotReady")
            if self.deleting or policy == "Never" or (policy == "OnFailure" and code == 0):
                self._status(phase="Succeeded" if code == 0 else "Failed",
                             containerStatuses=self._container_status({"terminated": terminated}))
                return
            self.restarts += 1
            self._status(phase="Running", containerStatuses=self._container_status(
                {"waiting": {"reason": "CrashLoopBackOff",
                             "message": f"back-off {backoff:.0f}s restarting failed container"}}))
            self.event("Warning", "BackOff", "Back-off restarting failed container")
            if await self.pause(backoff):
                return
            backoff = min(backoff * 2, 300)

    async def _start_and_wait(self, argv, env, mounts, ip) -> tuple[int, str, str, str | None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        home = self.dir / "home"
        home.mkdir(exist_ok=True)
        path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        proc_env = {"PATH": path, "HOME": str(home), "HOSTNAME": self.pod["metadata"]["name"], **env,
                    "TESTCLUSTER_POD_IP": ip}
        devices = self._claimed_devices()
        if devices:
            proc_env["TESTCLUSTER_DRA_DEVICES"] = ",".join(devices)
        proc_env["PYTHONPATH"] = os.pathsep.join(p for p in (PODNET, self._local_paths(env.get("PYTHONPATH", ""),
                                                                                        mounts)) if p)
        proc_env = {k: self._local_paths(v, mounts) for k, v in proc_env.items()}
        exe = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0], path=path)
        if exe is None:
            message = f'exec: "{argv[0]}": executable file not found in $PATH'
            self.event("Warning", "Failed", f"Error: {message}")
            return 128, "StartError", message, None
        workdir = self.container.get("workingDir") or str(home)
        with open(self.dir / "container.log", "ab") as logfile:
            self.proc = await asyncio.create_subprocess_exec(
                exe, *argv[1:], env=proc_env, cwd=self._local_paths(workdir, mounts), stdin=asyncio.subprocess.DEVNULL,
                stdout=logfile, stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_pdeathsig)
        started = now_rfc3339()
        self.event("Normal", "Started", f"Started container {self.container['name']}")
        self._condition("Ready", True)
        self._condition("ContainersReady", True)
        self._status(phase="Running", containerStatuses=self._container_status({"running": {"startedAt": started}},
                                                                               ready=True))
        wait = asyncio.ensure_future(self.proc.wait())
        violation = None
        while not wait.done():
            if self.deleting:
                await self._stop()
                break
            self.changed.clear()
            changed = asyncio.ensure_future(self.changed.wait())
            await asyncio.wait([wait, changed], timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            violation = violation or self._readonly_violation()
            if violation and not wait.done():
                self.signal(signal.SIGKILL)
        code = await wait
        code = 128 - code if code < 0 else code
        if violation:
            return code, "ReadOnlyMountWritten", violation, started
        return code, "Completed" if code == 0 else "Error", "", started

    def _claimed_devices(self) -> list[str]:
        """The devices allocated to the pod's claims (``driver/pool/device``): what a DRA driver would
        inject into the container (CDI devices), named instead."""
        claims = self.store.kind("resource.k8s.io", "v1", "resourceclaims")
        found = []
        for s in (self.pod.get("status") or {}).get("resourceClaimStatuses") or []:
            try:
                claim = self.store.get(claims, self.pod["metadata"]["namespace"], s["resourceClaimName"])
            except (ApiError, KeyError):
                continue
            for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                    "results") or []:
                found.append(f"{r['driver']}/{r['pool']}/{r['device']}")
        return found

    def _readonly_violation(self) -> str | None:
        for path, before in self.readonly.items():
            try:
                st = os.stat(path)
                now = (st.st_ino, st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                now = None
            if now != before:
                return f"the container wrote to {path}, on a read-only mount"
        return None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    async def _stop(self) -> None:
        """SIGTERM, then SIGKILL once the pod's grace period has passed."""
        if self.proc is None or self.proc.returncode is not None:
            return
        grace = 0 if self.gone else self.pod["metadata"].get("deletionGracePeriodSeconds", 30)
        if not grace:
            self.signal(signal.SIGKILL)
        elif not self.kubelet.pid1 or handles(self.proc.pid, signal.SIGTERM):
            self.signal(signal.SIGTERM)  # else, as a container's PID 1, the process would ignore it
        try:
            await asyncio.wait_for(self.proc.wait(), max(grace, 0.1))
        except asyncio.TimeoutError:
            self.signal(signal.SIGKILL)
            await self.proc.wait()
