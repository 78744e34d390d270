"""The webhook server reads an UPDATE review of a large object (old + new: over aiohttp's default 1 MiB)."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from typing import Any

import aiohttp
import pytest

from grpo_operator.webhook import server as webhook_server


@pytest.mark.asyncio
async def test_a_3_mib_update_review_is_read_not_refused_with_413() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = webhook_server.server("127.0.0.1", port, "127.0.0.1", None)
    seen: list[int] = []

    async def fn(request: Any, **_: Any) -> Any:
        seen.append(len(json.dumps(request)))
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": request["request"]["uid"], "allowed": True}}

    big = {"metadata": {"name": "j", "namespace": "ns"}, "spec": {"blob": "x" * (1536 * 1024)}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u1", "operation": "UPDATE", "object": big, "oldObject": big,
                          "kind": {"group": "grpo.dev", "version": "v1alpha1", "kind": "GRPOJob"},
                          "resource": {"group": "grpo.dev", "version": "v1alpha1", "resource": "grpojobs"},
                          "userInfo": {"username": "u"}, "namespace": "ns", "name": "j"}}
    async with srv as entered:
        gen = entered(fn)
        config = await gen.__anext__()
        try:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            async with aiohttp.ClientSession() as session:
                async with session.post(config["url"].rstrip("/") + "/validate", json=review, ssl=ctx,
                                        timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    body = await resp.json()
            assert resp.status == 200, body
            assert body["response"]["allowed"] is True and seen and seen[0] > 3 * 1024 * 1024
        finally:
            await gen.aclose()
            await asyncio.sleep(0)
