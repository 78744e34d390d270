"""Gang admission and gang scheduling in the lifecycle: what each mode requires of a gang restart, what Kueue
writes onto our pods, and when Kueue (not a failure) ended them. Pure (docs/scheduling.md).

Restart order, per mode (delete the old attempt's pods first in every mode):
  * none, coscheduling, volcano: create the next attempt once every old pod is *gone*. Coscheduling counts every
    pod carrying its PodGroup label toward minMember and tracks assigned pods by name until their delete event
    (scheduler-plugins pkg/coscheduling/core/core.go); Volcano counts a terminating pod as a task of the group.
  * Kueue: create the next attempt once every old pod is *settled* — Failed or Succeeded, or deleted before it
    was ever scheduled — never waiting for it to be gone: Kueue keeps its finalizer on a replaced pod until the
    replacement exists (a deadlock), and a replacement created while an old pod is still active is deleted as
    excess (kueue pkg/controller/jobs/pod/pod_controller.go, isPodRunnableOrSucceeded, FindMatchingWorkloads).

May import api, rules, render's names and the standard library.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from ..api import gang as g

NONE, KUEUE, COSCHEDULING, VOLCANO = "none", "kueue", g.GANG_COSCHEDULING, g.GANG_VOLCANO
MODES = (NONE, KUEUE, COSCHEDULING, VOLCANO)

@dataclass(frozen=True)
class GangFacts:
    """What the gang rules read from one pod (summarized once from its body)."""

    scheduled: bool = False  # spec.nodeName is set: a kubelet owns the pod and will end it
    gated: bool = False  # Kueue's admission gate is still on: the group waits for quota
    kueue_group: Optional[str] = None  # kueue.x-k8s.io/pod-group-name
    unretriable: bool = False  # kueue.x-k8s.io/retriable-in-group: "false" (the group ends with its pods)
    evicted: Optional[str] = None  # Kueue's TerminationTarget reason (WorkloadEvicted, NotAdmitted, ...) + message


class PodLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def deleting(self) -> bool: ...
    @property
    def gang(self) -> GangFacts: ...


def facts(body: Mapping[str, Any]) -> GangFacts:
    """A pod's body → GangFacts. Tolerates any missing field."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    gates = {x.get("name") for x in spec.get("schedulingGates") or [] if isinstance(x, dict)}
    evicted = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == g.KUEUE_TERMINATION_TARGET and cond.get("status") == "True":
            reason = cond.get("reason") or "Evicted"
            evicted = f"{reason}: {cond['message']}" if cond.get("message") else reason
    group = labels.get(g.KUEUE_GROUP_NAME_LABEL)
    return GangFacts(
        scheduled=bool(spec.get("nodeName")),
        gated=g.KUEUE_ADMISSION_GATE in gates,
        kueue_group=group if isinstance(group, str) and group else None,
        unretriable=annotations.get(g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION) == g.KUEUE_RETRIABLE_IN_GROUP_FALSE,
        evicted=evicted,
    )


def mode(kueue_queue: Optional[str], gang: Optional[str]) -> str:
    """The job's mode from its Kueue queue label and spec.scheduling.gang (validation rejects both at once)."""
    if kueue_queue:
        return KUEUE
    return gang if gang in (COSCHEDULING, VOLCANO) else NONE


def kueue_inactive(pod: PodLike) -> bool:
    """Kueue's own test (isPodRunnableOrSucceeded, negated, plus Succeeded): a pod Kueue no longer counts against
    the group's count, so a replacement can be created without being deleted as excess."""
    return pod.phase in ("Failed", "Succeeded") or (pod.deleting and not pod.gang.scheduled)


