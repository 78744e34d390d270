"""Pure lifecycle decisions: (job, observed pods, now) → status, actions, events.

No kopf, no kubernetes client, no I/O. controller/handlers.py feeds this module what it observed (the job's body and
compact summaries of its pods) and carries out the returned Decision. Every decision is *level-triggered*:
it is recomputed from the current observation, so a lost status write, a duplicated event or an operator
restart at any point converges to the same result.

State kept in the cluster (and only there):
  * status.restarts   — the current attempt number; pods carry it as the annotation grpo.dev/attempt.
                        Pods of an older attempt are stale and get deleted; pods of a newer attempt than
                        status says (a lost status write) raise status.restarts to their attempt.
  * the Restarting condition's lastTransitionTime — the start of the backoff before the next attempt.
  * status.startTime / completionTime — deadline and TTL anchors.

Failure classes (the trainer's exit-code contract):
  * exit 0                                   success
  * exit 1–127                               permanent: config/data/import/batch errors → Failed, no retry
  * exit ≥128, a signal, OOMKilled, Evicted,
    node lost (phase Unknown), a deleted pod  retryable → gang restart with exponential backoff, up to
                                             runPolicy.backoffLimit restarts
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from .. import api
from ..api.status import TERMINAL, ConditionType, Phase, Reason
from ..render import manifests, podgroup
from ..rules import validation
from . import gang, progress
from .conditions import clear_condition, fmt_time, get_condition, is_true, parse_time, set_condition
from .pods import ROLE_TRAINER, Failure, PodInfo, PodPhase, PodSets, as_int, classify


@dataclass(frozen=True)
class Policy:
    """Operator-wide knobs (from the environment), not part of the job's spec."""

    backoff_base: float = 10.0  # seconds before the first restart; doubles each restart
    backoff_cap: float = 300.0
    expectation_ttl: float = 30.0  # how long a pod we created may be missing from the watch cache
    # A pod still there this long after its deletionTimestamp (the end of its grace period) has no kubelet to
    # finish it: its node is lost. It is force-deleted (grace 0) so the gang can restart. None: never.
    force_delete_after: Optional[float] = 60.0


def backoff_seconds(restarts: int, policy: Policy) -> float:
    """Delay before attempt `restarts` (≥1): base, 2·base, 4·base … capped."""
    if restarts <= 0:
        return 0.0
    return min(policy.backoff_base * (2 ** (restarts - 1)), policy.backoff_cap)


@dataclass(frozen=True)
class JobEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    status: Optional[dict[str, Any]]  # the complete desired status (None: do not touch status)
    create_attempt: Optional[int] = None  # attempt number of the pods to create
    create_pods: list[str] = field(default_factory=list)  # pod names to create (from render)
    delete_pods: list[str] = field(default_factory=list)
    # stuck terminating on a lost node: (pod, why) to delete with grace 0; the I/O layer posts `why` as a
    # ForceDeleted Warning when it sends the delete (decide() repeats until the pod is gone)
    force_delete_pods: list[tuple[str, str]] = field(default_factory=list)
    delete_job: bool = False
    events: list[JobEvent] = field(default_factory=list)
    requeue_after: Optional[float] = None
    conflicts: list[str] = field(default_factory=list)  # child names owned by something else
    kueue_group: Optional[str] = None  # Kueue: the pod group the created pods join (render's kueue_group)
    # Kueue: pods to annotate kueue.x-k8s.io/retriable-in-group: "false", which ends their group (Kueue finishes its
    # Workload, releases the quota and removes its finalizers once none of its pods runs)
    end_kueue_groups: list[str] = field(default_factory=list)

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
    status: dict[str, Any]
    result: validation.ValidationResult  # validation.validate(body)

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
        )


