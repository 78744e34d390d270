"""Pure lifecycle decisions: (job, observed pods, now) → status, actions, events.

    decision    decide(): a table of contents of named steps over one Draft; Decision, JobView, Policy
    pods        PodInfo (a pod's summary), classify (what a failure means), PodSets (pods sorted once)
    conditions  status.conditions[] and time stamps
    progress    live training progress from the trainers' metrics text and final record

Pure: the clock is passed in. May import api, rules, render's names and the standard library; nothing from
controller, webhook, cli, kopf or kubernetes.
"""

from .conditions import clear_condition, fmt_time, get_condition, is_true, now_utc, parse_time, set_condition
from .decision import (
                       BATCH_KEYS,
                       Decision,
                       Draft,
                       JobEvent,
                       JobView,
                       Policy,
                       backoff_seconds,
                       clean_status,
                       decide,
                       expected_pod_names,
                       force_stuck,
                       status_patch,
                       topology_string,
)
from .pods import (
                       NODE_LOST_REASONS,
                       OWNER_KIND,
                       RETRYABLE_POD_REASONS,
                       ROLE_TRAINER,
                       ROLE_VLLM,
                       Failure,
                       PodInfo,
                       PodPhase,
                       PodSets,
                       as_int,
                       classify,
                       summarize_pod,
)

__all__ = [
    "BATCH_KEYS", "Decision", "Draft", "JobEvent", "JobView", "Policy", "backoff_seconds", "clean_status", "decide",
    "expected_pod_names", "force_stuck", "status_patch", "topology_string",
    "NODE_LOST_REASONS", "OWNER_KIND", "RETRYABLE_POD_REASONS", "ROLE_TRAINER", "ROLE_VLLM", "Failure", "PodInfo",
    "PodPhase", "PodSets", "as_int", "classify", "summarize_pod",
    "clear_condition", "fmt_time", "get_condition", "is_true", "now_utc", "parse_time", "set_condition",
]
