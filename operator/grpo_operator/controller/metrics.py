"""The operator's own Prometheus metrics: definitions, the job-phase collector and the HTTP endpoint.

The metrics are *updated* in the I/O layer only (controller/, the webhook server via count_review); the pure modules know
nothing of them. Served on `--metrics-listen ADDR:PORT` (env GRPO_METRICS_LISTEN) at /metrics from the operator's
event loop (aiohttp, no extra thread). docs/observability.md has a PromQL example for each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

log = logging.getLogger("grpo_operator.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

RECONCILE_DURATION = Histogram(
    "grpo_operator_reconcile_duration_seconds", "Duration of one reconcile pass of one GRPOJob (decide + writes).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY)
# One series per job the operator knows (removed when it forgets the job): how many passes it has decided and acted
# on, so a reader (a test, an alert) can tell "nothing happened" from "nothing has been looked at yet".
RECONCILE_PASSES = Counter("grpo_operator_reconcile_passes_total", "Reconcile passes of one GRPOJob that ran to "
                           "their end (decided, then wrote; a failed pass counts once its retry succeeds).",
                           ["namespace", "name"], registry=REGISTRY)
RECONCILE_ERRORS = Counter("grpo_operator_reconcile_errors_total", "Reconcile passes that failed (retried with backoff).",
                           registry=REGISTRY)
RESTARTS = Counter("grpo_operator_restarts_total", "Gang restarts decided, by the failure reason "
                   "(ExitCode143, OOMKilled, NodeLost, PodDeleted, Evicted, …).", ["reason"], registry=REGISTRY)
STATUS_WRITES = Counter("grpo_operator_status_writes_total", "GRPOJob status writes; progress=true when the write "
                        "carried a progress change.", ["progress"], registry=REGISTRY)
WEBHOOK_REQUESTS = Counter("grpo_operator_webhook_requests_total", "Admission reviews of GRPOJobs.",
                           ["operation", "allowed"], registry=REGISTRY)
WEBHOOK_DENIALS = Counter("grpo_operator_webhook_denials_total", "Denied admission reviews, by the first error's "
                          "field (e.g. spec.training.numGenerations).", ["reason"], registry=REGISTRY)
API_ERRORS = Counter("grpo_operator_api_errors_total", "Kubernetes API requests of the operator's own client that "
                     "failed, by verb and HTTP code (timeout/connection for no answer). kopf's watches are not "
                     "counted. 409 on create (AlreadyExists, idempotent creation) and 404 on delete are expected.",
                     ["verb", "code"], registry=REGISTRY)
EVENTS_DROPPED = Counter("grpo_operator_events_dropped_total", "Kubernetes Events not posted because the "
                         "background recorder's queue was full (the API server is slower than the jobs change).",
                         registry=REGISTRY)
PROGRESS_SCRAPES = Counter("grpo_operator_progress_scrapes_total", "Scrapes of trainer pods' /metrics: ok, timeout, "
                           "connection (refused/unreachable), http (non-200), parse (not Prometheus text); "
                           "no_rank0 counts job rounds where no pod said it is global rank 0.", ["result"],
                           registry=REGISTRY)

VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}
UNKNOWN_PHASE = "Unknown"


class JobsCollector:
    """grpo_operator_jobs{namespace,phase}: computed at scrape time from the operator's job cache."""

    def __init__(self, jobs: Callable[[], Iterable[Mapping[str, Any]]]):
        self.jobs = jobs

    def describe(self) -> list[Any]:
        return [GaugeMetricFamily("grpo_operator_jobs", "GRPOJobs known to this operator by namespace and phase.",
                                  labels=["namespace", "phase"])]

    def collect(self) -> Iterable[Any]:
        counts: dict[tuple[str, str], int] = {}
        for body in list(self.jobs()):
            meta = body.get("metadata") or {}
            phase = (body.get("status") or {}).get("phase") or UNKNOWN_PHASE
            k = (str(meta.get("namespace", "")), str(phase))
            counts[k] = counts.get(k, 0) + 1
        fam = GaugeMetricFamily("grpo_operator_jobs", "GRPOJobs known to this operator by namespace and phase.",
                                labels=["namespace", "phase"])
        for (ns, phase), n in sorted(counts.items()):
            fam.add_metric([ns, phase], n)
        yield fam


_jobs_collector: Optional[JobsCollector] = None


def track_jobs(jobs: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
    """(Re)point the jobs gauge at a job cache (one per process: the latest controller wins)."""
    global _jobs_collector
    if _jobs_collector is None:
        _jobs_collector = JobsCollector(jobs)
        REGISTRY.register(_jobs_collector)
    else:
        _jobs_collector.jobs = jobs


def forget_job(namespace: str, name: str) -> None:
    """Drop a job's per-job series (the job is gone)."""
    RECONCILE_PASSES.remove(namespace, name)


def api_error(method: str, code: Any) -> None:
    API_ERRORS.labels(verb=VERBS.get(method.upper(), method.lower()), code=str(code)).inc()


def text() -> bytes:
    return generate_latest(REGISTRY)


def count_review(operation: str, review: Any) -> None:
    """The webhook's on_review: one request, and a denial by its first offending field."""
    WEBHOOK_REQUESTS.labels(operation=operation, allowed="true" if review.allowed else "false").inc()
    if not review.allowed:
        WEBHOOK_DENIALS.labels(reason=review.reason or "unknown").inc()


def parse_listen(listen: str) -> tuple[str, int]:
    """'ADDR:PORT' (or ':PORT', '[::]:PORT') → (addr, port); the port must be 1–65535. Serves every listen flag."""
    addr, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address must be ADDR:PORT with a port 1–65535, got {listen!r}")
    return addr.strip("[]") or "0.0.0.0", int(port)


async def serve(listen: str) -> Any:
    """Start serving /metrics on the running loop; returns the aiohttp AppRunner (await runner.cleanup())."""
    from aiohttp import web

    async def handle(_request: Any) -> Any:
        return web.Response(body=text(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    addr, port = parse_listen(listen)
    site = web.TCPSite(runner, addr, port)
    await site.start()
    log.info("serving Prometheus metrics on http://%s:%d/metrics", addr, port)
    return runner
