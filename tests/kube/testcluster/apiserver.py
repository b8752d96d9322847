"""The HTTP face of the test API server: Kubernetes REST paths, discovery, watch streams.

Paths: ``/api/v1/...`` and ``/apis/<group>/<version>/...``, namespaced
(``.../namespaces/<ns>/<plural>[/<name>[/<subresource>]]``) or cluster-wide.
Verbs: GET (fetch, list, ``?watch=`` stream), POST (create), PUT (replace),
PATCH (merge / JSON / strategic-as-merge), DELETE (with DeleteOptions).
Boolean query values are read the way the real server reads them (Go's
``strconv.ParseBool``: ``true``, ``True``, ``1``, ...).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from .errors import ApiError
from .faults import Faults
from .kinds import Kind
from .schemas import KUBERNETES_VERSION
from .store import Store

log = logging.getLogger("testcluster.apiserver")

BOOKMARK_EVERY = 10.0

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_bool(value: str | None, name: str) -> bool:
    if value is None:
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ApiError(400, "BadRequest", f"invalid boolean {value!r} for {name}")


def _error(e: ApiError) -> web.Response:
    return web.json_response(e.status(), status=e.code)


def _ready(queue: asyncio.Queue) -> list:
    """What a queue holds now, without waiting."""
    ready = []
    while not queue.empty():
        ready.append(queue.get_nowait())
    return ready


def verb_of(method: str, name: str | None, watch: bool) -> str:
    """The authorization verb of a request, as the real server derives it."""
    if method == "GET":
        return "get" if name else ("watch" if watch else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())


class ApiServer:
    def __init__(self, store: Store):
        self.store = store
        # every resource request: when (Unix seconds), who (bearer token), verb, resource, namespace
        self.audit: list[dict] = []
        self.faults = Faults(store, restart=self.restart)
        self.app = self._application()
        self.port = 0
        self._runner: web.AppRunner | None = None

    def _application(self) -> web.Application:
        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_get("/testcluster/audit", self.serve_audit)
        app.router.add_post("/testcluster/faults", self.serve_faults)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    # -- listening --------------------------------------------------------------------------------

    async def start(self, port: int = 0) -> int:
        """Listen on 127.0.0.1 (``port``, or a free one); the port."""
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port or self.port, shutdown_timeout=2.0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner
        return self.port

    async def stop(self) -> None:
        """End every client's watch stream, then close the listening socket and every connection."""
        self.store.watches.cut()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def use(self, store: Store) -> None:
        """Serve a new run's state (a reused cluster, ``__main__.py``): its own audit log and faults, a new
        application and, once started again, a new port.  A restart the last run's fault had under way is
        called off."""
        self.faults.cancel()
        self.store = store
        self.audit = []
        self.faults = Faults(store, restart=self.restart)
        self.app = self._application()  # an application runs once
        self.port = 0

    async def restart(self, seconds: float) -> None:
        """A restart with the state kept (the ``restart`` fault): every connection closed, nothing listening
        for ``seconds``, then the same address again, with the history compacted as a restarted server's
        watch cache starts afresh (a watch resuming from before gets a 410)."""
        await asyncio.sleep(0.05)  # the fault request's own answer goes out first
        await self.stop()
        self.store.watches.compact()
        self.app = self._application()  # an application runs once
        await asyncio.sleep(seconds)
        await self.start(self.port)

    async def serve_audit(self, request: web.Request) -> web.Response:
        """The audit log (tests only): what each client asked, to compare with the RBAC it is granted;
        ``?user=`` those of one client (bearer token), ``?since=N`` from the Nth entry on (entries are
        numbered from 0 and never removed, so a reader can follow the log)."""
        entries = self.audit
        try:
            since = int(request.query.get("since") or 0)
        except ValueError:
            return _error(ApiError(400, "BadRequest", f"invalid since {request.query.get('since')!r}"))
        entries = entries[since:]
        user = request.query.get("user")
        if user is not None:
            entries = [e for e in entries if e["user"] == user]
        return web.json_response(entries)

    async def serve_faults(self, request: web.Request) -> web.Response:
        """Inject a fault (tests only; see faults.py)."""
        try:
            self.faults.apply(await request.json())
        except ApiError as e:
            return _error(e)
        return web.json_response({})

    def record(self, request: web.Request, kind: Kind, namespace, name, sub) -> dict:
        """Add a request to the audit log; its entry (``took`` and a create's ``name`` are set once served)."""
        auth = request.headers.get("Authorization", "")
        q = request.query
        watch = q.get("watch") in _TRUE
        entry = {
            "at": time.time(),
            "user": auth[len("Bearer "):] if auth.startswith("Bearer ") else "anonymous",
            "verb": verb_of(request.method, name, watch), "group": kind.group, "version": kind.version,
            "resource": kind.plural + (f"/{sub}" if sub else ""), "namespace": namespace, "name": name,
            "labelSelector": q.get("labelSelector"), "fieldSelector": q.get("fieldSelector"),
            "limit": q.get("limit"), "took": None}
        self.audit.append(entry)
        return entry

    # -- discovery ------------------------------------------------------------------------------

    def _resource_list(self, group: str, version: str) -> dict:
        kinds = [k for k in self.store.kinds.values() if k.group == group and k.version == version]
        if not kinds:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group}/{version})")
        resources = []
        for k in sorted(kinds, key=lambda k: k.plural):
            resources.append({"name": k.plural, "singularName": k.singular, "namespaced": k.namespaced,
                              "kind": k.kind, "verbs": list(k.verbs), "shortNames": list(k.short_names)})
            for sub in k.subresources:
                verbs = {"log": ["get"], "eviction": ["create"]}.get(sub, ["get", "patch", "update"])
                resources.append({"name": f"{k.plural}/{sub}", "singularName": "", "namespaced": k.namespaced,
                                  "kind": k.kind, "verbs": verbs})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}".lstrip("/"),
                "resources": resources}

    def _groups(self) -> list[dict]:
        groups: dict[str, list[str]] = {}
        for k in self.store.kinds.values():
            if k.group:
                versions = groups.setdefault(k.group, [])
                if k.version not in versions:
                    versions.append(k.version)
        return [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]

    def discovery(self, parts: list[str]) -> dict | None:
        if parts == ["version"]:
            major, minor, _ = KUBERNETES_VERSION.split(".")
            return {"major": major, "minor": minor, "gitVersion": f"v{KUBERNETES_VERSION}-testcluster",
                    "platform": "linux/amd64"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if parts == ["api", "v1"]:
            return self._resource_list("", "v1")
        if parts == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": self._groups()}
        if len(parts) == 2 and parts[0] == "apis":
            group = next((g for g in self._groups() if g["name"] == parts[1]), None)
            if group is None:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({parts[1]})")
            return {"kind": "APIGroup", "apiVersion": "v1", **group}
        if len(parts) == 3 and parts[0] == "apis":
            return self._resource_list(parts[1], parts[2])
        if parts in ([], ["healthz"], ["readyz"], ["livez"]):
            return {"paths": ["/api", "/api/v1", "/apis", "/version"]}
        return None

    # -- routing --------------------------------------------------------------------------------

    def route(self, parts: list[str]) -> tuple[Kind, str | None, str | None, str | None]:
        """(kind, namespace, name, subresource) for a resource path."""
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace = None
        plurals = {k.plural for k in self.store.kinds.values() if k.group == group and k.version == version}
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in plurals:
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind = self.store.kind(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in kind.subresources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({kind.plural}/{sub})")
        if kind.namespaced and name is not None and namespace is None:
            raise ApiError(404, "NotFound", f"a {kind.kind} is named inside a namespace")
        if not kind.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", f"{kind.kind} is not namespaced")
        return kind, namespace, name, sub

    async def handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        try:
            if request.method == "GET":
                found = self.discovery(parts)
                if found is not None:
                    return web.json_response(found)
            kind, namespace, name, sub = self.route(parts)
            request["audit"] = entry = self.record(request, kind, namespace, name, sub)
            await self.faults.check(kind.plural, verb_of(request.method, name, request.query.get("watch") in _TRUE))
            if "dryRun" in request.query:
                raise ApiError(400, "BadRequest", "dryRun is not supported by this test server")
            response = await self.serve(request, kind, namespace, name, sub)
            if isinstance(response, web.Response):  # (not a watch: its stream lasts as long as it lasts)
                entry["took"] = time.time() - entry["at"]
            return response
        except ApiError as e:
            return _error(e)
        except json.JSONDecodeError as e:
            return _error(ApiError(400, "BadRequest", f"the request body is not JSON: {e}"))

    async def _body(self, request: web.Request):
        raw = await request.read()
        return json.loads(raw) if raw else None

    async def serve(self, request: web.Request, kind: Kind, namespace, name, sub) -> web.StreamResponse:
        q = request.query
        store = self.store
        if request.method == "GET":
            if name is None:
                if parse_bool(q.get("watch"), "watch"):
                    return await self.stream(request, kind, namespace)
                try:
                    limit = int(q.get("limit") or 0)
                except ValueError:
                    raise ApiError(400, "BadRequest", f"invalid limit {q.get('limit')!r}") from None
                items, rv, following, rest = store.page(kind, namespace, q.get("labelSelector"),
                                                        q.get("fieldSelector"), limit, q.get("continue"))
                if not kind.custom:  # a real server leaves kind/apiVersion out of built-in list items
                    for item in items:
                        item.pop("kind", None)
                        item.pop("apiVersion", None)
                metadata = {"resourceVersion": str(rv)}
                if following:
                    metadata.update({"continue": following, "remainingItemCount": rest})
                return web.json_response({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                                          "metadata": metadata, "items": items})
            obj = store.get(kind, namespace, name)
            if sub == "log":
                text = store.log_reader(obj, q) if store.log_reader else ""
                return web.Response(text=text, content_type="text/plain")
            return web.json_response(obj)
        if request.method == "POST" and sub == "eviction":
            return web.json_response(store.evict(kind, namespace, name, await self._body(request)), status=201)
        if request.method == "POST" and name is None:
            made = store.create(kind, namespace, await self._body(request))
            request["audit"]["name"] = made["metadata"]["name"]  # what was made, for the audit log's reader
            return web.json_response(made, status=201)
        if request.method == "PUT" and name is not None:
            return web.json_response(store.replace(kind, namespace, name, await self._body(request), sub))
        if request.method == "PATCH" and name is not None:
            return web.json_response(store.patch(kind, namespace, name, request.headers.get("Content-Type", ""),
                                                 await self._body(request), sub))
        if request.method == "DELETE" and name is not None:
            options = await self._body(request) or {}
            if "propagationPolicy" in q:
                options["propagationPolicy"] = q["propagationPolicy"]
            if "gracePeriodSeconds" in q:
                options["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
            return web.json_response(store.delete(kind, namespace, name, options))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on {request.path}")

    async def stream(self, request: web.Request, kind: Kind, namespace: str | None) -> web.StreamResponse:
        q = request.query
        initial = parse_bool(q.get("sendInitialEvents"), "sendInitialEvents")
        watcher = self.store.watch(kind, namespace, q.get("labelSelector"), q.get("fieldSelector"),
                                   q.get("resourceVersion"), initial, remote=True)
        bookmarks = parse_bool(q.get("allowWatchBookmarks"), "allowWatchBookmarks")
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            while True:
                wait = BOOKMARK_EVERY
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        break
                try:
                    events = [await asyncio.wait_for(watcher.queue.get(), wait)]
                except asyncio.TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break  # the client went away
                    if bookmarks and (deadline is None or loop.time() < deadline):
                        events = [{"type": "BOOKMARK", "object": {
                            "kind": kind.kind, "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(self.store.rv)}}}]
                    else:
                        continue
                if not await self._send(response, events + _ready(watcher.queue)):
                    break
        except ConnectionResetError:
            pass
        finally:
            self.store.unwatch(watcher)
        try:
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, events: list[dict | None]) -> bool:
        """Write events in one chunk (all that were waiting: a watch that fell behind a busy server catches up
        in one write, not one event a turn of the loop); False once the stream is over (the server stops, or
        an ERROR was sent)."""
        lines, more = [], True
        for event in events:
            if event is None:  # the server is stopping
                more = False
                break
            lines.append(json.dumps(event).encode() + b"\n")
            if event["type"] == "ERROR":
                more = False
                break
        if lines:
            await response.write(b"".join(lines))
        return more
