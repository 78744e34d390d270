"""What decide()'s steps share: the Draft (the status being built, as the API's model, the decision, the pods sorted
once, the job's gang policy), the Decision it yields, and the operator-wide Policy knobs."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from .. import api
from ..api.status import ConditionType, Phase
from ..render import manifests
from ..rules import topology, validation
from . import gangs
from .conditions import clear_condition, set_condition
from .pods import ROLE_TRAINER, ROLE_VLLM, PodInfo, PodPhase, PodSets
from .server.order import EngineProbe, ProbeVerdict
from .stall_watch import StackRequest, StallPolicy, StallWatch


@dataclass(frozen=True)
class Policy:
    """Operator-wide knobs (from the environment), not part of the job's spec."""

    backoff_base: float = 10.0  # seconds before the first restart; doubles each restart
    backoff_cap: float = 300.0
    expectation_ttl: float = 30.0  # how long a pod we created may be missing from the watch cache
    # A pod still there this long after its deletionTimestamp (the end of its grace period) has no kubelet to
    # finish it: its node is lost. It is force-deleted (grace 0) so the gang can restart. None: never.
    force_delete_after: Optional[float] = 60.0
    stall: StallPolicy = StallPolicy()  # hung-job detection defaults (lifecycle/stall.py)


def backoff_seconds(restarts: int, policy: Policy) -> float:
    """Delay before attempt `restarts` (≥1): base, 2·base, 4·base … capped."""
    if restarts <= 0:
        return 0.0
    return min(policy.backoff_base * 2.0 ** (restarts - 1), policy.backoff_cap)


@dataclass(frozen=True)
class JobEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    # the complete desired status, as written: job_status dumped once (None: do not touch status)
    status: Optional[dict[str, Any]]
    create_attempt: Optional[int] = None  # attempt number of the pods to create
    create_pods: list[str] = field(default_factory=list)  # pod names to create (from render)
    max_restarts: Optional[int] = None  # the created trainers' in-place restarts (render's; lifecycle/inplace.py)
    delete_pods: list[str] = field(default_factory=list)
    # stuck terminating on a lost node: (pod, why) to delete with grace 0; the I/O layer posts `why` as a
    # ForceDeleted Warning when it sends the delete (decide() repeats until the pod is gone)
    force_delete_pods: list[tuple[str, str]] = field(default_factory=list)
    delete_job: bool = False
    events: list[JobEvent] = field(default_factory=list)
    requeue_after: Optional[float] = None
    conflicts: list[str] = field(default_factory=list)  # child names owned by something else
    # the gang scheduler's group the created pods of each role join (role → group; render's `groups`); a role
    # missing: render names a new group after the attempt
    groups: dict[str, str] = field(default_factory=dict)
    # pods to mark so that the gang scheduler releases their groups (its quota), and how (the policy's Release)
    release_pods: list[str] = field(default_factory=list)
    release: Optional[gangs.Release] = None
    job_status: Optional[api.GRPOJobStatus] = None  # the typed status (the API's own model)
    probe_server: Optional[EngineProbe] = None  # server mode: run the engine probe on a kept server (server/keep.py)
    dump_stacks: Optional[StackRequest] = None  # a stalled attempt: ask its trainer pods for their stacks (stall.py)

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


@dataclass
class JobView:
    """The parts of a GRPOJob body the lifecycle reads."""

    name: str
    namespace: str
    uid: str
    generation: Optional[int]
    deleting: bool
    status: dict[str, Any]  # as stored (what the status patch is computed against); Draft.begin parses it
    result: validation.ValidationResult  # validation.validate(body)
    # spec.cache: the download pod's last GRPO_STAGE progress record, read by the controller (None: not read)
    stage_progress: Optional[dict[str, Any]] = None
    spec_doc: Any = None  # the stored spec as sent: read where today's models cannot parse it (the TTL)
    # the API server's refusal of this job's last create (the controller's record: controller/refused.py); None:
    # none known (after an operator restart the next refused try records it again)
    create_refused: Optional[str] = None
    engine_probe: Optional[ProbeVerdict] = None  # server mode: the controller's last engine probe of a kept server
    stall: Optional[StallWatch] = None  # the scraper's watch of the running attempt's trainers (None: not watched)

    @classmethod
    def from_body(cls, body: Mapping[str, Any], result: Optional[validation.ValidationResult] = None) -> JobView:
        meta = body.get("metadata") or {}
        doc = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            generation=meta.get("generation"),
            deleting=bool(meta.get("deletionTimestamp")),
            status=dict(body.get("status") or {}),
            result=result if result is not None else validation.validate(doc),
            spec_doc=body.get("spec"),
        )


