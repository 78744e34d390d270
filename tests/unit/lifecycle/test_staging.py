"""lifecycle/staging.py: the initializer's decision table (create, wait, proceed, retry, fail), pure."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from grpo_operator import api
from grpo_operator.api.status import ConditionType, Reason
from grpo_operator.lifecycle.draft import Policy
from grpo_operator.lifecycle.pods import PodInfo
from grpo_operator.lifecycle.staging import Action, parse_record, progress_message
from grpo_operator.lifecycle.staging import decide_staging as _decide_staging
from grpo_trainer import contract

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REASON_RETRY = Reason.STAGING_RETRY


def decide_staging(*args, policy: Policy = Policy(), **kw):
    """decide_staging under the operator's default Policy (GRPO_BACKOFF_* unset: 10 s doubling, at most 300 s)."""
    return _decide_staging(*args, policy=policy, **kw)


CACHE = {"volumeClaimName": "hf"}


def job(cache: dict | None = CACHE, model="org/tiny", dataset="org/data", backoff=3) -> api.GRPOJob:
    spec = {"model": model, "dataset": {"name": dataset}, "rewards": [{"name": "accuracy"}],
            "runPolicy": {"backoffLimit": backoff}}
    if cache is not None:
        spec["cache"] = dict(cache)
    return api.GRPOJob.model_validate({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "j"},
                                       "spec": spec})


def pod(phase="Running", **kw) -> PodInfo:
    return PodInfo(name="j-stage", role=contract.ROLE_INITIALIZER, phase=phase, **kw)


def staged(status="True", reason="Staged", at=NOW) -> api.Condition:
    return api.Condition(type=ConditionType.STAGED, status=status, reason=reason,
                         lastTransitionTime=at.strftime("%Y-%m-%dT%H:%M:%SZ"), message="m")


DONE = contract.STAGE_PREFIX + json.dumps({"event": "done", "staged": ["model org/tiny@main"], "cached": [],
                                           "bytes": 2_500_000_000, "seconds": 41.2})


@pytest.mark.parametrize("j, p, cond, retries, action, reason", [
    # no cache / nothing from the Hub: straight on, no pod
    (job(None), None, None, 0, Action.PROCEED, "NotNeeded"),
    (job(model="/models/m", dataset="/data/d.jsonl"), None, None, 0, Action.PROCEED, "NotNeeded"),
    # first time: create; running: wait; succeeded: proceed
    (job(), None, None, 0, Action.CREATE, "Staging"),
    (job(), pod("Pending"), None, 0, Action.WAIT, "Staging"),
    (job(), pod("Running"), None, 0, Action.WAIT, "Staging"),
    (job(), pod("Succeeded", exit_code=0, message=DONE), None, 0, Action.PROCEED, "Staged"),
    # staged once: never a second download pod (gang restart, suspend/resume, pod garbage-collected)
    (job(), None, staged(), 0, Action.PROCEED, "Staged"),
    (job(), pod("Failed", exit_code=202), staged(), 0, Action.PROCEED, "Staged"),
    # permanent Hub answers fail the job with the Hub's reason
    (job(), pod("Failed", exit_code=contract.HUB_DENIED, message="gated"), None, 0, Action.FAIL, "HubAccessDenied"),
    (job(), pod("Failed", exit_code=contract.HUB_NOT_FOUND, message="404"), None, 0, Action.FAIL, "HubNotFound"),
    (job(), pod("Failed", exit_code=contract.CONFIG), None, 0, Action.FAIL, "ConfigError"),
    # retryable: delete and recreate after a backoff, up to runPolicy.backoffLimit
    (job(), pod("Failed", exit_code=contract.TRANSIENT_IO), None, 0, Action.RETRY, "TransientIOError"),
    (job(), pod("Failed", reason="Evicted"), None, 1, Action.RETRY, "Evicted"),
    (job(), pod("Failed", exit_code=contract.TRANSIENT_IO), None, 3, Action.FAIL, "TransientIOError"),
    (job(backoff=0), pod("Failed", exit_code=contract.TRANSIENT_IO), None, 0, Action.FAIL, "TransientIOError"),
    # a retry's delete in flight, then the backoff, then the new pod
    (job(), pod("Failed", exit_code=202, deleting=True), staged("False", REASON_RETRY), 1, Action.WAIT, REASON_RETRY),
    (job(), None, staged("False", REASON_RETRY, NOW - dt.timedelta(seconds=5)), 1, Action.WAIT, REASON_RETRY),
    (job(), None, staged("False", REASON_RETRY, NOW - dt.timedelta(seconds=11)), 1, Action.CREATE, "Staging"),
])
def test_decision_table(j, p, cond, retries, action, reason):
    d = decide_staging(j, p, cond, now=NOW, retries=retries)
    assert (d.action, d.reason) == (action, reason), d
    if action in (Action.CREATE, Action.RETRY):
        assert d.pod == "j-stage"
    if action == Action.RETRY:
        assert d.count_retry and d.requeue_after == 10.0 * 2 ** retries
        assert d.condition and d.condition.reason == REASON_RETRY
    if action == Action.FAIL:
        assert d.condition and d.condition.status == "False" and d.event


