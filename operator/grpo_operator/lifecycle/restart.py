"""Attempts and gang restarts: which attempt is current, failures of the current attempt (restart or give up),
an eviction by the gang scheduler (a restart not charged to the job), and the wait before the next attempt."""

from __future__ import annotations

import datetime as _dt

from grpo_trainer.contract import DISTRIBUTED

from ..api.status import ConditionType, Phase, Reason
from . import gangs, inplace
from .conditions import parse_time
from .draft import Draft, backoff_seconds
from .pods import ROLE_TRAINER, Failure, PodPhase, classify
from .server import keep as server_keep
from .terminal import fail


def adopt_newest_attempt(draft: Draft) -> bool:
    """status.restarts is the current attempt, unless pods of a newer one prove a lost status write."""
    draft.status.restarts = draft.pods.attempt
    return False


def delete_other_attempts(draft: Draft) -> bool:
    """Pods of an older attempt go first."""
    draft.delete(draft.pods.other_attempt)
    return False


def current_failures(draft: Draft) -> list[Failure]:
    """What went wrong in the current attempt: failed pods, pods deleted under a running gang, pods gone."""
    failures: list[Failure] = []
    for p in draft.pods.current:
        if p.synthetic:
            continue
        if p.deleting:
            # someone else deletes a pod of a running gang: the gang is broken. Before the gang ran (or
            # after a resume) a pod on its way out is waited for and then recreated under the same name.
            if draft.phase == Phase.RUNNING and p.phase != PodPhase.SUCCEEDED:
                failures.append(Failure(True, Reason.POD_DELETED, f"pod {p.name} was deleted"))
            continue
        f = classify(p)
        if f is not None:
            if not f.retryable and p.role != ROLE_TRAINER:  # a vLLM server's exit code is not the trainer's contract
                f = Failure(True, f.reason, f.message + " (vLLM server: retried)")
            failures.append(f)
    if draft.any_started and draft.phase in (Phase.RUNNING, Phase.PENDING, None):
        present = {p.name for p in draft.pods.current}
        for name in draft.expected:
            if name not in present and name not in draft.conflict_names:
                failures.append(Failure(True, Reason.POD_DELETED,
                                        f"pod {name} disappeared (deleted or its node was lost)"))
    return failures


# How long a gang whose only failures are lost-peer exits waits for the other trainers' own exit codes.
PEER_EXIT_GRACE_SECONDS = 30.0


def restart_or_fail(draft: Draft) -> bool:
    """A permanent failure fails the job; a retryable one restarts the whole gang after a backoff, up to
    runPolicy.backoffLimit restarts. An eviction by the gang scheduler restarts it without charging the job."""
    evicted = draft.gang.evicted(draft.pods.current)
    if evicted:
        return requeue_after_eviction(draft, evicted)
    failures = current_failures(draft)
    if not failures:
        return False
    wait = peer_exit_pending(draft, failures)
    if wait is not None:
        draft.decision.requeue(wait)
        return True  # nothing decided yet: the status stays as it is
    return restart_for(draft, failures)


def peer_exit_pending(draft: Draft, failures: list[Failure]) -> float | None:
    """Seconds to wait before deciding, or None to decide now. A trainer that exits with the lost-peer code (200) is
    usually the echo of another rank's failure: that rank's own code, maybe a permanent one (a config error), reaches
    the API server a moment later, under load after it. While every failure is such an echo and another trainer of
    the attempt still runs, the decision waits up to PEER_EXIT_GRACE_SECONDS after the first echo (the kubelet's
    finishedAt; a clock more than the grace ahead of ours is not waited for), so that a permanent error is not
    restarted once before it fails the job."""
    current = [p for p in draft.pods.current if p.role == ROLE_TRAINER and p.live]
    echoes = [p for p in current if p.phase == PodPhase.FAILED and p.exit_code == DISTRIBUTED and not p.signal]
    if len(echoes) != len(failures) or not any(p.phase == PodPhase.RUNNING for p in current):
        return None
    stamps = [p.finished_at for p in echoes if p.finished_at is not None]
    if len(stamps) != len(echoes):
        return None
    left = PEER_EXIT_GRACE_SECONDS - (draft.now - min(stamps)).total_seconds()
    return left if 0 < left <= 2 * PEER_EXIT_GRACE_SECONDS else None


