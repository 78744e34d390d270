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
