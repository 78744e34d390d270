"""A runPolicy or metadata edit never changes a started job's phase or pods (issue 27, finding 1): "the spec changed"
is told by status.specDigest (the stored spec its pods were rendered from, runPolicy aside), never by
metadata.generation moving past status.observedGeneration. Reproduced by calling decide() directly."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from grpo_operator.lifecycle.draft import spec_digest
from grpo_operator.rules.limits import Limits
from tests.support.jobs import job_body
from tests.support.lifecycle import decide, pod

STARTED = "2030-01-01T10:00:00Z"
FINISHED = "2030-01-01T11:00:00Z"
LOWERED = Limits(max_nodes_per_job=1)  # the platform lowered policy.maxNodesPerJob below the job's 2 nodes


def job(**kw: Any) -> dict[str, Any]:
    """A 2-node CPU job that today's rules accept, unless the operator's node limit is lowered below 2."""
    return job_body("job", **{"nodes": 2, "cpu": True, "num_generations": 4, **kw})


def started(phase: str, digest: Optional[str], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": phase, "observedGeneration": 1, "startTime": STARTED, "topology": "2x1cpu",
                           "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated",
                                           "message": "2 pod(s)", "lastTransitionTime": STARTED}], **extra}
    if digest is not None:
        out["specDigest"] = digest
    return out


ORIGINAL = job()["spec"]  # the spec the pods were rendered from
EDITS = {  # runPolicy edits the webhook admits on a job today's rules refuse ("this update adds no error")
    "activeDeadlineSeconds": {"deadline": 86400},
    "ttlSecondsAfterFinished": {"ttl": 3600},
    "backoffLimit": {"backoff_limit": 9},
}


@pytest.mark.parametrize("digest", ["recorded", "none (status of an older release)"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_runpolicy_edit_on_a_running_refused_job_keeps_its_pods(edit: str, digest: str) -> None:
    """Finding 1: with generation 2 > observedGeneration 1, has_started() said "not started" and the running job
    became Rejected with both pods deleted."""
    st = started("Running", spec_digest(ORIGINAL) if digest == "recorded" else None)
    body = job(generation=2, status=st, **EDITS[edit])
    dec = decide(body, [pod(0), pod(1)], limits=LOWERED)
    assert dec.status is not None and dec.status["phase"] == "Running", dec.status
    assert not dec.delete_pods and not dec.delete_job
    conds = {c["type"]: c for c in dec.status["conditions"]}
    assert conds["SpecInvalid"]["status"] == "True" and "Rejected" not in conds
    assert dec.status["specDigest"] == spec_digest(ORIGINAL)


def test_suspending_a_running_refused_job_suspends_it() -> None:
    """Finding 1: `suspend: true` on a running job that a lowered limit refuses suspended nothing: it was Rejected."""
    body = job(generation=2, status=started("Running", spec_digest(ORIGINAL)),
                    suspend=True)
    dec = decide(body, [pod(0), pod(1)], limits=LOWERED)
    assert dec.status is not None and dec.status["phase"] == "Suspended", dec.status
    assert "Rejected" not in {c["type"] for c in dec.status["conditions"]}


def test_a_succeeded_job_given_a_ttl_stays_succeeded_and_the_ttl_fires() -> None:
    """Finding 1: a Succeeded job given ttlSecondsAfterFinished (generation 2) became Rejected."""
    st = started("Succeeded", spec_digest(ORIGINAL), completionTime=FINISHED)
    pods = [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)]
    dec = decide(job(generation=2, status=st, ttl=60), pods, limits=LOWERED)
    assert dec.status is not None and dec.status["phase"] == "Succeeded" and dec.delete_job
    early = decide(job(generation=2, status=st, ttl=7200), pods, limits=LOWERED)
    assert early.status is not None and early.status["phase"] == "Succeeded" and not early.delete_job
    assert early.requeue_after == pytest.approx(3600)


def test_a_changed_spec_that_todays_rules_refuse_is_rejected_as_before() -> None:
    """The other half of finding 1: a spec edit (not runPolicy) past the recorded digest is refused as before,
    whatever ran (the webhook being off)."""
    body = job(generation=2, status=started("Running", spec_digest(ORIGINAL)),
                    num_generations=6)
    dec = decide(body, [pod(0), pod(1)], limits=LOWERED)
    assert dec.status is not None and dec.status["phase"] == "Rejected"
    assert sorted(dec.delete_pods) == ["job-node-0", "job-node-1"]


def test_a_valid_job_records_the_digest_and_a_runpolicy_edit_keeps_it() -> None:
    dec = decide(job(), [], limits=Limits())
    assert dec.status is not None and dec.status["specDigest"] == spec_digest(ORIGINAL)
    assert spec_digest(job(deadline=5, suspend=True)["spec"]) == spec_digest(ORIGINAL)
    assert spec_digest(job(nodes=3)["spec"]) != spec_digest(ORIGINAL)
