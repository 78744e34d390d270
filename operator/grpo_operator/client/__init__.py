"""GRPOClient: submit, inspect, follow and steer GRPOJobs from Python, on the official `kubernetes` client.

    from grpo_operator.client import GRPOClient
    c = GRPOClient()                       # kube-config (KUBECONFIG, ~/.kube/config) or in-cluster
    job = c.create_job("job.yaml")         # validated locally with the webhook's validator first
    for line in c.get_job_logs(job.name, follow=True):   # re-attaches to the new pod after a gang restart
        print(line)

May import api, rules, render (names and labels of the children), the `kubernetes` client, yaml and the standard
library; never kopf, torch, lifecycle, controller, webhook or cli (`kubectl-grpo` in cli imports this).
State comes from the job's status.phase and conditions, which the operator writes; never guessed from pods.
"""

from .client import GRPOClient
from .dryrun import DryRunObject, DryRunReport
from .errors import (
    ApiError,
    ConfigError,
    GRPOClientError,
    InvalidJob,
    JobExists,
    JobFailed,
    JobNotFound,
    LogsUnavailable,
    UnreachableStatus,
    WaitTimeout,
)
from .history import History, Sample
from .types import PHASES, TERMINAL_PHASES, Condition, Event, Job, LogLine, NodePod, Progress

__all__ = [
    "GRPOClient", "Job", "NodePod", "Condition", "Progress", "Event", "LogLine", "History", "Sample", "PHASES", "TERMINAL_PHASES",
    "DryRunReport", "DryRunObject",
    "GRPOClientError", "ConfigError", "ApiError", "JobNotFound", "JobExists", "InvalidJob", "LogsUnavailable",
    "UnreachableStatus", "JobFailed", "WaitTimeout",
]
