"""A job's pods as the lifecycle sees them: compact summaries (PodInfo), what a failed pod means (classify), and the
pods of one job sorted once into current / other attempt / stale / foreign (PodSets), as jobset sorts its child
jobs. Pure."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from grpo_trainer import contract

from .. import api
from ..api.status import Reason, signal_reason
from ..render import manifests
from .conditions import parse_time
from .gangs import GangFacts
from .gangs import facts as gang_facts

ROLE_TRAINER = contract.ROLE_TRAINER
ROLE_VLLM = contract.ROLE_VLLM
ROLE_INITIALIZER = contract.ROLE_INITIALIZER
OWNER_KIND = api.KIND


class PodPhase:
    """Kubernetes' pod.status.phase values (not the job's: api.status.Phase)."""

    PENDING, RUNNING, SUCCEEDED, FAILED, UNKNOWN = "Pending", "Running", "Succeeded", "Failed", "Unknown"
    FINISHED = (SUCCEEDED, FAILED)


# Pod-level reasons (pod.status.reason) that mean "the node/infrastructure went away", all retryable.
NODE_LOST_REASONS = {"NodeLost", "Shutdown", "Terminated", "NodeShutdown"}
# Pod-level reasons of a Failed pod that say nothing about the trainer itself: retryable whatever the exit code.
RETRYABLE_POD_REASONS = {"Evicted", "Preempting", "DeadlineExceeded", "UnexpectedAdmissionError", "NodeAffinity",
                         "OutOfcpu", "OutOfmemory", "OutOfpods"}


@dataclass(frozen=True)
class PodInfo:
    """What the lifecycle needs to know about one pod (a compact summary, kept in the operator's index)."""

    name: str
    uid: Optional[str] = None
    role: str = ROLE_TRAINER
    rank: Optional[int] = None
    attempt: int = 0
    owner_uid: Optional[str] = None
    owner_kind: Optional[str] = None
    phase: str = PodPhase.PENDING
    deleting: bool = False
    deletion_due: Optional[_dt.datetime] = None  # metadata.deletionTimestamp: when the kubelet should be done
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    reason: Optional[str] = None  # pod.status.reason (Evicted, NodeLost, DeadlineExceeded…)
    container_reason: Optional[str] = None  # the main container's terminated reason (OOMKilled, Error…)
    message: Optional[str] = None
    unschedulable: Optional[str] = None  # the scheduler's message when PodScheduled=False/Unschedulable
    waiting: Optional[str] = None  # a container waiting reason worth surfacing (ImagePullBackOff…)
    synthetic: bool = False  # created by us a moment ago, not yet seen in the watch
    ready: bool = False  # the Ready condition (a vLLM server's /health readiness probe passes)
    start_time: Optional[_dt.datetime] = None  # status.startTime: the kubelet accepted the pod
    finished_at: Optional[_dt.datetime] = None  # the main container's terminated finishedAt (the kubelet's clock)
    ip: Optional[str] = None  # status.podIP (a kept vLLM server's engine probe dials it)
    gang: GangFacts = GangFacts()  # what the gang scheduler wrote on the pod (lifecycle/gangs)

    @property
    def started(self) -> bool:
        return self.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED, PodPhase.UNKNOWN)

    @property
    def live(self) -> bool:
        """Neither on its way out nor only expected: a pod a delete would act on."""
        return not self.deleting and not self.synthetic


def as_int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def summarize_pod(body: Mapping[str, Any]) -> PodInfo:
    """A pod's body → PodInfo. Tolerates any missing field."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = body.get("status") or {}
    owner_uid = owner_kind = None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            owner_uid, owner_kind = ref.get("uid"), ref.get("kind")
            break
    else:
        refs = meta.get("ownerReferences") or []
        if refs:
            owner_uid, owner_kind = refs[0].get("uid"), refs[0].get("kind")
    rank_label = labels.get(contract.LABEL_RANK)
    reason = status.get("reason")
    term, waiting = _main_container(status)
    exit_code, sig, finished = term.get("exitCode"), term.get("signal") or None, term.get("finishedAt")
    creason = term.get("reason")
    message = status.get("message") or term.get("message")
    unsched, ready = _conditions(status)
    return PodInfo(
        name=meta.get("name", ""),
        uid=meta.get("uid"),
        role=labels.get(contract.LABEL_ROLE, ROLE_TRAINER),
        rank=as_int(rank_label) if rank_label is not None else None,
        attempt=as_int(annotations.get(contract.ANNOTATION_ATTEMPT), 0),
        owner_uid=owner_uid,
        owner_kind=owner_kind,
        phase=status.get("phase") or PodPhase.PENDING,
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=sig if isinstance(sig, int) else None,
        reason=reason,
        container_reason=creason,
        message=(message or None) and str(message)[:1024],
        unschedulable=unsched,
        waiting=waiting,
        ready=ready,
        start_time=parse_time(status.get("startTime")),
        finished_at=parse_time(finished) if isinstance(finished, str) else None,
        ip=status.get("podIP") or None,
        gang=gang_facts(body),
    )


def _main_container(status: Mapping[str, Any]) -> tuple[Mapping[str, Any], Optional[str]]:
    """The main container's (trainer or vLLM server) terminated state ({} if none) and a waiting reason worth
    surfacing (ImagePullBackOff…)."""
    statuses = list(status.get("containerStatuses") or [])
    mains = (manifests.TRAINER_CONTAINER, manifests.VLLM_CONTAINER)
    main = next((c for c in statuses if c.get("name") in mains), statuses[0] if statuses else None)
    state = (main or {}).get("state") or {}
    wait = state.get("waiting")
    waiting = None
    if wait and wait.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
        waiting = f"{wait.get('reason')}: {wait.get('message') or ''}".rstrip(": ")
    return state.get("terminated") or {}, waiting


def _conditions(status: Mapping[str, Any]) -> tuple[Optional[str], bool]:
    """The scheduler's message when PodScheduled=False/Unschedulable, and whether the pod is Ready."""
    unsched, ready = None, False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            unsched = cond.get("message") or "Unschedulable"
        ready = ready or (cond.get("type") == "Ready" and cond.get("status") == "True")
    return unsched, ready


