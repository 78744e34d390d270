"""Kueue's plain-pod integration, lifecycle side (render: render/gangs/kueue.py): what Kueue writes onto our pods,
when it (not a failure) ended them, what a gang restart waits for, which group new pods join, and how the job
releases its quota (docs/scheduling.md).

Restart order: create the next attempt once every old pod is *settled* — Failed or Succeeded, or deleted before it
was ever scheduled — never waiting for it to be gone: Kueue keeps its finalizer on a replaced pod until the
replacement exists (a deadlock), and a replacement created while an old pod is still active is deleted as excess
(kueue pkg/controller/jobs/pod/pod_controller.go, isPodRunnableOrSucceeded, FindMatchingWorkloads).

Groups: the pods of a run form one pod group; replacements of a gang restart join it (its Workload keeps the
quota), a new run starts a new one. In server mode the vLLM server's pods are a group of their own, admitted before
the trainers' group is created, and kept across a trainer restart. A job that gives up, is suspended or deleted ends
its groups (retriable-in-group: "false" on one pod of each), so Kueue finishes the Workloads and frees the quota.

May import api, render and the standard library (not lifecycle/pods.py: base.py says why).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from grpo_trainer import contract

from ... import api
from ...api import gang as g
from ...api.status import Reason
from ...render import names
from ...render.gangs import kueue as render_kueue
from .base import GangPolicy, PodLike, Release


@dataclass(frozen=True)
class GangFacts:
    """What Kueue wrote on one pod (summarized once from its body; lifecycle/pods.py PodInfo.gang)."""

    scheduled: bool = False  # spec.nodeName is set: a kubelet owns the pod and will end it
    gated: bool = False  # Kueue's admission gate is still on: the group waits for quota
    kueue_group: Optional[str] = None  # kueue.x-k8s.io/pod-group-name
    unretriable: bool = False  # kueue.x-k8s.io/retriable-in-group: "false" (the group ends with its pods)
    evicted: Optional[str] = None  # Kueue's TerminationTarget reason (WorkloadEvicted, NotAdmitted, ...) + message


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


def inactive(pod: PodLike) -> bool:
    """Kueue's own test (isPodRunnableOrSucceeded, negated, plus Succeeded): a pod Kueue no longer counts against
    the group's count, so a replacement can be created without being deleted as excess."""
    return pod.phase in ("Failed", "Succeeded") or (pod.deleting and not pod.gang.scheduled)


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
    groups (render/manifests.py _gang); a group holding both was made by an older release (one group per attempt),
    and is neither joined again nor kept across a trainer restart."""
    mine = {p.gang.kueue_group for p in pods if p.gang.kueue_group}
    return mine & {p.gang.kueue_group for p in others if p.gang.kueue_group}


def _by_role(pods: Sequence[PodLike], role: str) -> tuple[list[PodLike], list[PodLike]]:
    return [p for p in pods if p.role == role], [p for p in pods if p.role != role]


@dataclass(frozen=True)
class KueueGang(GangPolicy):
    """Kueue's pod groups: settled, not gone; groups ended to release the quota."""

    mode: str = render_kueue.NAME
    queue_name: str = ""
    eviction_reason: ClassVar[str] = Reason.EVICTED_BY_KUEUE
    releases: ClassVar[Optional[Release]] = Release(
        patch={"metadata": {"annotations": {g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION: g.KUEUE_RETRIABLE_IN_GROUP_FALSE}}},
        refused="cannot end the Kueue pod group of pod {pod} ({error}); the operator needs patch on pods "
                "(chart: rbac.kueue=true)")
    admitted: ClassVar[str] = "Kueue admitted the pod group"

    @classmethod
    def for_job(cls, job: api.GRPOJob) -> GangPolicy:
        return cls(queue_name=render_kueue.queue(job) or "")

    def resume_starts_new_attempt(self) -> bool:
        # the suspended run's pod group was ended: a new run, with a new group (its Workload may still exist,
        # Finished) and new pod names; the old pods are waited for as Kueue requires (ready_to_replace)
        return True

    def evicted(self, current: Iterable[PodLike]) -> Optional[str]:
        return evicted_by_kueue(current)

    def eviction_message(self, evicted: str, attempt: int) -> str:
        return (f"Kueue evicted the pods ({evicted}); attempt {attempt} waits for Kueue to admit the group "
                "again (not counted against runPolicy.backoffLimit)")

    def eviction_summary(self) -> str:
        return "Kueue evicted the pods"

    def may_create_next(self, old: Iterable[PodLike]) -> tuple[bool, str]:
        active = [p.name for p in old if not inactive(p)]
        if active:
            return False, (f"waiting for {len(active)} pod(s) of the previous attempt to end before creating their "
                           f"replacements (Kueue would delete replacements as excess): {', '.join(sorted(active)[:3])}")
        return True, ""

    def ready_to_replace(self, old: Sequence[PodLike]) -> tuple[bool, list[str]]:
        ready, _ = self.may_create_next(old)
        if not ready:
            return False, []
        # a group the previous attempt's server and trainers shared (an older release's) is ended, not replaced
        shared = shared_groups(*_by_role(old, contract.ROLE_VLLM))
        ending = list(dict.fromkeys(groups_to_end_before_replacing(old) + release_target(
            [p for p in old if p.gang.kueue_group in shared])))
        return not ending, ending

    def group_of_new_pods(self, ours: Iterable[PodLike], job_name: str, uid: str, attempt: int,
                          role: str) -> Optional[str]:
        # replacements join the role's group of the run (it keeps its Workload and quota); else a new group. In
        # server mode the server's group and the trainers' are two Workloads, admitted one after the other.
        mine, others = _by_role(list(ours), role)
        return (carried_group(mine, exclude=shared_groups(mine, others))
                or render_kueue.group_name(names.names(job_name).base, uid, attempt, server=role == contract.ROLE_VLLM))

    def keeps_server(self, servers: Sequence[PodLike], trainers: Sequence[PodLike]) -> bool:
        # the server's own group keeps its Workload while the trainers' group is refilled; a server in the trainers'
        # group (an older release's) goes with them
        return not shared_groups(servers, trainers)

    def release(self, ours: Iterable[PodLike]) -> list[str]:
        return release_target(ours)

    def queued(self, current: Iterable[PodLike]) -> list[str]:
        return queued(current)

    def queued_condition(self, gated: Sequence[str]) -> tuple[str, str]:
        return Reason.WAITING_FOR_KUEUE, (f"{len(gated)} pod(s) wait for Kueue to admit their pod group "
                                          f"(queue {self.queue_name})")

    def queued_note(self, server: bool) -> str:
        return ("; queued: waiting for Kueue to admit the vLLM server's pod group" if server
                else "; queued: waiting for Kueue to admit the pod group")

    @staticmethod
    def held(pod: PodLike) -> bool:
        # held by Kueue's finalizer until its replacement exists, not by a lost kubelet
        return bool(pod.gang.kueue_group) and inactive(pod)