def may_create_next(mode_: str, old: Iterable[PodLike]) -> tuple[bool, str]:
    """After the old attempt's pods were deleted: may the next attempt's pods be created now? (yes/no, why not)."""
    old = list(old)
    if mode_ == KUEUE:
        active = [p.name for p in old if not kueue_inactive(p)]
        if active:
            return False, (f"waiting for {len(active)} pod(s) of the previous attempt to end before creating their "
                           f"replacements (Kueue would delete replacements as excess): {', '.join(sorted(active)[:3])}")
        return True, ""
    if old:
        why = {COSCHEDULING: "coscheduling counts every pod with the PodGroup label",
               VOLCANO: "Volcano counts a terminating pod as a task of the PodGroup"}.get(mode_, "")
        return False, (f"waiting for {len(old)} pod(s) of the previous attempt to be gone"
                       + (f" ({why})" if why else ""))
    return True, ""


def evicted_by_kueue(pods: Iterable[PodLike]) -> Optional[str]:
    """The reason Kueue gave when it ended pods of this attempt (preemption, eviction), or None. Such an end is
    not the job's failure: the next attempt does not spend runPolicy.backoffLimit."""
    return next((f"{p.name}: {p.gang.evicted}" for p in pods if p.gang.evicted), None)


def queued(pods: Iterable[PodLike]) -> list[str]:
    """Names of the pods that Kueue still holds at its admission gate (not deleted)."""
    return [p.name for p in pods if p.gang.gated and not p.deleting]


def carried_group(pods: Iterable[Any], exclude: Collection[str] = ()) -> Optional[str]:
    """The Kueue group the next pods must join: the group of the newest attempt's pods that still exist (the run
    goes on: a gang restart or a Kueue eviction creates *replacements* of that group, which keeps its Workload
    and quota), or None for a new run. An unretriable group has ended and is never joined again, nor is one in
    `exclude`."""
    best: Optional[tuple[int, str]] = None
    for p in pods:
        group = p.gang.kueue_group
        if group and group not in exclude and not p.gang.unretriable and (best is None or p.attempt > best[0]):
            best = (p.attempt, group)
    if best is None:
        return None
    ended = any(p.gang.kueue_group == best[1] and p.gang.unretriable for p in pods)
    return None if ended else best[1]


def release_target(pods: Iterable[PodLike]) -> list[str]:
    """To end a Kueue group for good (give-up, suspend): Kueue finishes its Workload, releases the quota and
    removes its finalizers once one pod of the group carries retriable-in-group: "false" and none is running.
    Returns the one pod per group to annotate (none when a pod of that group already carries it)."""
    by_group: dict[str, list[PodLike]] = {}
    for p in pods:
        if p.gang.kueue_group:
            by_group.setdefault(p.gang.kueue_group, []).append(p)
    out = []
    for _, members in sorted(by_group.items()):
        if any(p.gang.unretriable for p in members):
            continue
        out.append(sorted(members, key=lambda p: (p.deleting, p.name))[0].name)
    return out


def groups_to_end_before_replacing(old: Iterable[PodLike]) -> list[str]:
    """Kueue counts a Succeeded pod as active for good (isPodRunnableOrSucceeded), so a replacement for it would be
    deleted as excess. When a pod of the previous attempt Succeeded (a process that exited 0 on SIGTERM), its group
    is ended instead (release_target) and the next attempt starts a new group. Returns the pods to annotate."""
    old = list(old)
    hit = {p.gang.kueue_group for p in old if p.phase == "Succeeded" and p.gang.kueue_group}
    return release_target([p for p in old if p.gang.kueue_group in hit])


def shared_groups(pods: Iterable[PodLike], others: Iterable[PodLike]) -> set[str]:
    """The Kueue groups that pods of both sets belong to. In server mode the vLLM server and the trainers form two
    groups (server_order.gang_groups); a group holding both was made by an older release (one group per attempt),
    and is neither joined again nor kept across a trainer restart."""
    mine = {p.gang.kueue_group for p in pods if p.gang.kueue_group}
    return mine & {p.gang.kueue_group for p in others if p.gang.kueue_group}
