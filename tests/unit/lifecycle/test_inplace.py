"""runPolicy.restartPolicy: the choice between a restart in place and new pods (exhaustive tables), the budget the
pods' torchrun gets (--max-restarts), and in-place restarts counted into the status against backoffLimit."""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from typing import Any

import pytest

from grpo_operator import api
from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle import inplace
from grpo_operator.lifecycle.inplace import Action, Cause
from grpo_operator.lifecycle.pods import Failure
from grpo_operator.render import job as render_job
from grpo_operator.rules import restarts, validation
from tests.support.jobs import job_body, pod_body

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
UID = "uid-1"
RUNNING = {"phase": "Running", "restarts": 0, "startTime": "2030-01-01T11:00:00Z",
           "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated"},
                          {"type": "Running", "status": "True", "reason": "AllNodesRunning"}]}


# ------------------------------------------------------------------------------------------------ the choice
# (cause, retryable, restartPolicy, backoffLimit, charged, in_place_left) → action: every row written out
CHOICES = [
    # a process failure in a healthy pod: in place while the attempt's budget lasts, else new pods, else Failed
    (Cause.PROCESS, True, "InPlace", 3, 0, 2, Action.IN_PLACE),
    (Cause.PROCESS, True, "InPlace", 3, 1, 1, Action.IN_PLACE),
    (Cause.PROCESS, True, "InPlace", 3, 2, 0, Action.RECREATE),  # the last retry: new pods
    (Cause.PROCESS, True, "InPlace", 3, 3, 0, Action.FAIL),
    (Cause.PROCESS, True, "InPlace", 0, 0, 0, Action.FAIL),
    (Cause.PROCESS, True, "Recreate", 3, 0, 2, Action.RECREATE),  # Recreate never restarts in place
    (Cause.PROCESS, True, "Recreate", 3, 3, 0, Action.FAIL),
    (Cause.PROCESS, False, "InPlace", 3, 0, 2, Action.FAIL),  # a permanent code: never retried
    # what the operator sees is pod-level: new pods whatever the policy, or Failed
    (Cause.POD_FAILED, True, "InPlace", 3, 0, 2, Action.RECREATE),
    (Cause.POD_FAILED, True, "InPlace", 3, 3, 0, Action.FAIL),
    (Cause.POD_FAILED, False, "InPlace", 3, 0, 2, Action.FAIL),
    (Cause.POD_LOST, True, "InPlace", 3, 0, 2, Action.RECREATE),
    (Cause.POD_LOST, True, "Recreate", 3, 2, 0, Action.RECREATE),
    (Cause.POD_LOST, True, "InPlace", 1, 1, 0, Action.FAIL),
    (Cause.EVICTED, True, "InPlace", 3, 0, 2, Action.RECREATE),
    (Cause.EVICTED, True, "Recreate", 3, 0, 0, Action.RECREATE),
    (Cause.EVICTED, True, "InPlace", 2, 2, 0, Action.FAIL),
]


@pytest.mark.parametrize("cause, retryable, policy, limit, charged, left, expected", CHOICES)
def test_choose_table(cause: Cause, retryable: bool, policy: str, limit: int, charged: int, left: int,
                      expected: Action) -> None:
    assert inplace.choose(cause, retryable=retryable, restart_policy=policy, backoff_limit=limit, charged=charged,
                          in_place_left=left) == expected


def test_choose_every_combination_obeys_the_rules() -> None:
    """Over the whole grid: Failed exactly when the failure is permanent or the budget is spent; in place only for a
    process failure under InPlace with budget left in the attempt; never in place for anything pod-level."""
    for cause, retryable, policy, limit, charged, left in itertools.product(
            Cause, (True, False), ("InPlace", "Recreate"), range(4), range(5), range(3)):
        got = inplace.choose(cause, retryable=retryable, restart_policy=policy, backoff_limit=limit,
                             charged=charged, in_place_left=left)
        assert (got == Action.FAIL) == (not retryable or charged >= limit)
        if got == Action.IN_PLACE:
            assert cause == Cause.PROCESS and policy == "InPlace" and left > 0
        if cause != Cause.PROCESS:
            assert got != Action.IN_PLACE


