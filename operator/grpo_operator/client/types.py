"""The client's typed results (plain dataclasses) and how they are read from API objects (pure: dicts in).

A job's status is read with the operator's own models (api.parse_status: api.GRPOJobStatus, leniently: an invalid
value is dropped, the rest kept). Its state is `Job.phase`: the operator's status.phase, or, when a status has no
phase, the condition that is True (api.GRPOJobStatus.state), else "Unknown" (the operator has not reported on the
job yet). It is never guessed from the pods: a resumed job, gated pods or the old Failed pods of a gang restart in
flight do not change it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import api
from . import _contract as c

PHASES: tuple[str, ...] = c.PHASES
UNKNOWN = "Unknown"
TERMINAL_PHASES = frozenset({c.SUCCEEDED, c.FAILED})
# Ends of a wait that are not a success: the job will not move on by itself (Rejected: until its spec is edited).
FAILURE_PHASES = frozenset({c.FAILED, c.REJECTED})


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any, default: Optional[int] = None) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


parse_time = c.parse_time  # the lifecycle's (one parser for the operator and the client)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""
    last_transition_time: Optional[str] = None
    observed_generation: Optional[int] = None

    @classmethod
    def of(cls, cond: api.Condition) -> Condition:
        return cls(type=cond.type, status=cond.status, reason=cond.reason, message=cond.message,
                   last_transition_time=cond.lastTransitionTime, observed_generation=cond.observedGeneration)


@dataclass(frozen=True)
class Progress:
    """status.progress: what global rank 0 of the trainer last reported (any node may hold global rank 0)."""

    step: Optional[int] = None
    max_steps: Optional[int] = None
    reward: Optional[float] = None
    reward_std: Optional[float] = None
    rewards: Optional[dict[str, float]] = None
    kl: Optional[float] = None
    completion_length: Optional[float] = None
    learning_rate: Optional[float] = None
    tokens_per_second: Optional[float] = None
    eta_seconds: Optional[float] = None
    update_time: Optional[str] = None
    display: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, p: Optional[api.ProgressStatus]) -> Optional[Progress]:
        """status.progress as the operator's model reads it; fields it does not know in `extra`. None when empty."""
        if p is None or not p.model_dump(exclude_none=True):
            return None
        return cls(step=p.step, max_steps=p.maxSteps, reward=p.reward, reward_std=p.rewardStd, rewards=p.rewards,
                   kl=p.kl, completion_length=p.completionLength, learning_rate=p.learningRate,
                   tokens_per_second=p.tokensPerSecond, eta_seconds=p.etaSeconds, update_time=p.updateTime,
                   display=p.display, extra=dict(p.model_extra or {}))

    @classmethod
    def from_dict(cls, d: Any) -> Optional[Progress]:
        """status.progress as stored (camelCase keys), read leniently (api.parse_lenient)."""
        return cls.of(api.parse_lenient(api.ProgressStatus, d)) if isinstance(d, Mapping) and d else None

    @property
    def fraction(self) -> Optional[float]:
        """step / maxSteps in [0, 1], None when either is unknown."""
        if isinstance(self.step, (int, float)) and isinstance(self.max_steps, (int, float)) and self.max_steps > 0:
            return max(0.0, min(1.0, self.step / self.max_steps))
        return None


