"""Creating the current attempt: conflicts with objects we do not own, and the attempt's missing pods (with the
pod group the gang policy puts them in)."""

from __future__ import annotations

from ..api.status import ConditionType, Phase, Reason
from .conditions import fmt_time
from .draft import Draft
from .inplace import attempt_budget
from .pods import ROLE_TRAINER, ROLE_VLLM, PodInfo


def note_conflicts(draft: Draft) -> bool:
    """Objects with our pod names owned by something else: Created=False until the user removes them."""
    if draft.conflict_names:
        message = ("objects with this job's pod names exist but are not owned by it: "
                   + ", ".join(sorted(draft.conflict_names)) + "; delete or rename them")
        draft.set(ConditionType.CREATED, "False", Reason.CHILD_CONFLICT, message)
    return False


def start(draft: Draft) -> None:
    """status.startTime (the anchor of runPolicy.activeDeadlineSeconds), once; not while the API server refuses this
    job's creates (nothing was created)."""
    if draft.status.startTime is None and not draft.job.create_refused:
        draft.status.startTime = fmt_time(draft.now)
        deadline = draft.spec.runPolicy.activeDeadlineSeconds
        if deadline is not None:
            draft.decision.requeue(deadline)


def create_pods(draft: Draft) -> bool:
    """The current attempt's missing pods, unless the gang already started (then a missing pod is a failure)."""
    attempt, expected, conflicts = draft.pods.attempt, draft.expected, draft.conflict_names
    present = {p.name for p in draft.pods.current}
    missing = [n for n in expected if n not in present and n not in conflicts]
    restarting = draft.is_true(ConditionType.RESTARTING)
    created = f"attempt {attempt}: {len(expected)} pod(s)"
    recreated = f"attempt {attempt} started after {attempt} restart(s)"
    if missing and not draft.any_started:
        draft.decision.create_attempt = attempt
        draft.decision.create_pods = missing
        draft.decision.max_restarts = attempt_budget(draft)  # in-place restarts (runPolicy.restartPolicy)
        # a vLLM server created too joins a group of its own (render/manifests.py _gang)
        draft.join_groups(attempt, [ROLE_TRAINER] + ([ROLE_VLLM] if set(missing) & set(expected[draft.nodes:]) else []))
        # while the API server refuses this job's creates, nothing was created: no start, no Created claim (the
        # controller sends a job's first creates before the status that claims them, so a refusal stops that too)
        start(draft)
        if not conflicts and not draft.job.create_refused:
            draft.set(ConditionType.CREATED, "True", Reason.PODS_CREATED, created)
        if restarting:
            draft.set(ConditionType.RESTARTING, "False", Reason.PODS_RECREATED, recreated)
        servers = set(expected[draft.nodes:])
        draft.current += [PodInfo(name=n, attempt=attempt, owner_uid=draft.job.uid, synthetic=True,
                                  role=ROLE_VLLM if n in servers else ROLE_TRAINER) for n in missing]
    elif not missing and not conflicts and draft.current:
        start(draft)  # the pods exist: after refused creates, the job starts when they finally went through
        if not draft.is_true(ConditionType.CREATED):
            draft.set(ConditionType.CREATED, "True", Reason.PODS_CREATED, created)
        if restarting:
            draft.set(ConditionType.RESTARTING, "False", Reason.PODS_RECREATED, recreated)
    return False


def refused_creates(draft: Draft) -> None:
    """After every pass: a create the API server refused (quota, PodSecurity, a webhook's denial…) is condition
    CreateFailed=True with the server's message while something is still to be created (the controller retries with
    backoff); once nothing is left to create, False. Without a record (an operator restart) it stays as it was until
    the next try says."""
    refusal, creating = draft.job.create_refused, bool(draft.decision.create_pods)
    if creating and refusal:
        draft.set(ConditionType.CREATE_FAILED, "True", Reason.FAILED_CREATE, refusal)
        if draft.status.phase in (None, Phase.PENDING):
            draft.status.message = f"creating the pods is refused: {refusal}"
    elif not creating:
        draft.clear(ConditionType.CREATE_FAILED, Reason.PODS_CREATED, "nothing left to create")
