"""scheduler-plugins coscheduling, lifecycle side: the waits of plain pods, with the scheduler's reason (render:
render/gangs/coscheduling.py). Coscheduling counts every pod carrying its PodGroup label toward minMember and tracks
assigned pods by name until their delete event (scheduler-plugins pkg/coscheduling/core/core.go): the next attempt
waits for the old pods to be gone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...api import gang as g
from .base import GangPolicy


@dataclass(frozen=True)
class CoschedulingGang(GangPolicy):
    mode: str = g.GANG_COSCHEDULING
    wait_why: ClassVar[str] = "coscheduling counts every pod with the PodGroup label"
