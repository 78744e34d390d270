"""spec.cache: when to create the download pod, wait for it, go on to the trainers, retry or fail (pure; the clock is
passed in). `stage` is decide()'s step (lifecycle/decision.py) before create_pods: the initializer pod is created
through render() (the controller creates the job's ConfigMap first: the initializer reads the config); the trainer
and vLLM pods only on PROCEED.

    decide_staging(job, pod, condition, now=…, policy=…, retries=…) → StagingDecision
        job        the GRPOJob
        pod        the observed initializer pod (PodInfo, role `initializer`, name render.initializer.pod_name) or None
        condition  the job's current `Staged` condition (api.Condition) or None
        policy     the operator's Policy: a retry waits its restart backoff (GRPO_BACKOFF_BASE_SECONDS/_CAP_SECONDS)
        retries    staging retries so far (status.stagingRetries; bounded by runPolicy.backoffLimit)
        progress   the download pod's last GRPO_STAGE record (parse_record; the controller scrapes it from the pod's
                   /progress), for the message while it downloads

Rules:
- no spec.cache, or nothing from the Hub (model and dataset are paths in the pod): PROCEED at once, no pod.
- `Staged=True` already (set on the first success): PROCEED, whatever became of the pod. So a gang restart, a
  suspend/resume or a deleted pod never start a second download.
- no pod: CREATE it (after the backoff of a retry, measured from the condition's lastTransitionTime).
- pod Pending/Running: WAIT, with the progress (bytes and files done/total) as the condition's message.
- pod Succeeded: PROCEED and set `Staged=True` (reason Staged, the summary: what was staged, bytes, seconds), and
  record the commit each repo was staged at (status.stagedRevisions, from the pod's termination message): the
  trainers and vLLM load those commits (render), so another job moving `main` in the shared cache never reaches them.
- pod Failed, permanent (exit 18 HubAccessDenied, 19 HubNotFound, 10 ConfigError, …): FAIL the job with the pod's
  reason and the Hub's message (the termination message). Never an endless Pending.
- pod Failed, retryable (202 TransientIOError after the pod's own retries, eviction, node lost, a signal): RETRY —
  delete the pod, recreate it after the gang restart's backoff (draft.backoff_seconds with the operator's Policy:
  GRPO_BACKOFF_BASE_SECONDS·2^(retries-1) s, capped) — until `retries` reaches runPolicy.backoffLimit, then FAIL with
  the last reason.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from grpo_trainer import contract

from .. import api
from ..api.status import ConditionType, Phase, Reason
from ..render import cache as render_cache
from ..render import initializer as render_initializer
from .conditions import fmt_time, parse_time
from .draft import Draft, JobEvent, Policy, backoff_seconds
from .pods import PodInfo, PodPhase, classify
from .terminal import fail

# the download pod's progress record comes from the job's own image: what reaches the status is bounded
MAX_MESSAGE = 1024


class Action:
    PROCEED = "Proceed"  # create the trainers (and vLLM): the cache is ready, or not needed
    CREATE = "Create"  # create the initializer pod
    WAIT = "Wait"  # the initializer runs (or a retry's backoff runs): requeue after `requeue_after`
    RETRY = "Retry"  # delete the failed initializer pod; CREATE follows after the backoff
    FAIL = "Fail"  # the job fails with `reason`


@dataclass(frozen=True)
class StagingDecision:
    action: str
    reason: str = ""
    message: str = ""
    condition: Optional[api.Condition] = None  # the Staged condition to set (type, status, reason, message)
    pod: Optional[str] = None  # the initializer pod to create (CREATE) or delete (RETRY)
    requeue_after: Optional[float] = None
    count_retry: bool = False  # RETRY: the caller increments its staging retry count
    event: Optional[tuple[str, str]] = None  # (reason, message) of an Event: the download's time, a failure
    revisions: list[api.StagedRevision] = field(default_factory=list)  # PROCEED on success: the staged commits
    extra: dict[str, Any] = field(default_factory=dict)


def parse_record(text: Optional[str]) -> Optional[dict[str, Any]]:
    """The last `GRPO_STAGE {json}` record in a log tail or termination message; None if there is none."""
    for line in reversed((text or "").splitlines()):
        if line.startswith(contract.STAGE_PREFIX):
            try:
                doc = json.loads(line[len(contract.STAGE_PREFIX):])
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# The download pod's progress record is the tenant's pod talking: what it puts into status.message is bounded
MAX_PROGRESS_MESSAGE = 512


def _bounded(text: str) -> str:
    return bounded(text, MAX_PROGRESS_MESSAGE)


def revisions(record: Optional[dict[str, Any]]) -> list[api.StagedRevision]:
    """The commits a done record names (`revisions`), each checked (kind, repo, a 40-hex commit); others dropped."""
    found = record.get("revisions") if record else None
    out = []
    for entry in found if isinstance(found, list) else []:
        try:
            out.append(api.StagedRevision.model_validate(entry))
        except ValueError:
            continue
    return out


def _size(n: Any) -> str:
    try:
        value = float(n or 0)
    except (TypeError, ValueError):
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def progress_message(record: Optional[dict[str, Any]]) -> str:
    """'model org/x@main: 1.2 GB / 3.4 GB, 3/7 files' from a progress record; a plain line without one."""
    if not record or not record.get("item"):
        return "downloading the model and dataset into the cache"
    if record.get("event") == "cached":
        return _bounded(f"{record['item']} is already in the cache")
    text = f"downloading {record['item']}"
    if record.get("totalBytes"):
        text += f": {_size(record.get('bytes'))} / {_size(record['totalBytes'])}"
    if record.get("totalFiles"):
        text += f", {record.get('files') or 0}/{record['totalFiles']} files"
    return _bounded(text)


def _condition(status: api.ConditionStatus, reason: str, message: str) -> api.Condition:
    return api.Condition(type=ConditionType.STAGED, status=status, reason=reason, message=message)


def _staged_message(record: Optional[dict[str, Any]]) -> str:
    if not record or record.get("event") != "done":
        return "the cache holds the model and dataset"
    staged, cached = record.get("staged") or [], record.get("cached") or []
    parts = []
    if staged:
        took = f"{_size(record.get('bytes'))} in {record.get('seconds', 0)} s"
        parts.append(f"staged {', '.join(map(str, staged))} ({took})")
    if cached:
        parts.append(f"already cached: {', '.join(map(str, cached))}")
    return _bounded("; ".join(parts)) or "nothing to stage"


def decide_staging(job: api.GRPOJob, pod: Optional[PodInfo], condition: Optional[api.Condition], *,
                   now: _dt.datetime, policy: Policy, retries: int = 0,
                   progress: Optional[dict[str, Any]] = None) -> StagingDecision:
    if not render_cache.needs_initializer(job):
        return StagingDecision(Action.PROCEED, reason=Reason.NOT_NEEDED)
    if condition is not None and condition.status == "True":
        return StagingDecision(Action.PROCEED, reason=Reason.STAGED)
    name = render_initializer.pod_name(job.metadata.name or "")
    if pod is None or pod.deleting:
        return _create_or_wait(name, condition, now=now, delay=backoff_seconds(retries, policy), retries=retries,
                               deleting=pod is not None)
    if pod.phase == PodPhase.SUCCEEDED:
        record = parse_record(pod.message)
        message = _staged_message(record)
        # the download's time, when something was downloaded (a cache hit took nothing worth reporting)
        took = f"Staged in {record.get('seconds', 0)} s ({_size(record.get('bytes'))}): " \
            if record and record.get("event") == "done" and record.get("staged") else ""
        event = (Reason.STAGED, f"{took}{message}; pod {name}")
        return StagingDecision(Action.PROCEED, Reason.STAGED, message, _condition("True", Reason.STAGED, message),
                               event=event, revisions=revisions(record))
    failure = classify(pod)
    if failure is None:  # Pending or Running
        why = pod.unschedulable or pod.waiting
        message = f"pod {name} is waiting: {why}" if why else progress_message(progress)
        return StagingDecision(Action.WAIT, Reason.STAGING, message, _condition("False", Reason.STAGING, message),
                               requeue_after=10.0)
    hub_message = pod.message if pod.message and not pod.message.startswith(contract.STAGE_PREFIX) else ""
    message = f"downloading into spec.cache failed: {hub_message or failure.message}"
    if not failure.retryable or retries >= job.spec.runPolicy.backoffLimit:
        if failure.retryable:
            message += f" (gave up after {retries} retries: runPolicy.backoffLimit)"
        return StagingDecision(Action.FAIL, failure.reason, message, _condition("False", failure.reason, message),
                               event=(failure.reason, message))
    delay = backoff_seconds(retries + 1, policy)
    message += f"; retrying in {delay:.0f} s ({retries + 1}/{job.spec.runPolicy.backoffLimit})"
    return StagingDecision(Action.RETRY, failure.reason, message, _condition("False", Reason.STAGING_RETRY, message),
                           pod=name, requeue_after=delay, count_retry=True, event=(failure.reason, message))


def _create_or_wait(name: str, condition: Optional[api.Condition], *, now: _dt.datetime, delay: float, retries: int,
                    deleting: bool) -> StagingDecision:
    """No pod (or the last one on its way out): create one, once a retry's backoff (`delay`) has passed."""
    if deleting:  # a retry's delete in flight: a new pod of the same name must wait for it
        return StagingDecision(Action.WAIT, Reason.STAGING_RETRY, f"waiting for pod {name} to go", requeue_after=2.0)
    if condition is not None and condition.reason == Reason.STAGING_RETRY and retries > 0:
        since = parse_time(condition.lastTransitionTime)
        due = since + _dt.timedelta(seconds=delay) if since else now
        if now < due:
            return StagingDecision(Action.WAIT, Reason.STAGING_RETRY, condition.message,
                                   requeue_after=(due - now).total_seconds())
    message = f"pod {name} downloads the model and dataset into the cache"
    return StagingDecision(Action.CREATE, Reason.STAGING, message, _condition("False", Reason.STAGING, message),
                           pod=name)


