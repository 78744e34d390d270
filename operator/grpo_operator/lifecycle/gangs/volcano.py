"""Volcano, lifecycle side: the waits of plain pods, with the scheduler's reason (render: render/gangs/volcano.py).
Volcano counts a terminating pod as a task of the PodGroup: the next attempt waits for the old pods to be gone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...api import gang as g
from .base import GangPolicy


@dataclass(frozen=True)
class VolcanoGang(GangPolicy):
    mode: str = g.GANG_VOLCANO
    wait_why: ClassVar[str] = "Volcano counts a terminating pod as a task of the PodGroup"
