"""The webhook as the chart runs it in a cluster (defects seen on a real node, docs/real-node.md):
registered by Service reference, kopf must end up with the path "/validate" (it was "//validate", which the API
server refuses, so the in-cluster operator crash-looped); a refused spec is logged at INFO, not ERROR."""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import time
from pathlib import Path

import kopf
import pytest
from kopf._cogs.structs import references
from kopf._core.engines.admission import build_webhooks

from grpo_operator import api
from grpo_operator.webhook import certs
from grpo_operator.webhook import server as webhook_server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _handlers(registry: kopf.OperatorRegistry) -> list:
    return list(registry._webhooks.get_all_handlers())


@pytest.mark.asyncio
@pytest.mark.parametrize("root", [None, "", "/", "/hooks/"])
async def test_service_reference_gives_the_api_server_a_valid_path(root: str | None) -> None:
    registry = kopf.OperatorRegistry()
    webhook_server.register(registry)
    port = _free_port()
    srv = webhook_server.server("127.0.0.1", port, "127.0.0.1", None, "grpo-system/grpo-webhook:9443")
    srv.path = root
    srv.dial = ("127.0.0.1", port)  # the Service's name does not resolve here: dial the server itself
    async with srv:
        gen = srv(lambda *a, **k: None)
        client_config = await gen.__anext__()
        await gen.aclose()
    resource = references.Resource(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, namespaced=True)
    hooks = build_webhooks(_handlers(registry), resources=[resource], name_suffix="grpo.dev", client_config=client_config)
    [hook] = hooks
    service = hook["clientConfig"]["service"]
    expected = "/hooks/validate" if root == "/hooks/" else "/validate"
    assert service == {"namespace": "grpo-system", "name": "grpo-webhook", "port": 9443, "path": expected}
    # the API server's rule: every segment non-empty
    assert all(service["path"].split("/")[1:]), service["path"]


def test_a_refusal_is_logged_at_info_not_error(caplog: pytest.LogCaptureFixture) -> None:
    registry = kopf.OperatorRegistry()
    webhook_server.register(registry)
    [handler] = _handlers(registry)
    # kopf's own logger and message format (kopf/_core/actions/execution.py: f"{handler} failed permanently: {e}")
    logger = logging.getLogger("kopf.objects")
    with caplog.at_level(logging.DEBUG, logger="kopf.objects"):
        logger.error(f"{handler} failed permanently: spec.training.numGenerations: 3 does not divide 8")
        logger.error("Webhook 'other' failed permanently: boom")  # not ours: stays an error
    levels = [(r.levelname, r.getMessage()[:20]) for r in caplog.records]
    assert levels == [("INFO", "Webhook 'validate' f"), ("ERROR", "Webhook 'other' fail")]


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_the_configuration_is_published_once_the_service_reaches_the_server(caplog) -> None:
    """Right after a start (an upgrade) the Service has no endpoint yet: publishing then made every GRPOJob write
    fail with "connection refused" (seen on a real node). A forwarder plays the Service: it appears after a while."""
    port, service_port = _free_port(), _free_port()
    srv = webhook_server.server("127.0.0.1", port, "127.0.0.1", None, "grpo-system/grpo-webhook:9443")
    srv.dial = ("127.0.0.1", service_port)
    connections: list[int] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(_forward(reader, up_writer), _forward(up_reader, writer))

    async def endpoint_appears() -> asyncio.AbstractServer:
        await asyncio.sleep(1.0)
        return await asyncio.start_server(relay, "127.0.0.1", service_port)

    caplog.set_level(logging.INFO, logger="grpo_operator.webhook")
    async with srv:
        appear = asyncio.ensure_future(endpoint_appears())
        gen = srv(lambda *a, **k: None)
        t0 = time.monotonic()
        client_config = await asyncio.wait_for(gen.__anext__(), 20)
        waited = time.monotonic() - t0
        await gen.aclose()
        (await appear).close()
    assert waited >= 1.0 and connections, (waited, connections)  # not before the "Service" answered, through it
    assert client_config["service"]["name"] == "grpo-webhook" and client_config["caBundle"]
    assert any("reachable through grpo-webhook.grpo-system.svc:9443" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_an_unreachable_service_delays_the_configuration_but_does_not_withhold_it(caplog) -> None:
    port = _free_port()
    srv = webhook_server.server("127.0.0.1", port, "127.0.0.1", None, "grpo-system/grpo-webhook:9443")
    srv.dial, srv.reach_timeout = ("127.0.0.1", _free_port()), 0.5  # nothing listens there
    caplog.set_level(logging.INFO, logger="grpo_operator.webhook")
    async with srv:
        gen = srv(lambda *a, **k: None)
        client_config = await asyncio.wait_for(gen.__anext__(), 20)
        await gen.aclose()
    assert client_config["service"]["port"] == 9443
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "not reachable through grpo-webhook.grpo-system.svc:9443" in warnings[0].getMessage()


@pytest.mark.asyncio
async def test_a_server_with_another_certificate_is_not_taken_for_ours(tmp_path) -> None:
    """Reaching *a* TLS server is not enough: it must verify with our CA for the Service's name (a server with
    another CA, e.g. a previous operator's, does not count)."""
    port = _free_port()
    srv = webhook_server.server("127.0.0.1", port, "127.0.0.1", None, "grpo-system/grpo-webhook:9443")
    srv.dial = ("127.0.0.1", port)
    other = certs.generate(str(tmp_path), ["grpo-webhook.grpo-system.svc"])
    other_ca = base64.b64encode(Path(other.cafile).read_bytes()).decode()
    async with srv:
        gen = srv(lambda *a, **k: None)
        cfg = await asyncio.wait_for(gen.__anext__(), 20)  # listening, and reachable with its own CA
        name = "grpo-webhook.grpo-system.svc"
        assert await webhook_server.until_reachable(name, 9443, cfg["caBundle"], 0.0, dial=("127.0.0.1", port))
        assert not await webhook_server.until_reachable(name, 9443, other_ca, 0.0, dial=("127.0.0.1", port))
        assert not await webhook_server.until_reachable("other.grpo-system.svc", 9443, cfg["caBundle"], 0.0,
                                                        dial=("127.0.0.1", port))  # not the name in its certificate
        await gen.aclose()
