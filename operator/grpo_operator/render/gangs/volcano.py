"""Volcano (spec.scheduling.gang: volcano), render side: a scheduling.volcano.sh/v1beta1 PodGroup (podgroup.py) with
its queue and PriorityClass, its group annotation on each trainer pod, and Volcano's schedulerName.

May import api, render's quantities and the standard library.
"""

from __future__ import annotations

from typing import Any

from ... import api
from ...api import gang as g
from .base import Obj
from .podgroup import PodGroupScheduler


class VolcanoGang(PodGroupScheduler):
    def mark(self, pod: Obj, labels: dict[str, str], annotations: dict[str, str], group: str) -> None:
        annotations[g.VOLCANO_GROUP_NAME_ANNOTATION] = group
        spec = pod.setdefault("spec", {})
        if not spec.get("schedulerName"):  # the user's own scheduler name (a second Volcano profile) is kept
            spec["schedulerName"] = g.VOLCANO_SCHEDULER_NAME

    def spec_fields(self, job: api.GRPOJob, scheduling: api.SchedulingSpec) -> dict[str, Any]:
        spec: dict[str, Any] = {"queue": scheduling.queue or g.VOLCANO_DEFAULT_QUEUE}
        priority = scheduling.priorityClassName or job.spec.template.priorityClassName
        if priority:
            spec["priorityClassName"] = priority
        return spec


UNIT = VolcanoGang(name=g.GANG_VOLCANO, api_version=g.VOLCANO_API_VERSION)