@dataclass(frozen=True)
class ValidJob:
    """A validation result narrowed once: a job that passed validation, with its topology and batch."""

    job: api.GRPOJob
    topology: topology.Topology
    batch: Optional[api.BatchStatus]  # status.batch (None: the rules could not compute it)

    @classmethod
    def of(cls, result: validation.ValidationResult) -> Optional[ValidJob]:
        if not result.valid or result.job is None or result.topology is None:
            return None
        return cls(result.job, result.topology, _batch(result.batch))

    @classmethod
    def kept(cls, result: validation.ValidationResult) -> Optional[ValidJob]:
        """A started job that today's rules refuse: what it needs to go on (its pods rendered as today's models parse
        it), when today's models parse it and compute its topology; None otherwise."""
        if result.not_a_grpojob or result.job is None or result.topology is None:
            return None
        return cls(result.job, result.topology, _batch(result.batch))


def _batch(breakdown: Optional[dict[str, Any]]) -> Optional[api.BatchStatus]:
    """The rules' batch breakdown as status.batch (its fields only)."""
    if not breakdown:
        return None
    return api.BatchStatus.model_validate({k: v for k, v in breakdown.items() if k in api.BatchStatus.model_fields})


# Phases only a job whose pods were created reaches (Suspended is not one: a job may be created suspended)
STARTED_PHASES = (Phase.RUNNING, Phase.RESTARTING, Phase.SUCCEEDED, Phase.FAILED)


# Spec fields whose edit does not change what the pods were rendered from (webhook/review.py MUTABLE_FIELDS)
RUN_POLICY = "runPolicy"


def spec_digest(spec: Any) -> str:
    """The stored spec's identity as far as its pods are concerned: a digest of all of it but runPolicy (a
    metadata or runPolicy edit moves metadata.generation, never this)."""
    rest = {k: v for k, v in spec.items() if k != RUN_POLICY} if isinstance(spec, dict) else spec
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def has_started(status: api.GRPOJobStatus, digest: str, ours: Iterable[PodInfo]) -> bool:
    """Started: the operator created pods for the job at least once (status.startTime, the Created condition, a phase
    only pods reach, or a pod of its own). From then on it was admitted by the rules of its day, and a later release's
    stricter rule never deletes its work (a rule only refuses a job that has not started). Not started: a Rejected
    job (its rejection deleted its pods), and a spec changed since its pods were rendered (`digest`, the stored spec's
    spec_digest, differs from status.specDigest): an edit today's rules refuse is refused as before, whatever ran.
    A runPolicy or metadata edit (suspend, a deadline, a TTL, a label) moves the generation, not the digest: it never
    turns a started job into a refused one. A status without specDigest (written by a release that did not record it)
    reads as unchanged: the webhook and the CRD's rules keep a started job's spec immutable."""
    changed = status.specDigest is not None and status.specDigest != digest
    if status.phase == Phase.REJECTED or changed:
        return False
    return bool(status.startTime or status.phase in STARTED_PHASES
                or status.is_true(ConditionType.CREATED) or any(True for _ in ours))


def server_attempt(status: api.GRPOJobStatus) -> Optional[int]:
    """status.vllmServerAttempt: the attempt whose vLLM server is kept (None: the current attempt's own)."""
    return status.vllmServerAttempt


