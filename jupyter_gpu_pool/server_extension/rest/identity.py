"""Who is asking: the pool user a request acts for, and whether they are an admin.

- A personal server (jupyter_server's own token/password identity, no JupyterHub): whoever
  holds the token is the server's owner, so every authenticated request acts for
  ``GPUPool.owner`` (the user its kernels are leased to) and may see the pool view, unless the
  pool says otherwise (the pool service knows whether the server's Unix user is an admin).
- Otherwise (JupyterHub, or a custom IdentityProvider) the request's user name is the
  pool user.  Admins are the names in ``GPUPoolExtension.admin_users`` and, under
  JupyterHub, users whose hub model carries ``admin: true``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider


@dataclass(frozen=True)
class Caller:
    user: str
    admin: bool


def is_personal_server(identity_provider) -> bool:
    """jupyter_server's own identity providers outside JupyterHub: one owner holds the token.  (Under
    JupyterHub the single-user server has the hub's identity provider and an API token; a JUPYTERHUB_USER
    variable alone is a name anyone can set and says nothing.)"""
    if os.environ.get("JUPYTERHUB_API_TOKEN"):
        return False
    return type(identity_provider) in (IdentityProvider, PasswordIdentityProvider)


def caller_of(current_user, *, personal: bool, owner: str, admin_users: set[str],
              owner_admin: bool | None = None) -> Caller:
    if personal:
        return Caller(user=owner, admin=True if owner_admin is None else owner_admin)
    name = getattr(current_user, "username", None) or str(current_user)
    hub_user = getattr(current_user, "hub_user", None)
    hub_admin = bool(hub_user.get("admin")) if isinstance(hub_user, dict) else False
    return Caller(user=name, admin=name in admin_users or hub_admin)
