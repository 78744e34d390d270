"""Pure lifecycle decisions: (job, observed pods, now) → status, actions, events (decision), and live training
progress from the trainers' metrics text (progress).

Pure: the clock is passed in. May import api, rules, render's names and the standard library; nothing from
controller, webhook, cli, kopf or kubernetes.
"""

from .decision import (  # noqa: F401 — the package's public surface
    PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED, REJECTED, TERMINAL, C_CREATED, C_RUNNING,
    C_RESTARTING, C_SUCCEEDED, C_FAILED, C_SUSPENDED, C_REJECTED, C_UNSCHEDULABLE, ROLE_TRAINER, ROLE_VLLM,
    NODE_LOST_REASONS, RETRYABLE_POD_REASONS, OWNER_KIND, Policy, now_utc, fmt_time, parse_time, PodInfo, as_int,
    summarize_pod, Failure, classify, backoff_seconds, set_condition, get_condition, is_true, clear_condition,
    JobEvent, Decision, JobView, expected_pod_names, topology_string, BATCH_KEYS, clean_status, force_stuck,
    decide, status_patch,
)
