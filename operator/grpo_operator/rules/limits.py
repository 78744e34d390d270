"""A platform team's admission policy (pure): limits the operator is configured with (GRPO_MAX_NODES_PER_JOB, the
chart's policy.maxNodesPerJob) and its job defaults (the chart's jobDefaults: rules/defaults.py), applied by the one
validator behind the webhook and the operator. None is set by default. `grpojob check` does not know a cluster's
limits (the webhook is where they are enforced); it applies job defaults given with --defaults FILE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

MAX_NODES_ENV = "GRPO_MAX_NODES_PER_JOB"
MAX_NODES_VALUE = "policy.maxNodesPerJob"


@dataclass(frozen=True)
class Limits:
    max_nodes_per_job: Optional[int] = None  # None: no limit
    # a spec.template merged under every job's own (rules/defaults.py); checked when read (defaults.check)
    job_defaults: dict[str, Any] = field(default_factory=dict, hash=False)

    def problem(self) -> Optional[str]:
        """The first thing wrong with the limits themselves, naming the variable; None: fine."""
        if self.max_nodes_per_job is not None and self.max_nodes_per_job < 1:
            return f"{MAX_NODES_ENV} must be >= 1 (unset: no limit), got {self.max_nodes_per_job}"
        return None


NO_LIMITS = Limits()


def nodes_problem(nodes: int, limits: Limits) -> Optional[str]:
    """Why spec.nodes is over the limit, with the fix; None: within it."""
    cap = limits.max_nodes_per_job
    if cap is None or nodes <= cap:
        return None
    return (f"{nodes} nodes is more than this cluster allows per job: at most {cap} (the operator's "
            f"{MAX_NODES_VALUE}, set by your platform team); set spec.nodes to {cap} or fewer, or ask them to raise "
            "the limit")
