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
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from .. import api
from ..render import manifests
from . import progress
from ..rules import validation

# ---------------------------------------------------------------------------------------------- constants
PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED, REJECTED = (
    "Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Rejected")
TERMINAL = (SUCCEEDED, FAILED)

# Condition types (status.conditions[].type)
C_CREATED, C_RUNNING, C_RESTARTING, C_SUCCEEDED, C_FAILED, C_SUSPENDED, C_REJECTED, C_UNSCHEDULABLE = (
    "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended", "Rejected", "Unschedulable")

ROLE_TRAINER = "trainer"
ROLE_VLLM = "vllm-server"

# Pod-level reasons (pod.status.reason) that mean "the node/infrastructure went away", all retryable.
NODE_LOST_REASONS = {"NodeLost", "Shutdown", "Terminated", "NodeShutdown"}
# Pod-level reasons of a Failed pod that say nothing about the trainer itself: retryable whatever the exit code.
RETRYABLE_POD_REASONS = {"Evicted", "Preempting", "DeadlineExceeded", "UnexpectedAdmissionError", "NodeAffinity",
                         "OutOfcpu", "OutOfmemory", "OutOfpods"}

OWNER_KIND = api.KIND


@dataclass(frozen=True)
class Policy:
    """Operator-wide knobs (from the environment), not part of the job's spec."""

    backoff_base: float = 10.0  # seconds before the first restart; doubles each restart
    backoff_cap: float = 300.0
    expectation_ttl: float = 30.0  # how long a pod we created may be missing from the watch cache
    # A pod still there this long after its deletionTimestamp (the end of its grace period) has no kubelet to
    # finish it: its node is lost. It is force-deleted (grace 0) so the gang can restart. None: never.
    force_delete_after: Optional[float] = 60.0


# ---------------------------------------------------------------------------------------------- time
def now_utc() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def fmt_time(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: Any) -> Optional[_dt.datetime]:
    if not isinstance(s, str) or not s:
        return None
    try:
        t = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t


# ---------------------------------------------------------------------------------------------- pods
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
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Unknown
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

    @property
    def started(self) -> bool:
        return self.phase in ("Running", "Succeeded", "Failed", "Unknown")


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
    rank_label = labels.get(manifests.LABEL_RANK)
    exit_code = sig = None
    reason = status.get("reason")
    message = status.get("message")
    creason = None
    waiting = None
    statuses = list(status.get("containerStatuses") or [])
    main = next((c for c in statuses if c.get("name") in ("trainer", "vllm")), statuses[0] if statuses else None)
    if main:
        state = main.get("state") or {}
        term = state.get("terminated")
        if term:
            exit_code = term.get("exitCode")
            sig = term.get("signal") or None
            creason = term.get("reason")
            if term.get("message") and not message:
                message = term.get("message")
        wait = state.get("waiting")
        if wait and wait.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            waiting = f"{wait.get('reason')}: {wait.get('message') or ''}".rstrip(": ")
    unsched = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            unsched = cond.get("message") or "Unschedulable"
    return PodInfo(
        name=meta.get("name", ""),
        uid=meta.get("uid"),
        role=labels.get(manifests.LABEL_ROLE, ROLE_TRAINER),
        rank=as_int(rank_label) if rank_label is not None else None,
        attempt=as_int(annotations.get(manifests.ANNOTATION_ATTEMPT), 0),
        owner_uid=owner_uid,
        owner_kind=owner_kind,
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=sig if isinstance(sig, int) else None,
        reason=reason,
        container_reason=creason,
        message=(message or None) and str(message)[:1024],
        unschedulable=unsched,
        waiting=waiting,
    )


@dataclass(frozen=True)
class Failure:
    retryable: bool
    reason: str  # CamelCase, for status.lastFailureReason and conditions
    message: str


