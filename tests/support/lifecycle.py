"""Helpers of the decide() tests (tests/unit/lifecycle, tests/unit/gang): one pass of the real, pure decision on a
job body and pod summaries, a pod as the operator renders it, and the body the next pass reads."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from grpo_operator import lifecycle as lc
from grpo_operator.rules import validation
from grpo_operator.rules.limits import Limits
from tests.support.jobs import pod_body

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
UID = "uid-1"  # job_body's uid: the owner of pod()'s pods
POLICY = lc.Policy(backoff_base=10.0, backoff_cap=300.0, expectation_ttl=30.0)


def decide(body: dict[str, Any], pods: list[lc.PodInfo], now: dt.datetime = T0, *, policy: lc.Policy = POLICY,
           limits: Limits | None = None, **view: Any) -> lc.Decision:
    """decide() on `body` as the controller calls it. `limits`: the operator's policy the spec is validated within;
    `view`: what the controller adds to the JobView (engine_probe, create_refused, stage_progress, stall)."""
    result = None
    if limits is not None:
        result = validation.validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")}, limits)
    job = lc.JobView.from_body(body, result)
    for name, value in view.items():
        if not hasattr(job, name):
            raise TypeError(f"JobView has no field {name!r}")
        setattr(job, name, value)
    return lc.decide(job, pods, now, policy)


def pod(rank: int, phase: str = "Running", *, job: str = "job", uid: str = UID, **kw: Any) -> lc.PodInfo:
    """Trainer pod `rank` of `job` (owned by the job with `uid`), as summarized from its body (jobs.pod_body's
    keywords: attempt, exit_code, deleting, waiting, …)."""
    return lc.summarize_pod(pod_body(job, rank, phase, uid=uid, **kw))


def then(body: dict[str, Any], dec: lc.Decision) -> dict[str, Any]:
    """The job body the next pass reads: `body` with the decided status written."""
    out = copy.deepcopy(body)
    out["status"] = dec.status
    return out
