"""The gang schedulers, lifecycle side: one unit per scheduler (its waits, its release, what "held by the scheduler"
means for it), and the one table that lists them. decide()'s steps call the job's policy's hooks (base.py) and
never name a scheduler; the render side of each is render/gangs.

    base           GangPolicy: the hooks, and their defaults (no gang scheduler: plain pods); Release
    kueue          Kueue's pod groups: settled-not-gone waits, groups carried across restarts, quota released
    coscheduling   scheduler-plugins' PodGroup: the plain waits, with its reason
    volcano        Volcano's PodGroup: the plain waits, with its reason

Adding a scheduler: docs/architecture.md "Adding a gang scheduler". May import api, render, grpo_trainer.contract
and the standard library.
"""

from __future__ import annotations

from typing import Optional

from ... import api
from ...render import gangs as render_gangs
from . import coscheduling, kueue, volcano
from .base import GangPolicy, PodLike, Release

# The registry: a render unit's name (render/gangs UNITS) → the scheduler's policy.
POLICIES: dict[str, type[GangPolicy]] = {
    kueue.KueueGang.mode: kueue.KueueGang,
    coscheduling.CoschedulingGang.mode: coscheduling.CoschedulingGang,
    volcano.VolcanoGang.mode: volcano.VolcanoGang,
}

# What a pod's summary keeps of what the schedulers wrote on it (lifecycle/pods.py PodInfo.gang)
GangFacts = kueue.GangFacts
facts = kueue.facts

# The Restarting reasons of restarts a scheduler caused by evicting the pods: its own queue is the wait, not a
# backoff (lifecycle/restart.py wait_for_previous_attempt)
EVICTION_REASONS: frozenset[str] = frozenset(p.eviction_reason for p in POLICIES.values() if p.eviction_reason)

NONE = GangPolicy.mode


def for_job(job: Optional[api.GRPOJob]) -> GangPolicy:
    """The job's policy, from the render unit that takes it (None, an invalid job: no gang)."""
    unit = render_gangs.of(job) if job is not None else None
    return POLICIES[unit.name].for_job(job) if unit is not None and job is not None else GangPolicy()


def policy(mode: str) -> GangPolicy:
    """A scheduler's policy by its name, with default settings (tests, docs)."""
    return POLICIES[mode]() if mode in POLICIES else GangPolicy()


def held(pod: PodLike) -> bool:
    """Does any scheduler hold this pod's deletion up on purpose (lifecycle/finish.py force_stuck)?"""
    return any(p.held(pod) for p in POLICIES.values())


__all__ = ["EVICTION_REASONS", "NONE", "POLICIES", "GangFacts", "GangPolicy", "PodLike", "Release", "facts", "for_job",
           "held", "policy"]