def classify(pod: PodInfo) -> Optional[Failure]:
    """None for a pod that has not failed; otherwise whether the failure is worth a gang restart."""
    if pod.phase == "Unknown" or (pod.reason in NODE_LOST_REASONS and pod.phase != "Succeeded"):
        return Failure(True, "NodeLost", f"pod {pod.name}: node lost ({pod.reason or 'phase Unknown'})")
    if pod.phase != "Failed":
        return None
    detail = f": {pod.message}" if pod.message else ""
    if pod.reason in RETRYABLE_POD_REASONS:
        return Failure(True, pod.reason, f"pod {pod.name} failed ({pod.reason}){detail}")
    if pod.container_reason == "OOMKilled":
        return Failure(True, "OOMKilled", f"pod {pod.name} was OOM-killed (exit {pod.exit_code}){detail}")
    if pod.signal:
        return Failure(True, f"Signal{pod.signal}", f"pod {pod.name} was killed by signal {pod.signal}{detail}")
    if pod.exit_code is not None:
        if pod.exit_code >= 128:
            return Failure(True, f"ExitCode{pod.exit_code}",
                           f"pod {pod.name} exited with code {pod.exit_code} (signal {pod.exit_code - 128}; retryable){detail}")
        if 1 <= pod.exit_code <= 127:
            return Failure(False, f"ExitCode{pod.exit_code}",
                           f"pod {pod.name} exited with code {pod.exit_code}: a permanent error (configuration, "
                           f"data, import or batch); not retried{detail}")
        if pod.exit_code < 0:
            return Failure(True, f"ExitCode{pod.exit_code}", f"pod {pod.name} exited with code {pod.exit_code}{detail}")
    reason = pod.reason or "PodFailed"
    return Failure(True, reason if reason[:1].isupper() else "PodFailed",
                   f"pod {pod.name} failed ({reason}){detail}")


def backoff_seconds(restarts: int, policy: Policy) -> float:
    """Delay before attempt `restarts` (≥1): base, 2·base, 4·base … capped."""
    if restarts <= 0:
        return 0.0
    return min(policy.backoff_base * (2 ** (restarts - 1)), policy.backoff_cap)