@pytest.mark.parametrize("reason, cause", [
    ("PodDeleted", Cause.POD_LOST), ("NodeLost", Cause.POD_LOST), ("Shutdown", Cause.POD_LOST),
    ("Evicted", Cause.EVICTED), ("Preempting", Cause.EVICTED), ("DeadlineExceeded", Cause.EVICTED),
    ("OOMKilled", Cause.POD_FAILED), ("Signal9", Cause.POD_FAILED), ("Preempted", Cause.POD_FAILED),
    ("ExitCode137", Cause.POD_FAILED), ("DistributedError", Cause.POD_FAILED), ("Stalled", Cause.POD_FAILED),
])
def test_cause_of_observed_failures(reason: str, cause: Cause) -> None:
    assert inplace.cause_of(Failure(True, reason, "m")) == cause


# ------------------------------------------------------------------------------------------------ the budget
@pytest.mark.parametrize("policy, limit, charged, budget", [
    ("InPlace", 3, 0, 2), ("InPlace", 3, 1, 1), ("InPlace", 3, 2, 0), ("InPlace", 3, 5, 0),
    ("InPlace", 1, 0, 0), ("InPlace", 0, 0, 0), ("InPlace", 10, 4, 5),
    ("Recreate", 3, 0, 0), ("Recreate", 10, 0, 0),
])
def test_in_place_budget(policy: str, limit: int, charged: int, budget: int) -> None:
    assert restarts.in_place_budget(policy, limit, charged) == budget
    # the budget is exactly what `choose` restarts in place: every unit of it leaves the last retry to new pods
    if budget:
        assert inplace.choose(Cause.PROCESS, retryable=True, restart_policy=policy, backoff_limit=limit,
                              charged=charged + budget - 1, in_place_left=1) == Action.IN_PLACE
    assert inplace.choose(Cause.PROCESS, retryable=True, restart_policy=policy, backoff_limit=limit,
                          charged=charged + budget, in_place_left=0) != Action.IN_PLACE


@pytest.mark.parametrize("policy, limit, budget", [("InPlace", 3, 3), ("InPlace", 0, 0), ("Recreate", 3, 0)])
def test_run_local_restarts_in_place_with_every_retry(policy: str, limit: int, budget: int) -> None:
    """One machine has no pods to recreate: under InPlace every retry is in place; under Recreate none is."""
    assert restarts.local_in_place_budget(policy, limit) == budget


def _argv(body: dict[str, Any], **kw: Any) -> list[str]:
    res = validation.validate(body)
    assert res.valid and res.job is not None and res.topology is not None, res.summary()
    objs = render_job.render(res.job, res.topology, "ns", uid=UID, **kw)
    pods = [o for o in objs if o["kind"] == "Pod"]
    return [a for p in pods for a in p["spec"]["containers"][0]["args"] if a.startswith("--max-restarts")]


@pytest.mark.parametrize("policy, limit, expected", [("InPlace", 3, 2), ("InPlace", 0, 0), ("Recreate", 3, 0),
                                                     (None, 3, 2)])
def test_rendered_pods_carry_a_new_jobs_budget(policy: str | None, limit: int, expected: int) -> None:
    body = job_body("job", nodes=2, backoff_limit=limit)
    if policy is not None:
        body["spec"]["runPolicy"]["restartPolicy"] = policy
    assert _argv(body) == [f"--max-restarts={expected}"] * 2
    assert _argv(body, max_restarts=1) == ["--max-restarts=1"] * 2  # what the lifecycle passes for a later attempt


