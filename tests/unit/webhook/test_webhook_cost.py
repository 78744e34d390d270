"""The webhook's cost is bounded per request (issue 27, finding 3): a flood of unknown keys computes a bounded
number of "did you mean" matches and yields a bounded message, and a review never runs on the event loop shared
with the controller and the Lease elector."""

from __future__ import annotations

import asyncio
import difflib
import time
from typing import Any

import kopf
import pytest

from grpo_operator.api import trl_fields
from grpo_operator.rules import validation
from grpo_operator.webhook import review as webhook
from grpo_operator.webhook import server as webhook_server
from tests.support.jobs import job_body

FLOOD = 5000  # unknown keys: 5,000 took 13.8 s of the event loop and made a 295 KB refusal before the caps


def flooded(where: str) -> dict[str, Any]:
    body = job_body("job", nodes=1)
    target = body["spec"]["training"] if where == "training" else body["spec"]
    for i in range(FLOOD):
        target[f"learningRat{i:05d}"] = i
    return body


@pytest.mark.parametrize("where", ["training", "spec"])
def test_a_key_flood_computes_a_bounded_number_of_suggestions(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3: every unknown spec.training key ran difflib over ~180 names (and every unknown spec key over its
    siblings): the cost grew with the number of keys a tenant sent. Now the matches stop at the reported errors."""
    calls = {"n": 0}
    real = difflib.get_close_matches

    def counted(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    r = webhook.review("CREATE", flooded(where))
    assert not r.allowed
    assert calls["n"] <= 2 * validation.MAX_ERRORS, calls  # trl_fields.suggest makes up to 2 per key
    assert len(r.message) <= webhook.MAX_MESSAGE and "learningRat00000" in r.message
    assert "more" in r.message  # the rest is counted, not listed


def test_a_long_key_gets_no_fuzzy_match_and_a_short_message() -> None:
    body = job_body("job", nodes=1)
    body["spec"]["training"]["x" * 200_000] = 1
    r = webhook.review("CREATE", body)
    assert not r.allowed and len(r.message) <= webhook.MAX_MESSAGE
    assert trl_fields.suggest("learningRat") == "learningRate"  # short typos still get their hint
    assert "did you mean 'learningRate'" in webhook.review("CREATE", flooded("training")).message


def test_the_summary_written_to_status_is_bounded() -> None:
    res = validation.validate(flooded("spec"))
    assert not res.valid and len(res.summary()) <= 4096


@pytest.mark.asyncio
async def test_a_slow_review_does_not_stall_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3: review() ran synchronously on the event loop, so a slow review delayed the controller and the Lease
    renewals (the leader lost its Lease and exited). Four CPU-bound reviews of 0.4 s each now run on worker threads
    while the loop keeps ticking."""
    def slow_review(*_: Any, **__: Any) -> webhook.Review:
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:
            pass
        return webhook.Review(True)

    monkeypatch.setattr(webhook_server, "review", slow_review)
    registry = kopf.OperatorRegistry()
    webhook_server.register(registry)
    [handler] = list(registry._webhooks.get_all_handlers())
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    body = job_body("job", nodes=1)
    await asyncio.gather(*(handler.fn(body=body, warnings=[], new=body, operation="CREATE") for _ in range(4)))
    done.set()
    await tick
    assert len(gaps) > 10 and max(gaps) < 0.3, max(gaps)
