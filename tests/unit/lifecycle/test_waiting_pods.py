"""A job whose pods cannot start (image not pullable, bad config) says why in its Running condition with the
kubelet's reason, and one Warning event per new reason - not an endless Pending with the reason only in a message."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api.status import ConditionType, Phase, Reason
from grpo_operator.lifecycle import decision as d
from grpo_operator.lifecycle.finish import dump_status
from tests.support.jobs import job_body
from tests.support.lifecycle import T0, UID, pod

POLICY = lc.Policy(backoff_base=10, backoff_cap=300)


def run(pods: list[lc.PodInfo], status: Optional[dict[str, Any]] = None) -> d.Draft:
    dr = d.Draft.begin(lc.JobView.from_body(job_body("job", uid=UID, status=status, nodes=2)), pods, T0, POLICY)
    d.phase_from_pods(dr)
    return dr


def stored(dr: d.Draft) -> dict[str, Any]:
    """The draft's status as written (what the next pass reads)."""
    return dump_status(dr.status)


@pytest.mark.parametrize("waiting, reason", [
    ("ErrImagePull", "ErrImagePull"),
    ("ImagePullBackOff", "ImagePullBackOff"),
    ("ErrImageNeverPull", "ErrImageNeverPull"),
    ("InvalidImageName", "InvalidImageName"),
    ("CreateContainerConfigError", "CreateContainerConfigError"),
])
def test_the_kubelets_reason_is_the_running_conditions(waiting: str, reason: str) -> None:
    dr = run([pod(0, "Running"), pod(1, "Pending", waiting=waiting)])
    assert dr.status.phase == Phase.PENDING
    c = dr.condition(ConditionType.RUNNING)
    assert c is not None and c.status == "False" and c.reason == reason
    assert "job-node-1" in c.message and reason in c.message
    assert [(e.type, e.reason) for e in dr.decision.events] == [("Warning", reason)]


def test_one_event_per_new_reason_and_cleared_once_running() -> None:
    first = run([pod(0, "Pending", waiting="ErrImagePull"), pod(1, "Pending", waiting="ErrImagePull")])
    same = run([pod(0, "Pending", waiting="ErrImagePull"), pod(1, "Pending")], status=stored(first))
    assert same.decision.events == []                                   # no event storm while it stays
    backoff = run([pod(0, "Pending", waiting="ImagePullBackOff"), pod(1, "Pending")], status=stored(first))
    assert [e.reason for e in backoff.decision.events] == ["ImagePullBackOff"]
    running = run([pod(0, "Running"), pod(1, "Running")], status=stored(backoff))
    c = running.condition(ConditionType.RUNNING)
    assert running.status.phase == Phase.RUNNING and c is not None and (c.status, c.reason) == (
        "True", Reason.ALL_NODES_RUNNING)


def test_pods_merely_being_created_set_no_condition() -> None:
    dr = run([pod(0, "Pending"), pod(1, "Pending")])
    assert dr.condition(ConditionType.RUNNING) is None and dr.decision.events == []
