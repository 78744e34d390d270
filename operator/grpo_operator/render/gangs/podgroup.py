"""A PodGroup, the object the two PodGroup schedulers (coscheduling.py, volcano.py) share: one per job, named like
the job's headless Service, owned by the job, created before the pods; minMember counts every pod that must start
together (the trainers) and minResources is the sum of their effective requests. Each unit adds its own spec fields.

May import api, render's quantities and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import api
from ...api import gang as g
from ..quantities import sum_requests
from .base import Obj, RenderGang, owner, spec_scheduling


@dataclass(frozen=True)
class PodGroupScheduler(RenderGang):
    """spec.scheduling.gang = `name`: a PodGroup of `api_version` for the trainers, named in each pod."""

    plurals: Mapping[str, str] = field(default_factory=lambda: {g.POD_GROUP_KIND: g.POD_GROUP_PLURAL})

    def selected(self, job: api.GRPOJob) -> bool:
        scheduling = spec_scheduling(job)
        return scheduling is not None and scheduling.gang == self.name

    def decorate(self, job: api.GRPOJob, gang: Sequence[Obj], servers: Sequence[Obj], *, base: str, uid: str,
                 attempt: int, groups: Mapping[str, str]) -> None:
        for pod in gang:  # the server carries no PodGroup mark: a group counting it would hold it at Permit
            meta = pod.setdefault("metadata", {})
            self.mark(pod, meta.setdefault("labels", {}), meta.setdefault("annotations", {}), base)

    def mark(self, pod: Obj, labels: dict[str, str], annotations: dict[str, str], group: str) -> None:
        """Name the PodGroup `group` on one pod (the scheduler's own label or annotation)."""

    def spec_fields(self, job: api.GRPOJob, scheduling: api.SchedulingSpec) -> dict[str, Any]:
        """This scheduler's fields of the PodGroup's spec, beyond minMember and minResources."""
        return {}

    def objects(self, job: api.GRPOJob, gang: Sequence[Obj], *, name: str, namespace: str, labels: Mapping[str, str],
                annotations: Mapping[str, str], uid: str) -> list[Obj]:
        scheduling = spec_scheduling(job)
        if scheduling is None:
            return []
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels),
                                "annotations": dict(annotations)}
        if uid:
            meta["ownerReferences"] = owner(job.metadata.name or "", uid)
        spec: dict[str, Any] = {"minMember": len(gang)}
        resources = sum_requests(gang)
        if resources:
            spec["minResources"] = resources
        spec.update(self.spec_fields(job, scheduling))
        return [{"apiVersion": self.api_version, "kind": g.POD_GROUP_KIND, "metadata": meta, "spec": spec}]

    def not_created(self, obj: Mapping[str, Any], status: int, reason: str) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return "PodGroupNotCreated", (
            f"cannot create {obj.get('apiVersion')} {obj.get('kind')} {meta.get('name')} for spec.scheduling.gang "
            f"({status} {reason}): install the scheduler's PodGroup CRD and grant the operator podgroups "
            f"(chart: rbac.podGroups=true); the pods are created once it exists")
