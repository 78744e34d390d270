"""The vocabulary of GRPOJob status, defined once: phases, condition types and condition reasons.

lifecycle writes them, the controller and the client read them, the CRD's schema and the docs list them
(tests/unit/test_docs.py checks the docs). Members are `str`s, so a status read from the API server compares equal
to them and they serialise as their value.
"""

from __future__ import annotations

from enum import StrEnum


class _Str(StrEnum):
    def __str__(self) -> str:  # the value, as str() of a plain string (not 'Phase.RUNNING')
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


class Phase(_Str):
    """status.phase."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    REJECTED = "Rejected"


TERMINAL = (Phase.SUCCEEDED, Phase.FAILED)


# status.conditions[].type: one per phase but Pending, plus Created (the pods exist), Unschedulable, Queued (Kueue
# holds the pods at its admission gate, docs/scheduling.md) and the conditions below
# (tests/unit/api/test_vocabulary.py: no condition type or reason is defined anywhere else)
class ConditionType(_Str):
    """status.conditions[].type (tests/unit/api checks one per phase but Pending)."""

    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    REJECTED = "Rejected"
    UNSCHEDULABLE = "Unschedulable"
    QUEUED = "Queued"
    # a job that started under earlier rules and that today's rules refuse (an upgrade tightened one): it keeps
    # running, this condition names the rule (lifecycle/validity.py)
    SPEC_INVALID = "SpecInvalid"
    # the API server refused a create of the job's objects (quota, PodSecurity, a webhook…): the server's message,
    # retried with backoff, False once nothing is left to create (lifecycle/create.py refused_creates)
    CREATE_FAILED = "CreateFailed"
    # no step past the job's stall deadline, or one rank's heartbeat frozen (lifecycle/stall.py); the reason names the
    # phase it hung in (StallReason), False once steps move again
    STALLED = "Stalled"
    # spec.cache: True once the download pod staged the model and dataset into the cache (lifecycle/staging.py);
    # False, reason Staging or StagingRetry, while it downloads
    STAGED = "Staged"


class Reason(_Str):
    """status.conditions[].reason (and Event reasons) the lifecycle sets itself. A failure's reason
    (status.lastFailureReason) is one of the failure reasons below, a trainer exit code by name
    (grpo_trainer.contract.EXIT_REASONS, e.g. DatasetError), a signal that killed the pod (signal_reason), or the pod's
    own reason (Evicted, ...)."""

    # Rejected
    INVALID_SPEC = "InvalidSpec"
    SPEC_VALID = "SpecValid"
    # Suspended
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    # Created / Restarting
    PODS_CREATED = "PodsCreated"
    PODS_RECREATED = "PodsRecreated"
    CHILD_CONFLICT = "ChildConflict"
    FAILED_CREATE = "FailedCreate"
    # Running / Unschedulable / Succeeded
    ALL_NODES_RUNNING = "AllNodesRunning"
    PODS_NOT_RUNNING = "PodsNotRunning"
    UNSCHEDULABLE = "Unschedulable"
    SCHEDULED = "Scheduled"
    ALL_NODES_SUCCEEDED = "AllNodesSucceeded"
    COMPLETED = "Completed"
    # Failed (the job) and failures (a pod)
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    NODE_LOST = "NodeLost"
    POD_DELETED = "PodDeleted"
    POD_FAILED = "PodFailed"
    OOM_KILLED = "OOMKilled"
    # Queued (Kueue) and a gang restart Kueue caused
    WAITING_FOR_KUEUE = "WaitingForKueue"
    ADMITTED = "Admitted"
    EVICTED_BY_KUEUE = "EvictedByKueue"
    # Stalled=False; a stall as a failure (status.lastFailureReason, Restarting) and its Warning Event
    PROGRESSING = "Progressing"
    STALLED = "Stalled"
    # an in-place gang restart (runPolicy.restartPolicy InPlace): the Event's reason
    RESTARTED_IN_PLACE = "RestartedInPlace"
    # spec.cache, the Staged condition (and its Events; a failed download's reason is the pod's): the download pod
    # runs, it succeeded, a retryable failure waits for its backoff. NotNeeded: staging's decision for a job with
    # nothing to download (it sets no condition)
    STAGING = "Staging"
    STAGED = "Staged"
    STAGING_RETRY = "StagingRetry"
    NOT_NEEDED = "NotNeeded"
    # vLLM server mode (lifecycle/server/order.py): the Running condition while the trainers wait for the server, the
    # server's failures (status.lastFailureReason), a kept server's engine probe and its replacement (an Event too)
    WAITING_FOR_VLLM_SERVER = "WaitingForVllmServer"
    VLLM_SERVER_STARTUP_TIMEOUT = "VllmServerStartupTimeout"
    VLLM_SERVER_FAILED = "VllmServerFailed"
    VLLM_SERVER_WEDGED = "VllmServerWedged"
    VLLM_SERVER_KEPT = "VllmServerKept"
    # Events only
    TTL_EXPIRED = "TTLExpired"
    FORCE_DELETED = "ForceDeleted"
    POD_GROUP_NOT_CREATED = "PodGroupNotCreated"  # the gang scheduler's PodGroup CRD is missing or not granted


def signal_reason(signal: int) -> str:
    """A failure's reason when a signal killed the pod's container (the kubelet's terminated.signal): Signal<N>."""
    return f"Signal{signal}"


def listing(values: type[_Str]) -> str:
    """'A, B, C or D': the members of an enum, for descriptions and docs."""
    names = [v.value for v in values]
    return ", ".join(names[:-1]) + " or " + names[-1]


class StallReason(_Str):
    """The Stalled condition's reason: the phase the stuck rank was in (grpo_trainer.contract.PHASES), or what failed."""

    LOADING = "Loading"
    GENERATING = "Generating"
    REWARDS = "Rewards"
    TRAINING = "Training"
    SAVING = "Saving"
    WEIGHT_SYNC = "WeightSync"
    EVALUATING = "Evaluating"
    DONE = "Done"
    METRICS_UNANSWERED = "MetricsUnanswered"  # a running trainer pod's metrics endpoint stopped answering
    UNKNOWN_PHASE = "UnknownPhase"  # an image that publishes no phases