# ---------------------------------------------------------------------------------------------- the step
def stage(draft: Draft) -> bool:
    """decide()'s step between wait_for_previous_attempt and create_pods: the trainers only once the cache holds what
    the job needs (Staged=True, kept in the status: a gang restart or a resume never stages again). Settles the pass
    while the download pod is created, runs, or waits for a retry; fails the job on a permanent download error."""
    status = draft.status
    retries = as_retries(status.stagingRetries)
    condition = draft.condition(ConditionType.STAGED)
    pod = draft.pods.initializer
    # a failed pod already counted (the condition says StagingRetry; a pass that does not see its delete yet) is
    # decided on the count before it
    counted = condition is not None and condition.reason == Reason.STAGING_RETRY and pod is not None and not pod.deleting
    d = decide_staging(draft.checked.job, pod, condition, now=draft.now, policy=draft.policy,
                       retries=retries - 1 if counted and retries > 0 else retries, progress=draft.stage_progress)
    if d.event is not None:
        kind = "Normal" if d.action == Action.PROCEED else "Warning"
        draft.decision.events.append(JobEvent(kind, d.event[0], bounded(d.event[1])))
    message = bounded(d.message)
    if d.action == Action.PROCEED:
        if d.condition is not None:
            draft.set(ConditionType.STAGED, "True", d.condition.reason, message)
            status.stagedRevisions = d.revisions
        return False
    if d.action == Action.FAIL:
        draft.set(ConditionType.STAGED, "False", d.reason, message)
        status.lastFailureReason = d.reason
        return fail(draft, d.reason, message)
    if d.action == Action.RETRY:
        # counted once per failed pod: a second pass that still sees it (its delete not yet in the watch) finds the
        # condition already at StagingRetry
        if not counted:
            status.stagingRetries = retries + 1
            draft.set(ConditionType.STAGED, "False", Reason.STAGING_RETRY, message, force_transition=True)
        status.lastFailureReason = d.reason
        draft.delete([pod] if pod is not None else [])
    elif d.action == Action.CREATE:
        draft.decision.create_attempt = draft.pods.attempt
        draft.decision.create_pods = [d.pod or render_initializer.pod_name(draft.job.name)]
        if status.startTime is None and not draft.job.create_refused:  # the download counts towards the deadline
            status.startTime = fmt_time(draft.now)
    if d.condition is not None and d.action != Action.RETRY:
        draft.set(ConditionType.STAGED, "False", d.condition.reason, message)
    status.phase = Phase.PENDING
    status.message = message or f"waiting for pod {render_initializer.pod_name(draft.job.name)}"
    if d.requeue_after is not None:
        draft.decision.requeue(d.requeue_after)
    return True


def as_retries(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0