def expected_pod_names(job: api.GRPOJob, nodes: int, attempt: int = 0) -> list[str]:
    """The pods of an attempt. Under Kueue every attempt has its own names (render/podgroup.py)."""
    n = manifests.names(job.metadata.name or "")
    kueue = podgroup.kueue_queue(job) is not None
    out = [n.pod(r) for r in range(nodes)]
    if job.spec.vllm.mode == "server":
        out.append(n.vllm_pod(0))
    return [podgroup.attempt_pod_name(name, attempt, kueue=kueue) for name in out]


def topology_string(topo: Any) -> str:
    if topo.gpu_resource:
        return f"{topo.nodes}x{topo.gpus_per_node}"
    return f"{topo.nodes}x{topo.nproc_per_node}cpu"


BATCH_KEYS = ("worldSize", "nprocPerNode", "generationBatchSize", "stepsPerGeneration", "promptsPerGeneration")


def clean_status(status: dict[str, Any]) -> dict[str, Any]:
    """Drop None values (the API server would drop them too, and we must compare like with like); phases and
    reasons as plain strings."""
    return {k: (v.value if isinstance(v, Enum) else v) for k, v in status.items() if v is not None}


# ---------------------------------------------------------------------------------------------- the decision
def decide(job: JobView, pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy = Policy()) -> Decision:
    """The whole reconciliation: what the status should be and what to create/delete.

    A table of contents: every step reads and writes one Draft (the status being built, the decision, the pods
    sorted once); the first step that settles the job ends the pass.
    """
    if job.deleting:  # the garbage collector deletes the children; under Kueue their groups end (quota released)
        return Decision(status=None, end_kueue_groups=deleted_job_groups(job, pods))
    draft = Draft.begin(job, pods, now, policy)
    steps: tuple[Callable[[Draft], bool], ...] = (
        reject_invalid,             # an invalid spec: Rejected, no pods (else: clear Rejected, topology, batch)
        keep_terminal,              # Succeeded/Failed stay; what still runs is deleted; TTL
        adopt_newest_attempt,       # pods of a newer attempt than status.restarts (a lost write) win
        suspend,                    # runPolicy.suspend: no pods
        resume,                     # unsuspended: wait for the suspended pods to be gone
        enforce_deadline,           # runPolicy.activeDeadlineSeconds
        delete_other_attempts,      # pods of an older attempt go first
        note_conflicts,             # our pod names owned by something else
        restart_or_fail,            # failures of the current attempt: gang restart, or Failed
        wait_for_previous_attempt,  # the older attempt's pods still exist, or the backoff runs
        create_pods,                # the current attempt's missing pods
        phase_from_pods,            # Succeeded / Running / Pending from the current attempt's pods
    )
    for step in steps:
        if step(draft):
            break
    return draft.finish()


def deleted_job_groups(job: JobView, pods: Iterable[PodInfo]) -> list[str]:
    """A job on its way out ends its Kueue pod groups: else Kueue keeps their Workloads admitted, and the quota
    held, waiting for replacement pods that never come (lifecycle/gang.py release_target)."""
    spec_job = job.result.job
    if spec_job is None or podgroup.kueue_queue(spec_job) is None:
        return []
    return gang.release_target([p for p in pods if p.owner_uid == job.uid])


