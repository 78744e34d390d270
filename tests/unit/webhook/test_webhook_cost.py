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
from grpo_operator.rules.errors import MAX_ERRORS
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


def count_fuzzy_matches(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """difflib.get_close_matches counted (the validator's "did you mean"): {"n": calls so far}."""
    calls = {"n": 0}
    real = difflib.get_close_matches

    def counted(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    return calls


@pytest.mark.parametrize("where", ["training", "spec"])
def test_a_key_flood_computes_a_bounded_number_of_suggestions(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3: every unknown spec.training key ran difflib over ~180 names (and every unknown spec key over its
    siblings): the cost grew with the number of keys a tenant sent. Now the matches stop at the reported errors."""
    calls = count_fuzzy_matches(monkeypatch)
    r = webhook.review("CREATE", flooded(where))
    assert not r.allowed
    assert calls["n"] <= 2 * MAX_ERRORS, calls  # trl_fields.suggest makes up to 2 per key
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


def _mutated(rng: Any, i: int) -> dict[str, Any]:
    """A valid job with one hostile change: a key flood (in spec, training, a typed or a free-form object), a deep
    value, a huge key or string, or a value of the wrong type."""
    body = job_body(f"fuzz-{i}", nodes=rng.choice([1, 2]))
    spec = body["spec"]
    target = rng.choice([spec, spec["training"], spec["runPolicy"], spec["dataset"],
                         spec["training"].setdefault("modelInitKwargs", {})])
    kind = rng.choice(["flood", "deep", "long", "type"])
    if kind == "flood":
        for k in range(rng.choice([100, 500, 2000])):
            target[f"{rng.choice(['numGeneration', 'node', 'learningRat', 'x'])}{k}"] = rng.choice([1, "a", None, [1]])
    elif kind == "deep":
        value: Any = 1
        for _ in range(rng.choice([20, 40, 200])):
            value = {"a": value}
        target[rng.choice(["maxSteps", "beta", "zz"])] = value
    elif kind == "long":
        target["y" * rng.choice([100, 10_000, 300_000])] = "z" * rng.choice([10, 100_000])
    else:
        target[rng.choice(list(target) or ["k"])] = rng.choice([[[]], {"a": []}, -1, 1e308, "", True])
    return body


def test_an_admission_fuzz_with_key_floods_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3's fuzz: 120 mutated specs (key floods included) through review(): never an exception, every
    message within MAX_MESSAGE, and the fuzzy matching per review bounded (it grew with the keys a tenant sent)."""
    import random

    rng = random.Random(27)
    calls = count_fuzzy_matches(monkeypatch)
    worst = 0
    for i in range(120):
        calls["n"] = 0
        body = _mutated(rng, i)
        r = webhook.review("CREATE", body)
        old = job_body(f"fuzz-{i}", nodes=1, status={"phase": "Running", "startTime": "2030-01-01T10:00:00Z"})
        u = webhook.review("UPDATE", body, old)
        for res in (r, u):
            assert len(res.message) <= webhook.MAX_MESSAGE and all(len(w) <= 4096 for w in res.warnings)
        worst = max(worst, calls["n"])
    assert worst <= 8 * MAX_ERRORS, worst  # both reviews, each validating up to 3 objects