# ---------------------------------------------------------------------------------------------- failures
@dataclass(frozen=True)
class Failure:
    retryable: bool
    reason: str  # CamelCase, for status.lastFailureReason and conditions
    message: str


def classify(pod: PodInfo) -> Optional[Failure]:
    """None for a pod that has not failed; otherwise whether the failure is worth a gang restart."""
    if pod.phase == PodPhase.UNKNOWN or (pod.reason in NODE_LOST_REASONS and pod.phase != PodPhase.SUCCEEDED):
        return Failure(True, Reason.NODE_LOST, f"pod {pod.name}: node lost ({pod.reason or 'phase Unknown'})")
    if pod.phase != PodPhase.FAILED:
        return None
    detail = f": {pod.message}" if pod.message else ""
    if pod.reason in RETRYABLE_POD_REASONS:
        return Failure(True, pod.reason, f"pod {pod.name} failed ({pod.reason}){detail}")
    if pod.container_reason == "OOMKilled":
        return Failure(True, Reason.OOM_KILLED, f"pod {pod.name} was OOM-killed (exit {pod.exit_code}){detail}")
    if pod.signal:
        return Failure(True, signal_reason(pod.signal), f"pod {pod.name} was killed by signal {pod.signal}{detail}")
    if pod.exit_code is not None and pod.exit_code != contract.OK:
        return exit_failure(pod.name, pod.exit_code, detail)
    reason = pod.reason or Reason.POD_FAILED
    return Failure(True, reason if reason[:1].isupper() else Reason.POD_FAILED,
                   f"pod {pod.name} failed ({reason}){detail}")


def exit_failure(pod: str, code: int, detail: str = "") -> Failure:
    """A failed pod's exit code under the trainer's contract: 1-127 permanent, >=128 (or negative) retryable; the
    reason names the trainer's codes (DatasetError) and says ExitCode<N> for the others."""
    reason, retryable = contract.exit_reason(code), contract.is_retryable(code)
    known = contract.PERMANENT.get(code) or contract.RETRYABLE.get(code)
    what = f" ({known})" if known else ""
    if not retryable:
        return Failure(False, reason, f"pod {pod} exited with code {code}{what}: a permanent error (configuration, "
                                      f"data, import or batch); not retried{detail}")
    if code >= contract.SIGNAL_BASE:
        return Failure(True, reason, f"pod {pod} exited with code {code} ({known or f'signal {code - 128}'}; "
                                     f"retryable){detail}")
    return Failure(True, reason, f"pod {pod} exited with code {code}{detail}")


# ---------------------------------------------------------------------------------------------- sorting
@dataclass(frozen=True)
class PodSets:
    """One job's pods, sorted once.

    current        ours, of the current attempt
    other_attempt  ours, of an older attempt (deleted before the next attempt starts)
    stale          of an older GRPOJob of the same name, its garbage collection pending (deleted)
    foreign        owned by something else: a conflict, never touched
    initializer    ours, the spec.cache download pod (one per job, not per attempt): kept out of the attempts, so it
                   is never counted, restarted or replaced as a trainer (lifecycle/staging.py owns it)

    A vLLM server kept across trainer restarts (status.vllmServerAttempt, lifecycle/server/keep.py) keeps the attempt
    that created it: it is current while its attempt is the recorded server attempt, else of another attempt.
    """

    attempt: int  # the current attempt: status.restarts, or newer when pods prove it (a lost status write)
    current: tuple[PodInfo, ...]
    other_attempt: tuple[PodInfo, ...]
    stale: tuple[PodInfo, ...]
    foreign: tuple[PodInfo, ...]
    ours: tuple[PodInfo, ...]  # current and other_attempt, in the order observed
    initializer: Optional[PodInfo] = None

    @classmethod
    def sort(cls, job_uid: str, pods: Iterable[PodInfo], recorded_attempt: int,
             server_attempt: Optional[int] = None) -> PodSets:
        ours, stale, foreign = [], [], []
        initializer: Optional[PodInfo] = None
        for p in pods:
            if p.owner_uid == job_uid and p.role == ROLE_INITIALIZER:
                initializer = p
            elif p.owner_uid == job_uid:
                ours.append(p)
            elif p.owner_kind == OWNER_KIND and p.owner_uid:
                stale.append(p)
            else:
                foreign.append(p)
        attempt = max([recorded_attempt] + [p.attempt for p in ours])
        kept = server_attempt if server_attempt is not None and server_attempt < attempt else attempt
        if not any(p.role == ROLE_VLLM and p.attempt == kept for p in ours):
            kept = attempt  # the kept server is gone: the current attempt's own server is the one

        def current(p: PodInfo) -> bool:
            return p.attempt == (kept if p.role == ROLE_VLLM else attempt)

        return cls(attempt=attempt,
                   current=tuple(p for p in ours if current(p)),
                   other_attempt=tuple(p for p in ours if not current(p)),
                   stale=tuple(stale), foreign=tuple(foreign), ours=tuple(ours), initializer=initializer)