@dataclass
class Draft:
    """What the steps of one decide() share: the job, the status being built and the decision."""

    job: JobView
    now: _dt.datetime
    policy: Policy
    status: dict[str, Any]
    conditions: list[dict[str, Any]]
    decision: Decision
    pods: PodSets
    current: list[PodInfo]  # pods.current, plus the pods this pass creates
    phase: Optional[str]  # the phase found (None after a cleared Rejected, Pending after a resume)

    @classmethod
    def begin(cls, job: JobView, pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy) -> Draft:
        status: dict[str, Any] = dict(job.status)
        conditions = [dict(c) for c in job.status.get("conditions") or [] if isinstance(c, dict) and c.get("type")]
        status["conditions"] = conditions
        status["observedGeneration"] = job.generation
        status["restarts"] = as_int(job.status.get("restarts"), 0)
        sets = PodSets.sort(job.uid, pods, status["restarts"])
        # an older GRPOJob of the same name (its GC pending) → delete; anything else is a conflict, never touched
        decision = Decision(status=status, delete_pods=[p.name for p in sets.stale if not p.deleting],
                            conflicts=[p.name for p in sets.foreign])
        return cls(job, now, policy, status, conditions, decision, sets, list(sets.current), status.get("phase"))

    # -- the valid spec (every step after reject_invalid)
    @property
    def spec(self) -> api.GRPOJobSpec:
        return self.job.result.job.spec  # type: ignore[union-attr]

    @property
    def nodes(self) -> int:
        return self.job.result.topology.nodes  # type: ignore[union-attr]

    @property
    def expected(self) -> list[str]:
        return expected_pod_names(self.job.result.job, self.nodes, self.pods.attempt)  # type: ignore[arg-type]

    @property
    def mode(self) -> str:
        """none | kueue | coscheduling | volcano (lifecycle/gang.py): what a gang restart must wait for."""
        job = self.job.result.job
        return gang.mode(podgroup.kueue_queue(job), podgroup.gang_of(job))  # type: ignore[arg-type]

    @property
    def requeues(self) -> int:
        return as_int(self.status.get("requeues"), 0)

    def next_attempt(self, *, charged: bool) -> int:
        """Start the next attempt (status.restarts + 1); one not `charged` (Kueue's doing) is also counted in
        status.requeues, and so not against runPolicy.backoffLimit. The pods are sorted again around it."""
        attempt = self.status["restarts"] = self.pods.attempt + 1
        if not charged:
            self.status["requeues"] = self.requeues + 1
        self.pods = PodSets.sort(self.job.uid, self.pods.ours + self.pods.stale + self.pods.foreign, attempt)
        self.current = list(self.pods.current)
        return attempt

    def end_kueue_groups(self) -> None:
        """Under Kueue, a job that gives up or is suspended ends its pod groups, so Kueue releases their quota."""
        if self.mode == gang.KUEUE:
            self.decision.end_kueue_groups += [n for n in gang.release_target(self.pods.ours)
                                               if n not in self.decision.end_kueue_groups]

    @property
    def conflict_names(self) -> set[str]:
        return {p.name for p in self.pods.foreign}

    @property
    def any_started(self) -> bool:
        return any(p.started for p in self.pods.current)

    # -- writing
    def set(self, ctype: str, status: str, reason: str, message: str, *, force_transition: bool = False) -> None:
        set_condition(self.conditions, ctype, status, reason, message, self.now, self.job.generation,
                      force_transition=force_transition)

    def clear(self, ctype: str, reason: str, message: str) -> None:
        clear_condition(self.conditions, ctype, reason, message, self.now, self.job.generation)

    def is_true(self, ctype: str) -> bool:
        return is_true(self.conditions, ctype)

    def delete(self, pods: Iterable[PodInfo]) -> None:
        """Delete these pods (those not already on their way out, each once)."""
        for p in pods:
            if p.live and p.name not in self.decision.delete_pods:
                self.decision.delete_pods.append(p.name)

    def finish(self) -> Decision:
        self.decision.status = clean_status(self.status)
        _transition_events(self.job.status, self.decision.status, self.decision)
        force_stuck(self.pods.ours + self.pods.stale, self.now, self.policy, self.decision)
        return self.decision


def _active(pods: Iterable[PodInfo], keep_succeeded: bool = False) -> list[PodInfo]:
    """Pods still doing something: finished trainer pods stay for their logs (GC'd with the job), and with
    `keep_succeeded` every finished pod does."""
    return [p for p in pods if not (p.phase in PodPhase.FINISHED and (keep_succeeded or p.role == ROLE_TRAINER))]


