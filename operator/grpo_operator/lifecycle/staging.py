"""spec.cache: when to create the download pod, wait for it, go on to the trainers, retry or fail (pure; the clock is
passed in). The lead wires `decide_staging` into lifecycle/decision.py: before any trainer or vLLM pod is created,
the job's ConfigMap first (the initializer reads the config), then this decision; trainers only on PROCEED.

    decide_staging(job, pod, condition, now=…, retries=…) → StagingDecision
        job        the GRPOJob
        pod        the observed initializer pod (PodInfo, role `initializer`, name render.initializer.pod_name) or None
        condition  the job's current `Staged` condition (a dict from status.conditions) or None
        retries    staging retries so far (the caller keeps the count; it bounds them with runPolicy.backoffLimit)
        progress   the last GRPO_STAGE record of the pod's log (parse_record), for the message while it downloads

Rules:
- no spec.cache, or nothing from the Hub (model and dataset are paths in the pod): PROCEED at once, no pod.
- `Staged=True` already (set on the first success): PROCEED, whatever became of the pod. So a gang restart, a
  suspend/resume or a deleted pod never start a second download.
- no pod: CREATE it (after the backoff of a retry, measured from the condition's lastTransitionTime).
- pod Pending/Running: WAIT, with the progress (bytes and files done/total) as the condition's message.
- pod Succeeded: PROCEED and set `Staged=True` (reason Staged, the summary: what was staged, bytes, seconds).
- pod Failed, permanent (exit 17 HubAccessDenied, 18 HubNotFound, 10 ConfigError, …): FAIL the job with the pod's
  reason and the Hub's message (the termination message). Never an endless Pending.
- pod Failed, retryable (202 TransientIOError after the pod's own retries, eviction, node lost, a signal): RETRY —
  delete the pod, recreate it after base·2^retries s (capped) — until `retries` reaches runPolicy.backoffLimit, then
  FAIL with the last reason.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from grpo_trainer import contract

from .. import api
from ..render import cache as render_cache
from ..render import initializer as render_initializer
from .conditions import parse_time
from .pods import PodInfo, PodPhase, classify

CONDITION = "Staged"  # status.conditions[].type (True once the cache holds what the job needs)
REASON_STAGING = "Staging"
REASON_STAGED = "Staged"
REASON_RETRY = "StagingRetry"
BACKOFF_BASE, BACKOFF_CAP = 10.0, 300.0


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
    condition: Optional[dict[str, Any]] = None  # the Staged condition to set (type, status, reason, message)
    pod: Optional[str] = None  # the initializer pod to create (CREATE) or delete (RETRY)
    requeue_after: Optional[float] = None
    count_retry: bool = False  # RETRY: the caller increments its staging retry count
    event: Optional[tuple[str, str]] = None  # (reason, message) of an Event: the download's time, a failure
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


def _size(n: Any) -> str:
    value = float(n or 0)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def progress_message(record: Optional[dict[str, Any]]) -> str:
    """'model org/x@main: 1.2 GB / 3.4 GB, 3/7 files' from a progress record; a plain line without one."""
    if not record or not record.get("item"):
        return "downloading the model and dataset into the cache"
    text = f"downloading {record['item']}"
    if record.get("totalBytes"):
        text += f": {_size(record.get('bytes'))} / {_size(record['totalBytes'])}"
    if record.get("totalFiles"):
        text += f", {record.get('files') or 0}/{record['totalFiles']} files"
    return text


def _condition(status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": CONDITION, "status": status, "reason": reason, "message": message}


def _staged_message(record: Optional[dict[str, Any]]) -> str:
    if not record or record.get("event") != "done":
        return "the cache holds the model and dataset"
    staged, cached = record.get("staged") or [], record.get("cached") or []
    parts = []
    if staged:
        parts.append(f"staged {', '.join(staged)} ({_size(record.get('bytes'))} in {record.get('seconds', 0)} s)")
    if cached:
        parts.append(f"already cached: {', '.join(cached)}")
    return "; ".join(parts) or "nothing to stage"


def _backoff(retries: int) -> float:
    return min(BACKOFF_BASE * 2 ** max(retries - 1, 0), BACKOFF_CAP) if retries > 0 else 0.0


def decide_staging(job: api.GRPOJob, pod: Optional[PodInfo], condition: Optional[dict[str, Any]], *,
                   now: _dt.datetime, retries: int = 0, progress: Optional[dict[str, Any]] = None) -> StagingDecision:
    if not render_cache.needs_initializer(job):
        return StagingDecision(Action.PROCEED, reason="NotNeeded")
    if condition is not None and condition.get("status") == "True":
        return StagingDecision(Action.PROCEED, reason=REASON_STAGED)
    name = render_initializer.pod_name(job.metadata.name or "")
    if pod is None or pod.deleting:
        return _create_or_wait(name, condition, now=now, retries=retries, deleting=pod is not None)
    if pod.phase == PodPhase.SUCCEEDED:
        record = parse_record(pod.message)
        message = _staged_message(record)
        event = (REASON_STAGED, f"{message}; pod {name}")
        return StagingDecision(Action.PROCEED, REASON_STAGED, message, _condition("True", REASON_STAGED, message),
                               event=event)
    failure = classify(pod)
    if failure is None:  # Pending or Running
        why = pod.unschedulable or pod.waiting
        message = f"pod {name} is waiting: {why}" if why else progress_message(progress)
        return StagingDecision(Action.WAIT, REASON_STAGING, message, _condition("False", REASON_STAGING, message),
                               requeue_after=10.0)
    hub_message = pod.message if pod.message and not pod.message.startswith(contract.STAGE_PREFIX) else ""
    message = f"downloading into spec.cache failed: {hub_message or failure.message}"
    if not failure.retryable or retries >= job.spec.runPolicy.backoffLimit:
        if failure.retryable:
            message += f" (gave up after {retries} retries: runPolicy.backoffLimit)"
        return StagingDecision(Action.FAIL, failure.reason, message, _condition("False", failure.reason, message),
                               event=(failure.reason, message))
    delay = _backoff(retries + 1)
    message += f"; retrying in {delay:.0f} s ({retries + 1}/{job.spec.runPolicy.backoffLimit})"
    return StagingDecision(Action.RETRY, failure.reason, message, _condition("False", REASON_RETRY, message),
                           pod=name, requeue_after=delay, count_retry=True, event=(failure.reason, message))


def _create_or_wait(name: str, condition: Optional[dict[str, Any]], *, now: _dt.datetime, retries: int,
                    deleting: bool) -> StagingDecision:
    if deleting:  # a retry's delete in flight: a new pod of the same name must wait for it
        return StagingDecision(Action.WAIT, REASON_RETRY, f"waiting for pod {name} to go", requeue_after=2.0)
    if condition is not None and condition.get("reason") == REASON_RETRY and retries > 0:
        since = parse_time(condition.get("lastTransitionTime"))
        due = since + _dt.timedelta(seconds=_backoff(retries)) if since else now
        if now < due:
            return StagingDecision(Action.WAIT, REASON_RETRY, str(condition.get("message") or ""),
                                   requeue_after=(due - now).total_seconds())
    message = f"pod {name} downloads the model and dataset into the cache"
    return StagingDecision(Action.CREATE, REASON_STAGING, message, _condition("False", REASON_STAGING, message),
                           pod=name)
