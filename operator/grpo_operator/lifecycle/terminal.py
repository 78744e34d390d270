"""Ending a job: Failed (fail), the activeDeadlineSeconds limit, and what Succeeded/Failed jobs keep (TTL)."""

from __future__ import annotations

import datetime as _dt

from ..api.status import TERMINAL, ConditionType, Phase, Reason
from .conditions import fmt_time, parse_time
from .draft import Draft, JobEvent, active
from .pods import ROLE_TRAINER


def fail(draft: Draft, reason: str, message: str) -> bool:
    """The job failed for good: Failed, what still runs deleted, the gang released, TTL from now."""
    draft.status.phase = Phase.FAILED
    draft.status.message = message
    draft.status.completionTime = fmt_time(draft.now)
    draft.set(ConditionType.FAILED, "True", reason, message)
    draft.clear(ConditionType.RUNNING, reason, "the job failed")
    draft.clear(ConditionType.RESTARTING, reason, "the job failed")
    draft.clear(ConditionType.QUEUED, reason, "the job failed")
    draft.delete(active(draft.pods.ours))
    draft.stop_initializer()
    draft.release_gang()
    ttl = draft.spec.runPolicy.ttlSecondsAfterFinished
    if ttl is not None:
        draft.decision.requeue(ttl)
    return True


def keep_terminal(draft: Draft) -> bool:
    """Succeeded and Failed are final: what still runs is deleted, and the job itself after its TTL."""
    if draft.phase not in TERMINAL:
        return False
    draft.delete(active(draft.pods.ours, keep_succeeded=True))
    draft.stop_initializer()
    if draft.phase == Phase.FAILED:
        draft.release_gang()  # repeated until seen: a lost patch is sent again
    else:
        draft.release_gang([p for p in draft.pods.ours if p.role != ROLE_TRAINER])  # the vLLM server's own group
    ttl = draft.ttl_after_finished
    if ttl is not None:
        status, now = draft.status, draft.now
        done = parse_time(status.completionTime) or now
        if status.completionTime is None:
            status.completionTime = fmt_time(now)
        due = done + _dt.timedelta(seconds=ttl)
        if now >= due:
            draft.decision.delete_job = True
            draft.decision.events.append(JobEvent("Normal", Reason.TTL_EXPIRED,
                                                  f"deleting the job {ttl}s after it finished"))
        else:
            draft.decision.requeue((due - now).total_seconds())
    return True


def enforce_deadline(draft: Draft) -> bool:
    """runPolicy.activeDeadlineSeconds, counted from status.startTime."""
    deadline = draft.spec.runPolicy.activeDeadlineSeconds
    start = parse_time(draft.status.startTime)
    if deadline is None or start is None:
        return False
    due = start + _dt.timedelta(seconds=deadline)
    if draft.now >= due:
        return fail(draft, Reason.DEADLINE_EXCEEDED,
                    f"the job ran longer than runPolicy.activeDeadlineSeconds={deadline}")
    draft.decision.requeue((due - draft.now).total_seconds())
    return False
