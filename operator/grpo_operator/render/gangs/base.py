"""What a gang scheduler's render unit may do to a job's objects; the defaults do nothing (no gang).

A unit (kueue.py, coscheduling.py, volcano.py) is one object of a subclass, listed in the registry
(render/gangs/__init__.py). render/manifests.py calls the registry; it never names a scheduler.

May import api, grpo_trainer.contract, render's quantities and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ... import api

Obj = dict[str, Any]


@dataclass(frozen=True)
class RenderGang:
    """One gang scheduler, render side: which jobs it takes, what it puts on their pods, what objects it adds."""

    name: str
    attempt_names: bool = False  # each attempt's pods get names of their own (<stable>-a<attempt>)
    # objects of other API groups this unit creates: kind → plural (the controller's URL for them)
    plurals: Mapping[str, str] = field(default_factory=dict)
    api_version: str = ""  # the API group/version of those objects
    pass_through_labels: tuple[str, ...] = ()  # the job's labels its pods carry too (the scheduler reads them there)

    def selected(self, job: api.GRPOJob) -> bool:
        """Does this scheduler take the job (its labels, spec.scheduling)?"""
        return False

    def pod_name(self, stable: str, attempt: int) -> str:
        """A pod's name from its stable name (its hostname, e.g. <base>-node-<rank>)."""
        return f"{stable}-a{attempt}" if self.attempt_names and attempt > 0 else stable

    def decorate(self, job: api.GRPOJob, gang: Sequence[Obj], servers: Sequence[Obj], *, base: str, uid: str,
                 attempt: int, groups: Mapping[str, str]) -> None:
        """Mark the rendered pods in place: `gang` the trainers, which must start together; `servers` the vLLM
        server's pods (server mode), created before them and so outside their gang. `groups`: the group each role's
        pods join (the lifecycle's choice, by role; a role missing: a new group named after this attempt)."""

    def objects(self, job: api.GRPOJob, gang: Sequence[Obj], *, name: str, namespace: str, labels: Mapping[str, str],
                annotations: Mapping[str, str], uid: str) -> list[Obj]:
        """The scheduler's own objects for the gang (created before the pods)."""
        return []

    def not_created(self, obj: Mapping[str, Any], status: int, reason: str) -> tuple[str, str]:
        """One of this unit's objects was refused (403/404: its CRD or the operator's RBAC missing): the Event's
        reason and what to install or grant."""
        return "GangObjectNotCreated", f"cannot create {obj.get('kind')}: {status} {reason}"


def owner(job_name: str, uid: str) -> list[dict[str, Any]]:
    """The job as the controlling owner of a gang object (none without a uid)."""
    return [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": job_name, "uid": uid,
             "controller": True, "blockOwnerDeletion": True}] if uid else []


def spec_scheduling(job: api.GRPOJob) -> Optional[api.SchedulingSpec]:
    return getattr(job.spec, "scheduling", None)
