"""The webhook as the chart runs it in a cluster (defects seen on a real node, shared/notes/images.md):
registered by Service reference, kopf must end up with the path "/validate" (it was "//validate", which the API
server refuses, so the in-cluster operator crash-looped); a refused spec is logged at INFO, not ERROR."""

from __future__ import annotations

import logging
import socket

import kopf
import pytest
from kopf._cogs.structs import references
from kopf._core.engines.admission import build_webhooks

from grpo_operator import api
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
    srv = webhook_server.server("127.0.0.1", _free_port(), "127.0.0.1", None, "grpo-system/grpo-webhook:9443")
    srv.path = root
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
        logger.error(f"Webhook 'other' failed permanently: boom")  # not ours: stays an error
    levels = [(r.levelname, r.getMessage()[:20]) for r in caplog.records]
    assert levels == [("INFO", "Webhook 'validate' f"), ("ERROR", "Webhook 'other' fail")]
