"""The platform's limit on spec.nodes (GRPO_MAX_NODES_PER_JOB, chart policy.maxNodesPerJob): one pure rule, applied
by the validator the webhook and the controller share, read from the operator's environment."""

from __future__ import annotations

import pytest

from grpo_operator.controller.settings import Settings
from grpo_operator.rules import validation
from grpo_operator.rules.limits import Limits
from grpo_operator.webhook import review as webhook
from tests.support.jobs import job_body


@pytest.mark.parametrize("nodes, cap, refused", [(2, None, False), (2, 2, False), (1, 1, False), (2, 1, True),
                                                 (8, 4, True)])
def test_spec_nodes_over_the_limit_is_refused_naming_field_limit_and_fix(nodes: int, cap: int | None,
                                                                         refused: bool) -> None:
    body = job_body("big", nodes=nodes)
    assert validation.validate(body).valid  # no limit by default
    res = validation.validate(body, Limits(max_nodes_per_job=cap))
    errors = [e for e in res.errors if e.field == "spec.nodes"]
    assert bool(errors) == refused, res.errors
    if refused:
        assert len(res.errors) == 1, res.errors
        msg = errors[0].message
        assert f"{nodes} nodes" in msg and f"at most {cap}" in msg and "policy.maxNodesPerJob" in msg, msg
        assert f"set spec.nodes to {cap} or fewer" in msg, msg
        assert res.topology is not None and res.job is not None  # a started job over it can still be rendered


def test_the_webhook_refuses_a_new_job_over_the_limit_and_admits_a_label_on_a_started_one() -> None:
    limits = Limits(max_nodes_per_job=1)
    r = webhook.review("CREATE", job_body("big", nodes=2), limits=limits)
    assert not r.allowed and "spec.nodes: 2 nodes" in r.message and "at most 1" in r.message, r.message
    assert r.reason == "spec.nodes"
    assert webhook.review("CREATE", job_body("small", nodes=1), limits=limits).allowed
    # a job admitted before the limit was lowered: metadata changes are not blocked by a rule it predates
    old = job_body("big", nodes=2)
    new = job_body("big", nodes=2, labels={"team": "a"})
    assert webhook.review("UPDATE", new, old, limits=limits).allowed


@pytest.mark.parametrize("env, cap", [({}, None), ({"GRPO_MAX_NODES_PER_JOB": ""}, None),
                                      ({"GRPO_MAX_NODES_PER_JOB": "4"}, 4)])
def test_the_limit_comes_from_the_environment(env: dict[str, str], cap: int | None) -> None:
    s = Settings.from_env(env)
    assert s.limits.max_nodes_per_job == cap and s.limits.problem() is None
    assert Limits(max_nodes_per_job=0).problem() == "GRPO_MAX_NODES_PER_JOB must be >= 1 (unset: no limit), got 0"
