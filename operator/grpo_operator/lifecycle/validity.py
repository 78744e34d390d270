"""The first step: an invalid spec is Rejected (the webhook may be off) unless the job already started; a valid one
records topology and batch.

Upgrades: a new release may tighten a rule (a stricter bound, a TRL field renamed in a newer lock). A rule only ever
refuses a job that has not started (draft.has_started: the operator created its pods at least once). A started job
that today's rules refuse keeps what it has: condition SpecInvalid=True names the rule (and a Warning event), its
status.topology and status.batch stay those it started with, terminal phases stay final and their TTL fires. When
today's models still parse the spec and compute its topology, it goes on as any job (restarts included); when they
cannot, it gets no new pods and none of its pods is deleted: its phase follows its pods to Succeeded, else it waits
for a spec that today's rules accept.
"""

from __future__ import annotations

import re

from .. import api
from ..api.status import TERMINAL, ConditionType, Phase, Reason
from .conditions import fmt_time
from .draft import Draft, JobEvent, active
from .pods import ROLE_TRAINER, PodPhase

BATCH_KEYS = tuple(api.BatchStatus.model_fields)  # status.batch's keys
_NODES = re.compile(r"^(\d+)x")  # status.topology: "2x8", "1x4cpu"


def reject_invalid(draft: Draft) -> bool:
    """The webhook may be off: an invalid spec of a job that has not started is Rejected here too, and has no pods.
    A started one is kept (keep_started). A valid one clears Rejected and SpecInvalid and records its topology and
    batch."""
    status, valid = draft.status, draft.valid
    if draft.refused is not None:
        return keep_started(draft, draft.refused)
    if valid is None:
        message = draft.job.result.summary() or "invalid GRPOJob"
        status.phase = Phase.REJECTED
        status.message = f"invalid spec: {message}"
        draft.set(ConditionType.REJECTED, "True", Reason.INVALID_SPEC, message)
        draft.delete(active(draft.pods.ours))
        return True
    if draft.is_true(ConditionType.REJECTED):
        draft.set(ConditionType.REJECTED, "False", Reason.SPEC_VALID, "the spec is valid now")
        if status.phase == Phase.REJECTED:
            status.phase = draft.phase = None
    if draft.is_true(ConditionType.SPEC_INVALID):
        draft.set(ConditionType.SPEC_INVALID, "False", Reason.SPEC_VALID, "the spec is valid now")
    status.topology = valid.topology.display()
    if valid.batch:
        status.batch = valid.batch
    return False


def keep_started(draft: Draft, refused: str) -> bool:
    """A started job that today's rules refuse: SpecInvalid=True naming the rule; never Rejected, nothing deleted for
    it. Goes on through the other steps when its pods can be rendered (draft.valid) or it is terminal (keep_terminal
    and its TTL); else holds (hold_unrenderable)."""
    status, valid = draft.status, draft.valid
    message = (f"today's rules refuse the spec: {refused}; the job started under earlier rules and keeps going "
               "(fix the spec to clear this)")
    if not draft.is_true(ConditionType.SPEC_INVALID):
        draft.decision.events.append(JobEvent("Warning", ConditionType.SPEC_INVALID, message))
    draft.set(ConditionType.SPEC_INVALID, "True", Reason.INVALID_SPEC, message)
    if valid is not None:  # the values it started with win over today's (which the refused rule may not compute)
        if status.topology is None:
            status.topology = valid.topology.display()
        if valid.batch and not status.batch:
            status.batch = valid.batch
        return False
    if draft.phase in TERMINAL:
        return False
    return hold_unrenderable(draft, refused)


def hold_unrenderable(draft: Draft, refused: str) -> bool:
    """Today's models cannot render the job's pods: none is created and none deleted. Succeeded once every trainer of
    the current attempt succeeded (as many as status.topology's nodes); otherwise the phase stays."""
    status = draft.status
    trainers = [p for p in draft.pods.current if p.role == ROLE_TRAINER]
    found = _NODES.match(status.topology or "")
    nodes = int(found.group(1)) if found else 1
    if len(trainers) >= nodes and all(p.phase == PodPhase.SUCCEEDED for p in trainers):
        status.phase = Phase.SUCCEEDED
        status.completionTime = fmt_time(draft.now)
        status.message = f"all {len(trainers)} node(s) succeeded after {draft.pods.attempt} restart(s)"
        draft.set(ConditionType.SUCCEEDED, "True", Reason.ALL_NODES_SUCCEEDED, status.message)
        draft.clear(ConditionType.RUNNING, Reason.COMPLETED, "the job completed")
        draft.decision.delete_pods += [p.name for p in draft.pods.current if p.role != ROLE_TRAINER and p.live]
        ttl = draft.ttl_after_finished
        if ttl is not None:
            draft.decision.requeue(ttl)
        return True
    status.message = f"no new pods until today's rules accept the spec; existing pods keep running: {refused}"
    return True
