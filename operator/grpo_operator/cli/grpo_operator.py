"""`grpo-operator`: run the controller (and optionally the admission webhook) against $KUBECONFIG or in-cluster.

    grpo-operator --namespace default --webhook-listen 127.0.0.1:9443 --webhook-manage

Flags (fixed: docs/operator.md lists them) override the environment the Helm chart sets (GRPO_NAMESPACES,
GRPO_ALL_NAMESPACES, GRPO_TRAINER_IMAGE, GRPO_WEBHOOK_*, GRPO_LIVENESS, GRPO_LOG_FORMAT=json, …).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import sys
from collections.abc import Sequence
from typing import Any, Optional

# kopf imports the official `kubernetes` client, when installed, only to recognise its model objects in handler
# results (ours return plain dicts) and to offer a login through it (ours is kopf's own). Importing it costs this
# long-running process ~11 MB of RSS and ~0.5 s of start-up, for nothing: make those imports fail here, before kopf.
for _client in ("kubernetes", "kubernetes_asyncio", "pykube"):
    sys.modules.setdefault(_client, None)  # type: ignore[arg-type]

from ..controller import registration, settings  # noqa: E402 — after the block above


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


def parse_args(argv: Optional[Sequence[str]] = None) -> settings.Settings:
    """Flags over the environment, validated (controller/settings.py); exits 2 on a usage error."""
    return settings.parse(argv)


def run(cfg: settings.Settings, stop_flag: Optional[Any] = None, ready_flag: Optional[Any] = None) -> None:
    import kopf

    registry, kopf_settings, controller = registration.build(cfg)
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
        elected = None
        if cfg.leader_elect:  # the controller waits for the Lease (controller/ha.py); kopf serves the webhook now
            from ..controller import ha

            elected = await ha.start(cfg, controller.start_leading, registration._login)
        try:
            await kopf.operator(
                registry=registry, settings=kopf_settings, clusterwide=clusterwide,
                standalone=cfg.peering is None, peering_name=cfg.peering,
                namespaces=[] if clusterwide else cfg.namespaces, liveness_endpoint=cfg.liveness,
                stop_flag=stop_flag, ready_flag=ready_flag, memo=controller, priority=priority,
            )
        finally:
            if elected is not None:
                await ha.stop(*elected)
            if runner is not None:
                await runner.cleanup()

    try:
        loop.run_until_complete(operate())
    finally:
        loop.close()


# The cyclic GC's thresholds (CPython's default: 700, 10, 10). A full collection scans every live object — at 1000
# jobs the job cache, the parsed specs and the pod index, ~75 ms each — and with the default it ran 8 times in a burst
# of 1000 new jobs (0.6 s, a tenth of the operator's CPU; docs/performance.md). Collecting the young generation every
# 10,000 allocations instead of 700 costs as much in all (each object is scanned once there either way) and leaves
# it a few MB of short-lived cycles at most; gen 2 is looked at after 100 gen-1 collections instead of 10.
GC_THRESHOLDS = (10_000, 20, 100)

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
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0]
        return f"cannot use the Kubernetes credentials: {type(exc).__name__}: {first}"
    return NO_CREDENTIALS


def main(argv: Optional[Sequence[str]] = None) -> int:
    cfg = parse_args(argv)
    setup_logging(cfg.json_logs, cfg.log_level)
    logging.getLogger("grpo_operator").info(
        "grpo-operator starting: namespaces=%s webhook=%s manage=%s image=%s cpu-image=%s job-defaults=%s "
        "leader-elect=%s", "*" if cfg.all_namespaces else ",".join(cfg.namespaces), cfg.webhook_listen,
        cfg.webhook_manage, cfg.image, cfg.cpu_image, ",".join(sorted(cfg.limits.job_defaults)) or "none",
        cfg.leader_elect_lease if cfg.leader_elect else "off")
    # Everything imported so far lives forever: keep it out of the cyclic GC's full collections, which otherwise
    # re-scan the ~80k objects of kopf, pydantic, aiohttp and our modules every time the job cache grows.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    problem = credentials_problem()
    if problem:
        print(f"grpo-operator: error: {problem}", file=sys.stderr)
        return 1
    try:
        run(cfg)
    except Exception as exc:
        import kopf

        if not isinstance(exc, kopf.LoginError):
            raise
        print(f"grpo-operator: error: {NO_CREDENTIALS}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
