"""The service's socket and what crosses it: where it is made and with which mode and group (never by a
path someone could have swapped for a link), how large a reply may be (the service and its clients agree),
and which Unix users are pool users when the admin strips a prefix (one pool name, one Unix user)."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest
from service_helpers import identity, raw, request, user_env

from jupyter_gpu_pool.service.client import ServiceClient, ServiceError
from jupyter_gpu_pool.service.identity import Identities, NotAPoolUser
from jupyter_gpu_pool.service.server import PoolService, StartError

pytestmark = pytest.mark.timeout(240)


class Running:
    """A PoolService in this process, its event loop in a thread of its own (the blocking client is ours)."""

    def __init__(self, lab, **options):
        from jupyter_gpu_pool.config import load_settings
        from jupyter_gpu_pool.local.pool import LocalPool

        self.pool = LocalPool(load_settings(paths=[str(lab.conf)]))
        self.service = PoolService(self.pool, Identities(user_prefix="jupyter-"), **options)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def close(self) -> None:
        self.run(self.service.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.pool.ledger.close()


@pytest.fixture
def running(lab):
    made = []

    def make(**options) -> Running:
        made.append(Running(lab, **options))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _can_connect(lab, name: str, path: str) -> bool:
    code = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\nexcept " \
           "PermissionError:\n    sys.exit(3)\n"
    done = subprocess.run([sys.executable, "-c", code, path], **identity(name), env=user_env(lab, name), timeout=60)
    assert done.returncode in (0, 3)
    return done.returncode == 0


# -- where the socket is made ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_link_or_a_file_where_the_socket_goes_is_refused_and_left_as_it_was(lab, running, kind):
    victim = lab.root / "victim"
    victim.write_text("the admin's")
    os.chmod(victim, 0o600)
    run = lab.root / "sock"
    run.mkdir()
    path = run / "pool.sock"
    if kind == "link":
        path.symlink_to(victim)  # chmod 0666 on this path would have made the victim everyone's
    else:
        path.write_text("not a socket")
    r = running()
    with pytest.raises(StartError, match=f"is a {'symbolic link' if kind == 'link' else 'file'}, not a socket"):
        r.run(r.service.start(str(path)))
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "the admin's"
    assert path.is_symlink() if kind == "link" else path.read_text() == "not a socket"
    assert os.listdir(run) == ["pool.sock"]  # nothing left behind


def test_the_socket_is_made_with_its_group_and_mode_and_replaces_a_stale_one(lab, running):
    run = lab.root / "sock"
    run.mkdir(mode=0o755)
    os.chmod(run, 0o755)
    path = str(run / "pool.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # a killed service's socket file
    stale.close()
    r = running()
    r.run(r.service.start(path, group="jupyter-alice"))
    found = os.lstat(path)
    assert stat.S_ISSOCK(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o660
    assert found.st_gid == grp.getgrnam("jupyter-alice").gr_gid and found.st_uid == 0
    assert os.listdir(run) == ["pool.sock"]  # the directory it was made in is gone
    assert _can_connect(lab, "alice", path) and not _can_connect(lab, "bob", path)  # only the group's members
    assert ServiceClient(path).call("whoami")["user"] == "root"


def test_without_a_group_every_user_may_connect(lab, running):
    r = running()
    r.run(r.service.start(lab.socket))
    assert stat.S_IMODE(os.lstat(lab.socket).st_mode) == 0o666
    assert _can_connect(lab, "bob", lab.socket)


def test_a_socket_that_cannot_be_made_is_a_start_error_naming_the_path(lab, running):
    deep = lab.root / ("d" * 100)  # a Unix socket's path is limited to 107 bytes: bind() refuses this one
    deep.mkdir()
    r = running()
    with pytest.raises(StartError, match=f"cannot put the socket at {deep}/pool.sock"):
        r.run(r.service.start(str(deep / "pool.sock")))
    assert os.listdir(deep) == []  # nothing left behind


def test_a_clean_stop_removes_its_socket_but_never_a_newer_services(lab, running):
    r = running()
    r.run(r.service.start(lab.socket))
    r.run(r.service.close())
    assert not os.path.lexists(lab.socket)  # clients are told "not answering", not left connecting to nothing
    first, second = running(), running()
    first.run(first.service.start(lab.socket))
    second.run(second.service.start(lab.socket))  # a new service took the path over (a restart)
    first.run(first.service.close())
    assert ServiceClient(lab.socket).call("whoami")["user"] == "root"  # the newer one's socket stays


def test_an_unknown_socket_group_is_refused_before_anything_is_made(lab, running):
    r = running()
    with pytest.raises(StartError, match="no Unix group 'no-such-group'"):
        r.run(r.service.start(lab.socket, group="no-such-group"))
    assert not os.path.lexists(lab.socket)


# -- how large a reply may be -------------------------------------------------------------------------------


def _journal_entries(client: ServiceClient, count: int) -> None:
    for i in range(count):
        client.call("record", kind="noted", detail={"n": i, "text": "x" * 15_000})


def test_a_reply_larger_than_a_reply_may_be_is_refused_plainly_and_the_connection_serves_on(lab, running):
    r = running(max_reply=256 * 1024)
    r.run(r.service.start(lab.socket))
    client = ServiceClient(lab.socket)
    _journal_entries(client, 24)  # some 360 KB of journal (entries of at most 16 KiB)
    with pytest.raises(ServiceError, match=r"the reply would be \d+ bytes, more than the 262144") as refused:
        client.call("journal", limit=100)
    assert refused.value.reason == "too_large" and refused.value.status == 413
    assert len(client.call("journal", limit=5)) == 5  # less is answered, on the same connection
    assert client.call("whoami")["user"] == "root"


def test_a_client_told_more_than_it_reads_says_so_and_does_not_ask_again(lab, running):
    r = running()
    r.run(r.service.start(lab.socket))
    _journal_entries(ServiceClient(lab.socket), 8)
    small = ServiceClient(lab.socket, max_reply=64 * 1024)
    served = r.service.served
    with pytest.raises(ServiceError, match="longer than the 65536 bytes this client reads") as refused:
        small.call("journal", limit=100)
    assert refused.value.reason == "too_large"
    assert r.service.served == served + 1  # asked once: a reply cut short is not a dropped connection to retry
    assert small.call("whoami")["user"] == "root"  # and the client goes on (a new connection)


def test_a_read_of_more_leases_than_a_reply_carries_is_refused_before_it_is_encoded(lab, running):
    r = running(max_rows=3)
    r.run(r.service.start(lab.socket))
    client = ServiceClient(lab.socket)
    for i in range(4):  # a user who starts and stops kernels in a loop: each lease is kept a week
        lease = client.call("allocate", kernel_id=f"k-{i}", profile="small")
        client.call("release", lease_id=lease.id)
    with pytest.raises(ServiceError, match="4 leases are released: a reply carries at most 3; ask for fewer") as no:
        client.call("leases", states=["released"])
    assert no.value.reason == "too_large" and no.value.status == 413
    assert client.call("leases", states=["active"]) == []  # the held ones are answered
    assert client.call("whoami")["user"] == "root"


# -- one pool name, one Unix user ----------------------------------------------------------------------------


def test_pool_names_with_a_prefix():
    tljh = Identities(user_prefix="jupyter-")
    assert tljh.pool_name("jupyter-alice") == "alice" and tljh.pool_name("root") == "root"
    for unix_name in ("alice", "jupyter-", "ubuntu"):
        with pytest.raises(NotAPoolUser, match="is not a user of the GPU pool"):
            tljh.pool_name(unix_name)
    with pytest.raises(NotAPoolUser, match="one pool name cannot be two users"):
        tljh.pool_name("jupyter-root")
    lenient = Identities(user_prefix="jupyter-", unprefixed=("root", "ubuntu"))
    assert lenient.pool_name("ubuntu") == "ubuntu"
    assert Identities().pool_name("alice") == "alice"  # no prefix: every Unix name is its own


GREETING = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(30)
print(s.makefile("rb").readline().decode())  # a refusal comes first, unasked (the connection is then closed)
"""


