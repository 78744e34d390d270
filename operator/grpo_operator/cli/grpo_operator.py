"""`grpo-operator`: run the controller (and optionally the admission webhook) against $KUBECONFIG or in-cluster.

    grpo-operator --namespace default --webhook-listen 127.0.0.1:9443 --webhook-manage

Flags (fixed: docs/operator.md lists them) override the environment the Helm chart sets (GRPO_NAMESPACES,
GRPO_ALL_NAMESPACES, GRPO_TRAINER_IMAGE, GRPO_WEBHOOK_*, GRPO_LIVENESS, GRPO_LOG_FORMAT=json, …).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import sys
from typing import Any, Optional, Sequence

# kopf imports the official `kubernetes` client, when installed, only to recognise its model objects in handler
# results (ours return plain dicts) and to offer a login through it (ours is kopf's own). Importing it costs this
# long-running process ~11 MB of RSS and ~0.5 s of start-up, for nothing: make those imports fail here, before kopf.
for _client in ("kubernetes", "kubernetes_asyncio", "pykube"):
    sys.modules.setdefault(_client, None)  # type: ignore[arg-type]

from ..controller import handlers  # noqa: E402 — after the block above


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attr in ("k8s_ref", "k8s_skip"):  # kopf's object loggers attach the object reference
            if hasattr(record, attr) and attr == "k8s_ref":
                out["object"] = getattr(record, attr)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(json_logs: bool, level: str) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter() if json_logs else logging.Formatter(
        "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(h)
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # kopf logs every handler success per object at INFO: noise at 1000 jobs
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING)


def parse_args(argv: Optional[Sequence[str]] = None) -> handlers.Config:
    p = argparse.ArgumentParser(prog="grpo-operator", description="Kubernetes operator for GRPO post-training jobs.")
    try:
        cfg = handlers.Config.from_env()
    except ValueError as exc:
        p.error(f"environment: {exc}")  # exits 2 with the usage line, like a bad flag
    p.add_argument("--namespace", "-n", action="append", dest="namespaces", metavar="NS",
                   help="watch this namespace (repeatable; env GRPO_NAMESPACES, comma-separated)")
    p.add_argument("--all-namespaces", "-A", action="store_true", default=None, help="watch the whole cluster")
    p.add_argument("--webhook-listen", metavar="ADDR:PORT", help="serve the validating admission webhook (HTTPS) here")
    p.add_argument("--webhook-host", metavar="HOST", help="name/IP the API server dials (default: the listen address)")
    p.add_argument("--webhook-manage", action="store_true", default=None,
                   help="create/patch the ValidatingWebhookConfiguration (URL + caBundle) ourselves")
    p.add_argument("--webhook-cert-dir", metavar="DIR",
                   help="tls.crt/tls.key[/ca.crt] (e.g. from cert-manager); default: generate a CA and certificate")
    p.add_argument("--webhook-service", metavar="NS/NAME[:PORT]",
                   help="with --webhook-manage: register the webhook by this Service reference instead of a URL "
                        "(env GRPO_WEBHOOK_SERVICE; what in-cluster installs need)")
    p.add_argument("--liveness", metavar="URL", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--log-format", choices=["text", "json"], help="log format (env GRPO_LOG_FORMAT)")
    p.add_argument("--json-logs", action="store_true", default=None, help="same as --log-format=json")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING… (env GRPO_LOG_LEVEL)")
    p.add_argument("--trainer-image", help="default trainer image (env GRPO_TRAINER_IMAGE)")
    p.add_argument("--no-controller", action="store_true", help="serve only the webhook")
    p.add_argument("--peering", metavar="NAME", help="kopf peering object for HA (env GRPO_PEERING); default standalone")
    p.add_argument("--metrics-listen", metavar="ADDR:PORT",
                   help="serve the operator's Prometheus metrics at /metrics here (env GRPO_METRICS_LISTEN), "
                        "e.g. 0.0.0.0:8081")
    p.add_argument("--progress-interval", type=float, metavar="SECONDS",
                   help="scrape running trainers' metrics this often and write status.progress at most this often "
                        "per job (env GRPO_PROGRESS_INTERVAL_SECONDS, default 15; 0: no live progress)")
    p.add_argument("--trainer-metrics-port", type=int, metavar="PORT",
                   help="port of the trainer pods' /metrics for new jobs (env GRPO_TRAINER_METRICS_PORT, default "
                        "9400; 0: trainers serve no metrics)")
    a = p.parse_args(argv)
    if a.namespaces:
        cfg.namespaces = a.namespaces
    if a.all_namespaces:
        cfg.all_namespaces = True
    for attr in ("webhook_listen", "webhook_host", "webhook_cert_dir", "webhook_service", "liveness", "log_level"):
        if getattr(a, attr):
            setattr(cfg, attr, getattr(a, attr))
    if a.webhook_manage:
        cfg.webhook_manage = True
    if a.json_logs or a.log_format == "json":
        cfg.json_logs = True
    elif a.log_format == "text":
        cfg.json_logs = False
    if a.trainer_image:
        cfg.image = a.trainer_image
    if a.peering:
        cfg.peering = a.peering
    if a.no_controller:
        cfg.controller = False
    if a.metrics_listen:
        cfg.metrics_listen = a.metrics_listen
    if a.progress_interval is not None:
        cfg.progress_interval = a.progress_interval
    if a.trainer_metrics_port is not None:
        cfg.trainer_metrics_port = a.trainer_metrics_port
    if cfg.progress_interval < 0:
        p.error("--progress-interval must be >= 0")
    if not 0 <= cfg.trainer_metrics_port <= 65535:
        p.error("--trainer-metrics-port must be a port number (0: off)")
    if cfg.max_concurrent_writes < 1:  # 0 would let no write through, ever
        p.error(f"environment: GRPO_MAX_CONCURRENT_WRITES must be >= 1, got {cfg.max_concurrent_writes}")
    if cfg.resync_seconds <= 0:  # 0 would re-kick every job in a busy loop
        p.error(f"environment: GRPO_RESYNC_SECONDS must be > 0, got {cfg.resync_seconds:g}")
    from ..controller import metrics
    from ..webhook import server as webhook

    for flag, listen in (("--metrics-listen", cfg.metrics_listen), ("--webhook-listen", cfg.webhook_listen)):
        if listen:
            try:
                metrics.parse_listen(listen)
            except ValueError:
                p.error(f"{flag} must be ADDR:PORT (e.g. 0.0.0.0:8443), got {listen!r}")
    if cfg.webhook_service:
        try:
            webhook.parse_service(cfg.webhook_service)
        except ValueError as exc:
            p.error(f"--webhook-service: {exc}")
    if cfg.all_namespaces and cfg.namespaces:
        p.error("--all-namespaces and --namespace are mutually exclusive")
    if not cfg.all_namespaces and not cfg.namespaces:
        p.error("give --namespace NS (repeatable) or --all-namespaces")
    if cfg.webhook_manage and not cfg.webhook_listen:
        p.error("--webhook-manage needs --webhook-listen")
    return cfg


def run(cfg: handlers.Config, stop_flag: Optional[Any] = None, ready_flag: Optional[Any] = None) -> None:
    import kopf

    registry, settings, controller = handlers.build(cfg)
    clusterwide = cfg.all_namespaces
    # kopf pauses every peer of equal priority; a random one makes exactly one replica active.
    priority = random.SystemRandom().randint(1, 2**31) if cfg.peering else 0
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def operate() -> None:
        runner = None
        if cfg.metrics_listen:
            from ..controller import metrics

            runner = await metrics.serve(cfg.metrics_listen)
        try:
            await kopf.operator(
                registry=registry, settings=settings, clusterwide=clusterwide,
                standalone=cfg.peering is None, peering_name=cfg.peering,
                namespaces=[] if clusterwide else cfg.namespaces, liveness_endpoint=cfg.liveness,
                stop_flag=stop_flag, ready_flag=ready_flag, memo=controller, priority=priority,
            )
        finally:
            if runner is not None:
                await runner.cleanup()

    try:
        loop.run_until_complete(operate())
    finally:
        loop.close()


NO_CREDENTIALS = "no Kubernetes credentials: run in a pod with a service account, or set KUBECONFIG (or ~/.kube/config)"


def credentials_problem() -> Optional[str]:
    """Why the operator could not log in to Kubernetes (None: it can), checked before kopf starts so that the user
    gets one line instead of kopf's retries and tracebacks."""
    import kopf

    quiet = logging.getLogger("grpo_operator.login")
    try:
        settings = kopf.OperatorSettings()
        if (kopf.login_with_service_account(logger=quiet, settings=settings)
                or kopf.login_with_kubeconfig(logger=quiet, settings=settings)):
            return None
    except Exception as exc:  # noqa: BLE001 — a kubeconfig that exists but cannot be used
        first = (str(exc).splitlines() or [""])[0]
        return f"cannot use the Kubernetes credentials: {type(exc).__name__}: {first}"
    return NO_CREDENTIALS


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg = parse_args(argv)
    setup_logging(cfg.json_logs, cfg.log_level)
    logging.getLogger("grpo_operator").info(
        "grpo-operator starting: namespaces=%s webhook=%s manage=%s image=%s",
        "*" if cfg.all_namespaces else ",".join(cfg.namespaces), cfg.webhook_listen, cfg.webhook_manage, cfg.image)
    # Everything imported so far lives forever: keep it out of the cyclic GC's full collections, which otherwise
    # re-scan the ~80k objects of kopf, pydantic, aiohttp and our modules every time the job cache grows.
    gc.freeze()
    problem = credentials_problem()
    if problem:
        print(f"grpo-operator: error: {problem}", file=sys.stderr)
        return 1
    try:
        run(cfg)
    except Exception as exc:  # noqa: BLE001 — the operator's one exit path for what it cannot start with
        import kopf

        if not isinstance(exc, kopf.LoginError):
            raise
        print(f"grpo-operator: error: {NO_CREDENTIALS}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