# ---------------------------------------------------------------------------------------------- conditions
def set_condition(conditions: list[dict[str, Any]], ctype: str, status: str, reason: str, message: str,
                  now: _dt.datetime, generation: Optional[int], *, force_transition: bool = False) -> None:
    """Upsert a condition in place; lastTransitionTime changes only when status changes (or forced)."""
    status = {True: "True", False: "False"}.get(status, status)  # type: ignore[call-overload]
    for cond in conditions:
        if cond.get("type") == ctype:
            if cond.get("status") != status or force_transition or not cond.get("lastTransitionTime"):
                cond["lastTransitionTime"] = fmt_time(now)
            cond["status"], cond["reason"], cond["message"] = status, reason, message
            if generation is not None:
                cond["observedGeneration"] = generation
            return
    cond = {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": fmt_time(now)}
    if generation is not None:
        cond["observedGeneration"] = generation
    conditions.append(cond)


def get_condition(conditions: Iterable[Mapping[str, Any]], ctype: str) -> Optional[Mapping[str, Any]]:
    return next((c for c in conditions if c.get("type") == ctype), None)


def is_true(conditions: Iterable[Mapping[str, Any]], ctype: str) -> bool:
    c = get_condition(conditions, ctype)
    return bool(c and c.get("status") == "True")


def clear_condition(conditions: list[dict[str, Any]], ctype: str, reason: str, message: str,
                    now: _dt.datetime, generation: Optional[int]) -> None:
    """Set an existing condition to False (a missing one stays missing)."""
    if get_condition(conditions, ctype) is not None:
        set_condition(conditions, ctype, "False", reason, message, now, generation)


# ---------------------------------------------------------------------------------------------- decision
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
    def from_body(cls, body: Mapping[str, Any], result: Optional[validation.ValidationResult] = None) -> "JobView":
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


def expected_pod_names(job: api.GRPOJob, nodes: int) -> list[str]:
    n = manifests.names(job.metadata.name or "")
    out = [n.pod(r) for r in range(nodes)]
    if job.spec.vllm.mode == "server":
        out.append(n.vllm_pod(0))
    return out


def topology_string(topo: Any) -> str:
    if topo.gpu_resource:
        return f"{topo.nodes}x{topo.gpus_per_node}"
    return f"{topo.nodes}x{topo.nproc_per_node}cpu"


BATCH_KEYS = ("worldSize", "nprocPerNode", "generationBatchSize", "stepsPerGeneration", "promptsPerGeneration")


def clean_status(status: dict[str, Any]) -> dict[str, Any]:
    """Drop None values (the API server would drop them too, and we must compare like with like)."""
    return {k: v for k, v in status.items() if v is not None}


def _transition_events(old: Mapping[str, Any], new: Mapping[str, Any], dec: Decision) -> None:
    old_phase, new_phase = old.get("phase"), new.get("phase")
    if new_phase != old_phase and new_phase is not None:
        kind = "Warning" if new_phase in (FAILED, REJECTED, RESTARTING) else "Normal"
        dec.events.append(JobEvent(kind, new_phase, new.get("message") or new_phase))
    old_c = {c.get("type"): c for c in old.get("conditions") or []}
    for c in new.get("conditions") or []:
        o = old_c.get(c["type"])
        if c["type"] == C_UNSCHEDULABLE and c["status"] == "True" and (o is None or o.get("status") != "True"):
            dec.events.append(JobEvent("Warning", "Unschedulable", c.get("message", "")))
        if c["type"] == C_CREATED and c["status"] == "False" and c.get("reason") == "ChildConflict" and (
                o is None or o.get("message") != c.get("message")):
            dec.events.append(JobEvent("Warning", "ChildConflict", c.get("message", "")))


def force_stuck(pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy, dec: Decision) -> None:
    """Pods still terminating `policy.force_delete_after` seconds past their deletionTimestamp are force-deleted
    (their node's kubelet is gone: they would block the gang restart forever); the others are waited for."""
    if policy.force_delete_after is None:
        return
    for p in pods:
        if not p.deleting or p.deletion_due is None or p.synthetic:
            continue
        late = (now - p.deletion_due).total_seconds()
        if late >= policy.force_delete_after:
            dec.force_delete_pods.append((p.name, f"pod {p.name} was still terminating {late:.0f}s after its grace "
                                                  f"period ended (its node is unreachable?); force-deleted so the "
                                                  f"job can go on"))
        else:
            dec.requeue(policy.force_delete_after - late)


def decide(job: JobView, pods: Iterable[PodInfo], now: _dt.datetime, policy: Policy = Policy()) -> Decision:
    """The whole reconciliation: what the status should be and what to create/delete."""
    old = job.status
    if job.deleting:
        return Decision(status=None)
    st: dict[str, Any] = {k: v for k, v in old.items()}
    conds: list[dict[str, Any]] = [dict(c) for c in old.get("conditions") or [] if isinstance(c, dict) and c.get("type")]
    st["conditions"] = conds
    gen = job.generation
    st["observedGeneration"] = gen
    st["restarts"] = as_int(old.get("restarts"), 0)
    dec = Decision(status=st)
    pods = list(pods)
    ours = [p for p in pods if p.owner_uid == job.uid]
    # pods with our names but another owner: an older GRPOJob of the same name (its GC pending) → delete;
    # anything else is a conflict we must not touch
    foreign = [p for p in pods if p.owner_uid != job.uid]
    stale_incarnation = [p for p in foreign if p.owner_kind == OWNER_KIND and p.owner_uid]
    conflicts = [p for p in foreign if p not in stale_incarnation]
    dec.delete_pods += [p.name for p in stale_incarnation if not p.deleting]
    dec.conflicts = [p.name for p in conflicts]

    def finish() -> Decision:
        dec.status = clean_status(st)
        _transition_events(old, dec.status, dec)
        force_stuck(ours + stale_incarnation, now, policy, dec)
        return dec

    def delete_active(keep_succeeded: bool = False) -> None:
        for p in ours:
            if p.deleting or p.synthetic or p.name in dec.delete_pods:
                continue
            if p.phase in ("Succeeded", "Failed") and (keep_succeeded or p.role == ROLE_TRAINER):
                continue  # finished pods stay for their logs (GC'd with the job)
            dec.delete_pods.append(p.name)

    # ---- validation (the webhook may be off)
    res = job.result
    if not res.valid or res.job is None or res.topology is None:
        msg = res.summary() or "invalid GRPOJob"
        st["phase"] = REJECTED
        st["message"] = f"invalid spec: {msg}"
        set_condition(conds, C_REJECTED, "True", "InvalidSpec", msg, now, gen)
        delete_active()
        for p in ours:
            if p.name not in dec.delete_pods and not p.deleting and not p.synthetic:
                dec.delete_pods.append(p.name)
        return finish()
    if is_true(conds, C_REJECTED):
        set_condition(conds, C_REJECTED, "False", "SpecValid", "the spec is valid now", now, gen)
        if st.get("phase") == REJECTED:
            st["phase"] = None
    spec = res.job.spec
    topo = res.topology
    st["topology"] = topology_string(topo)
    if res.batch:
        st["batch"] = {k: res.batch[k] for k in BATCH_KEYS if k in res.batch}
    rp = spec.runPolicy
    phase = st.get("phase")

    # ---- terminal: keep it; clean up what still runs; TTL
    if phase in TERMINAL:
        delete_active(keep_succeeded=True)
        if rp.ttlSecondsAfterFinished is not None:
            done = parse_time(st.get("completionTime")) or now
            if st.get("completionTime") is None:
                st["completionTime"] = fmt_time(now)
            due = done + _dt.timedelta(seconds=rp.ttlSecondsAfterFinished)
            if now >= due:
                dec.delete_job = True
                dec.events.append(JobEvent("Normal", "TTLExpired",
                                           f"deleting the job {rp.ttlSecondsAfterFinished}s after it finished"))
            else:
                dec.requeue((due - now).total_seconds())
        return finish()

    def fail(reason: str, message: str) -> Decision:
        st["phase"] = FAILED
        st["message"] = message
        st["completionTime"] = fmt_time(now)
        set_condition(conds, C_FAILED, "True", reason, message, now, gen)
        clear_condition(conds, C_RUNNING, reason, "the job failed", now, gen)
        clear_condition(conds, C_RESTARTING, reason, "the job failed", now, gen)
        delete_active()
        if rp.ttlSecondsAfterFinished is not None:
            dec.requeue(rp.ttlSecondsAfterFinished)
        return finish()

    # ---- attempts: status.restarts is the current attempt; pods may prove a newer one (lost status write)
    restarts = st["restarts"]
    newest = max((p.attempt for p in ours), default=restarts)
    if newest > restarts:
        restarts = st["restarts"] = newest
    current = [p for p in ours if p.attempt == restarts]
    stale = [p for p in ours if p.attempt < restarts]

    # ---- suspend: no pods; the deadline clock restarts on resume
    if rp.suspend:
        delete_active()
        for p in ours:
            if p.name not in dec.delete_pods and not p.deleting and not p.synthetic:
                dec.delete_pods.append(p.name)
        st["phase"] = SUSPENDED
        st["message"] = "suspended: pods deleted; unsuspend to resume from the latest checkpoint"
        st["startTime"] = None
        set_condition(conds, C_SUSPENDED, "True", "Suspended", "runPolicy.suspend is true", now, gen)
        clear_condition(conds, C_RUNNING, "Suspended", "the job is suspended", now, gen)
        clear_condition(conds, C_UNSCHEDULABLE, "Suspended", "the job is suspended", now, gen)
        return finish()
    if is_true(conds, C_SUSPENDED) or phase == SUSPENDED:
        set_condition(conds, C_SUSPENDED, "False", "Resumed", "runPolicy.suspend is false", now, gen)
        phase = st["phase"] = PENDING
        st["message"] = "resumed"
        if any(p.deleting for p in ours):  # the suspended pods are still terminating: wait for them
            return finish()

    # ---- deadline
    start = parse_time(st.get("startTime"))
    if rp.activeDeadlineSeconds is not None and start is not None:
        due = start + _dt.timedelta(seconds=rp.activeDeadlineSeconds)
        if now >= due:
            return fail("DeadlineExceeded",
                        f"the job ran longer than runPolicy.activeDeadlineSeconds={rp.activeDeadlineSeconds}")
        dec.requeue((due - now).total_seconds())

    # ---- stale pods (a previous attempt) go first
    for p in stale:
        if not p.deleting and not p.synthetic and p.name not in dec.delete_pods:
            dec.delete_pods.append(p.name)

    expected = expected_pod_names(res.job, topo.nodes)
    by_name = {p.name: p for p in current}
    conflict_names = {p.name for p in conflicts}
    if conflict_names:
        msg = ("objects with this job's pod names exist but are not owned by it: "
               + ", ".join(sorted(conflict_names)) + "; delete or rename them")
        set_condition(conds, C_CREATED, "False", "ChildConflict", msg, now, gen)
    any_started = any(p.started for p in current)

    # ---- failures of the current attempt
    failures: list[Failure] = []
    for p in current:
        if p.synthetic:
            continue
        if p.deleting:
            # someone else deletes a pod of a running gang: the gang is broken. Before the gang ran (or
            # after a resume) a pod on its way out is waited for and then recreated under the same name.
            if phase == RUNNING and p.phase != "Succeeded":
                failures.append(Failure(True, "PodDeleted", f"pod {p.name} was deleted"))
            continue
        f = classify(p)
        if f is not None:
            if not f.retryable and p.role != ROLE_TRAINER:  # a vLLM server's exit code is not the trainer's contract
                f = Failure(True, f.reason, f.message + " (vLLM server: retried)")
            failures.append(f)
    if any_started and phase in (RUNNING, PENDING, None):
        for name in expected:
            if name not in by_name and name not in conflict_names:
                failures.append(Failure(True, "PodDeleted", f"pod {name} disappeared (deleted or its node was lost)"))
    permanent = [f for f in failures if not f.retryable]
    if permanent:
        f = permanent[0]
        st["lastFailureReason"] = f.reason
        return fail(f.reason, f.message)
    if failures:
        f = failures[0]
        st["lastFailureReason"] = f.reason
        if restarts >= rp.backoffLimit:
            return fail("BackoffLimitExceeded",
                        f"{f.message}; runPolicy.backoffLimit={rp.backoffLimit} restarts already used")
        restarts = st["restarts"] = restarts + 1
        st["phase"] = RESTARTING
        delay = backoff_seconds(restarts, policy)
        st["message"] = f"gang restart {restarts}/{rp.backoffLimit} in {delay:g}s: {f.message}"
        set_condition(conds, C_RESTARTING, "True", f.reason, st["message"], now, gen, force_transition=True)
        clear_condition(conds, C_RUNNING, f.reason, "restarting all nodes", now, gen)
        for p in ours:
            if not p.deleting and not p.synthetic and p.name not in dec.delete_pods:
                dec.delete_pods.append(p.name)
        dec.requeue(delay)
        return finish()

    # ---- (re)create: wait for stale pods to be gone and for the backoff
    if any(p.attempt < restarts for p in ours):
        if phase is None:
            st["phase"] = PENDING
        return finish()
    restarting = is_true(conds, C_RESTARTING)
    if restarting and not current:
        since = parse_time((get_condition(conds, C_RESTARTING) or {}).get("lastTransitionTime")) or now
        due = since + _dt.timedelta(seconds=backoff_seconds(restarts, policy))
        if now < due:
            st["phase"] = RESTARTING
            dec.requeue((due - now).total_seconds())
            return finish()
    missing = [n for n in expected if n not in by_name and n not in conflict_names]
    if missing and not any_started:
        dec.create_attempt = restarts
        dec.create_pods = missing
        if st.get("startTime") is None:
            st["startTime"] = fmt_time(now)
            if rp.activeDeadlineSeconds is not None:
                dec.requeue(rp.activeDeadlineSeconds)
        if not conflict_names:
            set_condition(conds, C_CREATED, "True", "PodsCreated",
                          f"attempt {restarts}: {len(expected)} pod(s)", now, gen)
        if restarting:
            set_condition(conds, C_RESTARTING, "False", "PodsRecreated",
                          f"attempt {restarts} started after {restarts} restart(s)", now, gen)
        current = current + [PodInfo(name=n, attempt=restarts, owner_uid=job.uid, synthetic=True) for n in missing]
    elif not missing and not conflict_names and current:
        if not is_true(conds, C_CREATED):
            set_condition(conds, C_CREATED, "True", "PodsCreated", f"attempt {restarts}: {len(expected)} pod(s)", now, gen)
        if restarting:
            set_condition(conds, C_RESTARTING, "False", "PodsRecreated",
                          f"attempt {restarts} started after {restarts} restart(s)", now, gen)

    # ---- phase from the pods of the current attempt
    trainers = [p for p in current if p.role == ROLE_TRAINER]
    vllm = [p for p in current if p.role != ROLE_TRAINER]
    n_trainers = topo.nodes
    if len(trainers) >= n_trainers and all(p.phase == "Succeeded" for p in trainers):
        st["phase"] = SUCCEEDED
        st["completionTime"] = fmt_time(now)
        st["message"] = f"all {n_trainers} node(s) succeeded after {restarts} restart(s)"
        for p in trainers:  # the rank-0 pod's final record: where training really ended
            final = progress.from_result_message(p.message, st.get("progress"), now.timestamp())
            if final is not None:
                st["progress"] = final
                break
        set_condition(conds, C_SUCCEEDED, "True", "AllNodesSucceeded", st["message"], now, gen)
        clear_condition(conds, C_RUNNING, "Completed", "the job completed", now, gen)
        clear_condition(conds, C_UNSCHEDULABLE, "Completed", "the job completed", now, gen)
        for p in vllm:
            if not p.deleting and not p.synthetic:
                dec.delete_pods.append(p.name)
        if rp.ttlSecondsAfterFinished is not None:
            dec.requeue(rp.ttlSecondsAfterFinished)
        return finish()
    all_present = all(n in by_name for n in expected) and len(current) >= len(expected)
    all_running = all_present and all(p.phase in ("Running", "Succeeded") and not p.synthetic and not p.deleting
                                      for p in current)
    unsched = [p for p in current if p.unschedulable]
    if unsched:
        p = unsched[0]
        set_condition(conds, C_UNSCHEDULABLE, "True", "Unschedulable",
                      f"{len(unsched)} pod(s) unschedulable; {p.name}: {p.unschedulable}", now, gen)
    else:
        clear_condition(conds, C_UNSCHEDULABLE, "Scheduled", "all pods are scheduled", now, gen)
    if all_running:
        st["phase"] = RUNNING
        st["message"] = f"{n_trainers} node(s) running (attempt {restarts})"
        set_condition(conds, C_RUNNING, "True", "AllNodesRunning", st["message"], now, gen)
    else:
        st["phase"] = PENDING
        waiting = [p for p in current if p.waiting]
        running = sum(1 for p in current if p.phase in ("Running", "Succeeded"))
        msg = f"{running}/{len(expected)} pod(s) running (attempt {restarts})"
        if unsched:
            msg += f"; unschedulable: {unsched[0].unschedulable}"
        elif waiting:
            msg += f"; {waiting[0].name}: {waiting[0].waiting}"
        st["message"] = msg
        if is_true(conds, C_RUNNING):
            set_condition(conds, C_RUNNING, "False", "PodsNotRunning", msg, now, gen)
    if any(p.synthetic for p in current):
        dec.requeue(policy.expectation_ttl)
    return finish()


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
