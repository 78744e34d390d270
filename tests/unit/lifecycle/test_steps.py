"""decide()'s steps one at a time: each named step on a Draft, with a table of inputs → (settled?, what it wrote).

test_lifecycle.py checks whole passes of decide(); these pin down which step does what, so a change to one step
shows up in that step's table.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api.status import ConditionType, Phase, Reason
from grpo_operator.lifecycle import decision as d
from tests.support.jobs import job_body
from tests.support.lifecycle import T0, UID, pod

POLICY = lc.Policy(backoff_base=10, backoff_cap=300)


def draft(pods: list[lc.PodInfo] = (), status: Optional[dict[str, Any]] = None, now: dt.datetime = T0,
          **spec: Any) -> d.Draft:
    body = job_body("job", uid=UID, status=status, **spec)
    return d.Draft.begin(lc.JobView.from_body(body), pods, now, POLICY)


def cond(dr: d.Draft, ctype: str) -> Optional[dict[str, Any]]:
    c = dr.condition(ctype)
    return c.model_dump() if c is not None else None


# ------------------------------------------------------------------------------------------------ sorting
def test_pods_are_sorted_once_into_current_other_attempt_stale_and_foreign() -> None:
    current = pod(0, attempt=2)
    older = pod(1, attempt=1)
    stale = pod(2, uid="an-older-job-of-the-same-name")
    foreign = pod(3, uid="x", owner_kind="Deployment")
    sets = lc.PodSets.sort(UID, [older, stale, current, foreign], recorded_attempt=2)
    assert (sets.attempt, sets.current, sets.other_attempt, sets.stale, sets.foreign) == \
        (2, (current,), (older,), (stale,), (foreign,))
    assert sets.ours == (older, current)  # in the order observed
    # pods of a newer attempt than status.restarts (a lost status write) make it the current one
    assert lc.PodSets.sort(UID, [older, current], recorded_attempt=0).attempt == 2


def test_begin_deletes_an_older_jobs_pods_and_records_conflicts() -> None:
    dr = draft([pod(0, uid="older-job"), pod(1, uid="x", owner_kind="Deployment"),
                pod(2, uid="older-job", deleting=True)], nodes=3)
    assert dr.decision.delete_pods == ["job-node-0"] and dr.decision.conflicts == ["job-node-1"]


# ------------------------------------------------------------------------------------------------ the steps
@pytest.mark.parametrize("spec, status, settled, phase, rejected", [
    # its pod is of a spec edited since (status.specDigest is another spec's): refused
    ({"num_generations": 3}, {"observedGeneration": 0, "specDigest": "sha256:another"}, True, Phase.REJECTED,
     ("True", Reason.INVALID_SPEC)),
    # started under earlier rules: kept, with SpecInvalid (tests/unit/lifecycle/test_upgrade.py)
    ({"num_generations": 3}, {"phase": "Running", "startTime": "2030-01-01T11:00:00Z"}, False, Phase.RUNNING, None),
    ({}, None, False, None, None),
    ({}, {"phase": "Rejected", "conditions": [{"type": "Rejected", "status": "True"}]}, False, None,
     ("False", Reason.SPEC_VALID)),
])
def test_reject_invalid(spec, status, settled, phase, rejected) -> None:
    dr = draft([pod(0)], status, **spec)
    assert d.reject_invalid(dr) is settled
    assert dr.status.phase == phase
    c = cond(dr, ConditionType.REJECTED)
    assert (c["status"], c["reason"]) == rejected if rejected else c is None
    assert dr.decision.delete_pods == (["job-node-0"] if settled else [])
    if not settled:
        assert dr.status.topology == "1x4" and dr.status.batch.worldSize == 4


@pytest.mark.parametrize("phase, pods, ttl, completed, settled, deletes, delete_job, requeue", [
    ("Running", [], None, None, False, [], False, None),
    ("Succeeded", [pod(0, "Succeeded", exit_code=0), pod(1)], None, None, True, ["job-node-1"], False, None),
    ("Failed", [pod(0, "Failed", exit_code=1)], None, None, True, [], False, None),
    ("Failed", [], 60, "2030-01-01T11:59:30Z", True, [], False, 30.0),
    ("Succeeded", [], 60, "2030-01-01T11:58:00Z", True, [], True, None),
])
def test_keep_terminal(phase, pods, ttl, completed, settled, deletes, delete_job, requeue) -> None:
    status = {"phase": phase, **({"completionTime": completed} if completed else {})}
    dr = draft(pods, status, nodes=2, ttl=ttl)
    assert d.keep_terminal(dr) is settled
    assert (dr.decision.delete_pods, dr.decision.delete_job, dr.decision.requeue_after) == (deletes, delete_job, requeue)


def test_adopt_newest_attempt() -> None:
    dr = draft([pod(0, attempt=3)], {"restarts": 1})
    assert d.adopt_newest_attempt(dr) is False and dr.status.restarts == 3


@pytest.mark.parametrize("suspend_spec, status, pods, settled, phase, deletes", [
    (True, {"phase": "Running", "startTime": "2030-01-01T11:00:00Z"}, [pod(0), pod(1, "Succeeded", exit_code=0)],
     True, Phase.SUSPENDED, ["job-node-0", "job-node-1"]),
    (False, {"phase": "Running"}, [pod(0)], False, "Running", []),
])
def test_suspend(suspend_spec, status, pods, settled, phase, deletes) -> None:
    dr = draft(pods, status, nodes=2, suspend=suspend_spec)
    assert d.suspend(dr) is settled
    assert (dr.status.phase, dr.decision.delete_pods) == (phase, deletes)
    if settled:
        assert dr.status.startTime is None and cond(dr, ConditionType.SUSPENDED)["status"] == "True"


@pytest.mark.parametrize("status, pods, settled, phase", [
    ({"phase": "Suspended", "conditions": [{"type": "Suspended", "status": "True"}]}, [], False, Phase.PENDING),
    ({"phase": "Suspended"}, [pod(0, deleting=True)], True, Phase.PENDING),  # wait for the old pods to go
    ({"phase": "Running"}, [], False, "Running"),
])
def test_resume(status, pods, settled, phase) -> None:
    dr = draft(pods, status)
    assert d.resume(dr) is settled and dr.phase == phase


@pytest.mark.parametrize("deadline, start, settled, phase, requeue", [
    (None, "2030-01-01T11:00:00Z", False, "Running", None),
    (3600, None, False, "Running", None),
    (7200, "2030-01-01T11:00:00Z", False, "Running", 3600.0),
    (3600, "2030-01-01T11:00:00Z", True, Phase.FAILED, None),
])
def test_enforce_deadline(deadline, start, settled, phase, requeue) -> None:
    dr = draft([pod(0)], {"phase": "Running", **({"startTime": start} if start else {})}, deadline=deadline)
    assert d.enforce_deadline(dr) is settled
    assert (dr.status.phase, dr.decision.requeue_after) == (phase, requeue)
    if settled:
        assert cond(dr, ConditionType.FAILED)["reason"] == Reason.DEADLINE_EXCEEDED


def test_delete_other_attempts_and_note_conflicts() -> None:
    dr = draft([pod(0, attempt=0), pod(1, attempt=1), pod(2, uid="x", owner_kind="Deployment")], {"restarts": 1},
               nodes=3)
    assert d.delete_other_attempts(dr) is False and dr.decision.delete_pods == ["job-node-0"]
    assert d.note_conflicts(dr) is False
    c = cond(dr, ConditionType.CREATED)
    assert (c["status"], c["reason"]) == ("False", Reason.CHILD_CONFLICT) and "job-node-2" in c["message"]


@pytest.mark.parametrize("phase, pods, restarts, limit, settled, new_phase, reason, new_restarts", [
    ("Running", [pod(0), pod(1)], 0, 3, False, "Running", None, 0),
    ("Running", [pod(0, "Failed", exit_code=143), pod(1)], 0, 3, True, Phase.RESTARTING, "Preempted", 1),
    ("Running", [pod(0, "Failed", exit_code=143, attempt=3), pod(1, attempt=3)], 3, 3, True, Phase.FAILED,
     "Preempted", 3),
    ("Running", [pod(0, "Failed", exit_code=11), pod(1, "Failed", exit_code=143)], 0, 3, True, Phase.FAILED,
     "DatasetError", 0),
    ("Running", [pod(0)], 0, 3, True, Phase.RESTARTING, Reason.POD_DELETED, 1),  # node-1 disappeared
    ("Running", [pod(0), pod(1, deleting=True)], 0, 3, True, Phase.RESTARTING, Reason.POD_DELETED, 1),
    ("Pending", [pod(0, "Pending"), pod(1, "Pending", deleting=True)], 0, 3, False, "Pending", None, 0),
])
def test_restart_or_fail(phase, pods, restarts, limit, settled, new_phase, reason, new_restarts) -> None:
    dr = draft(pods, {"phase": phase, "restarts": restarts}, nodes=2, backoff_limit=limit)
    assert d.restart_or_fail(dr) is settled
    assert (dr.status.phase, dr.status.lastFailureReason, dr.status.restarts) == \
        (new_phase, reason, new_restarts)
    if new_phase == Phase.RESTARTING:
        assert dr.decision.requeue_after == 10.0 and set(dr.decision.delete_pods) == \
            {p.name for p in pods if not p.deleting}


@pytest.mark.parametrize("pods, restarting_since, settled, phase, requeue", [
    ([pod(0, attempt=0)], None, True, Phase.PENDING, None),  # the older attempt's pod still exists
    ([], "2030-01-01T11:59:55Z", True, Phase.RESTARTING, 5.0),  # backoff of attempt 1: 10 s
    ([], "2030-01-01T11:59:00Z", False, None, None),  # backoff over
    ([pod(0, attempt=1)], "2030-01-01T11:59:55Z", False, None, None),  # the next attempt already has pods
])
def test_wait_for_previous_attempt(pods, restarting_since, settled, phase, requeue) -> None:
    conds = [{"type": "Restarting", "status": "True", "lastTransitionTime": restarting_since}] if restarting_since else []
    dr = draft(pods, {"restarts": 1, "conditions": conds})
    assert d.wait_for_previous_attempt(dr) is settled
    assert (dr.status.phase, dr.decision.requeue_after) == (phase, requeue)


@pytest.mark.parametrize("pods, creates, created", [
    ([], ["job-node-0", "job-node-1"], ("True", Reason.PODS_CREATED)),
    ([pod(0, "Pending")], ["job-node-1"], ("True", Reason.PODS_CREATED)),
    ([pod(0), pod(1)], [], ("True", Reason.PODS_CREATED)),
    ([pod(0)], [], None),  # the gang started: a missing pod is a failure, never recreated alone
])
def test_create_pods(pods, creates, created) -> None:
    dr = draft(pods, {}, nodes=2)
    assert d.create_pods(dr) is False
    assert dr.decision.create_pods == creates and dr.decision.create_attempt == (0 if creates else None)
    c = cond(dr, ConditionType.CREATED)
    assert ((c["status"], c["reason"]) if c else None) == created
    assert [p.name for p in dr.current if p.synthetic] == creates
    if creates:
        assert dr.status.startTime == "2030-01-01T12:00:00Z"


@pytest.mark.parametrize("pods, phase, running_cond", [
    ([pod(0), pod(1)], Phase.RUNNING, "True"),
    ([pod(0), pod(1, "Pending")], Phase.PENDING, None),
    ([pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)], Phase.SUCCEEDED, None),
    ([pod(0), pod(1, "Pending", unschedulable="0/3 nodes are available")], Phase.PENDING, None),
])
def test_phase_from_pods(pods, phase, running_cond) -> None:
    dr = draft(pods, {}, nodes=2)
    assert d.phase_from_pods(dr) is True and dr.status.phase == phase
    c = cond(dr, ConditionType.RUNNING)
    assert (c["status"] if c else None) == running_cond
    unschedulable = cond(dr, ConditionType.UNSCHEDULABLE)
    assert bool(unschedulable) == any(p.unschedulable for p in pods)


def test_decide_is_a_table_of_contents() -> None:
    """decide() stays short: the work is in the named steps."""
    import inspect

    lines = [ln for ln in inspect.getsource(d.decide).splitlines() if ln.strip()]
    assert len(lines) <= 50, len(lines)