def test_restart_policy_is_validated_with_the_field_named() -> None:
    body = job_body("job")
    body["spec"]["runPolicy"]["restartPolicy"] = "Sometimes"
    res = validation.validate(body)
    assert not res.valid and any("restartPolicy" in e.field for e in res.errors), res.summary()


# ------------------------------------------------------------------------------------------------ decide()
def view(body: dict[str, Any]) -> lc.JobView:
    return lc.JobView.from_body(body)


def pod(rank: int, phase: str = "Running", *, attempt: int = 0, **kw: Any) -> lc.PodInfo:
    return lc.summarize_pod(pod_body("job", rank, phase, attempt=attempt, uid=UID, **kw))


def decide(body: dict[str, Any], pods: list[lc.PodInfo]) -> lc.Decision:
    return lc.decide(view(body), pods, T0, lc.Policy(backoff_base=10, backoff_cap=300))


def with_progress(status: dict[str, Any], attempt: int, in_place: int) -> dict[str, Any]:
    out = copy.deepcopy(status)
    out["progress"] = {"step": 4, "maxSteps": 10, "display": "4/10", "attempt": attempt, "inPlaceRestarts": in_place}
    return out


def test_in_place_restarts_are_counted_once_with_an_event_and_the_pods_stay() -> None:
    body = job_body("job", nodes=2, uid=UID, status=with_progress(RUNNING, 0, 1))
    running = [pod(0), pod(1)]
    d1 = decide(body, running)
    st = d1.status
    assert st["inPlaceRestarts"] == 1 and st["inPlaceCounted"] == {"attempt": 0, "restarts": 1}
    assert st["phase"] == "Running" and st["restarts"] == 0 and not d1.delete_pods and not d1.create_pods
    [event] = [e for e in d1.events if e.reason == "RestartedInPlace"]
    assert event.type == "Warning" and "(1/3 retries of runPolicy.backoffLimit used)" in event.message
    # the same report again (the next pass): counted already, no second Event
    d2 = decide({**body, "status": d1.status}, running)
    assert d2.status["inPlaceRestarts"] == 1 and not [e for e in d2.events if e.reason == "RestartedInPlace"]
    # a second in-place restart of the same attempt: one more
    d3 = decide({**body, "status": with_progress(d1.status, 0, 2)}, running)
    assert d3.status["inPlaceRestarts"] == 2 and d3.status["inPlaceCounted"] == {"attempt": 0, "restarts": 2}


def test_progress_of_an_older_attempt_is_not_counted_again() -> None:
    status = {**with_progress(RUNNING, 0, 2), "restarts": 1, "inPlaceRestarts": 2,
              "inPlaceCounted": {"attempt": 0, "restarts": 2}}
    dec = decide(job_body("job", nodes=2, uid=UID, status=status), [pod(0, attempt=1), pod(1, attempt=1)])
    assert dec.status["inPlaceRestarts"] == 2 and not [e for e in dec.events if e.reason == "RestartedInPlace"]
    # the new attempt's first in-place restart counts from 0 again
    dec = decide(job_body("job", nodes=2, uid=UID, status=with_progress(status, 1, 1)),
                 [pod(0, attempt=1), pod(1, attempt=1)])
    assert dec.status["inPlaceRestarts"] == 3 and dec.status["inPlaceCounted"] == {"attempt": 1, "restarts": 1}