def fail(draft: Draft, reason: str, message: str) -> bool:
    """The job failed for good: Failed, what still runs deleted, TTL from now."""
    draft.status["phase"] = Phase.FAILED
    draft.status["message"] = message
    draft.status["completionTime"] = fmt_time(draft.now)
    draft.set(ConditionType.FAILED, "True", reason, message)
    draft.clear(ConditionType.RUNNING, reason, "the job failed")
    draft.clear(ConditionType.RESTARTING, reason, "the job failed")
    draft.clear(ConditionType.QUEUED, reason, "the job failed")
    draft.delete(_active(draft.pods.ours))
    draft.end_kueue_groups()
    ttl = draft.spec.runPolicy.ttlSecondsAfterFinished
    if ttl is not None:
        draft.decision.requeue(ttl)
    return True


# ---------------------------------------------------------------------------------------------- the steps
def reject_invalid(draft: Draft) -> bool:
    """The webhook may be off: an invalid spec is Rejected here too, and has no pods. A valid one clears Rejected and
    records its topology and batch."""
    result, status = draft.job.result, draft.status
    if not result.valid or result.job is None or result.topology is None:
        message = result.summary() or "invalid GRPOJob"
        status["phase"] = Phase.REJECTED
        status["message"] = f"invalid spec: {message}"
        draft.set(ConditionType.REJECTED, "True", Reason.INVALID_SPEC, message)
        draft.delete(_active(draft.pods.ours))
        draft.delete(draft.pods.ours)
        return True
    if draft.is_true(ConditionType.REJECTED):
        draft.set(ConditionType.REJECTED, "False", Reason.SPEC_VALID, "the spec is valid now")
        if status.get("phase") == Phase.REJECTED:
            status["phase"] = draft.phase = None
    status["topology"] = topology_string(result.topology)
    if result.batch:
        status["batch"] = {k: result.batch[k] for k in BATCH_KEYS if k in result.batch}
    return False


def keep_terminal(draft: Draft) -> bool:
    """Succeeded and Failed are final: what still runs is deleted, and the job itself after its TTL."""
    if draft.phase not in TERMINAL:
        return False
    draft.delete(_active(draft.pods.ours, keep_succeeded=True))
    if draft.phase == Phase.FAILED:
        draft.end_kueue_groups()  # repeated until seen: a lost patch is sent again
    ttl = draft.spec.runPolicy.ttlSecondsAfterFinished
    if ttl is not None:
        status, now = draft.status, draft.now
        done = parse_time(status.get("completionTime")) or now
        if status.get("completionTime") is None:
            status["completionTime"] = fmt_time(now)
        due = done + _dt.timedelta(seconds=ttl)
        if now >= due:
            draft.decision.delete_job = True
            draft.decision.events.append(JobEvent("Normal", Reason.TTL_EXPIRED,
                                                  f"deleting the job {ttl}s after it finished"))
        else:
            draft.decision.requeue((due - now).total_seconds())
    return True


def adopt_newest_attempt(draft: Draft) -> bool:
    """status.restarts is the current attempt, unless pods of a newer one prove a lost status write."""
    draft.status["restarts"] = draft.pods.attempt
    return False


def suspend(draft: Draft) -> bool:
    """runPolicy.suspend: every pod deleted; the deadline clock restarts on resume."""
    if not draft.spec.runPolicy.suspend:
        return False
    draft.delete(_active(draft.pods.ours))
    draft.delete(draft.pods.ours)
    draft.status["phase"] = Phase.SUSPENDED
    draft.status["message"] = "suspended: pods deleted; unsuspend to resume from the latest checkpoint"
    draft.status["startTime"] = None
    draft.set(ConditionType.SUSPENDED, "True", Reason.SUSPENDED, "runPolicy.suspend is true")
    draft.clear(ConditionType.RUNNING, Reason.SUSPENDED, "the job is suspended")
    draft.clear(ConditionType.UNSCHEDULABLE, Reason.SUSPENDED, "the job is suspended")
    draft.clear(ConditionType.QUEUED, Reason.SUSPENDED, "the job is suspended")
    draft.end_kueue_groups()
    return True


