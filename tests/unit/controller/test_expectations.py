"""controller/expectations.py: a pod created a moment ago counts as present (synthetic) until the watch shows it,
with the role it will have — the spec.cache download pod as the initializer, never as a trainer."""

from __future__ import annotations

from grpo_operator import lifecycle as lc
from grpo_operator.controller.expectations import Expectations
from grpo_operator.render import initializer

KEY = ("ns", "job")
UID = "uid-1"


def test_a_created_download_pod_is_expected_as_the_initializer_until_seen() -> None:
    exp = Expectations(ttl=30.0)
    stage = initializer.pod_name("job")
    exp.created(KEY, [stage], attempt=2)  # created during attempt 2; the pod itself carries no attempt
    [synthetic] = exp.observed(KEY, [], UID)
    assert synthetic.role == lc.ROLE_INITIALIZER and synthetic.synthetic
    assert lc.PodSets.sort(UID, [synthetic], 2).initializer == synthetic
    seen = lc.PodInfo(name=stage, role=lc.ROLE_INITIALIZER, owner_uid=UID, phase="Pending")
    assert exp.observed(KEY, [seen], UID) == [seen]  # seen at all is seen: the expectation is dropped
    assert exp.observed(KEY, [], UID) == []



def test_a_created_trainer_pod_is_expected_as_a_trainer() -> None:
    exp = Expectations(ttl=30.0)
    exp.created(KEY, ["job-node-0"], attempt=1)
    [synthetic] = exp.observed(KEY, [], UID)
    assert synthetic.role == lc.ROLE_TRAINER and synthetic.attempt == 1
    assert lc.PodSets.sort(UID, [synthetic], 1).initializer is None
