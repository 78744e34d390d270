"""Fencing at the moment of sending (controller/kube.py): a write waiting for a connection of the pool, and the retry
after a 401 re-login, pass the fence when they are sent, not only when they were issued. Against a real HTTP server
on loopback (aiohttp), since the pool wait is aiohttp's own."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from grpo_operator.controller import kube as kube_mod
from grpo_operator.controller import leader


class Info:
    """What kube.Kube needs of kopf's ConnectionInfo."""

    def __init__(self, server: str) -> None:
        self.server = server

    def as_ssl_context(self) -> ssl.SSLContext:
        raise AssertionError("plain HTTP")

    def as_http_headers(self) -> dict[str, str]:
        return {}


class Fence:
    def __init__(self) -> None:
        self.lost = False

    def __call__(self) -> None:
        if self.lost:
            raise leader.Fenced("lease lost")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[str, list[str], asyncio.Event]]:
    seen: list[str] = []
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        seen.append(request.path)
        await release.wait()
        return web.json_response({})

    async def fast(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({})

    async def unauthorized(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"message": "token expired"}, status=401)

    app = web.Application()
    app.router.add_route("*", "/slow", slow)
    app.router.add_route("*", "/fast", fast)
    app.router.add_route("*", "/expired", unauthorized)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen, release
    finally:
        release.set()
        await runner.cleanup()


@pytest.fixture
def fence() -> Any:
    f = Fence()
    kube_mod.set_fence(f)
    yield f
    kube_mod.set_fence(None)


@pytest.mark.asyncio
async def test_a_write_waiting_for_the_pool_is_fenced_when_it_gets_a_connection(server: Any, fence: Fence) -> None:
    """Finding (issue 27, Medium 6): fencing was check-then-act: `fence()` ran before the connection-pool wait, so a
    write queued behind the pool when the lease was lost was still sent once a connection came free."""
    url, seen, release = server
    k = kube_mod.Kube(Info(url), limit=1)
    try:
        first = asyncio.create_task(k.request("PATCH", "/slow", body={}))
        while "/slow" not in seen:
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(k.request("PATCH", "/fast", body={}))  # passes the early check, then waits
        await asyncio.sleep(0.05)
        fence.lost = True  # the renew deadline passes while it waits for the only connection
        release.set()
        await first
        with pytest.raises(leader.Fenced):
            await queued
        assert seen == ["/slow"]
        assert await k.request("GET", "/fast") == {}  # reads are not fenced
    finally:
        await k.close()


@pytest.mark.asyncio
async def test_the_retry_after_a_401_relogin_is_fenced(server: Any, fence: Fence) -> None:
    """Finding (issue 27, Medium 6): the 401 re-login retry was not fenced: a write whose first attempt got a 401 was
    sent again after the re-login even when the lease was lost meanwhile."""
    url, seen, _ = server

    async def relogin() -> Info:
        fence.lost = True  # the re-login took long enough for the renew deadline to pass
        return Info(url)

    k = kube_mod.Kube(Info(url), relogin=relogin)
    try:
        with pytest.raises(leader.Fenced):
            await k.request("PATCH", "/expired", body={})
        assert seen == ["/expired"]
    finally:
        await k.close()


@pytest.mark.asyncio
async def test_a_fence_set_after_the_session_was_made_still_fences_at_send(server: Any) -> None:
    """Without a fence the session runs no trace hooks (their cost on every request); once a fence is set, writes go
    through a session that checks it at send — the pool wait included."""
    url, seen, release = server
    k = kube_mod.Kube(Info(url), limit=1)
    f = Fence()
    try:
        assert await k.request("PATCH", "/fast", body={}) == {}  # no fence yet: an untraced session
        assert not k.session.trace_configs
        kube_mod.set_fence(f)
        assert await k.request("GET", "/fast") == {}  # reads (and the elector's own writes) keep the session they have
        assert not k.session.trace_configs
        first = asyncio.create_task(k.request("PATCH", "/slow", body={}))
        while "/slow" not in seen:
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(k.request("PATCH", "/fast", body={}))  # passes the early check, then waits
        await asyncio.sleep(0.05)
        f.lost = True
        release.set()
        await first
        with pytest.raises(leader.Fenced):
            await queued
        assert seen == ["/fast", "/fast", "/slow"]
        assert k.session.trace_configs
    finally:
        kube_mod.set_fence(None)
        await k.close()
