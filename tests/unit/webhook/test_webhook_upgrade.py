"""webhook.review() after an operator upgrade: a stored job that today's rules refuse (a rule tightened since it was
admitted) can still be labelled, have other controllers' finalizers added and removed, be suspended, and be deleted;
an update that adds an error is still denied."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_operator.webhook import review as webhook
from tests.support.jobs import job_body


def stored(kind: str) -> dict[str, Any]:
    """A stored job today's validator refuses: a rule (7 generations do not divide the batch) or a field today's
    models do not know (renamed in a newer release)."""
    if kind == "rule":
        return job_body("job", nodes=1, num_generations=7)
    body = job_body("job", nodes=1)
    body["spec"]["renamedInANewerRelease"] = True
    return body


KINDS = ["rule", "unparseable"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_stored_job_is_refused_today(kind: str) -> None:
    assert not webhook.review("CREATE", stored(kind)).allowed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("change", ["label", "finalizer", "annotation"])
def test_a_metadata_only_update_is_admitted(kind: str, change: str) -> None:
    old = stored(kind)
    new = copy.deepcopy(old)
    meta = new["metadata"]
    if change == "label":
        meta["labels"] = {"team": "a"}
    elif change == "finalizer":
        meta["finalizers"] = ["example.com/another-controller"]
    else:
        meta["annotations"] = {"note": "x"}
    r = webhook.review("UPDATE", new, old)
    assert r.allowed and any("stored spec" in w for w in r.warnings), r.message
    # and back again (the other controller removes its finalizer)
    assert webhook.review("UPDATE", old, new).allowed


@pytest.mark.parametrize("kind", KINDS)
def test_run_policy_of_a_refused_job_may_change(kind: str) -> None:
    old = stored(kind)
    new = copy.deepcopy(old)
    new["spec"]["runPolicy"]["suspend"] = True
    assert webhook.review("UPDATE", new, old).allowed


@pytest.mark.parametrize("kind", KINDS)
def test_an_update_that_adds_an_error_is_denied(kind: str) -> None:
    old = stored(kind)
    bad_policy = copy.deepcopy(old)
    bad_policy["spec"]["runPolicy"]["backoffLimit"] = -1
    r = webhook.review("UPDATE", bad_policy, old)
    assert not r.allowed and "backoffLimit" in r.message
    # a label that conflicts with the spec (Kueue's queue label on a PodGroup-gang job) is a new error too
    old_gang = copy.deepcopy(old)
    old_gang["spec"]["scheduling"] = {"gang": "coscheduling"}
    labelled = copy.deepcopy(old_gang)
    labelled["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    if kind == "rule":  # (an unparseable spec has no gang to conflict with)
        assert not webhook.review("UPDATE", labelled, old_gang).allowed


@pytest.mark.parametrize("kind", KINDS)
def test_a_spec_change_of_a_refused_job_is_validated(kind: str) -> None:
    old = stored(kind)
    new = copy.deepcopy(old)
    new["spec"]["nodes"] = 2
    assert not webhook.review("UPDATE", new, old).allowed


@pytest.mark.parametrize("kind", [*KINDS, "valid"])
def test_every_update_while_deleting_is_admitted(kind: str) -> None:
    old = job_body("job", nodes=1) if kind == "valid" else stored(kind)
    old["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    old["metadata"]["finalizers"] = ["example.com/another-controller"]
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    new["spec"]["nodes"] = 3  # even a spec change: the object is on its way out
    r = webhook.review("UPDATE", new, old)
    assert r.allowed and not r.message


STARTED = {"phase": "Running", "startTime": "2030-01-01T10:00:00Z",
           "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated", "message": "2 pod(s)"}]}


@pytest.mark.parametrize("status", [STARTED, {"phase": "Succeeded", "startTime": "2030-01-01T10:00:00Z"},
                                    {"phase": "Pending", "conditions": STARTED["conditions"]}])
def test_a_started_refused_job_keeps_its_spec_immutable(status: dict[str, Any]) -> None:
    """Finding 7: the immutability check was skipped for stored jobs today's rules refuse (`if old_valid:`): a
    running job under a lowered node limit could go nodes 2→4 (and fix its batch), which gang-restarted it with a
    new pod spec beside its old, create-only ConfigMap."""
    from grpo_operator.rules.limits import Limits

    lowered = Limits(max_nodes_per_job=4)
    old = job_body("job", nodes=5, status=status)  # admitted before the limit was lowered to 4
    new = copy.deepcopy(old)
    new["spec"]["nodes"] = 4
    r = webhook.review("UPDATE", new, old, lowered)
    assert not r.allowed and "spec.nodes cannot change on an existing job" in r.message, r.message
    # the refused job of today's rules whose batch rule broke: the same
    old7 = job_body("job", nodes=1, num_generations=7, status=status)
    new7 = copy.deepcopy(old7)
    new7["spec"]["nodes"], new7["spec"]["training"]["numGenerations"] = 2, 8
    assert not webhook.review("UPDATE", new7, old7).allowed


@pytest.mark.parametrize("status", [None, {"phase": "Rejected", "observedGeneration": 1,
                                           "conditions": [{"type": "Rejected", "status": "True"}]}])
def test_a_refused_job_that_never_started_may_be_fixed_freely(status: Any) -> None:
    """Finding 7's other half: "never started" is read from the stored status (no startTime, no Created=True, no
    phase only pods reach): such a job has nothing rendered from its spec."""
    old = job_body("job", nodes=1, num_generations=7, status=status)
    new = job_body("job", nodes=2, num_generations=8, status=status)
    assert webhook.review("UPDATE", new, old).allowed
