"""Who is calling the pool service: from the socket's peer credentials, never from the caller's word.

The kernel reports the connecting process's uid (``SO_PEERCRED``); the service maps it to a pool
user name (the Unix name, less a prefix such as TLJH's ``jupyter-``) and to groups (the Unix groups,
the admin's ``group_members``, and, when the service runs as a JupyterHub service, the user's hub
groups).  Admins are the members of a configured Unix or hub group, or hub admins.

With a prefix, one pool name must not stand for two Unix users (``jupyter-alice`` and ``alice``):
only names with the prefix are pool users, but for the few the admin lets in as they are
(``unprefixed``, root by default), whose names no prefixed user may take.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a Unix socket, as the kernel says."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return Peer(pid, uid, gid)


@dataclass(frozen=True)
class Caller:
    """A pool user: their name, their groups, whether they administer the pool."""

    user: str
    groups: tuple[str, ...]
    admin: bool
    uid: int


class NoSuchUser(PermissionError):
    """A uid with no name on this machine: such a process may not use the pool."""

    reason = "no_such_user"


class NotAPoolUser(NoSuchUser):
    """A Unix user whose name would not be theirs alone in the pool (see ``Identities.unprefixed``)."""

    reason = "not_a_pool_user"


@dataclass
class Identities:
    """Maps peers to callers, with a short cache (a hub lookup is an HTTP request)."""

    user_prefix: str = ""  # stripped from Unix names: TLJH names its users jupyter-<name>
    unprefixed: tuple[str, ...] = ("root",)  # with a prefix, the Unix users who are pool users under their own name
    admin_groups: tuple[str, ...] = ()  # Unix or hub groups whose members administer the pool
    unix_groups: bool = True
    group_members: dict | None = None  # the admin's own group lists (GPUPool.group_members)
    hub_api_url: str = ""  # set when the service runs as a JupyterHub service
    hub_api_token: str = ""
    ttl: float = 60.0

    def __post_init__(self):
        self._cache: dict[int, tuple[float, Caller]] = {}

    def caller(self, peer: Peer) -> Caller:
        hit = self._cache.get(peer.uid)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        found = self._look_up(peer.uid)
        self._cache[peer.uid] = (now, found)
        return found

    def by_name(self, user: str) -> Caller | None:
        """The pool user ``user`` as the service would know them on the socket (their Unix user is
        ``user_prefix + user``, or ``user``), or None where this machine has no such user."""
        names = (self.user_prefix + user, user) if user in self.unprefixed or not self.user_prefix else \
            (self.user_prefix + user,)
        for name in dict.fromkeys(names):
            try:
                return self.caller(Peer(pid=0, uid=pwd.getpwnam(name).pw_uid, gid=-1))
            except (KeyError, NotAPoolUser):
                continue
        return None

    def pool_name(self, unix_name: str) -> str:
        """The pool user a Unix user is, or :class:`NotAPoolUser` where that name would not be theirs alone."""
        prefix = self.user_prefix
        if not prefix:
            return unix_name
        if unix_name in self.unprefixed:
            return unix_name
        user = unix_name[len(prefix):] if unix_name.startswith(prefix) else ""
        if not user:
            raise NotAPoolUser(f"Unix user {unix_name!r} is not a user of the GPU pool: its users are named "
                               f"{prefix}<name> (PoolService.user_prefix); the admin may let others in by name "
                               "(PoolService.unprefixed_users)")
        if user in self.unprefixed:
            raise NotAPoolUser(f"Unix user {unix_name!r} would be the GPU pool's user {user!r}, which is the Unix user "
                               f"{user!r} (PoolService.unprefixed_users): one pool name cannot be two users")
        return user

    def _look_up(self, uid: int) -> Caller:
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise NoSuchUser(f"uid {uid} has no user name on this machine") from None
        unix_name = entry.pw_name
        user = self.pool_name(unix_name)
        groups: set[str] = set()
        if self.unix_groups:
            groups |= {grp.getgrgid(g).gr_name for g in os.getgrouplist(unix_name, entry.pw_gid)
                       if _has_group(g)}
        groups |= {g for g, members in (self.group_members or {}).items() if user in members}
        hub_admin = False
        if self.hub_api_url and self.hub_api_token:
            hub = self._hub_user(user)
            groups |= set(hub.get("groups") or ())
            hub_admin = bool(hub.get("admin"))
        admin = uid == 0 or hub_admin or bool(groups & set(self.admin_groups))
        return Caller(user=user, groups=tuple(sorted(groups)), admin=admin, uid=uid)

    def _hub_user(self, name: str) -> dict:
        url = f"{self.hub_api_url.rstrip('/')}/users/{urllib.parse.quote(name)}"
        request = urllib.request.Request(url, headers={"Authorization": f"token {self.hub_api_token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            log.warning("GPU pool service: JupyterHub does not say who %s is (%s); Unix groups only", name, e)
            return {}


def _has_group(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False
