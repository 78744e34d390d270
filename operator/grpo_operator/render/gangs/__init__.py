"""The gang schedulers, render side: one unit per scheduler (what it puts on the pods, the objects it adds), and the
one table that lists them. render/manifests.py and render/names.py ask this registry; they never name a scheduler.

    kueue          Kueue's pod groups: labels and per-attempt pod names (no object of its own)
    coscheduling   scheduler-plugins' PodGroup and its pod label
    volcano        Volcano's PodGroup, its pod annotation and schedulerName
    podgroup       the PodGroup the last two share; base: RenderGang, a unit's hooks and their no-op defaults

Adding a scheduler: docs/architecture.md "Adding a gang scheduler". May import api, grpo_trainer.contract, render's
quantities and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from ... import api
from . import coscheduling, kueue, volcano
from .base import RenderGang

# The registry: every gang scheduler, in the order a job's choice is read (validation refuses two at once).
UNITS: tuple[RenderGang, ...] = (kueue.UNIT, coscheduling.UNIT, volcano.UNIT)

# The job's labels its pods carry too (the schedulers read them on the pods)
PASS_THROUGH_LABELS: tuple[str, ...] = tuple(label for unit in UNITS for label in unit.pass_through_labels)
# The gang objects' kinds → plurals, for the controller's URLs
PLURALS: dict[str, str] = {kind: plural for unit in UNITS for kind, plural in unit.plurals.items()}


def selected(job: api.GRPOJob) -> list[RenderGang]:
    """The schedulers that take this job (one, or none; render applies each)."""
    return [unit for unit in UNITS if unit.selected(job)]


def of(job: api.GRPOJob) -> Optional[RenderGang]:
    """The job's gang scheduler (None: plain pods)."""
    return next((unit for unit in UNITS if unit.selected(job)), None)


def pod_name(job: api.GRPOJob, stable: str, attempt: int) -> str:
    """A pod's name as the job's scheduler wants it (stable unless it names each attempt's pods apart)."""
    unit = next((u for u in selected(job) if u.attempt_names), None)
    return unit.pod_name(stable, attempt) if unit is not None else stable


def owner_of(obj: Mapping[str, Any]) -> Optional[RenderGang]:
    """The unit whose object this is (a PodGroup of its API group), or None for the job's own kinds."""
    return next((u for u in UNITS if obj.get("kind") in u.plurals and obj.get("apiVersion") == u.api_version), None)
