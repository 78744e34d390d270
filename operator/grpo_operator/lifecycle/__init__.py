"""Pure lifecycle decisions: (job, observed pods, now) → status, actions, events.

    decision     decide(): the table of contents, the steps in order (room for the planned ones)
    draft        Draft (what the steps share), Decision, JobView, ValidJob, Policy
    gangs        the gang schedulers (one unit each, one registry): the policy hooks the steps call
    validity     reject_invalid
    terminal     fail, keep_terminal, enforce_deadline
    suspend      suspend, resume
    restart      adopt_newest_attempt, delete_other_attempts, restart_or_fail, wait_for_previous_attempt
    staging      stage (spec.cache: the download pod before the trainers), decide_staging
    create       note_conflicts, create_pods
    phase        phase_from_pods
    finish       after every pass: the status, transition Events, force-deleting stuck pods; status_patch
    pods        PodInfo (a pod's summary), classify (what a failure means), PodSets (pods sorted once)
    conditions  status.conditions[] and time stamps
    progress    live training progress from the trainers' metrics text and final record

Pure: the clock is passed in. May import api, rules, render's names and the standard library; nothing from
controller, webhook, cli, kopf or kubernetes.
"""

from .conditions import clear_condition, fmt_time, get_condition, is_true, now_utc, parse_time, set_condition
from .decision import STEPS, decide
from .draft import Decision, Draft, JobEvent, JobView, Policy, ValidJob, backoff_seconds, clean_status
from .finish import force_stuck, status_patch
from .gangs import GangPolicy
from .pods import (
                       NODE_LOST_REASONS,
                       OWNER_KIND,
                       RETRYABLE_POD_REASONS,
                       ROLE_INITIALIZER,
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
from .validity import BATCH_KEYS

__all__ = [
    "BATCH_KEYS", "STEPS", "Decision", "Draft", "JobEvent", "JobView", "Policy", "ValidJob", "backoff_seconds",
    "clean_status", "decide", "force_stuck", "status_patch", "GangPolicy",
    "NODE_LOST_REASONS", "OWNER_KIND", "RETRYABLE_POD_REASONS", "ROLE_INITIALIZER", "ROLE_TRAINER", "ROLE_VLLM", "Failure",
    "PodInfo", "PodPhase", "PodSets", "as_int", "classify", "summarize_pod",
    "clear_condition", "fmt_time", "get_condition", "is_true", "now_utc", "parse_time", "set_condition",
]
