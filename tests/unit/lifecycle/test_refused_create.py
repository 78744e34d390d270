"""A create the API server refused (the controller's record, JobView.create_refused) is condition CreateFailed with
the server's message while pods are still to be created; it is cleared once nothing is left to create, and an
operator restart (no record) leaves it as it was (lifecycle/create.py refused_creates)."""

from __future__ import annotations

from typing import Any, Optional

from grpo_operator import lifecycle as lc
from tests.support import lifecycle
from tests.support.jobs import job_body
from tests.support.lifecycle import T0, UID, pod

MESSAGE = 'Error creating Pod job-node-0: 403 Forbidden: pods "job-node-0" is forbidden: exceeded quota: q'


def decide(status: Optional[dict[str, Any]], pods: list[lc.PodInfo], refusal: Optional[str]) -> lc.Decision:
    return lifecycle.decide(job_body("job", nodes=2, uid=UID, status=status), pods, create_refused=refusal)


def cond(dec: lc.Decision) -> dict[str, Any]:
    assert dec.status is not None
    return dict(lc.get_condition(dec.status.get("conditions") or [], "CreateFailed") or {})


def test_a_refused_create_is_condition_create_failed_and_the_pods_are_tried_again() -> None:
    dec = decide(None, [], MESSAGE)
    assert dec.create_pods == ["job-node-0", "job-node-1"]  # tried again (the work queue's backoff paces it)
    c = cond(dec)
    assert (c["status"], c["reason"], c["message"]) == ("True", "FailedCreate", MESSAGE)
    assert dec.status is not None and dec.status["phase"] == "Pending" and "exceeded quota" in dec.status["message"]


def test_without_a_record_the_condition_stays_until_the_pods_exist() -> None:
    refused = decide(None, [], MESSAGE).status
    after_restart = decide(refused, [], None)  # an operator restart forgot the record: the condition stays
    assert cond(after_restart)["status"] == "True" and after_restart.create_pods
    created = decide(after_restart.status, [pod(0, "Pending"), pod(1, "Pending")], None)
    c = cond(created)
    assert (c["status"], c["reason"]) == ("False", "PodsCreated")
    assert not created.create_pods


def test_a_job_never_refused_has_no_create_failed_condition() -> None:
    assert cond(decide(None, [], None)) == {}
    assert cond(decide(None, [pod(0, "Pending"), pod(1, "Pending")], None)) == {}


def test_while_creates_are_refused_no_start_and_no_created_claim() -> None:
    """Finding (issue 27, Low): `Created=True` and `startTime` were written before any create succeeded: a job whose
    every pod create a webhook refused said "attempt 0: 2 pod(s)" created, and its activeDeadlineSeconds ran."""
    refused = decide(None, [], MESSAGE).status
    assert refused is not None and "startTime" not in refused
    assert (lc.get_condition(refused.get("conditions") or [], "Created") or {}).get("status") != "True"
    created = decide(refused, [pod(0, "Pending"), pod(1, "Pending")], None).status  # the pods went through at last
    assert created is not None and created["startTime"] == T0.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert lc.get_condition(created["conditions"], "Created")["status"] == "True"
