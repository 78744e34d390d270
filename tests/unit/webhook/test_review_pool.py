"""The webhook sheds load with a fast 429 instead of queueing without end (issue 27, finding 3): past the reviews it
may hold, or for a review that already waited its budget for a worker (the API server may have given up on it).
Before, every review was queued, and under 200 costly reviews in flight each one's answer came later than the last."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from grpo_operator.rules.limits import NO_LIMITS
from grpo_operator.webhook import review as webhook
from grpo_operator.webhook import server as webhook_server
from tests.support.jobs import job_body


def blocking_review(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """review() replaced by one that waits for `release`; `calls` counts the reviews that were validated."""
    release, calls = threading.Event(), [0]

    def slow(*_: Any, **__: Any) -> webhook.Review:
        calls[0] += 1
        release.wait(10)
        return webhook.Review(True)

    monkeypatch.setattr(webhook_server, "review", slow)
    return release, calls


@pytest.mark.asyncio
async def test_past_the_bound_a_review_is_answered_busy_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    release, calls = blocking_review(monkeypatch)
    pool = webhook_server.ReviewPool(threads=1, max_held=3)
    body = job_body("job", nodes=1)
    held = [asyncio.create_task(pool.review("CREATE", body, None, NO_LIMITS)) for _ in range(3)]
    await asyncio.sleep(0)  # the three are held (one validating, two waiting)
    extra = await asyncio.wait_for(pool.review("CREATE", body, None, NO_LIMITS), 1)
    assert not extra.allowed and extra.code == 429 and "busy" in extra.message and "3 reviews" in extra.message
    release.set()
    assert all(r.allowed for r in await asyncio.gather(*held)) and calls[0] == 3
    assert pool.held == 0 and (await pool.review("CREATE", body, None, NO_LIMITS)).allowed  # the bound is released


@pytest.mark.asyncio
async def test_a_review_that_waited_past_its_budget_is_not_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    release, calls = blocking_review(monkeypatch)
    now = [0.0]
    pool = webhook_server.ReviewPool(threads=1, queue_budget=5.0, clock=lambda: now[0])
    body = job_body("job", nodes=1)
    first = asyncio.create_task(pool.review("CREATE", body, None, NO_LIMITS))
    second = asyncio.create_task(pool.review("CREATE", body, None, NO_LIMITS))
    while calls[0] < 1:  # the first is validating (its wait was measured at 0 s)
        await asyncio.sleep(0.01)
    now[0] = 6.0  # the second review has waited 6 s behind the first when a worker frees up
    release.set()
    a, b = await asyncio.gather(first, second)
    assert a.allowed and calls[0] == 1
    assert not b.allowed and b.code == 429 and "waited 6.0 s" in b.message


@pytest.mark.asyncio
async def test_the_served_review_answers_each_admission_review_as_the_api_server_expects() -> None:
    """Our server answers our reviews without kopf's admission path (which deep-copies every reviewed object, as
    costly as the review itself for the largest specs): the same decision, as an AdmissionReview response."""
    import kopf

    from tests.support.admission import review_request, worst_spec
    from tests.support.jobs import manifest

    serve = webhook_server.register(kopf.OperatorRegistry())
    ok, bad = review_request(manifest("ok", nodes=1)), review_request(worst_spec("bad"))
    a, b = await serve(ok), await serve(bad)
    warnings = webhook.review("CREATE", ok["request"]["object"]).warnings
    assert a == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "response": {"uid": ok["request"]["uid"], "allowed": True, **({"warnings": warnings} if warnings else {})}}
    expected = webhook.review("CREATE", bad["request"]["object"])
    assert b["response"]["uid"] == bad["request"]["uid"] and b["response"]["allowed"] is False
    assert b["response"]["status"] == {"message": expected.message, "code": 422}
    assert "did you mean 'learningRate'" in expected.message
