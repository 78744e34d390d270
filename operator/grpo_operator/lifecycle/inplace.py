"""In place or new pods (runPolicy.restartPolicy): the choice for each kind of failure (a pure table), the retries
charged to runPolicy.backoffLimit, and the in-place restarts the trainers report, counted into the status.

Who acts: a trainer *process* failure inside a healthy pod is restarted in place by torchrun's agents in the pods
(`--max-restarts`, rules/restarts.py; grpo_trainer/launch.py keeps permanent exit codes out of it); the operator
never sees it as a failure, only as a count in the trainers' metrics (status.progress.inPlaceRestarts, for the
attempt status.progress.attempt). Everything the operator does see is pod-level (a pod failed, was deleted,
evicted, lost with its node): new pods (restart.py) or Failed.
"""

from __future__ import annotations

from enum import StrEnum

from .. import api
from ..api.status import Reason
from ..rules import restarts
from .draft import Draft, JobEvent
from .pods import NODE_LOST_REASONS, RETRYABLE_POD_REASONS, Failure


class Cause(StrEnum):
    PROCESS = "Process"  # a trainer process failed (exit >= 128, a signal, an NCCL/gloo error) in a healthy pod
    POD_FAILED = "PodFailed"  # the trainer container ended: torchrun gave up (in-place restarts used up), or it died
    POD_LOST = "PodLost"  # the pod was deleted or disappeared, or its node was lost
    EVICTED = "Evicted"  # the kubelet or the scheduler evicted or preempted the pod


class Action(StrEnum):
    IN_PLACE = "InPlace"  # torchrun restarts the workers inside the same pods
    RECREATE = "Recreate"  # the gang's pods are deleted and created again
    FAIL = "Fail"


def choose(cause: Cause, *, retryable: bool, restart_policy: str, backoff_limit: int, charged: int,
           in_place_left: int) -> Action:
    """What a failure leads to. `charged`: retries already spent (charged_retries); `in_place_left`: in-place
    restarts the attempt's pods may still do (their --max-restarts less those done)."""
    if not retryable or charged >= backoff_limit:
        return Action.FAIL
    if cause == Cause.PROCESS and restart_policy == restarts.IN_PLACE and in_place_left > 0:
        return Action.IN_PLACE
    return Action.RECREATE


def cause_of(failure: Failure) -> Cause:
    """The cause of a failure the operator observed (restart.current_failures: always pod-level)."""
    if failure.reason in (Reason.POD_DELETED, Reason.NODE_LOST) or failure.reason in NODE_LOST_REASONS:
        return Cause.POD_LOST
    if failure.reason in RETRYABLE_POD_REASONS:
        return Cause.EVICTED
    return Cause.POD_FAILED


def charged_retries(status: api.GRPOJobStatus) -> int:
    """Retries runPolicy.backoffLimit paid for: gang restarts with new pods (less Kueue's) and in place."""
    return status.restarts - status.requeues + status.inPlaceRestarts


def attempt_budget(draft: Draft) -> int:
    """--max-restarts of the pods created now (rules/restarts.py)."""
    policy = draft.spec.runPolicy
    return restarts.in_place_budget(policy.restartPolicy, policy.backoffLimit, charged_retries(draft.status))


def count_in_place(draft: Draft) -> bool:
    """Count the current attempt's in-place restarts, as its global-rank-0 trainer reports them, into
    status.inPlaceRestarts (each once: status.inPlaceCounted), with a Warning Event per new one. Never settles."""
    progress, status = draft.found.progress, draft.status
    if progress is None or progress.attempt != draft.pods.attempt or not progress.inPlaceRestarts:
        return False
    seen = status.inPlaceCounted.restarts if status.inPlaceCounted and \
        status.inPlaceCounted.attempt == draft.pods.attempt else 0
    new = progress.inPlaceRestarts - seen
    if new <= 0:
        return False
    status.inPlaceRestarts += new
    status.inPlaceCounted = api.InPlaceCount(attempt=draft.pods.attempt, restarts=progress.inPlaceRestarts)
    used = f" ({charged_retries(status)}/{draft.spec.runPolicy.backoffLimit} retries of runPolicy.backoffLimit used)"
    draft.decision.events.append(JobEvent(
        "Warning", Reason.RESTARTED_IN_PLACE,
        f"a trainer process failed: torchrun restarted the workers inside the pods of attempt {draft.pods.attempt} "
        f"({progress.inPlaceRestarts} time(s) in this attempt){used}; they resume from the latest checkpoint"))
    return False
