"""After every pass: the status dumped once, Events for the transitions, pods stuck on a lost node force-deleted;
and the merge patch the controller writes."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .. import api
from ..api.status import ConditionType, Phase, Reason
from . import gangs
from .create import refused_creates
from .draft import Decision, Draft, JobEvent, Policy
from .pods import PodInfo


def finish(draft: Draft) -> Decision:
    """The status the steps built (the API's model: the CRD's schema), dumped once."""
    refused_creates(draft)
    draft.decision.job_status = draft.status
    draft.decision.status = dump_status(draft.status)
    transition_events(draft.found, draft.status, draft.decision)
    force_stuck(draft.pods.ours + draft.pods.stale, draft.now, draft.policy, draft.decision)
    return draft.decision


def dump_status(status: api.GRPOJobStatus) -> dict[str, Any]:
    """A status as the CRD expects it (and the API server stores it): JSON values, fields never set or None left
    out."""
    dumped: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    return dumped


def transition_events(old: api.GRPOJobStatus, new: api.GRPOJobStatus, decision: Decision) -> None:
    if new.phase != old.phase and new.phase is not None:
        kind = "Warning" if new.phase in (Phase.FAILED, Phase.REJECTED, Phase.RESTARTING) else "Normal"
        decision.events.append(JobEvent(kind, str(new.phase), new.message or str(new.phase)))
    for c in new.conditions:
        o = old.condition(c.type)
        if c.type == ConditionType.UNSCHEDULABLE and c.status == "True" and (o is None or o.status != "True"):
            decision.events.append(JobEvent("Warning", Reason.UNSCHEDULABLE, c.message))
        if c.type == ConditionType.CREATED and c.status == "False" and c.reason == Reason.CHILD_CONFLICT and (
                o is None or o.message != c.message):
            decision.events.append(JobEvent("Warning", Reason.CHILD_CONFLICT, c.message))


def force_stuck(pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy, decision: Decision) -> None:
    """Pods still terminating `policy.force_delete_after` seconds past their deletionTimestamp are force-deleted
    (their node's kubelet is gone: they would block the gang restart forever); the others are waited for."""
    if policy.force_delete_after is None:
        return
    for p in pods:
        if not p.deleting or p.deletion_due is None or p.synthetic:
            continue
        if gangs.held(p):
            continue  # held by the gang scheduler's finalizer on purpose, not by a lost kubelet
        late = (now - p.deletion_due).total_seconds()
        if late >= policy.force_delete_after:
            decision.force_delete_pods.append((p.name, f"pod {p.name} was still terminating {late:.0f}s after its "
                                                       f"grace period ended (its node is unreachable?); force-deleted "
                                                       f"so the job can go on"))
        else:
            decision.requeue(policy.force_delete_after - late)


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The merge patch that turns `old` status into `new` (None when they are equal)."""
    patch: dict[str, Any] = {}
    for k, v in new.items():
        if old.get(k) != v:
            patch[k] = v
    for k in old:
        if k not in new:
            patch[k] = None
    return patch or None
