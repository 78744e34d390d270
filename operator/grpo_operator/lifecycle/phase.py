"""The last step: the phase from the current attempt's pods (Succeeded, Running or Pending, and why), with the
Unschedulable and Queued conditions."""

from __future__ import annotations

from .. import api
from ..api.status import ConditionType, Phase, Reason
from . import progress
from .conditions import fmt_time
from .draft import Draft, JobEvent
from .pods import ROLE_TRAINER, PodInfo, PodPhase


def phase_from_pods(draft: Draft) -> bool:
    """Succeeded when every trainer pod succeeded, Running when every pod runs, else Pending (and why)."""
    if succeeded(draft):
        return True
    current, attempt, nodes = draft.current, draft.pods.attempt, draft.nodes
    observed = {p.name for p in draft.pods.current}
    all_present = all(n in observed for n in draft.expected) and len(current) >= len(draft.expected)
    all_running = all_present and all(p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) and p.live for p in current)
    unschedulable, gated = scheduling(draft, current)
    if all_running:
        draft.status.phase = Phase.RUNNING
        draft.status.message = f"{nodes} node(s) running (attempt {attempt})"
        draft.set(ConditionType.RUNNING, "True", Reason.ALL_NODES_RUNNING, draft.status.message)
    else:
        _pending(draft, current, unschedulable, gated)
    if any(p.synthetic for p in current):
        draft.decision.requeue(draft.policy.expectation_ttl)
    return True


def succeeded(draft: Draft) -> bool:
    """Every trainer pod succeeded: Succeeded, with the rank-0 pod's final progress record; TTL from now."""
    status, current, nodes = draft.status, draft.current, draft.nodes
    trainers = [p for p in current if p.role == ROLE_TRAINER]
    if not (len(trainers) >= nodes and all(p.phase == PodPhase.SUCCEEDED for p in trainers)):
        return False
    status.phase = Phase.SUCCEEDED
    status.completionTime = fmt_time(draft.now)
    status.message = f"all {nodes} node(s) succeeded after {draft.pods.attempt} restart(s)"
    previous = status.progress.model_dump(mode="json", exclude_none=True) if status.progress is not None else None
    for p in trainers:  # the rank-0 pod's final record: where training really ended
        final = progress.from_result_message(p.message, previous, draft.now.timestamp())
        if final is not None:
            status.progress = api.parse_lenient(api.ProgressStatus, final)
            break
    draft.set(ConditionType.SUCCEEDED, "True", Reason.ALL_NODES_SUCCEEDED, status.message)
    draft.clear(ConditionType.RUNNING, Reason.COMPLETED, "the job completed")
    draft.clear(ConditionType.QUEUED, Reason.COMPLETED, "the job completed")
    draft.clear(ConditionType.UNSCHEDULABLE, Reason.COMPLETED, "the job completed")
    draft.decision.delete_pods += [p.name for p in current if p.role != ROLE_TRAINER and p.live]
    release_servers(draft)
    ttl = draft.spec.runPolicy.ttlSecondsAfterFinished
    if ttl is not None:
        draft.decision.requeue(ttl)
    return True


def release_servers(draft: Draft) -> None:
    """A succeeded job's vLLM server ends its own gang (a scheduler's group of its own, which would otherwise hold
    its quota waiting for a replacement of the deleted server); the trainers' group finished with them."""
    draft.release_gang([p for p in draft.pods.ours if p.role != ROLE_TRAINER])


def scheduling(draft: Draft, current: list[PodInfo]) -> tuple[list[PodInfo], list[str]]:
    """Unschedulable and Queued (held at the gang scheduler's gate): the conditions, and the pods concerned."""
    unschedulable = [p for p in current if p.unschedulable]
    if unschedulable:
        p = unschedulable[0]
        draft.set(ConditionType.UNSCHEDULABLE, "True", Reason.UNSCHEDULABLE,
                  f"{len(unschedulable)} pod(s) unschedulable; {p.name}: {p.unschedulable}")
    else:
        draft.clear(ConditionType.UNSCHEDULABLE, Reason.SCHEDULED, "all pods are scheduled")
    gated = draft.gang.queued(current)
    if gated:
        draft.set(ConditionType.QUEUED, "True", *draft.gang.queued_condition(gated))
    else:
        draft.clear(ConditionType.QUEUED, Reason.ADMITTED, draft.gang.admitted)
    return unschedulable, gated


def pending_message(head: str, current: list[PodInfo], unschedulable: list[PodInfo], queued: str) -> str:
    """`head`, and why the pods wait: the first unschedulable pod's scheduler message, the gang scheduler's note
    while pods wait at its gate (`queued`, "" when none does), or the first waiting pod's kubelet reason (the
    trainers' Pending here, the vLLM server's in server/first.py)."""
    waiting = [p for p in current if p.waiting]
    if unschedulable:
        return f"{head}; unschedulable: {unschedulable[0].unschedulable}"
    if queued:
        return head + queued
    if waiting:
        return f"{head}; {waiting[0].name}: {waiting[0].waiting}"
    return head


def _pending(draft: Draft, current: list[PodInfo], unschedulable: list[PodInfo], gated: list[str]) -> None:
    """Pending, and why: unschedulable, queued, or the kubelet's waiting reason (also the Running condition's)."""
    attempt = draft.pods.attempt
    draft.status.phase = Phase.PENDING
    waiting = [p for p in current if p.waiting]
    running = sum(1 for p in current if p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED))
    message = pending_message(f"{running}/{len(draft.expected)} pod(s) running (attempt {attempt})", current,
                              unschedulable, draft.gang.queued_note(server=False) if gated else "")
    draft.status.message = message
    if waiting and not unschedulable:
        # The kubelet's own reason (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, CreateContainerConfigError…)
        # as the Running condition's: a job whose image cannot be pulled says so, instead of an endless Pending.
        reason = (waiting[0].waiting or "").split(":", 1)[0].strip() or Reason.PODS_NOT_RUNNING
        previous = draft.condition(ConditionType.RUNNING)
        if previous is None or previous.reason != reason:
            draft.decision.events.append(JobEvent("Warning", reason, message))
        draft.set(ConditionType.RUNNING, "False", reason, message)
    elif draft.is_true(ConditionType.RUNNING):
        draft.set(ConditionType.RUNNING, "False", Reason.PODS_NOT_RUNNING, message)