def _refusal(lab, user: dict) -> dict:
    """What the service says, unasked, to a process of ``user`` (subprocess's user, group, extra_groups)."""
    done = subprocess.run([sys.executable, "-c", GREETING, lab.socket], **user, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_unix_user_without_the_prefix_is_refused_on_the_socket(lab):
    """jupyter-alice is the pool's alice: a Unix user 'alice' (here: 'nobody', any name without the prefix)
    would be a second one under the same name, so the service refuses them, saying why."""
    lab.service()
    refused = _refusal(lab, {"user": "nobody", "group": "nogroup", "extra_groups": []})
    assert refused["error"]["reason"] == "not_a_pool_user" and "jupyter-<name>" in refused["error"]["message"]
    [who] = raw(lab, "alice", [request("whoami")])
    assert who["result"]["user"] == "alice"


def test_a_prefixed_user_whose_pool_name_is_an_unprefixed_users_is_refused(lab):
    lab.configure(service={"unprefixed_users": ["root", "alice"]})  # the Unix user 'alice' is the pool's alice
    lab.service()
    refused = _refusal(lab, identity("alice"))
    assert refused["error"]["reason"] == "not_a_pool_user"
    assert "one pool name cannot be two users" in refused["error"]["message"]
    [who] = raw(lab, "bob", [request("whoami")])
    assert who["result"]["user"] == "bob"
