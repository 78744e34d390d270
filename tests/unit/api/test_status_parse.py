"""api.parse_status: a status read from the API server (an older operator's, or edited by hand) parses leniently —
unknown keys ignored, an invalid value dropped with the rest kept, never an exception — and decide() goes on from it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from grpo_operator import api
from grpo_operator import lifecycle as lc
from grpo_operator.api.status import Phase
from tests.support.jobs import job_body, pod_body

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)

GOOD_CONDITION = {"type": "Created", "status": "True", "reason": "PodsCreated", "message": "attempt 1: 2 pod(s)",
                  "lastTransitionTime": "2030-01-01T11:00:00Z", "observedGeneration": 1}
MALFORMED: dict[str, Any] = {
    "phase": "Runnning",  # a typo: dropped
    "restarts": "many",  # not an int: dropped (0)
    "requeues": 1,
    "message": "2 node(s) running (attempt 1)",
    "startTime": "2030-01-01T11:00:00Z",
    "conditions": [
        GOOD_CONDITION,
        {"type": "Running", "status": "Yes"},  # status not True/False/Unknown: the condition is dropped
        {"type": "Queued"},  # no status: dropped
        "junk",  # not an object: dropped
        {"type": "Unschedulable", "status": "False", "observedGeneration": "one"},  # only the bad field goes
    ],
    "progress": {"step": "ten", "maxSteps": 20, "reward": 0.5, "rewards": {"acc": "high", "fmt": 0.25},
                 "newGauge": 3},  # a later trainer's field: kept (ProgressStatus allows extra fields)
    "batch": {"worldSize": 4},  # incomplete: dropped whole
    "fieldOfANewerOperator": {"x": 1},  # unknown: ignored
}


def test_parse_status_drops_what_is_invalid_and_keeps_the_rest() -> None:
    s = api.parse_status(MALFORMED)
    assert s.phase is None and s.restarts == 0 and s.requeues == 1 and s.batch is None
    assert s.message == "2 node(s) running (attempt 1)" and s.startTime == "2030-01-01T11:00:00Z"
    assert [(c.type, c.status) for c in s.conditions] == [("Created", "True"), ("Unschedulable", "False")]
    assert s.conditions[0].model_dump(exclude_unset=True) == GOOD_CONDITION
    assert s.conditions[1].observedGeneration is None
    assert s.progress is not None and (s.progress.step, s.progress.maxSteps, s.progress.reward) == (None, 20, 0.5)
    assert s.progress.rewards == {"fmt": 0.25} and s.progress.model_extra == {"newGauge": 3}
    # what the document held is what is set (a dump with exclude_unset writes back only that)
    assert s.model_fields_set == {"requeues", "message", "startTime", "conditions", "progress"}
    assert MALFORMED["restarts"] == "many" and len(MALFORMED["conditions"]) == 5  # the caller's document untouched


@pytest.mark.parametrize("doc", [None, "Running", 7, [], {}, {"conditions": "Created"}, {"conditions": [None]},
                                 {"progress": []}, {"batch": {"worldSize": "four"}}, {"restarts": None}])
def test_parse_status_never_raises(doc: Any) -> None:
    assert api.parse_status(doc).model_dump(exclude_unset=True, exclude_none=True) in ({}, {"conditions": []})


def test_a_valid_status_parses_as_it_is() -> None:
    doc = {"phase": "Running", "restarts": 2, "conditions": [GOOD_CONDITION], "topology": "2x4",
           "batch": {"worldSize": 8, "nprocPerNode": 4, "generationBatchSize": 64, "stepsPerGeneration": 2,
                     "promptsPerGeneration": 8},
           "progress": {"step": 5, "maxSteps": 20, "display": "5/20"}}
    s = api.parse_status(doc)
    assert s.phase == Phase.RUNNING
    assert s.model_dump(mode="json", exclude_unset=True) == doc


def test_state_is_the_phase_else_the_true_condition() -> None:
    assert api.parse_status({"phase": "Suspended"}).state() == Phase.SUSPENDED
    conds = [{"type": "Created", "status": "True"}, {"type": "Failed", "status": "True"}]
    assert api.parse_status({"conditions": conds}).state() == Phase.FAILED
    assert api.parse_status({"phase": "bogus", "conditions": [{"type": "Created", "status": "True"}]}).state() \
        == Phase.PENDING
    assert api.parse_status({}).state() is None


def test_decide_goes_on_from_a_malformed_status() -> None:
    """The reconcile path never raises on what it reads: the valid rest of the status is kept, the pass decides as
    usual, and what it writes is a valid status (the CRD's schema)."""
    body = job_body("job", status=MALFORMED, nodes=2)
    pods = [lc.summarize_pod(pod_body("job", r, "Running")) for r in range(2)]
    dec = lc.decide(lc.JobView.from_body(body), pods, T0)
    assert dec.status is not None
    api.GRPOJobStatus.model_validate(dec.status)  # strictly valid, as written
    assert dec.status["phase"] == Phase.RUNNING and dec.status["restarts"] == 0 and dec.status["requeues"] == 1
    assert dec.status["startTime"] == "2030-01-01T11:00:00Z"  # kept: the deadline still counts from it
    assert dec.status["progress"] == {"maxSteps": 20, "reward": 0.5, "rewards": {"fmt": 0.25}, "newGauge": 3}
    created = next(c for c in dec.status["conditions"] if c["type"] == "Created")
    assert created["lastTransitionTime"] == "2030-01-01T11:00:00Z"  # an unchanged condition keeps its time
    assert "fieldOfANewerOperator" not in dec.status and "batch" in dec.status  # the batch recomputed
    # the patch removes what was invalid or unknown
    patch = lc.status_patch(lc.clean_status(body["status"]), dec.status)
    assert patch is not None and patch["fieldOfANewerOperator"] is None


def test_decide_reads_a_status_that_is_not_an_object() -> None:
    body = job_body("job", nodes=1)
    body["status"] = {"phase": ["Running"], "conditions": {"Created": True}, "restarts": -0.5}
    dec = lc.decide(lc.JobView.from_body(body), [], T0)
    assert dec.status is not None and dec.create_pods == ["job-node-0"] and dec.status["restarts"] == 0
