"""Prometheus metrics of a training run, served over HTTP by the process with LOCAL_RANK 0 on each node.

The operator scrapes `http://<podIP>:<metricsPort>/metrics` of the job's pods and writes `status.progress`; the
same endpoint serves Prometheus (the chart's PodMonitor). The trainer needs no Kubernetes credentials for this.

c10d does not make node 0 hold global rank 0, so every node's local rank 0 serves, and exactly one of them (the
process that is global rank 0) says `grpo_trainer_global_rank0 1` and carries the training gauges; the others
serve only `grpo_trainer_global_rank0 0` and `grpo_trainer_info`. Gauges not yet known are NaN (no sample is
better than a fake 0). See docs/observability.md.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from typing import Any, Optional

NAN = float("nan")

# gauge name (without the grpo_trainer_ prefix) -> (progress record field, help)
GAUGES = {
    "step": ("step", "Optimizer steps done (global_step); continues from the checkpoint after a gang restart."),
    "max_steps": ("maxSteps", "Total optimizer steps of the run."),
    "reward_mean": ("reward", "Mean total (weighted) reward at the last logging step."),
    "reward_std": ("rewardStd", "Standard deviation of the total reward at the last logging step."),
    "kl": ("kl", "Mean KL divergence to the reference model (NaN when beta is 0: TRL does not compute it)."),
    "completion_length_mean": ("completionLength", "Mean completion length in tokens."),
    "learning_rate": ("learningRate", "Learning rate at the last logging step."),
    "loss": ("loss", "Training loss at the last logging step."),
    "epoch": ("epoch", "Fractional epoch."),
    "tokens_per_second": ("tokensPerSecond", "Input tokens processed per second (recent logging steps)."),
    "eta_seconds": ("etaSeconds", "Estimated seconds until max_steps, from the recent step rate."),
    "last_log_timestamp_seconds": ("timestamp", "Unix time of the last logging step."),
}


def finite(value: Any) -> Optional[float]:
    """A float, or None for anything non-numeric, NaN or infinite (logs and gauges both use this)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class TrainerMetrics:
    """One registry per process; `serve()` on local rank 0, `update()` on global rank 0."""

    def __init__(self, *, global_rank0: bool, job: str = "", namespace: str = "", attempt: str = "",
                 pod: str = "", node_rank: str = ""):
        from prometheus_client import CollectorRegistry, Gauge, Info

        self.registry = CollectorRegistry(auto_describe=True)
        self.global_rank0 = global_rank0
        self.port: Optional[int] = None
        Gauge("grpo_trainer_global_rank0", "1 on the process that is global rank 0 (it carries the training gauges), "
              "0 on the other nodes' local rank 0.", registry=self.registry).set(1 if global_rank0 else 0)
        # Not `job`/`namespace`/`pod`: Prometheus sets those as target labels and would rename ours exported_*.
        Info("grpo_trainer", "The GRPOJob this trainer process belongs to.", registry=self.registry).info(
            {"grpojob": job, "grpojob_namespace": namespace, "attempt": attempt, "node_rank": node_rank,
             "pod_name": pod})
        self.gauges: dict[str, Any] = {}
        self.reward_mean = self.reward_std = None
        if global_rank0:
            for name, (_field, doc) in GAUGES.items():
                g = Gauge(f"grpo_trainer_{name}", doc, registry=self.registry)
                g.set(NAN)
                self.gauges[name] = g
            self.reward_mean = Gauge("grpo_trainer_reward_function_mean", "Mean of one reward function (unweighted) "
                                     "at the last logging step.", ["reward"], registry=self.registry)
            self.reward_std = Gauge("grpo_trainer_reward_function_std", "Standard deviation of one reward function "
                                    "at the last logging step.", ["reward"], registry=self.registry)

    @classmethod
    def from_env(cls, job: str = "", namespace: str = "") -> TrainerMetrics:
        e = os.environ
        return cls(global_rank0=int(e.get("RANK", "0")) == 0, job=job, namespace=namespace or e.get("POD_NAMESPACE", ""),
                   attempt=e.get("GRPO_ATTEMPT", ""), pod=e.get("POD_NAME", ""), node_rank=e.get("GRPO_NODE_RANK", ""))

    # ------------------------------------------------------------------ HTTP
    def serve(self, port: int, addr: Optional[str] = None) -> bool:
        """Serve /metrics on `port` (all interfaces: the pod IP). A busy port is a warning, never a failure."""
        from prometheus_client import start_http_server

        addrs = [addr] if addr else ["::", "0.0.0.0"]  # "::" also accepts IPv4 where the kernel allows dual stack
        last: Optional[Exception] = None
        for a in addrs:
            try:
                start_http_server(port, addr=a, registry=self.registry)
                self.port = port
                return True
            except OSError as e:  # no IPv6 in this network namespace, or the port is taken
                last = e
        sys.stderr.write(f"grpo_trainer: warning: cannot serve metrics on port {port} ({last}); training goes on "
                         "without them\n")
        return False

    # ------------------------------------------------------------------ values
    def begin(self, step: int, max_steps: int) -> None:
        if not self.global_rank0:
            return
        self.gauges["step"].set(step)
        self.gauges["max_steps"].set(max_steps)

    def update(self, record: Mapping[str, Any]) -> None:
        """Set the gauges from a progress record (progress.ProgressCallback's JSON line); None → NaN."""
        if not self.global_rank0:
            return
        for name, (field, _doc) in GAUGES.items():
            value = finite(record.get(field))
            self.gauges[name].set(NAN if value is None else value)
        for label, value in (record.get("rewards") or {}).items():
            v = finite(value)
            self.reward_mean.labels(reward=label).set(NAN if v is None else v)  # type: ignore[union-attr]
        for label, value in (record.get("rewardStds") or {}).items():
            v = finite(value)
            self.reward_std.labels(reward=label).set(NAN if v is None else v)  # type: ignore[union-attr]

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def start(metrics_port: int, job: str = "", namespace: str = "") -> Optional[TrainerMetrics]:
    """The metrics of this process: None unless a port is configured; served only by LOCAL_RANK 0."""
    if not metrics_port:
        return None
    m = TrainerMetrics.from_env(job, namespace)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        m.serve(metrics_port)
    return m