def resume(draft: Draft) -> bool:
    """Unsuspended: Pending again, once the suspended pods are gone."""
    if not (draft.is_true(ConditionType.SUSPENDED) or draft.phase == Phase.SUSPENDED):
        return False
    draft.set(ConditionType.SUSPENDED, "False", Reason.RESUMED, "runPolicy.suspend is false")
    draft.phase = draft.status["phase"] = Phase.PENDING
    draft.status["message"] = "resumed"
    if draft.mode == gang.KUEUE:
        # the suspended run's pod group was ended: a new run, with a new group (its Workload may still exist,
        # Finished) and new pod names; the old pods are waited for as Kueue requires (wait_for_previous_attempt)
        draft.next_attempt(charged=False)
        return False
    return any(p.deleting for p in draft.pods.ours)


def enforce_deadline(draft: Draft) -> bool:
    """runPolicy.activeDeadlineSeconds, counted from status.startTime."""
    deadline = draft.spec.runPolicy.activeDeadlineSeconds
    start = parse_time(draft.status.get("startTime"))
    if deadline is None or start is None:
        return False
    due = start + _dt.timedelta(seconds=deadline)
    if draft.now >= due:
        return fail(draft, Reason.DEADLINE_EXCEEDED,
                    f"the job ran longer than runPolicy.activeDeadlineSeconds={deadline}")
    draft.decision.requeue((due - draft.now).total_seconds())
    return False


def delete_other_attempts(draft: Draft) -> bool:
    """Pods of an older attempt go first."""
    draft.delete(draft.pods.other_attempt)
    return False


def note_conflicts(draft: Draft) -> bool:
    """Objects with our pod names owned by something else: Created=False until the user removes them."""
    if draft.conflict_names:
        message = ("objects with this job's pod names exist but are not owned by it: "
                   + ", ".join(sorted(draft.conflict_names)) + "; delete or rename them")
        draft.set(ConditionType.CREATED, "False", Reason.CHILD_CONFLICT, message)
    return False


def current_failures(draft: Draft) -> list[Failure]:
    """What went wrong in the current attempt: failed pods, pods deleted under a running gang, pods gone."""
    failures: list[Failure] = []
    for p in draft.pods.current:
        if p.synthetic:
            continue
        if p.deleting:
            # someone else deletes a pod of a running gang: the gang is broken. Before the gang ran (or
            # after a resume) a pod on its way out is waited for and then recreated under the same name.
            if draft.phase == Phase.RUNNING and p.phase != PodPhase.SUCCEEDED:
                failures.append(Failure(True, Reason.POD_DELETED, f"pod {p.name} was deleted"))
            continue
        f = classify(p)
        if f is not None:
            if not f.retryable and p.role != ROLE_TRAINER:  # a vLLM server's exit code is not the trainer's contract
                f = Failure(True, f.reason, f.message + " (vLLM server: retried)")
            failures.append(f)
    if draft.any_started and draft.phase in (Phase.RUNNING, Phase.PENDING, None):
        present = {p.name for p in draft.pods.current}
        for name in draft.expected:
            if name not in present and name not in draft.conflict_names:
                failures.append(Failure(True, Reason.POD_DELETED,
                                        f"pod {name} disappeared (deleted or its node was lost)"))
    return failures


