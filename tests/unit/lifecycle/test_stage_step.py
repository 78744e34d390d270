"""decide() with spec.cache: the `stage` step (lifecycle/staging.py) wired between wait_for_previous_attempt and
create_pods. Whole passes: the download pod first, trainers only once Staged=True, never a second download pod."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api.status import ConditionType, Phase, Reason
from grpo_operator.render import initializer
from grpo_trainer import contract
from tests.support.jobs import job_body, pod_body
from tests.support.lifecycle import T0, UID, decide

STAGE = initializer.pod_name("job")  # job-stage
TRAINERS = ["job-node-0", "job-node-1"]
DONE = contract.STAGE_PREFIX + '{"event": "done", "staged": ["model Qwen/Qwen2.5-0.5B-Instruct@main"], ' \
    '"cached": [], "bytes": 1000000, "seconds": 3.5}'


def body(status: Optional[dict[str, Any]] = None, cache: bool = True, **kw: Any) -> dict[str, Any]:
    b = job_body("job", uid=UID, status=status, nodes=2, **kw)
    if cache:
        b["spec"]["cache"] = {"volumeClaimName": "hf"}
    return b


def stage_pod(phase: str = "Running", exit_code: Optional[int] = None, message: Optional[str] = None,
              deleting: bool = False, uid: str = UID) -> lc.PodInfo:
    b = pod_body("job", 0, phase, exit_code=exit_code, deleting=deleting, uid=uid)
    b["metadata"]["name"] = STAGE
    b["metadata"]["labels"] = {contract.LABEL_JOB: "job", contract.LABEL_ROLE: contract.ROLE_INITIALIZER}
    del b["metadata"]["annotations"][contract.ANNOTATION_ATTEMPT]  # one per job, not per attempt
    if message:
        b["status"].setdefault("containerStatuses", [{"name": "stage", "state": {"terminated": {"exitCode": 0}}}])
        b["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message
    return lc.summarize_pod(b)


def trainer(rank: int, phase: str = "Running", **kw: Any) -> lc.PodInfo:
    return lc.summarize_pod(pod_body("job", rank, phase, **kw))


def staged_cond(dec: lc.Decision) -> dict[str, Any]:
    return next(c for c in dec.status["conditions"] if c["type"] == ConditionType.STAGED)  # type: ignore[index]


def after(dec: lc.Decision) -> dict[str, Any]:
    """The status a next pass reads."""
    return dict(dec.status or {})


def test_without_cache_nothing_changes() -> None:
    dec = decide(body(cache=False), [])
    assert dec.create_pods == TRAINERS and not any(c["type"] == ConditionType.STAGED for c in dec.status["conditions"])


def test_local_paths_need_no_download_pod() -> None:
    b = body()
    b["spec"]["model"], b["spec"]["dataset"]["name"] = "/models/m", "/data/train.jsonl"
    assert decide(b, []).create_pods == TRAINERS


def test_download_pod_first_then_wait_with_progress() -> None:
    dec = decide(body(), [])
    assert dec.create_pods == [STAGE] and dec.create_attempt == 0
    st = after(dec)
    assert st["phase"] == Phase.PENDING and st["startTime"]
    assert staged_cond(dec)["status"] == "False" and staged_cond(dec)["reason"] == "Staging"
    # while it runs: Pending, the progress as the condition's and the job's message, no trainer
    progress = {"event": "progress", "item": "model Qwen/Qwen2.5-0.5B-Instruct@main", "bytes": 1_500_000_000,
                "totalBytes": 3_000_000_000, "files": 2, "totalFiles": 5}
    dec = decide(body(st), [stage_pod("Running")], T0 + dt.timedelta(seconds=5), stage_progress=progress)
    assert dec.create_pods == [] and dec.requeue_after is not None
    msg = "downloading model Qwen/Qwen2.5-0.5B-Instruct@main: 1.5 GB / 3.0 GB, 2/5 files"
    assert dec.status["phase"] == Phase.PENDING and dec.status["message"] == msg and staged_cond(dec)["message"] == msg


def test_succeeded_download_creates_the_trainers_and_stays_staged_across_restarts() -> None:
    st = after(decide(body(), []))
    dec = decide(body(st), [stage_pod("Succeeded", exit_code=0, message=DONE)])
    assert dec.create_pods == TRAINERS and staged_cond(dec)["status"] == "True"
    assert "1.0 MB in 3.5 s" in staged_cond(dec)["message"]
    assert any(e.reason == "Staged" and "3.5 s" in e.message for e in dec.events)
    st = after(dec)
    # the trainers run; one fails (retryable): a gang restart. The download pod is not a trainer: not counted,
    # not deleted, and (once gone) never created again
    pods = [stage_pod("Succeeded", exit_code=0), trainer(0), trainer(1)]
    st = after(decide(body(st), pods))
    assert st["phase"] == Phase.RUNNING
    dec = decide(body(st), [stage_pod("Succeeded", exit_code=0), trainer(0), trainer(1, "Failed", exit_code=143)])
    assert sorted(dec.delete_pods) == TRAINERS and STAGE not in dec.delete_pods
    st = after(dec)
    dec = decide(body(st), [], T0 + dt.timedelta(seconds=60))  # the download pod garbage-collected meanwhile
    assert dec.create_pods == TRAINERS and dec.create_attempt == 1


def test_suspend_stops_a_running_download_and_resume_starts_it_again() -> None:
    st = after(decide(body(), []))
    dec = decide(body(st, suspend=True), [stage_pod("Running")])
    assert dec.delete_pods == [STAGE] and dec.status["phase"] == Phase.SUSPENDED
    st = after(dec)
    dec = decide(body(st), [stage_pod("Running", deleting=True)])  # resumed; the old download pod still goes
    assert dec.create_pods == [] and dec.status["phase"] == Phase.PENDING
    assert decide(body(after(dec)), []).create_pods == [STAGE]


@pytest.mark.parametrize("code, reason", [(contract.HUB_DENIED, "HubAccessDenied"),
                                          (contract.HUB_NOT_FOUND, "HubNotFound")])
def test_permanent_download_error_fails_the_job_and_keeps_the_pod_for_its_log(code: int, reason: str) -> None:
    st = after(decide(body(), []))
    dec = decide(body(st), [stage_pod("Failed", exit_code=code, message="401 Client Error: gated repo")])
    st = dec.status
    assert st["phase"] == Phase.FAILED and st["lastFailureReason"] == reason and dec.create_pods == []
    failed = next(c for c in st["conditions"] if c["type"] == ConditionType.FAILED)
    assert failed["reason"] == reason and "gated repo" in failed["message"]
    assert staged_cond(dec)["reason"] == reason and STAGE not in dec.delete_pods
    # terminal: still no trainer, the failed download pod stays (kubectl logs)
    dec = decide(body(after(dec)), [stage_pod("Failed", exit_code=code)])
    assert dec.create_pods == [] and dec.delete_pods == []


def test_retryable_download_error_retries_once_per_failed_pod_with_backoff_then_gives_up() -> None:
    st = after(decide(body(backoff_limit=1), []))
    failed = stage_pod("Failed", exit_code=contract.TRANSIENT_IO)
    dec = decide(body(st, backoff_limit=1), [failed])
    assert dec.delete_pods == [STAGE] and dec.status["stagingRetries"] == 1
    assert staged_cond(dec)["reason"] == Reason.STAGING_RETRY and dec.status["phase"] == Phase.PENDING
    # a second pass before the watch shows the delete: the same failure is not counted twice
    dec = decide(body(after(dec), backoff_limit=1), [failed], T0 + dt.timedelta(seconds=1))
    assert dec.status["stagingRetries"] == 1 and dec.delete_pods == [STAGE]
    st = after(dec)
    # gone: the backoff (10 s) runs, then a new download pod
    dec = decide(body(st, backoff_limit=1), [], T0 + dt.timedelta(seconds=3))
    assert dec.create_pods == [] and dec.requeue_after is not None and 6 < dec.requeue_after <= 7
    dec = decide(body(st, backoff_limit=1), [], T0 + dt.timedelta(seconds=11))
    assert dec.create_pods == [STAGE]
    # the retry fails too: backoffLimit=1 is spent → Failed
    dec = decide(body(after(dec), backoff_limit=1), [failed], T0 + dt.timedelta(seconds=20))
    assert dec.status["phase"] == Phase.FAILED and "gave up after 1 retries" in dec.status["message"]


def test_a_pod_sorted_as_initializer_is_never_a_trainer() -> None:
    sets = lc.PodSets.sort(UID, [stage_pod("Failed", exit_code=1), trainer(0)], 0)
    assert sets.initializer is not None and sets.initializer.name == STAGE
    assert [p.name for p in sets.current] == ["job-node-0"] and STAGE not in {p.name for p in sets.ours}
    # a download pod of an older job of the same name is stale, deleted like its trainers
    old = lc.PodSets.sort(UID, [stage_pod("Running", uid="older")], 0)
    assert old.initializer is None and [p.name for p in old.stale] == [STAGE]


def test_the_staged_commits_are_recorded_once_and_kept_across_restarts() -> None:
    """Issue 27, item 8: the commits the download pod resolved (its done record's `revisions`) go into
    status.stagedRevisions in the pass that sees it succeed, the pass that creates the trainers (render pins them);
    a restart keeps them; a job staged by an older operator (no record) has none and keeps its revision."""
    import json

    revs = [{"kind": "model", "repo": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "main", "commit": "a" * 40},
            {"kind": "dataset", "repo": "openai/gsm8k", "revision": "main", "commit": "not-a-commit"}]
    done = contract.STAGE_PREFIX + json.dumps({"event": "done", "staged": [], "cached": [], "revisions": revs})
    st = after(decide(body(), []))
    dec = decide(body(st), [stage_pod("Succeeded", exit_code=0, message=done)])
    assert dec.create_pods == TRAINERS
    assert dec.job_status is not None and [r.commit for r in dec.job_status.stagedRevisions] == ["a" * 40]
    st = after(dec)
    assert st["stagedRevisions"] == [revs[0]]  # the malformed entry is dropped
    st = after(decide(body(st), [stage_pod("Succeeded", exit_code=0), trainer(0), trainer(1)]))
    dec = decide(body(st), [trainer(0), trainer(1, "Failed", exit_code=143)])
    assert after(dec)["stagedRevisions"] == [revs[0]]
    old = after(decide(body(after(decide(body(), []))), [stage_pod("Succeeded", exit_code=0, message=DONE)]))
    assert not old.get("stagedRevisions")


def test_the_download_pods_progress_in_the_status_is_bounded() -> None:
    """Issue 27, Low: status.message carried the download pod's progress record unbounded (it comes from the job's own
    image, up to the scraper's 1 MiB); the condition, the message and the events are bounded."""
    st = after(decide(body(), []))
    progress = {"event": "progress", "item": "model " + "x" * 500_000, "bytes": 1, "totalBytes": 2}
    dec = decide(body(st), [stage_pod("Running")], T0 + dt.timedelta(seconds=5), stage_progress=progress)
    assert dec.status["message"].startswith("downloading model xxx")
    assert len(dec.status["message"]) <= 1024 and len(staged_cond(dec)["message"]) <= 1024
    huge = contract.STAGE_PREFIX + '{"event": "done", "staged": ["' + "y" * 100_000 + '"], "cached": []}'
    dec = decide(body(after(dec)), [stage_pod("Succeeded", exit_code=0, message=huge)])
    assert len(staged_cond(dec)["message"]) <= 1024 and all(len(e.message) <= 1024 for e in dec.events)


def test_a_download_retry_waits_the_operators_restart_backoff() -> None:
    """Issue 29, item 3: staging's retry backoff was its own 10 s/300 s, so GRPO_BACKOFF_BASE_SECONDS and
    GRPO_BACKOFF_CAP_SECONDS (the gang restart's backoff) did not apply to it. It is the Policy's now, as the
    operator's settings build it."""
    from grpo_operator.controller.settings import Settings

    policy = Settings.from_env({"GRPO_BACKOFF_BASE_SECONDS": "2", "GRPO_BACKOFF_CAP_SECONDS": "3"}).policy
    failed = stage_pod("Failed", exit_code=contract.TRANSIENT_IO)
    st = after(decide(body(backoff_limit=5), [], policy=policy))
    dec = decide(body(st, backoff_limit=5), [failed], policy=policy)
    assert dec.delete_pods == [STAGE] and dec.requeue_after == 2.0 and "retrying in 2 s" in dec.status["message"]
    st = after(dec)
    dec = decide(body(st, backoff_limit=5), [], T0 + dt.timedelta(seconds=1), policy=policy)
    assert dec.create_pods == [] and dec.requeue_after is not None and 0 < dec.requeue_after <= 1
    dec = decide(body(st, backoff_limit=5), [], T0 + dt.timedelta(seconds=2), policy=policy)
    assert dec.create_pods == [STAGE]
    # the third failure: 2·2² = 8 s, capped at 3 s
    st = {**after(dec), "stagingRetries": 2}
    dec = decide(body(st, backoff_limit=5), [failed], T0 + dt.timedelta(seconds=30), policy=policy)
    assert dec.status["stagingRetries"] == 3 and dec.requeue_after == 3.0
