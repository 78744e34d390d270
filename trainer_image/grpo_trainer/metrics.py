"""Prometheus metrics of a training run, served over HTTP by the process with LOCAL_RANK 0 on each node.

The operator scrapes `http://<podIP>:<metricsPort>/metrics` of the job's pods and writes `status.progress`; the
same endpoint serves Prometheus (the chart's PodMonitor). The trainer needs no Kubernetes credentials for this.

c10d does not make node 0 hold global rank 0, so every node's local rank 0 serves, and exactly one of them (the
process that is global rank 0) says `grpo_trainer_global_rank0 1` and carries the training gauges; the others
serve only `grpo_trainer_global_rank0 0` and `grpo_trainer_info`. Gauges not yet known are NaN (no sample is
better than a fake 0). See docs/observability.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from .contract import ATTEMPT_ENV, IN_PLACE_RESTARTS_ENV, RANK_BEGAN_STEP, RANK_DOWNLOAD_BYTES, STACKS_PATH

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


def _number(text: str) -> float:
    """An integer from the environment, NaN when absent or not a number (no sample beats a fake 0)."""
    return float(text) if text.strip().isdigit() else NAN


class TrainerMetrics:
    """One registry per process; `serve()` on local rank 0, `update()` on global rank 0."""

    def __init__(self, *, global_rank0: bool, job: str = "", namespace: str = "", attempt: str = "",
                 pod: str = "", node_rank: str = "", in_place_restarts: str = ""):
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
        self.beat_directory = ""
        self.reward_mean = self.reward_std = None
        if global_rank0:
            for name, (_field, doc) in GAUGES.items():
                g = Gauge(f"grpo_trainer_{name}", doc, registry=self.registry)
                g.set(NAN)
                self.gauges[name] = g
            # the attempt and the gang's in-place restarts in it (launch.py): status.inPlaceRestarts counts these
            Gauge("grpo_trainer_attempt", "The GRPOJob attempt (pod generation) this process belongs to.",
                  registry=self.registry).set(_number(attempt))
            Gauge("grpo_trainer_in_place_restarts", "Times torchrun restarted this attempt's workers inside their pods "
                  "(runPolicy.restartPolicy InPlace).", registry=self.registry).set(_number(in_place_restarts))
            self.reward_mean = Gauge("grpo_trainer_reward_function_mean", "Mean of one reward function (unweighted) "
                                     "at the last logging step.", ["reward"], registry=self.registry)
            self.reward_std = Gauge("grpo_trainer_reward_function_std", "Standard deviation of one reward function "
                                    "at the last logging step.", ["reward"], registry=self.registry)

    @classmethod
    def from_env(cls, job: str = "", namespace: str = "") -> TrainerMetrics:
        e = os.environ
        return cls(global_rank0=int(e.get("RANK", "0")) == 0, job=job, namespace=namespace or e.get("POD_NAMESPACE", ""),
                   attempt=e.get(ATTEMPT_ENV, ""), pod=e.get("POD_NAME", ""), node_rank=e.get("GRPO_NODE_RANK", ""),
                   in_place_restarts=e.get(IN_PLACE_RESTARTS_ENV, ""))

    # ------------------------------------------------------------------ HTTP
    def serve(self, port: int, addr: Optional[str] = None) -> bool:
        """Serve /metrics on `port` (all interfaces: the pod IP). A busy port is a warning, never a failure."""
        addrs = [addr] if addr else ["::", "0.0.0.0"]  # "::" also accepts IPv4 where the kernel allows dual stack
        last: Optional[Exception] = None
        for a in addrs:
            try:
                _serve(port, a, self.app())
                self.port = port
                return True
            except OSError as e:  # no IPv6 in this network namespace, or the port is taken
                last = e
        sys.stderr.write(f"grpo_trainer: warning: cannot serve metrics on port {port} ({last}); training goes on "
                         "without them\n")
        return False

    def watch_ranks(self, directory: str) -> None:
        """Publish every local process's phase and heartbeat (phases.py's beat records in `directory`) at each scrape,
        and answer POST /stacks by dumping their stacks."""
        self.beat_directory = directory
        self.registry.register(RankCollector(directory))

    def app(self) -> Callable[..., Any]:
        """The WSGI app: /metrics (Prometheus), and POST /stacks when ranks are watched."""
        from prometheus_client import make_wsgi_app

        metrics_app = make_wsgi_app(self.registry)
        lock = threading.Lock()

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if environ.get("PATH_INFO") != STACKS_PATH or not self.beat_directory:
                return metrics_app(environ, start_response)
            if environ.get("REQUEST_METHOD") != "POST":
                start_response("405 Method Not Allowed", [("Allow", "POST")])
                return [b"POST only\n"]
            from . import phases

            with lock:  # one dump at a time; each writes only the pod's own stack files
                body = json.dumps({"ranks": phases.dump_all(self.beat_directory)}).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]

        return app

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


def _serve(port: int, addr: str, app: Callable[..., Any]) -> None:
    """prometheus_client's threading WSGI server (quiet handler, right address family) around our own app."""
    from wsgiref.simple_server import make_server

    from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

    class Server(ThreadingWSGIServer):
        pass

    Server.address_family, addr = _get_best_family(addr, port)
    httpd = make_server(addr, port, app, Server, handler_class=_SilentHandler)
    threading.Thread(target=httpd.serve_forever, name="grpo-metrics", daemon=True).start()