def clean_status(status: dict[str, Any]) -> dict[str, Any]:
    """Drop None values (the API server would drop them too, and we must compare like with like); phases and
    reasons as plain strings."""
    return {k: (v.value if isinstance(v, Enum) else v) for k, v in status.items() if v is not None}


def active(pods: Iterable[PodInfo], keep_succeeded: bool = False) -> list[PodInfo]:
    """Pods still doing something: finished trainer pods stay for their logs (GC'd with the job), and with
    `keep_succeeded` every finished pod does."""
    return [p for p in pods if not (p.phase in PodPhase.FINISHED and (keep_succeeded or p.role == ROLE_TRAINER))]


@dataclass
class Draft:
    """What the steps of one decide() share: the job, the status being built (the API's model, dumped once by
    finish) and the decision."""

    job: JobView
    now: _dt.datetime
    policy: Policy
    status: api.GRPOJobStatus  # the status being built
    found: api.GRPOJobStatus  # the job's status as this pass found it (parsed leniently: api.parse_status)
    decision: Decision
    pods: PodSets
    current: list[PodInfo]  # pods.current, plus the pods this pass creates
    phase: Optional[Phase]  # the phase found (None after a cleared Rejected, Pending after a resume)
    valid: Optional[ValidJob]  # None: an invalid spec (reject_invalid settles the pass)
    gang: gangs.GangPolicy  # chosen once per pass (lifecycle/gangs)
    refused: Optional[str] = None  # a started job that today's rules refuse: the errors (lifecycle/validity.py)

    @classmethod
    def begin(cls, job: JobView, pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy) -> Draft:
        found = api.parse_status(job.status)  # never raises: an older operator's or a hand-edited status
        status = api.parse_status(job.status)  # the same, a model of its own: a second parse costs a fifth of a deep copy
        # written whatever the steps do (finish dumps the fields set): the conditions, the generation acted on, the
        # attempt (0 when the status has none yet)
        status.conditions = [c for c in status.conditions if c.type]
        status.observedGeneration = job.generation
        status.restarts = found.restarts
        sets = PodSets.sort(job.uid, pods, status.restarts, server_attempt(status))
        # an older GRPOJob of the same name (its GC pending) → delete; anything else is a conflict, never touched
        decision = Decision(status=None, delete_pods=[p.name for p in sets.stale if not p.deleting],
                            conflicts=[p.name for p in sets.foreign])
        valid, refused, digest = ValidJob.of(job.result), None, spec_digest(job.spec_doc)
        if valid is None and has_started(found, digest, sets.ours):
            valid, refused = ValidJob.kept(job.result), job.result.summary() or "invalid GRPOJob"
        if valid is not None or refused is not None:  # the spec its pods are rendered from; a Rejected one: none
            status.specDigest = digest
        return cls(job, now, policy, status, found, decision, sets, list(sets.current), status.phase,
                   valid, gangs.for_job(valid.job if valid else None), refused)

    # -- the valid spec (every step after reject_invalid)
    @property
    def checked(self) -> ValidJob:
        if self.valid is None:
            raise ValueError("an invalid job reached a step after reject_invalid")
        return self.valid

    @property
    def spec(self) -> api.GRPOJobSpec:
        return self.checked.job.spec

    @property
    def ttl_after_finished(self) -> Optional[int]:
        """runPolicy.ttlSecondsAfterFinished, read from the stored spec when today's models cannot parse it: a
        finished job's TTL fires whatever a later release thinks of its spec."""
        if self.valid is not None:
            return self.spec.runPolicy.ttlSecondsAfterFinished
        doc = self.job.spec_doc if isinstance(self.job.spec_doc, dict) else {}
        run = doc.get("runPolicy")
        ttl = run.get("ttlSecondsAfterFinished") if isinstance(run, dict) else None
        return ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0 else None

    @property
    def nodes(self) -> int:
        return self.checked.topology.nodes

    @property
    def expected(self) -> list[str]:
        """The current attempt's pod names: its trainers, and the server of the attempt whose server is kept
        (status.vllmServerAttempt; under Kueue pod names differ per attempt)."""
        names = manifests.pod_names(self.checked.job, self.nodes, self.pods.attempt)
        kept = next((p.attempt for p in self.pods.current if p.role == ROLE_VLLM), self.pods.attempt)
        if kept != self.pods.attempt:
            names[self.nodes:] = manifests.pod_names(self.checked.job, self.nodes, kept)[self.nodes:]
        return names

    @property
    def stage_progress(self) -> Optional[dict[str, Any]]:
        return self.job.stage_progress

    @property
    def requeues(self) -> int:
        return self.status.requeues

    def next_attempt(self, *, charged: bool) -> int:
        """Start the next attempt (status.restarts + 1); one not `charged` (the gang scheduler's doing) is also
        counted in status.requeues, and so not against runPolicy.backoffLimit. The pods are sorted again around it."""
        attempt = self.status.restarts = self.pods.attempt + 1
        if not charged:
            self.status.requeues = self.requeues + 1
        kept = self.pods.ours + self.pods.stale + self.pods.foreign
        self.pods = PodSets.sort(self.job.uid, kept + ((self.pods.initializer,) if self.pods.initializer else ()),
                                 attempt, server_attempt(self.status))
        self.current = list(self.pods.current)
        return attempt

    def end_groups(self, pods: Iterable[str]) -> None:
        """Mark these pods to end their pod groups (each once), as the gang policy releases them."""
        for name in pods:
            if name not in self.decision.release_pods:
                self.decision.release_pods.append(name)
                self.decision.release = self.gang.releases

    def join_groups(self, attempt: int, roles: Iterable[str]) -> None:
        """The groups the `roles` pods created now join (the gang policy's choice; none without one)."""
        for role in roles:
            group = self.gang.group_of_new_pods(self.pods.ours, self.job.name, self.job.uid, attempt, role)
            if group:
                self.decision.groups[role] = group

    def release_gang(self, pods: Optional[Iterable[PodInfo]] = None) -> None:
        """A job that gives up or is suspended releases what its gang holds (its scheduler's groups); `pods`:
        only these pods' groups (default: all of the job's)."""
        self.end_groups(self.gang.release(self.pods.ours if pods is None else pods))

    @property
    def conflict_names(self) -> set[str]:
        return {p.name for p in self.pods.foreign}

    @property
    def any_started(self) -> bool:
        """The gang started: one of the current attempt's trainers did. A vLLM server started on its own before
        the trainers (server mode) does not count: its trainers are still to be created."""
        return any(p.started for p in self.pods.current if p.role == ROLE_TRAINER)

    # -- conditions
    @property
    def conditions(self) -> list[api.Condition]:
        return self.status.conditions

    def condition(self, ctype: str) -> Optional[api.Condition]:
        return self.status.condition(ctype)

    def set(self, ctype: str, status: api.ConditionStatus, reason: str, message: str, *,
            force_transition: bool = False) -> None:
        set_condition(self.conditions, ctype, status, reason, message, self.now, self.job.generation,
                      force_transition=force_transition)

    def clear(self, ctype: str, reason: str, message: str) -> None:
        clear_condition(self.conditions, ctype, reason, message, self.now, self.job.generation)

    def is_true(self, ctype: str) -> bool:
        return self.status.is_true(ctype)

    def stop_initializer(self) -> None:
        """A job that ends or is suspended stops a download still running (it resumes where it stopped when the
        job is resumed); a finished download pod stays for its log until the job is garbage-collected."""
        pod = self.pods.initializer
        if pod is not None and pod.phase not in PodPhase.FINISHED:
            self.delete([pod])

    def delete(self, pods: Iterable[PodInfo]) -> None:
        """Delete these pods (those not already on their way out, each once)."""
        for p in pods:
            if p.live and p.name not in self.decision.delete_pods:
                self.decision.delete_pods.append(p.name)