def restart_for(draft: Draft, failures: list[Failure]) -> bool:
    """These failures of the current attempt: Failed (a permanent one, or runPolicy.backoffLimit used up), else a
    gang restart of every pod after a backoff (lifecycle/server/first.py's start-up deadline comes here too); in
    server mode a healthy vLLM server is kept and only the trainers restart (lifecycle/server/keep.py)."""
    status, run = draft.status, draft.spec.runPolicy
    limit = run.backoffLimit
    permanent = [f for f in failures if not f.retryable]
    first = (permanent or failures)[0]
    status.lastFailureReason = first.reason
    if permanent:
        return fail(draft, first.reason, first.message)
    # the scheduler's evictions are not the job's failures; in-place restarts are (lifecycle/inplace.py)
    charged = inplace.charged_retries(status)
    action = inplace.choose(inplace.cause_of(first), retryable=True, restart_policy=run.restartPolicy,
                            backoff_limit=limit, charged=charged, in_place_left=0)
    if action == inplace.Action.FAIL:
        in_place = f", {status.inPlaceRestarts} of them in place" if status.inPlaceRestarts else ""
        return fail(draft, Reason.BACKOFF_LIMIT_EXCEEDED,
                    f"{first.message}; runPolicy.backoffLimit={limit} restarts already used{in_place}")
    keep, server_note = server_keep.restart_keeping(draft)  # server mode: a healthy vLLM server is kept
    draft.next_attempt(charged=True)
    charged += 1
    status.phase = Phase.RESTARTING
    delay = backoff_seconds(status.restarts - draft.requeues, draft.policy)  # as wait_for_previous_attempt counts
    status.message = f"gang restart {charged}/{limit} in {delay:g}s: {first.message}{server_note}"
    draft.set(ConditionType.RESTARTING, "True", first.reason, status.message, force_transition=True)
    draft.clear(ConditionType.RUNNING, first.reason, "restarting the trainers" if keep else "restarting all nodes")
    draft.delete(draft.pods.other_attempt if keep else draft.pods.ours)
    draft.decision.requeue(delay)
    return True


def requeue_after_eviction(draft: Draft, evicted: str) -> bool:
    """Kueue ended the pods (preemption, eviction: their TerminationTarget condition): not the job's failure. The
    next attempt's pods replace them in the same group without a backoff and wait at Kueue's gate for the group
    to be admitted again; runPolicy.backoffLimit is not spent."""
    status = draft.status
    status.vllmServerAttempt = None  # the next attempt starts with its own server (an eviction is no failure evidence)
    attempt = draft.next_attempt(charged=False)
    status.phase = Phase.RESTARTING
    status.message = draft.gang.eviction_message(evicted, attempt)
    reason = draft.gang.eviction_reason
    draft.set(ConditionType.RESTARTING, "True", reason, status.message, force_transition=True)
    draft.clear(ConditionType.RUNNING, reason, draft.gang.eviction_summary())
    draft.delete(draft.pods.ours)
    return True


def wait_for_previous_attempt(draft: Draft) -> bool:
    """The next attempt starts once the older attempt's pods are out of the way (as the gang policy requires:
    gone, or settled: lifecycle/gangs says why) and the backoff has run out."""
    if draft.pods.other_attempt:
        ready, ending = draft.gang.ready_to_replace(draft.pods.other_attempt)
        draft.end_groups(ending)
        if not ready:
            if draft.phase is None:
                draft.status.phase = Phase.PENDING
            return True
    # the next attempt began once a pod of its own exists (a vLLM server kept from an earlier attempt is not one)
    if not draft.is_true(ConditionType.RESTARTING) or any(p.attempt == draft.pods.attempt for p in draft.pods.current):
        return False
    restarting = draft.condition(ConditionType.RESTARTING)
    if restarting is not None and restarting.reason in gangs.EVICTION_REASONS:
        return False  # the scheduler's own queue is the wait
    since = parse_time(restarting.lastTransitionTime if restarting is not None else None)
    charged = draft.pods.attempt - draft.requeues
    due = (since or draft.now) + _dt.timedelta(seconds=backoff_seconds(charged, draft.policy))
    if draft.now >= due:
        return False
    draft.status.phase = Phase.RESTARTING
    draft.decision.requeue((due - draft.now).total_seconds())
    return True