class RankCollector:
    """Every local process's beat record (phases.py) as gauges, read at scrape time, labelled by global rank."""

    def __init__(self, directory: str):
        self.directory = directory

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only (auto_describe would otherwise call collect() at registration)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from .phases import read_beats

        phase = GaugeMetricFamily("grpo_trainer_rank_phase", "1 for the phase a training process is in.",
                                  labels=["rank", "phase"])
        since = GaugeMetricFamily("grpo_trainer_rank_phase_since_timestamp_seconds",
                                  "Unix time the process entered its current phase.", labels=["rank"])
        beat = GaugeMetricFamily("grpo_trainer_rank_heartbeat_timestamp_seconds",
                                 "Unix time of the process's last heartbeat (a thread ticks it every few seconds).",
                                 labels=["rank"])
        step = GaugeMetricFamily("grpo_trainer_rank_step", "Optimizer steps the process finished.", labels=["rank"])
        began = GaugeMetricFamily(RANK_BEGAN_STEP, "The step the process began training at (0, or the checkpoint's "
                                  "it resumed from).", labels=["rank"])
        fetched = GaugeMetricFamily(RANK_DOWNLOAD_BYTES, "While the process loads: bytes in its Hub cache (a download "
                                    "in progress grows it).", labels=["rank"])
        seconds = CounterMetricFamily("grpo_trainer_phase_seconds", "Seconds the process spent in each phase.",
                                      labels=["rank", "phase"])
        for rec in read_beats(self.directory):
            rank = str(rec.get("rank"))
            phase.add_metric([rank, str(rec.get("phase"))], 1)
            for family, key in ((since, "since"), (beat, "heartbeat"), (step, "step"), (began, "began_step"),
                                (fetched, "download_bytes")):
                value = finite(rec.get(key))
                if value is not None:
                    family.add_metric([rank], value)
            for name, value in (rec.get("seconds") or {}).items():
                if finite(value) is not None:
                    seconds.add_metric([rank, str(name)], float(value))
        yield from (phase, since, beat, step, began, fetched, seconds)


def start(metrics_port: int, job: str = "", namespace: str = "", beat_directory: str = "") -> Optional[TrainerMetrics]:
    """The metrics of this process: None unless a port is configured; served only by LOCAL_RANK 0 (with every local
    process's phase and heartbeat from `beat_directory`)."""
    if not metrics_port:
        return None
    m = TrainerMetrics.from_env(job, namespace)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        if beat_directory:
            m.watch_ranks(beat_directory)
        m.serve(metrics_port)
    return m