@dataclass(frozen=True)
class NodePod:
    """One pod of the job. `rank` is the pod's node rank (label grpo.dev/node-rank, the N in <job>-node-N): the
    index of the pod, not torch's global rank (c10d hands out ranks by arrival, so global rank 0 may be on any
    node). None for a vLLM server pod."""

    name: str
    rank: Optional[int]
    attempt: int
    role: str
    phase: str  # the pod's status.phase: Pending | Running | Succeeded | Failed | Unknown
    uid: str = ""
    node_name: Optional[str] = None
    started: bool = False  # the trainer container has run (its log exists)
    gated: bool = False  # spec.schedulingGates (e.g. Kueue's admission gate): not even scheduled yet
    deleting: bool = False
    exit_code: Optional[int] = None
    detail: str = ""  # why it waits / how it ended: Unschedulable, ImagePullBackOff, OOMKilled, exit 137…
    created: Optional[str] = None

    @classmethod
    def from_dict(cls, pod: Mapping[str, Any]) -> NodePod:
        meta, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
        labels = _dict(meta.get("labels"))
        info = c.summarize_pod(pod)  # the lifecycle's summary; what only the client shows is read below
        attempt = _int(labels.get(c.KEY_ATTEMPT), None)
        if attempt is None:
            attempt = info.attempt
        phase = str(info.phase)
        gates = spec.get("schedulingGates") or []
        started, exit_code, detail = False, None, ""
        statuses = status.get("containerStatuses") or []
        main = next((s for s in statuses if isinstance(s, dict) and s.get("name") == c.TRAINER_CONTAINER),
                    statuses[0] if statuses and isinstance(statuses[0], dict) else {})
        state = _dict(main.get("state"))
        if state.get("running") or state.get("terminated") or _dict(main.get("lastState")).get("terminated"):
            started = True
        term = _dict(state.get("terminated"))
        if term:
            exit_code = info.exit_code if info.exit_code is not None else _int(term.get("exitCode"))
            detail = f"{term.get('reason') or 'Terminated'}, exit {exit_code}"
        elif _dict(state.get("waiting")).get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            detail = str(state["waiting"].get("reason"))
        for cond in status.get("conditions") or []:
            if (isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                    and not detail):
                detail = str(cond.get("reason") or "NotScheduled")
        if gates and not detail:
            names = [g.get("name", "?") for g in gates if isinstance(g, dict)]
            detail = "SchedulingGated: " + ", ".join(names)
        if status.get("reason") and phase in ("Failed", "Unknown"):
            detail = str(status["reason"]) + (f" ({detail})" if detail else "")
        # A phase past Pending means the container ran (or its node was lost while it ran).
        started = started or phase in ("Running", "Succeeded", "Failed")
        return cls(name=info.name, rank=info.rank, attempt=attempt,
                   role=str(labels.get(c.LABEL_ROLE) or ""), phase=phase, uid=str(meta.get("uid") or ""),
                   node_name=spec.get("nodeName"), started=started, gated=bool(gates),
                   deleting=info.deleting, exit_code=exit_code, detail=detail,
                   created=meta.get("creationTimestamp"))

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Job:
    """A GRPOJob as the client reports it. `attempt` is status.restarts: 0 for the first set of pods, +1 for
    each gang restart. `pods` is filled by get_job (all pods the job owns, every attempt still present)."""

    name: str
    namespace: str
    phase: str
    message: str = ""
    attempt: int = 0
    nodes: int = 1
    topology: Optional[str] = None
    suspended: bool = False  # spec.runPolicy.suspend (what was asked; `phase` says whether it has happened)
    queue: Optional[str] = None
    conditions: tuple[Condition, ...] = ()
    progress: Optional[Progress] = None
    last_failure_reason: Optional[str] = None
    requeues: int = 0  # of the restarts, those Kueue caused by evicting the job (not charged to backoffLimit)
    in_place_restarts: int = 0  # gang restarts inside the running pods (runPolicy.restartPolicy InPlace)
    uid: str = ""
    generation: Optional[int] = None
    observed_generation: Optional[int] = None
    creation_timestamp: Optional[str] = None
    start_time: Optional[str] = None
    completion_time: Optional[str] = None
    pods: tuple[NodePod, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, body: Mapping[str, Any], pods: Optional[Sequence[Mapping[str, Any]]] = None) -> Job:
        meta, spec = _dict(body.get("metadata")), _dict(body.get("spec"))
        status = api.parse_status(body.get("status"))  # the operator's model, read leniently
        state = status.state()
        uid = str(meta.get("uid") or "")
        node_pods = []
        for p in pods or []:
            refs = _dict(p.get("metadata")).get("ownerReferences") or []
            # Pods of an earlier job of the same name (its garbage collection pending) are not this job's.
            if uid and refs and not any(isinstance(r, dict) and r.get("uid") == uid for r in refs):
                continue
            node_pods.append(NodePod.from_dict(p))
        node_pods.sort(key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.name, p.attempt))
        return cls(
            name=str(meta.get("name") or ""), namespace=str(meta.get("namespace") or ""),
            phase=state.value if state is not None else UNKNOWN, message=status.message or "",
            attempt=status.restarts, nodes=_int(spec.get("nodes"), 1) or 1, topology=status.topology,
            suspended=_dict(spec.get("runPolicy")).get("suspend") is True,
            queue=_dict(meta.get("labels")).get(c.QUEUE_LABEL),
            conditions=tuple(Condition.of(x) for x in status.conditions), progress=Progress.of(status.progress),
            last_failure_reason=status.lastFailureReason, requeues=status.requeues,
            in_place_restarts=status.inPlaceRestarts,
            uid=uid, generation=_int(meta.get("generation")), observed_generation=status.observedGeneration,
            creation_timestamp=meta.get("creationTimestamp"), start_time=status.startTime,
            completion_time=status.completionTime, pods=tuple(node_pods), raw=dict(body))

    # ---- views
    def condition(self, ctype: str) -> Optional[Condition]:
        return next((x for x in self.conditions if x.type == ctype), None)

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def up_to_date(self) -> bool:
        """The operator has acted on the latest spec (status.observedGeneration == metadata.generation)."""
        return self.generation is None or self.observed_generation == self.generation

    def pods_of_attempt(self, attempt: Optional[int] = None) -> list[NodePod]:
        a = self.attempt if attempt is None else attempt
        return [p for p in self.pods if p.attempt == a]

    def pod_for_rank(self, rank: int, attempt: Optional[int] = None) -> Optional[NodePod]:
        """The trainer pod of node rank `rank` at `attempt` (default: the current one); None when it has none."""
        found = [p for p in self.pods_of_attempt(attempt) if p.rank == rank and p.role == c.ROLE_TRAINER]
        return max(found, key=lambda p: (not p.deleting, p.created or ""), default=None)

    @property
    def waiting_for(self) -> str:
        """Why a Pending job is not running yet: its Queued (Kueue) or Unschedulable condition, else what its current
        pods wait for ('' if nothing is known)."""
        if self.phase != c.PENDING:
            return ""
        for ctype in (c.C_QUEUED, c.C_UNSCHEDULABLE):  # the operator's own word first (Kueue, the scheduler)
            cond = self.condition(ctype)
            if cond is not None and cond.status == "True":
                return cond.message or ctype
        current = self.pods_of_attempt()
        gated = [p for p in current if p.gated]
        if gated:
            return f"{len(gated)} pod(s) gated ({gated[0].detail}): waiting for admission"
        waiting = [p for p in current if p.detail and not p.started]
        return f"{waiting[0].name}: {waiting[0].detail}" if waiting else ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON/YAML-ready summary (what `kubectl grpo … -o json|yaml` prints)."""
        out = dataclasses.asdict(self)
        out.pop("raw", None)
        out["conditions"] = [dataclasses.asdict(x) for x in self.conditions]
        if self.progress is not None:
            out["progress"] = {k: v for k, v in dataclasses.asdict(self.progress).items() if v not in (None, {})}
        return out


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    object_kind: str
    object_name: str
    count: int = 1
    first_time: Optional[str] = None
    last_time: Optional[str] = None

    @classmethod
    def from_dict(cls, ev: Mapping[str, Any]) -> Event:
        inv, meta = _dict(ev.get("involvedObject")), _dict(ev.get("metadata"))
        series = _dict(ev.get("series"))
        last = (series.get("lastObservedTime") or ev.get("lastTimestamp") or ev.get("eventTime")
                or ev.get("firstTimestamp") or meta.get("creationTimestamp"))
        first = ev.get("firstTimestamp") or ev.get("eventTime") or meta.get("creationTimestamp")
        return cls(type=str(ev.get("type") or ""), reason=str(ev.get("reason") or ""),
                   message=str(ev.get("message") or ""), object_kind=str(inv.get("kind") or ""),
                   object_name=str(inv.get("name") or ""),
                   count=_int(series.get("count"), None) or _int(ev.get("count"), 1) or 1,
                   first_time=_iso(first), last_time=_iso(last))


def _iso(value: Any) -> Optional[str]:
    if isinstance(value, _dt.datetime):
        t = value if value.tzinfo else value.replace(tzinfo=_dt.UTC)
        return t.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class LogLine:
    """One line of a trainer pod's log, or (kind "attach") the note that the follower attached to a pod."""

    text: str
    rank: int
    attempt: int
    pod: str
    time: Optional[str] = None  # the kubelet's RFC 3339 timestamp of the line
    kind: str = "log"  # "log" | "attach" | "error" (follow_all_ranks: a rank with nothing to read; text says why)
