"""Gang policies as objects: what a gang restart, a suspend and a give-up must do under each way of gang admission
or scheduling. decide()'s steps call these hooks and never test the mode (lifecycle/gang.py has the rules they
apply and why).

    GangPolicy     none: plain pods; the next attempt waits for the old pods to be gone
    PodGroupGang   coscheduling, volcano: a PodGroup per job (render/podgroup.py); same waits, explained
    KueueGang      Kueue's pod groups: per-attempt pod names, quota released by ending groups; in server mode the
                   vLLM server and the trainers are two groups (server_order.gang_groups)

A new policy is one more subclass here, chosen in `for_job`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

from .. import api
from ..render import manifests, podgroup
from . import gang
from .pods import ROLE_TRAINER, ROLE_VLLM, PodInfo


@dataclass(frozen=True)
class GangPolicy:
    """No gang admission: the base every policy refines."""

    mode: str = gang.NONE

    def resume_starts_new_attempt(self) -> bool:
        """On resume, does the job start a new attempt at once (instead of waiting for the suspended pods)?"""
        return False

    def evicted(self, current: Iterable[PodInfo]) -> Optional[str]:
        """Why the scheduler (not a failure) ended the current attempt's pods, or None."""
        return None

    def ready_to_replace(self, old: Sequence[PodInfo]) -> tuple[bool, list[str]]:
        """May the next attempt's pods be created while these older pods exist? (yes/no, pods whose group must end
        first)."""
        ready, _ = gang.may_create_next(self.mode, old)
        return ready, []

    def group_of_new_pods(self, ours: Iterable[PodInfo], job_name: str, uid: str, attempt: int,
                          role: str = ROLE_TRAINER) -> Optional[str]:
        """The pod group the `role` pods created now join (None: no such group)."""
        return None

    def keeps_server(self, servers: Sequence[PodInfo], trainers: Sequence[PodInfo]) -> bool:
        """May a trainer restart keep these healthy vLLM server pods (is the server's admission its own)?"""
        return True

    def release(self, ours: Iterable[PodInfo]) -> list[str]:
        """The pods to mark so the scheduler releases what the job holds (give-up, suspend, deletion)."""
        return []

    def queued(self, current: Iterable[PodInfo]) -> list[str]:
        """The pods the scheduler holds at its admission gate."""
        return []

    def queue(self) -> str:
        return ""


@dataclass(frozen=True)
class PodGroupGang(GangPolicy):
    """spec.scheduling.gang: coscheduling or volcano (the waits of `none`, with the scheduler's reason)."""


@dataclass(frozen=True)
class KueueGang(GangPolicy):
    """Kueue's pod groups (lifecycle/gang.py: settled, not gone; groups ended to release the quota)."""

    mode: str = gang.KUEUE
    queue_name: str = ""

    def resume_starts_new_attempt(self) -> bool:
        # the suspended run's pod group was ended: a new run, with a new group (its Workload may still exist,
        # Finished) and new pod names; the old pods are waited for as Kueue requires (ready_to_replace)
        return True

    def evicted(self, current: Iterable[PodInfo]) -> Optional[str]:
        return gang.evicted_by_kueue(current)

    def ready_to_replace(self, old: Sequence[PodInfo]) -> tuple[bool, list[str]]:
        ready, _ = gang.may_create_next(self.mode, old)
        if not ready:
            return False, []
        # a group the previous attempt's server and trainers shared (an older release's) is ended, not replaced
        shared = gang.shared_groups(*_by_role(old, ROLE_VLLM))
        ending = list(dict.fromkeys(gang.groups_to_end_before_replacing(old) + gang.release_target(
            [p for p in old if p.gang.kueue_group in shared])))
        return not ending, ending

    def group_of_new_pods(self, ours: Iterable[PodInfo], job_name: str, uid: str, attempt: int,
                          role: str = ROLE_TRAINER) -> Optional[str]:
        # replacements join the role's group of the run (it keeps its Workload and quota); else a new group. In
        # server mode the server's group and the trainers' are two Workloads, admitted one after the other.
        mine, others = _by_role(list(ours), role)
        return (gang.carried_group(mine, exclude=gang.shared_groups(mine, others))
                or podgroup.kueue_group_name(manifests.names(job_name).base, uid, attempt, server=role == ROLE_VLLM))

    def keeps_server(self, servers: Sequence[PodInfo], trainers: Sequence[PodInfo]) -> bool:
        # the server's own group keeps its Workload while the trainers' group is refilled; a server in the trainers'
        # group (an older release's) goes with them
        return not gang.shared_groups(servers, trainers)

    def release(self, ours: Iterable[PodInfo]) -> list[str]:
        return gang.release_target(ours)

    def queued(self, current: Iterable[PodInfo]) -> list[str]:
        return gang.queued(current)

    def queue(self) -> str:
        return self.queue_name


def _by_role(pods: Sequence[PodInfo], role: str) -> tuple[list[PodInfo], list[PodInfo]]:
    return [p for p in pods if p.role == role], [p for p in pods if p.role != role]


def for_job(job: Optional[api.GRPOJob]) -> GangPolicy:
    """The job's policy, from its Kueue queue label and spec.scheduling.gang (validation rejects both at once)."""
    if job is None:
        return GangPolicy()
    queue = podgroup.kueue_queue(job)
    mode = gang.mode(queue, podgroup.gang_of(job))
    if mode == gang.KUEUE:
        return KueueGang(queue_name=queue or "")
    if mode in (gang.COSCHEDULING, gang.VOLCANO):
        return PodGroupGang(mode=mode)
    return GangPolicy()