def test_failure_message_carries_the_hubs_words():
    msg = "grpo_trainer.stage: hub access denied (exit 18): model org/tiny@main: the repo is gated"
    d = decide_staging(job(), pod("Failed", exit_code=18, message=msg), None, now=NOW)
    assert d.action == Action.FAIL and "the repo is gated" in d.message and d.condition.reason == "HubAccessDenied"


def test_success_condition_and_event_give_size_and_time():
    d = decide_staging(job(), pod("Succeeded", exit_code=0, message=DONE), None, now=NOW)
    assert d.condition == api.Condition(type="Staged", status="True", reason="Staged", message=d.message)
    assert "2.5 GB in 41.2 s" in d.message and d.event and d.event[0] == "Staged"
    assert d.event[1].startswith("Staged in 41.2 s (2.5 GB): staged ")  # the download's time, first in the event
    # a cache hit: nothing downloaded, so no "Staged in 0.001 s (0 B)" noise, only what the cache held
    hit = contract.STAGE_PREFIX + json.dumps({"event": "done", "staged": [], "cached": ["model org/tiny@main"],
                                              "bytes": 0, "seconds": 0.001})
    d = decide_staging(job(), pod("Succeeded", exit_code=0, message=hit), None, now=NOW)
    assert d.event and d.event[1].startswith("already cached: model org/tiny@main; pod ")
    # a pod whose termination message holds no summary (an older image): no time, still an event
    d = decide_staging(job(), pod("Succeeded", exit_code=0), None, now=NOW)
    assert d.event == ("Staged", "the cache holds the model and dataset; pod j-stage")


def test_progress_while_downloading():
    rec = parse_record("noise\n" + contract.STAGE_PREFIX + json.dumps(
        {"event": "progress", "item": "model org/tiny@main", "bytes": 1_200_000_000, "totalBytes": 3_400_000_000,
         "files": 3, "totalFiles": 7}) + "\n")
    assert progress_message(rec) == "downloading model org/tiny@main: 1.2 GB / 3.4 GB, 3/7 files"
    d = decide_staging(job(), pod("Running"), None, now=NOW, progress=rec)
    assert d.action == Action.WAIT and d.condition.message == progress_message(rec)
    d = decide_staging(job(), pod("Pending", unschedulable="persistentvolumeclaim \"hf\" not found"), None, now=NOW)
    assert "not found" in d.message
    assert parse_record("no records") is None
    assert progress_message({"event": "cached", "item": "dataset org/data@main"}) == \
        "dataset org/data@main is already in the cache"
    assert progress_message(None) == "downloading the model and dataset into the cache"  # before the first scrape


def test_a_hostile_progress_record_makes_a_bounded_message():
    """Low finding of issue 27: the download pod's progress record (the tenant's pod talking) went into
    status.message unbounded; a non-numeric size made the pass fail."""
    from grpo_operator.lifecycle.staging import MAX_PROGRESS_MESSAGE

    huge = {"event": "progress", "item": "x" * 200_000, "bytes": "lots", "totalBytes": 10, "totalFiles": 2}
    assert len(progress_message(huge)) <= MAX_PROGRESS_MESSAGE
    assert progress_message({**huge, "item": "model m"}) == "downloading model m: ? / 10 B, 0/2 files"
    d = decide_staging(job(), pod("Running"), None, now=NOW, progress=huge)
    assert len(d.message) <= MAX_PROGRESS_MESSAGE and len(d.condition.message) <= MAX_PROGRESS_MESSAGE
    assert len(progress_message({"event": "cached", "item": "y" * 100_000})) <= MAX_PROGRESS_MESSAGE