def restart_or_fail(draft: Draft) -> bool:
    """A permanent failure fails the job; a retryable one restarts the whole gang after a backoff, up to
    runPolicy.backoffLimit restarts."""
    if draft.mode == gang.KUEUE:
        evicted = gang.evicted_by_kueue(draft.pods.current)
        if evicted:
            return requeue_after_kueue_eviction(draft, evicted)
    failures = current_failures(draft)
    if not failures:
        return False
    status, limit = draft.status, draft.spec.runPolicy.backoffLimit
    permanent = [f for f in failures if not f.retryable]
    first = (permanent or failures)[0]
    status["lastFailureReason"] = first.reason
    if permanent:
        return fail(draft, first.reason, first.message)
    charged = status["restarts"] - draft.requeues  # Kueue's evictions are not the job's failures
    if charged >= limit:
        return fail(draft, Reason.BACKOFF_LIMIT_EXCEEDED,
                    f"{first.message}; runPolicy.backoffLimit={limit} restarts already used")
    draft.next_attempt(charged=True)
    charged += 1
    status["phase"] = Phase.RESTARTING
    delay = backoff_seconds(charged, draft.policy)
    status["message"] = f"gang restart {charged}/{limit} in {delay:g}s: {first.message}"
    draft.set(ConditionType.RESTARTING, "True", first.reason, status["message"], force_transition=True)
    draft.clear(ConditionType.RUNNING, first.reason, "restarting all nodes")
    draft.delete(draft.pods.ours)
    draft.decision.requeue(delay)
    return True


def requeue_after_kueue_eviction(draft: Draft, evicted: str) -> bool:
    """Kueue ended the pods (preemption, eviction: their TerminationTarget condition): not the job's failure. The
    next attempt's pods replace them in the same group without a backoff and wait at Kueue's gate for the group
    to be admitted again; runPolicy.backoffLimit is not spent."""
    status = draft.status
    attempt = draft.next_attempt(charged=False)
    status["phase"] = Phase.RESTARTING
    status["message"] = (f"Kueue evicted the pods ({evicted}); attempt {attempt} waits for Kueue to admit the group "
                         "again (not counted against runPolicy.backoffLimit)")
    draft.set(ConditionType.RESTARTING, "True", Reason.EVICTED_BY_KUEUE, status["message"], force_transition=True)
    draft.clear(ConditionType.RUNNING, Reason.EVICTED_BY_KUEUE, "Kueue evicted the pods")
    draft.delete(draft.pods.ours)
    return True


def wait_for_previous_attempt(draft: Draft) -> bool:
    """The next attempt starts once the older attempt's pods are out of the way — gone, or under Kueue Failed
    (lifecycle/gang.py says why) — and the backoff has run out."""
    if draft.pods.other_attempt:
        ready, _ = gang.may_create_next(draft.mode, draft.pods.other_attempt)
        if ready and draft.mode == gang.KUEUE:
            ending = gang.groups_to_end_before_replacing(draft.pods.other_attempt)
            draft.decision.end_kueue_groups += ending
            ready = not ending
        if not ready:
            if draft.phase is None:
                draft.status["phase"] = Phase.PENDING
            return True
    if not draft.is_true(ConditionType.RESTARTING) or draft.pods.current:
        return False
    restarting = get_condition(draft.conditions, ConditionType.RESTARTING) or {}
    if restarting.get("reason") == Reason.EVICTED_BY_KUEUE:
        return False  # Kueue's own queue is the wait
    since = parse_time(restarting.get("lastTransitionTime"))
    charged = draft.pods.attempt - draft.requeues
    due = (since or draft.now) + _dt.timedelta(seconds=backoff_seconds(charged, draft.policy))
    if draft.now >= due:
        return False
    draft.status["phase"] = Phase.RESTARTING
    draft.decision.requeue((due - draft.now).total_seconds())
    return True


