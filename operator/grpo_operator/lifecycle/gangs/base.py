"""What a gang scheduler's lifecycle unit decides; the defaults are the job without a gang scheduler (plain pods).

decide()'s steps call these hooks on the job's policy (Draft.gang, chosen once per pass by the registry,
lifecycle/gangs/__init__.py) and never test which scheduler it is. A unit is a subclass in a module of its own
(kueue.py, coscheduling.py, volcano.py), listed in the registry.

Restart order (delete the old attempt's pods first in every mode): without a gang scheduler, and under the
PodGroup schedulers, the next attempt is created once every old pod is *gone* (may_create_next; a unit says why
its scheduler needs that); Kueue waits for *settled* pods instead (kueue.py).

May import api, render, grpo_trainer.contract and the standard library; not lifecycle/pods.py (which imports the
registry for its pod facts): the hooks see pods through PodLike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Protocol

from ... import api


class PodLike(Protocol):
    """What the hooks read of a pod (lifecycle/pods.py PodInfo)."""

    @property
    def name(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def deleting(self) -> bool: ...
    @property
    def attempt(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def gang(self) -> Any: ...  # the scheduler's facts on the pod (the registry's GangFacts)


@dataclass(frozen=True)
class Release:
    """How the controller marks a pod so that the scheduler releases its group (give-up, suspend, deletion): a merge
    patch on the pod, and what to say when the API server refuses it (format fields: pod, error)."""

    patch: Mapping[str, Any]
    refused: str


@dataclass(frozen=True)
class GangPolicy:
    """No gang scheduler: the base every unit refines."""

    mode: str = "none"
    # the Restarting reason of a restart this scheduler caused by evicting the pods ("": it never evicts)
    eviction_reason: ClassVar[str] = ""
    releases: ClassVar[Optional[Release]] = None  # how a release is sent (None: nothing to release)
    wait_why: ClassVar[str] = ""  # why the next attempt waits for the old pods to be gone (the scheduler's rule)
    # the Queued condition's message once no pod waits at the gate (it is cleared only where a gate once set it)
    admitted: ClassVar[str] = "the scheduler admitted the pod group"

    @classmethod
    def for_job(cls, job: api.GRPOJob) -> GangPolicy:
        """The policy of a job this scheduler takes (the registry chose it)."""
        return cls()

    def resume_starts_new_attempt(self) -> bool:
        """On resume, does the job start a new attempt at once (instead of waiting for the suspended pods)?"""
        return False

    def evicted(self, current: Iterable[PodLike]) -> Optional[str]:
        """Why the scheduler (not a failure) ended the current attempt's pods, or None."""
        return None

    def eviction_message(self, evicted: str, attempt: int) -> str:
        """status.message of the uncharged restart after an eviction (`evicted`: evicted()'s answer). A unit whose
        evicted() answers gives this, eviction_summary and eviction_reason too."""
        raise NotImplementedError(f"{type(self).__name__}.evicted answered: it must word the eviction")

    def eviction_summary(self) -> str:
        """The Running condition's message when an eviction ends the attempt."""
        raise NotImplementedError(f"{type(self).__name__}.evicted answered: it must word the eviction")

    def may_create_next(self, old: Iterable[PodLike]) -> tuple[bool, str]:
        """After the old attempt's pods were deleted: may the next attempt's pods be created now? (yes/no, why not)."""
        old = list(old)
        if old:
            return False, (f"waiting for {len(old)} pod(s) of the previous attempt to be gone"
                           + (f" ({self.wait_why})" if self.wait_why else ""))
        return True, ""

    def ready_to_replace(self, old: Sequence[PodLike]) -> tuple[bool, list[str]]:
        """May the next attempt's pods be created while these older pods exist? (yes/no, pods whose group must end
        first)."""
        ready, _ = self.may_create_next(old)
        return ready, []

    def group_of_new_pods(self, ours: Iterable[PodLike], job_name: str, uid: str, attempt: int,
                          role: str) -> Optional[str]:
        """The group the `role` pods created now join (None: no such group; render names a new one)."""
        return None

    def keeps_server(self, servers: Sequence[PodLike], trainers: Sequence[PodLike]) -> bool:
        """May a trainer restart keep these healthy vLLM server pods (is the server's admission its own)?"""
        return True

    def release(self, ours: Iterable[PodLike]) -> list[str]:
        """The pods to mark (with `releases`) so the scheduler releases what the job holds."""
        return []

    def queued(self, current: Iterable[PodLike]) -> list[str]:
        """The pods the scheduler holds at its admission gate."""
        return []

    def queued_condition(self, gated: Sequence[str]) -> tuple[str, str]:
        """The Queued condition's reason and message while `gated` pods wait at the gate. A unit whose queued()
        answers gives this, queued_note and `admitted` too."""
        raise NotImplementedError(f"{type(self).__name__}.queued answered: it must word the Queued condition")

    def queued_note(self, server: bool) -> str:
        """What a Pending message adds while pods wait at the gate (`server`: the vLLM server's, server mode)."""
        raise NotImplementedError(f"{type(self).__name__}.queued answered: it must word the Queued condition")

    @staticmethod
    def held(pod: PodLike) -> bool:
        """A pod whose deletion the scheduler holds up on purpose (its finalizer), not a lost kubelet: it is not
        force-deleted (lifecycle/finish.py force_stuck)."""
        return False
