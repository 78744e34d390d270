"""Gang policies as objects: chosen once per pass from the job, the steps call their hooks and never test the mode,
and a group is marked for ending once however many steps ask."""

from __future__ import annotations

import datetime as dt
import inspect
from typing import Any

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api import gang as g
from grpo_operator.lifecycle import create, decision, draft, gangs, phase, restart, suspend, terminal, validity
from grpo_operator.rules import validation
from tests.support.jobs import job_body

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def body(gang_: Any = None, queue: Any = None) -> dict[str, Any]:
    b = job_body("job", labels={g.KUEUE_QUEUE_LABEL: queue} if queue else None)
    if gang_:
        b["spec"]["scheduling"] = {"gang": gang_}
    return b


@pytest.mark.parametrize("gang_, queue, kind, mode", [
    (None, None, gangs.GangPolicy, "none"),
    ("coscheduling", None, gangs.coscheduling.CoschedulingGang, "coscheduling"),
    ("volcano", None, gangs.volcano.VolcanoGang, "volcano"),
    (None, "team-a", gangs.kueue.KueueGang, "kueue"),
])
def test_the_policy_is_chosen_once_from_the_job(gang_: Any, queue: Any, kind: type, mode: str) -> None:
    res = validation.validate(body(gang_, queue))
    assert res.valid, res.summary()
    policy = gangs.for_job(res.job)
    assert type(policy) is kind and policy.mode == mode
    dr = draft.Draft.begin(lc.JobView.from_body(body(gang_, queue)), [], T0, lc.Policy())
    assert type(dr.gang) is kind
    assert type(gangs.for_job(None)) is gangs.GangPolicy  # an invalid job: no gang


def test_no_step_tests_the_mode() -> None:
    for module in (decision, draft, validity, terminal, suspend, restart, create, phase):
        source = inspect.getsource(module)
        assert "gang.KUEUE" not in source and ".mode ==" not in source, module.__name__


def test_groups_to_end_are_marked_once() -> None:
    dr = draft.Draft.begin(lc.JobView.from_body(body(queue="team-a")), [], T0, lc.Policy())
    dr.end_groups(["job-node-0", "job-node-0"])
    dr.end_groups(["job-node-0", "job-node-1"])
    assert dr.decision.release_pods == ["job-node-0", "job-node-1"]