def create_pods(draft: Draft) -> bool:
    """The current attempt's missing pods, unless the gang already started (then a missing pod is a failure)."""
    attempt, expected, conflicts = draft.pods.attempt, draft.expected, draft.conflict_names
    present = {p.name for p in draft.pods.current}
    missing = [n for n in expected if n not in present and n not in conflicts]
    restarting = draft.is_true(ConditionType.RESTARTING)
    if missing and not draft.any_started:
        draft.decision.create_attempt = attempt
        draft.decision.create_pods = missing
        if draft.mode == gang.KUEUE:  # replacements join the run's group (it keeps its quota); else a new group
            draft.decision.kueue_group = gang.carried_group(draft.pods.ours) or podgroup.kueue_group_name(
                manifests.names(draft.job.name).base, draft.job.uid, attempt)
        if draft.status.get("startTime") is None:
            draft.status["startTime"] = fmt_time(draft.now)
            deadline = draft.spec.runPolicy.activeDeadlineSeconds
            if deadline is not None:
                draft.decision.requeue(deadline)
        if not conflicts:
            draft.set(ConditionType.CREATED, "True", Reason.PODS_CREATED, f"attempt {attempt}: {len(expected)} pod(s)")
        if restarting:
            draft.set(ConditionType.RESTARTING, "False", Reason.PODS_RECREATED,
                      f"attempt {attempt} started after {attempt} restart(s)")
        draft.current += [PodInfo(name=n, attempt=attempt, owner_uid=draft.job.uid, synthetic=True) for n in missing]
    elif not missing and not conflicts and draft.current:
        if not draft.is_true(ConditionType.CREATED):
            draft.set(ConditionType.CREATED, "True", Reason.PODS_CREATED, f"attempt {attempt}: {len(expected)} pod(s)")
        if restarting:
            draft.set(ConditionType.RESTARTING, "False", Reason.PODS_RECREATED,
                      f"attempt {attempt} started after {attempt} restart(s)")
    return False


def phase_from_pods(draft: Draft) -> bool:
    """Succeeded when every trainer pod succeeded, Running when every pod runs, else Pending (and why)."""
    status, current, attempt, nodes = draft.status, draft.current, draft.pods.attempt, draft.nodes
    trainers = [p for p in current if p.role == ROLE_TRAINER]
    if len(trainers) >= nodes and all(p.phase == PodPhase.SUCCEEDED for p in trainers):
        status["phase"] = Phase.SUCCEEDED
        status["completionTime"] = fmt_time(draft.now)
        status["message"] = f"all {nodes} node(s) succeeded after {attempt} restart(s)"
        for p in trainers:  # the rank-0 pod's final record: where training really ended
            final = progress.from_result_message(p.message, status.get("progress"), draft.now.timestamp())
            if final is not None:
                status["progress"] = final
                break
        draft.set(ConditionType.SUCCEEDED, "True", Reason.ALL_NODES_SUCCEEDED, status["message"])
        draft.clear(ConditionType.RUNNING, Reason.COMPLETED, "the job completed")
        draft.clear(ConditionType.QUEUED, Reason.COMPLETED, "the job completed")
        draft.clear(ConditionType.UNSCHEDULABLE, Reason.COMPLETED, "the job completed")
        draft.decision.delete_pods += [p.name for p in current if p.role != ROLE_TRAINER and p.live]
        ttl = draft.spec.runPolicy.ttlSecondsAfterFinished
        if ttl is not None:
            draft.decision.requeue(ttl)
        return True
    observed = {p.name for p in draft.pods.current}
    all_present = all(n in observed for n in draft.expected) and len(current) >= len(draft.expected)
    all_running = all_present and all(p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) and p.live for p in current)
    unschedulable = [p for p in current if p.unschedulable]
    if unschedulable:
        p = unschedulable[0]
        draft.set(ConditionType.UNSCHEDULABLE, "True", Reason.UNSCHEDULABLE,
                  f"{len(unschedulable)} pod(s) unschedulable; {p.name}: {p.unschedulable}")
    else:
        draft.clear(ConditionType.UNSCHEDULABLE, Reason.SCHEDULED, "all pods are scheduled")
    gated = gang.queued(current) if draft.mode == gang.KUEUE else []
    if gated:
        draft.set(ConditionType.QUEUED, "True", Reason.WAITING_FOR_KUEUE,
                  f"{len(gated)} pod(s) wait for Kueue to admit their pod group (queue "
                  f"{podgroup.kueue_queue(draft.job.result.job)})")  # type: ignore[arg-type]
    else:
        draft.clear(ConditionType.QUEUED, Reason.ADMITTED, "Kueue admitted the pod group")
    if all_running:
        status["phase"] = Phase.RUNNING
        status["message"] = f"{nodes} node(s) running (attempt {attempt})"
        draft.set(ConditionType.RUNNING, "True", Reason.ALL_NODES_RUNNING, status["message"])
    else:
        status["phase"] = Phase.PENDING
        waiting = [p for p in current if p.waiting]
        running = sum(1 for p in current if p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED))
        message = f"{running}/{len(draft.expected)} pod(s) running (attempt {attempt})"
        if unschedulable:
            message += f"; unschedulable: {unschedulable[0].unschedulable}"
        elif gated:
            message += "; queued: waiting for Kueue to admit the pod group"
        elif waiting:
            message += f"; {waiting[0].name}: {waiting[0].waiting}"
        status["message"] = message
        if waiting and not unschedulable:
            # The kubelet's own reason (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, CreateContainerConfigError…)
            # as the Running condition's: a job whose image cannot be pulled says so, instead of an endless Pending.
            reason = (waiting[0].waiting or "").split(":", 1)[0].strip() or Reason.PODS_NOT_RUNNING
            previous = get_condition(draft.conditions, ConditionType.RUNNING) or {}
            if previous.get("reason") != reason:
                draft.decision.events.append(JobEvent("Warning", reason, message))
            draft.set(ConditionType.RUNNING, "False", reason, message)
        elif draft.is_true(ConditionType.RUNNING):
            draft.set(ConditionType.RUNNING, "False", Reason.PODS_NOT_RUNNING, message)
    if any(p.synthetic for p in current):
        draft.decision.requeue(draft.policy.expectation_ttl)
    return True


