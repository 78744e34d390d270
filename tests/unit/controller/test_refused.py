"""controller/refused.py: a refused create becomes one FailedCreate Warning Event per object per window and a record
that the lifecycle turns into condition CreateFailed (lifecycle/create.py refused_creates); render/job.py's size check
of the ConfigMap."""

from __future__ import annotations

from typing import Any

from grpo_operator.controller import kube, refused


class _Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[dict[str, Any], Any]] = []

    def record(self, job: dict[str, Any], event: Any) -> None:
        self.recorded.append((job, event))


def _refusals() -> tuple[refused.Refusals, _Events]:
    events = _Events()
    return refused.Refusals(events), events  # type: ignore[arg-type]


POD = {"kind": "Pod", "metadata": {"name": "j-node-0"}}
JOB = {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}


def test_a_refusal_is_one_warning_event_per_window() -> None:
    c, events = _refusals()
    exc = kube.ApiError(422, "Invalid", "spec.volumes[0].name: Invalid value")
    c.report(("ns", "j"), POD, exc, JOB)
    c.report(("ns", "j"), POD, exc, JOB)  # the reconcile's retry, inside the window
    assert len(events.recorded) == 1
    event = events.recorded[0][1]
    assert event.type == "Warning" and event.reason == "FailedCreate"
    assert "422" in event.message and "j-node-0" in event.message and "Invalid value" in event.message
    assert c.records == {("ns", "j"): event.message}  # what the next pass hands the lifecycle


def test_conflicts_and_throttling_are_not_refusals() -> None:
    c, events = _refusals()
    for status in (409, 429, 401):
        c.report(("ns", "j"), POD, kube.ApiError(status, "X", "y"), JOB)
    assert events.recorded == [] and c.records == {}


def test_a_failing_admission_webhook_is_reported_like_a_refusal() -> None:
    """Finding (issue 27, Low): 5xx create refusals (a failing third-party webhook) got no Event or condition: the job
    looked Pending with nothing said."""
    c, events = _refusals()
    message = ('Internal error occurred: failed calling webhook "policy.example.com": Post '
               '"https://policy.example.svc:443/validate": dial tcp 10.0.0.7:443: connect: connection refused')
    c.report(("ns", "j"), POD, kube.ApiError(500, "InternalError", message), JOB)
    assert len(events.recorded) == 1
    event = events.recorded[0][1]
    assert event.reason == "FailedCreate" and "500" in event.message and "failed calling webhook" in event.message
    assert c.records == {("ns", "j"): event.message}



def test_a_config_map_over_1_mib_is_caught_before_it_is_sent() -> None:
    from grpo_operator.render import job as render_job

    small = {"kind": "ConfigMap", "metadata": {"name": "j-config"}, "data": {"config.json": "{}"}}
    big = {"kind": "ConfigMap", "metadata": {"name": "j-config"},
           "data": {"config.json": "x" * render_job.MAX_CONFIG_MAP_BYTES}}
    assert render_job.oversized([POD, small]) is None
    problem = render_job.oversized([POD, big])
    assert problem is not None and "j-config" in problem and "1 MiB" in problem and "spec" in problem