def test_in_place_restarts_spend_backoff_limit_then_the_pods_are_recreated_with_what_is_left() -> None:
    # backoffLimit 3, torchrun's budget 2: both used in place; the container then exits (torchrun gave up)
    status = {**with_progress(RUNNING, 0, 2), "inPlaceRestarts": 2, "inPlaceCounted": {"attempt": 0, "restarts": 2}}
    body = job_body("job", nodes=2, uid=UID, status=status)
    d1 = decide(body, [pod(0, "Failed", exit_code=137), pod(1, "Running")])
    assert d1.status["phase"] == "Restarting" and d1.status["restarts"] == 1
    assert "gang restart 3/3" in d1.status["message"]
    assert sorted(d1.delete_pods) == ["job-node-0", "job-node-1"]
    # the next attempt's pods get no in-place budget: the last retry was theirs
    d2 = decide({**body, "status": {**d1.status, "conditions": [
        {**c, "lastTransitionTime": "2029-12-31T00:00:00Z"} for c in d1.status["conditions"]]}}, [])
    assert d2.create_attempt == 1 and d2.max_restarts == 0
    # and their failure fails the job: all 3 retries spent, 2 of them in place
    d3 = decide(job_body("job", nodes=2, uid=UID, status={**RUNNING, "restarts": 1, "inPlaceRestarts": 2}),
                [pod(0, "Failed", attempt=1, exit_code=137), pod(1, "Running", attempt=1)])
    failed = lc.get_condition(d3.status["conditions"], "Failed")
    assert d3.status["phase"] == "Failed" and failed is not None and failed["reason"] == "BackoffLimitExceeded"
    assert "2 of them in place" in d3.status["message"]


def test_first_attempt_gets_the_full_budget_and_recreate_gets_none() -> None:
    body = job_body("job", nodes=2, uid=UID)
    assert decide(body, []).max_restarts == 2
    body["spec"]["runPolicy"]["restartPolicy"] = "Recreate"
    assert decide(body, []).max_restarts == 0


def test_status_model_reads_the_new_fields_leniently() -> None:
    st = api.parse_status({"inPlaceRestarts": 3, "inPlaceCounted": {"attempt": "x"}})
    assert st.inPlaceRestarts == 3 and st.inPlaceCounted is None


def test_rank0_metrics_carry_the_attempt_and_its_in_place_restarts_into_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's gauges (grpo_trainer/metrics.py, from the launcher's GRPO_IN_PLACE_RESTARTS) → status.progress
    as the scraper computes it, before the restarted trainer's first logging step; then counted by decide()."""
    from grpo_operator.lifecycle import progress
    from grpo_trainer.metrics import TrainerMetrics

    for key, value in {"RANK": "0", "GRPO_ATTEMPT": "0", "GRPO_IN_PLACE_RESTARTS": "1"}.items():
        monkeypatch.setenv(key, value)
    metrics = TrainerMetrics.from_env("job", "ns")
    metrics.begin(4, 10)  # resumed from checkpoint-4, nothing logged yet
    live = progress.to_progress(progress.parse_metrics(metrics.text()), previous={"reward": 0.5})
    assert live is not None and live["attempt"] == 0 and live["inPlaceRestarts"] == 1 and live["step"] == 4
    dec = decide(job_body("job", nodes=2, uid=UID, status={**RUNNING, "progress": live}), [pod(0), pod(1)])
    assert dec.status["inPlaceRestarts"] == 1
    # a trainer started without the launcher's count (an older image): no field, nothing counted
    monkeypatch.delenv("GRPO_IN_PLACE_RESTARTS")
    metrics = TrainerMetrics.from_env("job", "ns")
    metrics.begin(4, 10)
    old = progress.to_progress(progress.parse_metrics(metrics.text()))
    assert old is not None and "inPlaceRestarts" not in old and old["attempt"] == 0


def test_describe_shows_in_place_restarts_next_to_the_attempt() -> None:
    from grpo_operator.cli.kubectl_text import describe_text
    from grpo_operator.client.types import Job

    body = job_body("job", nodes=2, uid=UID, status={**RUNNING, "restarts": 1, "inPlaceRestarts": 2})
    lines = describe_text(Job.from_dict(body), []).splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Attempt:"))
    assert lines[at + 1].startswith("In place:     2 restart(s) inside the running pods"), lines
    assert not [ln for ln in describe_text(Job.from_dict(job_body("job", status=RUNNING)), []).splitlines()
                if ln.startswith("In place:")]
