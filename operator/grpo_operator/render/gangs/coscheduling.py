"""scheduler-plugins coscheduling (spec.scheduling.gang: coscheduling), render side: a
scheduling.x-k8s.io/v1alpha1 PodGroup (podgroup.py) and its label on each trainer pod; scheduleTimeoutSeconds.

May import api, render's quantities and the standard library.
"""

from __future__ import annotations

from typing import Any

from ... import api
from ...api import gang as g
from .base import Obj
from .podgroup import PodGroupScheduler


class CoschedulingGang(PodGroupScheduler):
    def mark(self, pod: Obj, labels: dict[str, str], annotations: dict[str, str], group: str) -> None:
        labels[g.COSCHEDULING_POD_GROUP_LABEL] = group

    def spec_fields(self, job: api.GRPOJob, scheduling: api.SchedulingSpec) -> dict[str, Any]:
        if scheduling.scheduleTimeoutSeconds is None:
            return {}
        return {"scheduleTimeoutSeconds": scheduling.scheduleTimeoutSeconds}


UNIT = CoschedulingGang(name=g.GANG_COSCHEDULING, api_version=g.COSCHEDULING_API_VERSION)
