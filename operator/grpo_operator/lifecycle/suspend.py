"""runPolicy.suspend: suspend (every pod deleted, the gang released) and resume."""

from __future__ import annotations

from ..api.status import ConditionType, Phase, Reason
from .draft import Draft


def suspend(draft: Draft) -> bool:
    """runPolicy.suspend: every pod deleted; the deadline clock restarts on resume."""
    if not draft.spec.runPolicy.suspend:
        return False
    draft.delete(draft.pods.ours)
    draft.stop_initializer()
    draft.status.phase = Phase.SUSPENDED
    draft.status.message = "suspended: pods deleted; unsuspend to resume from the latest checkpoint"
    draft.status.startTime = None
    draft.status.vllmServerAttempt = None  # no server is kept across a suspend: the resumed job starts its own
    draft.set(ConditionType.SUSPENDED, "True", Reason.SUSPENDED, "runPolicy.suspend is true")
    draft.clear(ConditionType.RUNNING, Reason.SUSPENDED, "the job is suspended")
    draft.clear(ConditionType.UNSCHEDULABLE, Reason.SUSPENDED, "the job is suspended")
    draft.clear(ConditionType.QUEUED, Reason.SUSPENDED, "the job is suspended")
    draft.release_gang()
    return True


def resume(draft: Draft) -> bool:
    """Unsuspended: Pending again, once the suspended pods are gone (or, when the gang policy starts a new attempt
    on resume, at once: the old pods are then waited for as the policy requires)."""
    if not (draft.is_true(ConditionType.SUSPENDED) or draft.phase == Phase.SUSPENDED):
        return False
    draft.set(ConditionType.SUSPENDED, "False", Reason.RESUMED, "runPolicy.suspend is false")
    draft.phase = draft.status.phase = Phase.PENDING
    draft.status.message = "resumed"
    if draft.gang.resume_starts_new_attempt():
        draft.next_attempt(charged=False)
        return False
    return any(p.deleting for p in draft.pods.ours)
