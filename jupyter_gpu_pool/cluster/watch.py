"""List + watch that survives whatever the network or the API server does.

Every watch loop of the product that is not kopf's (the servers' GPUKernel
watch, the operator's kernel-pod watch, the node agent's pod watch) is
:func:`list_and_watch`: it lists in pages, then watches from the listing's
``resourceVersion`` with bookmarks.  A ``410 Gone`` (history compacted) lists
afresh at once; any other failure (an API error, a refused or reset
connection, a stream cut mid-response, which aiohttp raises as
``ClientPayloadError`` when the API server dies, a timeout, a bad line) is
logged and retried after an exponential back-off with jitter, reset once a
listing succeeds.  Only cancellation ends it.  (kopf's own watches do the same
for the custom resources the operator serves.)

Objects are handed on as the JSON the API server sent (dicts), never
deserialized into ``kubernetes_asyncio`` models: a watch of pods stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any, Awaitable, Callable

log = logging.getLogger("jupyter_gpu_pool.cluster")

PAGE_SIZE = 500
WATCH_SECONDS = 240
LIST_SECONDS = 60  # one page of a list: longer means a half-open connection, which would hang a list forever


class Backoff:
    """Seconds to wait before the next try: ``first``, doubling to ``cap``, each ±20%."""

    def __init__(self, first: float = 0.5, cap: float = 30.0):
        self.first, self.cap = first, cap
        self._next = first

    def next(self) -> float:
        wait = self._next
        self._next = min(self._next * 2, self.cap)
        return wait * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.first


class WatchError(Exception):
    """An ERROR event in a watch stream (``code`` as the API server gave it)."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


def _refusal(status: int, reason: str, data: bytes):
    """The API server's refusal as the client's ``ApiException``: its Status's message as the reason, and its
    body kept (as a refusal made with ``_preload_content`` keeps it)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        said = json.loads(data)
    except ValueError:
        said = {}
    e = ApiException(status=status, reason=said.get("message") or reason)
    e.body = data.decode(errors="replace")
    return e


async def _ok(response) -> None:
    """Raise the API server's refusal (without ``_preload_content`` the client does not)."""
    if 200 <= response.status <= 299:
        return
    try:
        data = await response.read()
    finally:
        response.release()
    raise _refusal(response.status, response.reason, data)


async def answer(call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> dict:
    """The JSON the API server answered to a ``kubernetes_asyncio`` call, not built into the client's models
    (a pod as a model costs milliseconds: most of a create's time in the operator); a refusal raised as the
    client's ``ApiException``, as with its models."""
    response = await call(*args, _preload_content=False, **kwargs)
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        raise _refusal(response.status, response.reason, data)
    return json.loads(data) if data else {}


async def list_all(list_call: Callable[..., Awaitable[Any]], *args: Any, page_size: int = PAGE_SIZE,
                   request_timeout: float = LIST_SECONDS, **kwargs: Any) -> tuple[list[dict], str]:
    """Every item (in pages of ``page_size``) and the listing's resourceVersion.  A page that takes more
    than ``request_timeout`` seconds (its answer included) raises ``TimeoutError``."""
    items: list[dict] = []
    token = None
    while True:
        page_kwargs = dict(kwargs, limit=page_size, _preload_content=False, _request_timeout=request_timeout)
        if token:
            page_kwargs["_continue"] = token
        response = await list_call(*args, **page_kwargs)
        await _ok(response)
        try:
            page = json.loads(await response.read())
        finally:
            response.release()
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items, page["metadata"]["resourceVersion"]


async def stream(list_call: Callable[..., Awaitable[Any]], *args: Any, resource_version: str,
                 timeout_seconds: int = WATCH_SECONDS, **kwargs: Any):
    """The events of one watch request (dicts: ``type``, ``object``), bookmarks included."""
    response = await list_call(*args, watch=True, resource_version=resource_version,
                               allow_watch_bookmarks=True, timeout_seconds=timeout_seconds,
                               _preload_content=False, _request_timeout=timeout_seconds + 30, **kwargs)
    await _ok(response)
    try:
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                raise WatchError(int(status.get("code") or 500), status.get("message", ""))
            yield event
    finally:
        response.release()


async def list_and_watch(list_call: Callable[..., Awaitable[Any]], *args: Any,
                         replace: Callable[[list[dict]], Awaitable[None]],
                         apply: Callable[[str, dict], Awaitable[None]], what: str,
                         backoff: Backoff | None = None, timeout_seconds: int = WATCH_SECONDS,
                         list_timeout: float = LIST_SECONDS, **kwargs: Any) -> None:
    """Keep ``replace`` (the whole listing, after each list) and ``apply`` (each ADDED / MODIFIED /
    DELETED event) up to date with a ``kubernetes_asyncio`` list call, until cancelled."""
    from kubernetes_asyncio.client.exceptions import ApiException

    backoff = backoff or Backoff()
    while True:
        try:
            items, rv = await list_all(list_call, *args, request_timeout=list_timeout, **kwargs)
            await replace(items)
            backoff.reset()
            while True:  # each request ends after timeout_seconds; resume from the last version seen
                async for event in stream(list_call, *args, resource_version=rv, timeout_seconds=timeout_seconds,
                                          **kwargs):
                    rv = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        await apply(event["type"], event["object"])
        except asyncio.CancelledError:
            raise
        except (ApiException, WatchError) as e:
            code = e.status if isinstance(e, ApiException) else e.code
            if code == 410:  # our version is too old: list afresh, now
                log.debug("watching %s: resource version expired; listing again", what)
                continue
            wait = backoff.next()
            log.warning("watching %s failed (%s %s); retrying in %.1fs", what, code,
                        getattr(e, "reason", None) or e, wait)
            await asyncio.sleep(wait)
        except Exception as e:  # the connection, the stream, the API server: none of it may end the watch
            wait = backoff.next()
            log.warning("watching %s failed (%s: %s); retrying in %.1fs", what, type(e).__name__, e, wait)
            await asyncio.sleep(wait)
