"""A real JupyterHub for the service tests: jupyterhub from the package registry, configurable-http-proxy
from npm, LocalProcessSpawner starting each user's server as their own Unix user, and the pool service
as a hub-managed service."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernel_helpers import free_port
from service_helpers import http_json

CHP_VERSION = "4"  # configurable-http-proxy's major version JupyterHub 5 and 6 speak to


def proxy_command(cache: Path) -> str:
    """configurable-http-proxy, installed from npm into ``cache`` once (CI has the network)."""
    chp = cache / "node_modules" / ".bin" / "configurable-http-proxy"
    if not chp.exists():
        cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache),
                               f"configurable-http-proxy@{CHP_VERSION}"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and chp.exists(), f"npm could not install configurable-http-proxy: {done.stderr}"
    return str(chp)


class Hub:
    """``jupyterhub`` run by root with the pool service as a managed service; driven through its REST API
    with a token of a test service that may create users, start servers and make users' tokens."""

    def __init__(self, lab, proxy: str, *, admins: list[str], groups: dict[str, list[str]]):
        self.lab, self.proxy = lab, proxy
        self.dir = lab.root / "hub"
        self.dir.mkdir(mode=0o700)
        self.port, self.hub_port, self.api_port = free_port(), free_port(), free_port()
        self.token = secrets.token_hex(32)
        self.admins, self.groups = admins, groups
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        lab, venv_bin = self.lab, os.path.dirname(sys.executable)
        service = [sys.executable, "-m", "jupyter_gpu_pool.cli", "serve", f"--config-dir={lab.conf}"]
        return "\n".join([
            f"c.JupyterHub.ip = '127.0.0.1'",
            f"c.JupyterHub.port = {self.port}",
            f"c.JupyterHub.hub_ip = '127.0.0.1'",
            f"c.JupyterHub.hub_port = {self.hub_port}",
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{self.api_port}'",
            f"c.ConfigurableHTTPProxy.command = [{self.proxy!r}]",
            f"c.ConfigurableHTTPProxy.pid_file = {str(self.dir / 'proxy.pid')!r}",
            f"c.JupyterHub.db_url = 'sqlite:///{self.dir / 'hub.sqlite'}'",
            f"c.JupyterHub.cookie_secret_file = {str(self.dir / 'cookie_secret')!r}",
            "c.JupyterHub.authenticator_class = 'dummy'",
            "c.Authenticator.allow_all = True",
            f"c.Authenticator.admin_users = {set(self.admins)!r}",
            f"c.JupyterHub.load_groups = {({g: {'users': users} for g, users in self.groups.items()})!r}",
            "c.JupyterHub.spawner_class = 'localprocess'",
            f"c.Spawner.cmd = [{os.path.join(venv_bin, 'jupyterhub-singleuser')!r}]",
            "c.Spawner.args = ['--GPUPoolExtension.cull_interval=1']",
            f"c.Spawner.environment = {{'JUPYTER_GPU_POOL_SOCKET': {lab.socket!r}, 'JUPYTER_PATH': {str(lab.share)!r},"
            " 'JUPYTER_PLATFORM_DIRS': '1', 'PYTHONDONTWRITEBYTECODE': '1'}",
            "c.Spawner.start_timeout = 180",
            "c.Spawner.http_timeout = 180",
            # The pool service, managed by the hub: it gets the hub's API URL and a token in its environment.
            f"c.JupyterHub.services = [{{'name': 'gpu-pool', 'command': {service!r}}},"
            f" {{'name': 'tester', 'api_token': {self.token!r}}}]",
            "c.JupyterHub.load_roles = ["
            "{'name': 'gpu-pool', 'scopes': ['read:users', 'read:groups'], 'services': ['gpu-pool']},"
            "{'name': 'tester', 'scopes': ['admin:users', 'admin:servers', 'tokens', 'access:servers', 'read:groups'],"
            " 'services': ['tester']}]",
        ]) + "\n"

    def start(self, timeout: float = 120.0) -> Hub:
        (self.dir / "jupyterhub_config.py").write_text(self.config())
        log = open(self.lab.root / "hub.log", "ab")
        env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "CONFIGPROXY_AUTH_TOKEN": secrets.token_hex(16)}
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(self.dir / "jupyterhub_config.py")],
                                     cwd=str(self.dir), stdout=log, stderr=log, env=env, start_new_session=True)
        self.wait(lambda: self.api("GET", "")[0] == 200, timeout, "the hub to answer through its proxy")
        self.wait(lambda: os.path.exists(self.lab.socket), timeout, "the hub to start the pool service")
        return self

    def log(self) -> str:
        return (self.lab.root / "hub.log").read_text(errors="replace")

    def wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the hub exited while waiting for {what}: {self.log()[-4000:]}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}: {self.log()[-4000:]}")

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return http_json(method, f"{self.url}/hub/api/{path}", self.token, body)

    def spawn(self, name: str, timeout: float = 180.0) -> HubUser:
        """The user's server, started by the hub as their Unix user; the user with a token of their own."""
        if self.api("GET", f"users/{name}")[0] == 404:
            assert self.api("POST", f"users/{name}")[0] == 201
        code, reply = self.api("POST", f"users/{name}/server")
        assert code in (201, 202), (code, reply, self.log()[-3000:])
        self.wait(lambda: self.api("GET", f"users/{name}")[1].get("servers", {}).get("", {}).get("ready"), timeout,
                  f"{name}'s server")
        code, token = self.api("POST", f"users/{name}/tokens", {"scopes": [f"access:servers!user={name}"],
                                                                 "note": "service tests"})
        assert code in (200, 201), token
        return HubUser(self, name, token["token"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the hub stops the users' servers, its services and its proxy
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        pid_file = self.dir / "proxy.pid"
        if pid_file.exists():  # a proxy the hub could not stop
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass


class HubUser:
    """A hub user's own view: their server through the hub's proxy, with their token."""

    def __init__(self, hub: Hub, name: str, token: str):
        self.hub, self.name, self.token = hub, name, token

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return http_json(method, f"{self.hub.url}/user/{self.name}/{path}", self.token, body)

    def start_kernel(self, profile: str = "small") -> tuple[int, dict]:
        return self.request("POST", "api/kernels", {"name": f"gpu-pool-{profile}"})

    def me(self) -> dict:
        code, me = self.request("GET", "gpu-pool/api/v1/me")
        assert code == 200, me
        return me


def npm_available() -> bool:
    return shutil.which("npm") is not None
