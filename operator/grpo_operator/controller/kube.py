"""A small asyncio Kubernetes API client (aiohttp) for the operator's own reads and writes.

kopf does the watching; this does the writes, with exactly the content types a real API server wants:
custom-object status updates are JSON merge patches (a dict sent as a JSON patch is a 400 there).
Credentials come from the same kopf login (ConnectionInfo) the watchers use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Optional
from urllib.parse import quote, urlencode

import aiohttp

from .. import api
from ..render import gangs
from . import metrics as opmetrics

log = logging.getLogger("grpo_operator.kube")

MERGE_PATCH = "application/merge-patch+json"

# Leader election's fence (leader.Elector.fence), called before every write: it raises or exits when this replica
# does not hold the Lease (or could not renew it in time). None: no leader election, every write goes.
_fence: Optional[Callable[[], None]] = None
FENCED = {"fenced": True}  # the trace context of a write that must pass the fence when it is sent


async def _fence_at_send(_session: Any, ctx: Any, _params: Any) -> None:
    """On a connection handed to a request (reused or new), i.e. after any wait for the pool and on every attempt
    (the 401 re-login's too): nothing but synchronous code runs from here to the socket write. A check before the wait
    would let a write queued behind the pool, or paused with the process, go out after the lease was lost."""
    if _fence is not None and ctx.trace_request_ctx is FENCED:
        _fence()


def _fence_trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_fence_at_send)
    trace.on_connection_create_end.append(_fence_at_send)
    return trace


def set_fence(check: Optional[Callable[[], None]]) -> None:
    global _fence
    _fence = check


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, body: Any = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message, self.body = status, reason, message, body


class NotFound(ApiError):
    pass


class Conflict(ApiError):  # 409: AlreadyExists or a resourceVersion conflict
    pass


class Gone(ApiError):  # 410: a watch's resourceVersion (or a list's continue token) expired: list again
    pass


def error_class(status: int) -> type[ApiError]:
    """The ApiError subclass callers catch for an HTTP status (or a watch ERROR event's code)."""
    return {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)


def decode_lines(buffer: bytearray, chunk: bytes) -> list[dict[str, Any]]:
    """Append a chunk of a watch stream to `buffer`; return the complete JSON lines in it, decoded (a line may span
    chunks, and a pod can be larger than aiohttp's line limit)."""
    buffer += chunk
    out: list[dict[str, Any]] = []
    while True:
        i = buffer.find(b"\n")
        if i < 0:
            return out
        line = bytes(buffer[:i])
        del buffer[:i + 1]
        if line.strip():
            out.append(json.loads(line))


# Objects of other API groups the operator creates (the gang schedulers' own: render/gangs): kind → plural.
GROUP_PLURALS = gangs.PLURALS
# Built-in kinds outside the core group the operator creates: kind → (group/version, plural). Not GROUP_PLURALS: a
# refusal of these is reported like a Service's (no "install the CRD" path).
BUILTIN_PLURALS = {"NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies")}


def path_for(kind: str, namespace: str, name: Optional[str] = None, subresource: Optional[str] = None,
             api_version: Optional[str] = None) -> str:
    if kind == "GRPOJob":
        base = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{quote(namespace)}/{api.PLURAL}"
    elif kind in GROUP_PLURALS and api_version and "/" in api_version:
        base = f"/apis/{api_version}/namespaces/{quote(namespace)}/{GROUP_PLURALS[kind]}"
    elif kind in BUILTIN_PLURALS:
        group_version, plural = BUILTIN_PLURALS[kind]
        base = f"/apis/{group_version}/namespaces/{quote(namespace)}/{plural}"
    elif kind == "Event":
        base = f"/api/v1/namespaces/{quote(namespace)}/events"
    else:
        plural = {"Pod": "pods", "Service": "services", "ConfigMap": "configmaps"}[kind]
        base = f"/api/v1/namespaces/{quote(namespace)}/{plural}"
    if name:
        base += f"/{quote(name)}"
    if subresource:
        base += f"/{subresource}"
    return base


class Kube:
    """One aiohttp session to the API server; re-logs in on 401."""

    def __init__(self, info: Any, relogin: Optional[Callable[[], Awaitable[Any]]] = None,
                 timeout: float = 30.0, limit: int = 64):
        self._info = info
        self._relogin = relogin
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._limit = limit
        self._session: Optional[aiohttp.ClientSession] = None
        self._traced = False  # whether _session checks the fence at send
        self._untraced: list[aiohttp.ClientSession] = []  # sessions replaced once a fence was set, closed on close()
        self._watch_session: Optional[aiohttp.ClientSession] = None
        self._lock = asyncio.Lock()

    def _make_session(self, limit: int, traced: bool, **options: Any) -> aiohttp.ClientSession:
        """`traced`: with the fence's trace hooks. Only while a fence is set: aiohttp runs a trace's callbacks for
        every request (~3 % of the operator's CPU at 1000 jobs without leader election, docs/performance.md)."""
        info = self._info
        ssl_ctx = info.as_ssl_context() if info.server.startswith("https") else False
        conn = aiohttp.TCPConnector(ssl=ssl_ctx, limit=limit)
        return aiohttp.ClientSession(connector=conn, headers=info.as_http_headers(),
                                     trace_configs=[_fence_trace()] if traced else None, **options)

    def _session_for(self, fence: bool) -> aiohttp.ClientSession:
        """The session for a request; for a write that must pass the fence, one that checks it at send."""
        if fence and _fence is not None and not self._traced and self._session is not None and not self._session.closed:
            self._untraced.append(self._session)  # a fence set after this session was made
            self._session = None
        return self.session

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._traced = _fence is not None
            self._session = self._make_session(self._limit, self._traced, timeout=self._timeout)
        return self._session

    async def _login_again(self) -> None:
        """After a 401: new credentials from the login, and new sessions carrying them."""
        assert self._relogin is not None
        async with self._lock:
            self._info = await self._relogin()
            await self.close()

    async def close(self) -> None:
        for attr in ("_session", "_watch_session"):
            session = getattr(self, attr)
            if session is not None:
                await session.close()
                setattr(self, attr, None)
        while self._untraced:
            await self._untraced.pop().close()

    async def watch(self, path: str, params: dict[str, Any], read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        """Stream a watch's events, decoded. Watches get their own connection pool: they hold a connection each for
        minutes, and must never take the slots writes are limited to."""
        if self._watch_session is None or self._watch_session.closed:
            self._watch_session = self._make_session(limit=0, traced=False)  # 0: no limit; reads are not fenced
        url = self._info.server.rstrip("/") + path + "?" + urlencode(params)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout)
        async with self._watch_session.get(url, timeout=timeout, headers={"Accept": "application/json"}) as resp:
            if resp.status >= 400:
                opmetrics.api_error("WATCH", resp.status)
                text = (await resp.read()).decode("utf-8", "replace")
                if resp.status == 401 and self._relogin is not None:
                    await self._login_again()
                raise error_class(resp.status)(resp.status, resp.reason or "", text[:2000])
            buffer = bytearray()
            async for chunk in resp.content.iter_any():
                for event in decode_lines(buffer, chunk):
                    yield event

    async def request(self, method: str, path: str, *, body: Any = None, params: Optional[dict] = None,
                      content_type: str = "application/json", decode: bool = True, fenced: bool = True) -> Any:
        fence = fenced and method != "GET"
        if fence and _fence is not None:
            _fence()  # early, so a standby fails fast; the check that counts is at the moment of sending
        url = self._info.server.rstrip("/") + path
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        for attempt in (0, 1):
            try:
                async with self._session_for(fence).request(method, url, data=data, trace_request_ctx=FENCED if fence else None,
                                                headers={"Content-Type": content_type, "Accept": "application/json"}) as resp:
                    raw = await resp.read()
                    status, http_reason = resp.status, resp.reason
            except TimeoutError:
                opmetrics.api_error(method, "timeout")
                raise
            except aiohttp.ClientError:
                opmetrics.api_error(method, "connection")
                raise
            if status >= 400:
                opmetrics.api_error(method, status)
            if status == 401 and attempt == 0 and self._relogin is not None:
                await self._login_again()
                continue
            if status < 400 and not decode:
                return None  # the caller needs no body (creates): JSON decoding was the operator's top CPU cost
            text = raw.decode("utf-8", "replace")
            try:
                payload = json.loads(text) if text else None
            except ValueError:
                payload = text
            if status < 400:
                return payload
            msg = payload.get("message", text) if isinstance(payload, dict) else text
            reason = payload.get("reason", http_reason or "") if isinstance(payload, dict) else (http_reason or "")
            raise error_class(status)(status, reason, str(msg)[:2000], payload)
        raise ApiError(401, "Unauthorized", "unauthorized after re-login")

    # ---- verbs
    async def create(self, obj: dict[str, Any], *, want_body: bool = False) -> Optional[dict[str, Any]]:
        """POST the object; its stored form only when `want_body` (decoding it costs more than sending it)."""
        meta = obj["metadata"]
        return await self.request("POST", path_for(obj["kind"], meta["namespace"], api_version=obj.get("apiVersion")),
                                  body=obj, decode=want_body)

    async def get(self, kind: str, namespace: str, name: str, api_version: Optional[str] = None) -> dict[str, Any]:
        return await self.request("GET", path_for(kind, namespace, name, api_version=api_version))

    async def patch(self, kind: str, namespace: str, name: str, merge_patch: dict[str, Any]) -> None:
        await self.request("PATCH", path_for(kind, namespace, name), body=merge_patch, content_type=MERGE_PATCH,
                           decode=False)

    async def delete(self, kind: str, namespace: str, name: str, *, propagation: Optional[str] = None,
                     uid: Optional[str] = None, grace_seconds: Optional[int] = None) -> bool:
        """Delete; False when already gone. A uid precondition never deletes a newer namesake."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path_for(kind, namespace, name), body=body)
            return True
        except NotFound:
            return False

    async def patch_status(self, kind: str, namespace: str, name: str, status_patch: dict[str, Any],
                           resource_version: Optional[str] = None) -> dict[str, Any]:
        """A merge patch of the status; with `resource_version`, conditional on it (the server answers 409 Conflict when
        the object changed since: the status was decided from an older version, or another replica wrote)."""
        body: dict[str, Any] = {"status": status_patch}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self.request("PATCH", path_for(kind, namespace, name, "status"), body=body,
                                  content_type=MERGE_PATCH)

    async def post_event(self, namespace: str, event: dict[str, Any]) -> None:
        await self.request("POST", path_for("Event", namespace), body=event, decode=False)


def server_version(info: Any) -> tuple[int, int]:
    """(major, minor) of the API server's /version answer; distributions write minor as '29+'. (0, 0) if unreadable."""
    try:
        return int(re.sub(r"\D", "", str(info["major"]))), int(re.sub(r"\D", "", str(info["minor"])))
    except (KeyError, TypeError, ValueError):
        return (0, 0)