# ---------------------------------------------------------------------------------------------- after every pass
def _transition_events(old: Mapping[str, Any], new: Mapping[str, Any], decision: Decision) -> None:
    old_phase, new_phase = old.get("phase"), new.get("phase")
    if new_phase != old_phase and new_phase is not None:
        kind = "Warning" if new_phase in (Phase.FAILED, Phase.REJECTED, Phase.RESTARTING) else "Normal"
        decision.events.append(JobEvent(kind, str(new_phase), new.get("message") or str(new_phase)))
    old_c = {c.get("type"): c for c in old.get("conditions") or []}
    for c in new.get("conditions") or []:
        o = old_c.get(c["type"])
        if c["type"] == ConditionType.UNSCHEDULABLE and c["status"] == "True" and (o is None or o.get("status") != "True"):
            decision.events.append(JobEvent("Warning", Reason.UNSCHEDULABLE, c.get("message", "")))
        if c["type"] == ConditionType.CREATED and c["status"] == "False" and c.get("reason") == Reason.CHILD_CONFLICT and (
                o is None or o.get("message") != c.get("message")):
            decision.events.append(JobEvent("Warning", Reason.CHILD_CONFLICT, c.get("message", "")))


def force_stuck(pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy, decision: Decision) -> None:
    """Pods still terminating `policy.force_delete_after` seconds past their deletionTimestamp are force-deleted
    (their node's kubelet is gone: they would block the gang restart forever); the others are waited for."""
    if policy.force_delete_after is None:
        return
    for p in pods:
        if not p.deleting or p.deletion_due is None or p.synthetic:
            continue
        if p.gang.kueue_group and gang.kueue_inactive(p):
            continue  # held by Kueue's finalizer until its replacement exists, not by a lost kubelet
        late = (now - p.deletion_due).total_seconds()
        if late >= policy.force_delete_after:
            decision.force_delete_pods.append((p.name, f"pod {p.name} was still terminating {late:.0f}s after its "
                                                       f"grace period ended (its node is unreachable?); force-deleted "
                                                       f"so the job can go on"))
        else:
            decision.requeue(policy.force_delete_after - late)


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The merge patch that turns `old` status into `new` (None when they are equal)."""
    patch: dict[str, Any] = {}
    for k, v in new.items():
        if old.get(k) != v:
            patch[k] = v
    for k in old:
        if k not in new:
            patch[k] = None
    return patch or None
