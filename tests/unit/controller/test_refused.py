"""controller/refused.py: a refused create becomes one FailedCreate Warning Event per object per window."""

from __future__ import annotations

from typing import Any

from grpo_operator.controller import kube, refused
from grpo_operator.controller.ratelimit import RateLimiter


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[dict[str, Any], Any]] = []

    def record(self, job: dict[str, Any], event: Any) -> None:
        self.recorded.append((job, event))


class _Controller:
    def __init__(self) -> None:
        self.failed_create_events = RateLimiter(refused.EVENT_WINDOW)
        self.events = _Events()


POD = {"kind": "Pod", "metadata": {"name": "j-node-0"}}
JOB = {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}


def test_a_refusal_is_one_warning_event_per_window() -> None:
    c = _Controller()
    exc = kube.ApiError(422, "Invalid", "spec.volumes[0].name: Invalid value")
    refused.report(c, ("ns", "j"), POD, exc, JOB)
    refused.report(c, ("ns", "j"), POD, exc, JOB)  # the reconcile's retry, inside the window
    assert len(c.events.recorded) == 1
    event = c.events.recorded[0][1]
    assert event.type == "Warning" and event.reason == "FailedCreate"
    assert "422" in event.message and "j-node-0" in event.message and "Invalid value" in event.message


def test_conflicts_and_throttling_are_not_refusals() -> None:
    c = _Controller()
    for status in (409, 429, 401, 500):
        refused.report(c, ("ns", "j"), POD, kube.ApiError(status, "X", "y"), JOB)
    assert c.events.recorded == []

