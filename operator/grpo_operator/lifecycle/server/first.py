"""Server mode's order, as a step of decide(): the vLLM server pod(s) first, the trainers only once every server pod
is Ready, and a start-up deadline (spec.vllm.server.startupTimeoutSeconds) past which the attempt ends as a
retryable failure of the server. The decisions are server/order.py's plan(); this step carries them out
on the Draft.

Placed after wait_for_previous_attempt (the attempt may start) and before create_pods (which creates the trainers
once this step lets the pass through). While it waits it settles the pass: status Pending, the Running condition
False with reason WaitingForVllmServer, a timer for the deadline.

A server kept across a trainer restart (server/keep.py) passes its engine probe here before the next
attempt's trainers are created.

The server is outside the trainers' gang (server/order.py says why): a scheduler that admits pods by group admits
the server alone, in a group of its own (GangPolicy.group_of_new_pods for the server's role: a replacement joins the
run's server group); the trainers' group is created once the server is Ready (docs/operator.md "vLLM server
mode")."""

from __future__ import annotations

from ...api.status import ConditionType, Phase, Reason
from ..conditions import fmt_time
from ..draft import Draft
from ..phase import pending_message, scheduling
from ..pods import ROLE_TRAINER, ROLE_VLLM, PodInfo
from ..restart import restart_for
from . import keep
from . import order as so


def server_first(draft: Draft) -> bool:
    """Withhold the trainers until every server pod of the current attempt is Ready (server mode)."""
    job = draft.checked.job
    if job.spec.vllm.mode != "server":
        return False
    current = draft.pods.current
    if any(p.role == ROLE_TRAINER for p in draft.current):  # the trainers exist: decide()'s usual rules
        return False
    if keep.verify_kept(draft, [p for p in current if p.role == ROLE_VLLM]):
        return True  # a server kept from an earlier attempt: its engine probe first (or its replacement)
    server_names = draft.expected[draft.nodes:]  # pod_names(): the trainers by rank, then the server's
    servers = [p for p in current if p.role == ROLE_VLLM]
    d = so.plan(job, servers, draft.now, expected_servers=len(server_names))
    if d.action == so.CREATE_TRAINERS:
        return False  # create_pods creates the missing trainers
    if d.action == so.RESTART_ALL and d.failure is not None:  # the start-up deadline (a failed server: restart_or_fail)
        return restart_for(draft, [d.failure])
    if d.action == so.CREATE_SERVER:
        _create_servers(draft, [n for n in server_names if n not in {p.name for p in current}])
    _waiting(draft, d)
    return True


def _create_servers(draft: Draft, missing: list[str]) -> None:
    attempt = draft.pods.attempt
    if not missing or missing[0] in draft.conflict_names:
        return  # note_conflicts said so (Created=False)
    draft.decision.create_attempt = attempt
    draft.decision.create_pods = missing
    draft.join_groups(attempt, [ROLE_VLLM])
    if draft.status.startTime is None and not draft.job.create_refused:  # refused: nothing created, not started
        draft.status.startTime = fmt_time(draft.now)
        deadline = draft.spec.runPolicy.activeDeadlineSeconds
        if deadline is not None:
            draft.decision.requeue(deadline)
    if draft.is_true(ConditionType.RESTARTING):  # the next attempt has begun, with its server
        draft.set(ConditionType.RESTARTING, "False", Reason.PODS_RECREATED,
                  f"attempt {attempt} started after {attempt} restart(s): its vLLM server first")
    draft.current += [PodInfo(name=n, attempt=attempt, owner_uid=draft.job.uid, role=ROLE_VLLM, synthetic=True)
                      for n in missing]


def _waiting(draft: Draft, d: so.ServerDecision) -> None:
    """Pending, and why: the server's own state (unschedulable, an image pull) when it has one."""
    unschedulable, gated = scheduling(draft, draft.current)
    message = pending_message(f"{d.message} (attempt {draft.pods.attempt})", draft.current, unschedulable,
                              draft.gang.queued_note(server=True) if gated else "")
    draft.status.phase = Phase.PENDING
    draft.status.message = message
    draft.set(ConditionType.RUNNING, "False", d.reason or so.WAITING_FOR_SERVER, message)
    if d.requeue_after is not None:
        draft.decision.requeue(d.requeue_after)
    if any(p.synthetic for p in draft.current):
        draft.decision.requeue(draft.policy.expectation_ttl)
