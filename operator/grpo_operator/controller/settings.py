"""The operator's settings, in one place: the environment the Helm chart sets (GRPO_*), the `grpo-operator` flags
(which win; the fixed set is in docs/operator.md) and their validation. A bad value is a usage error naming the
flag or variable (exit 2), checked before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import lifecycle
from ..lifecycle.stall_watch import StallPolicy
from ..render import manifests, netpol
from ..rules import defaults
from ..rules.limits import MAX_NODES_ENV, Limits
from ..webhook.server import parse_service
from .leader import Timing
from .metrics import parse_listen

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULT_LEASE_NAME = "grpo-operator"


@dataclass
class Settings:
    """Everything the operator process is told, from the environment (the chart) and flags (which win)."""


    namespaces: list[str] = field(default_factory=list)
    all_namespaces: bool = False
    image: str = manifests.DEFAULT_TRAINER_IMAGE  # pods with GPUs
    cpu_image: str = manifests.DEFAULT_CPU_TRAINER_IMAGE  # pods without
    resync_seconds: float = 60.0
    policy: lifecycle.Policy = field(default_factory=lifecycle.Policy)
    limits: Limits = field(default_factory=Limits)  # the platform team's admission policy (rules/limits.py)
    webhook_listen: Optional[str] = None
    webhook_host: Optional[str] = None
    webhook_manage: bool = False
    webhook_cert_dir: Optional[str] = None
    webhook_service: Optional[str] = None  # NAMESPACE/NAME[:PORT]: register by Service reference (in-cluster)
    webhook_config_name: str = "grpo-operator.grpo.dev"
    webhook_create: bool = True  # False (the chart): the configuration exists, the operator only patches it
    webhook_failure_policy: str = "Fail"  # the chart's webhook.failurePolicy: Ignore admits when no replica answers
    liveness: Optional[str] = None
    json_logs: bool = False
    log_level: str = "INFO"
    scanning: bool = True
    max_concurrent_writes: int = 32  # API requests in flight (and connections): 16 was as fast as 64 at 1000 jobs
    controller: bool = True  # False: webhook only
    peering: Optional[str] = None  # kopf peering object name (HA: one active replica); None: standalone
    progress_interval: float = 15.0  # seconds between progress scrapes, and the least between progress-only writes
    metrics_listen: Optional[str] = None  # ADDR:PORT of the operator's /metrics; None: off
    trainer_metrics_port: int = manifests.DEFAULT_METRICS_PORT  # rendered into new jobs' pods and config; 0: off
    leader_elect: bool = False  # HA through a coordination.k8s.io/v1 Lease (controller/leader.py)
    leader_elect_lease: Optional[str] = None  # NAMESPACE/NAME; default: our own namespace / grpo-operator
    leader_timing: Timing = field(default_factory=Timing)
    # A NetworkPolicy per job (render/netpol.py): off unless told (the chart turns it on: networkPolicy.perJob),
    # since an operator run outside the cluster is no pod a policy could admit.
    job_network_policy: bool = False
    operator_namespace: Optional[str] = None  # the operator pods' namespace; default: our own (own_namespace)
    operator_pod_labels: dict[str, str] = field(default_factory=dict)
    metrics_from: list[dict[str, Any]] = field(default_factory=list)  # NetworkPolicyPeers admitted to metrics

    def network_policy(self) -> Optional[netpol.Access]:
        """Who may reach a job's pods besides the job (render/netpol.py); None: no per-job NetworkPolicy."""
        if not self.job_network_policy:
            return None
        return netpol.Access(operator_namespace=self.operator_namespace or own_namespace(self),
                             operator_labels=dict(self.operator_pod_labels), metrics_from=tuple(self.metrics_from))

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Settings:
        e = os.environ if env is None else env

        def num(name: str, default: str, kind: type = float) -> Any:
            return env_number(name, e.get(name, default), kind)

        ns = [n.strip() for n in e.get("GRPO_NAMESPACES", "").replace(",", " ").split() if n.strip()]
        return cls(
            namespaces=ns,
            all_namespaces=e.get("GRPO_ALL_NAMESPACES", "") in ("1", "true", "yes"),
            image=e.get("GRPO_TRAINER_IMAGE") or manifests.DEFAULT_TRAINER_IMAGE,
            resync_seconds=num("GRPO_RESYNC_SECONDS", "60"),
            policy=lifecycle.Policy(backoff_base=num("GRPO_BACKOFF_BASE_SECONDS", "10"),
                                    backoff_cap=num("GRPO_BACKOFF_CAP_SECONDS", "300"),
                                    force_delete_after=seconds_or_off(
                                        "GRPO_FORCE_DELETE_AFTER_SECONDS", e.get("GRPO_FORCE_DELETE_AFTER_SECONDS",
                                                                                 "60")),
                                    stall=stall_policy(num)),
            cpu_image=e.get("GRPO_TRAINER_CPU_IMAGE") or manifests.DEFAULT_CPU_TRAINER_IMAGE,
            limits=Limits(max_nodes_per_job=num(MAX_NODES_ENV, e[MAX_NODES_ENV], int)
                          if e.get(MAX_NODES_ENV, "").strip() else None,
                          job_defaults=read_job_defaults(e.get(JOB_DEFAULTS_ENV, ""), JOB_DEFAULTS_ENV)),
            webhook_listen=e.get("GRPO_WEBHOOK_LISTEN") or None,
            webhook_host=e.get("GRPO_WEBHOOK_HOST") or None,
            webhook_manage=e.get("GRPO_WEBHOOK_MANAGE", "") in ("1", "true", "yes"),
            webhook_cert_dir=e.get("GRPO_WEBHOOK_CERT_DIR") or None,
            webhook_service=e.get("GRPO_WEBHOOK_SERVICE") or None,
            webhook_config_name=e.get("GRPO_WEBHOOK_CONFIG_NAME", "grpo-operator.grpo.dev"),
            webhook_create=e.get("GRPO_WEBHOOK_CREATE", "1") not in ("0", "false", "no"),
            webhook_failure_policy=e.get("GRPO_WEBHOOK_FAILURE_POLICY") or "Fail",
            liveness=e.get("GRPO_LIVENESS") or None,
            json_logs=e.get("GRPO_LOG_FORMAT", "") == "json",
            log_level=e.get("GRPO_LOG_LEVEL", "INFO"),
            scanning=e.get("GRPO_SCANNING", "1") not in ("0", "false", "no"),
            max_concurrent_writes=num("GRPO_MAX_CONCURRENT_WRITES", "32", int),
            peering=e.get("GRPO_PEERING") or None,
            progress_interval=num("GRPO_PROGRESS_INTERVAL_SECONDS", "15"),
            metrics_listen=e.get("GRPO_METRICS_LISTEN") or None,
            trainer_metrics_port=num("GRPO_TRAINER_METRICS_PORT", str(manifests.DEFAULT_METRICS_PORT), int),
            leader_elect=e.get("GRPO_LEADER_ELECT", "") in ("1", "true", "yes"),
            leader_elect_lease=e.get("GRPO_LEADER_ELECT_LEASE") or None,
            leader_timing=Timing(lease=num("GRPO_LEADER_ELECT_LEASE_SECONDS", "15"),
                                 renew_deadline=num("GRPO_LEADER_ELECT_RENEW_DEADLINE_SECONDS", "10"),
                                 retry=num("GRPO_LEADER_ELECT_RETRY_SECONDS", "2")),
            job_network_policy=e.get("GRPO_JOB_NETWORK_POLICY", "") in ("1", "true", "yes"),
            operator_namespace=e.get("GRPO_OPERATOR_NAMESPACE") or None,
            operator_pod_labels=netpol.parse_labels("GRPO_OPERATOR_POD_LABELS", e.get("GRPO_OPERATOR_POD_LABELS", "")),
            metrics_from=parse_peers("GRPO_JOB_NETWORK_POLICY_METRICS_FROM",
                                     e.get("GRPO_JOB_NETWORK_POLICY_METRICS_FROM", "")),
        )


JOB_DEFAULTS_ENV = "GRPO_JOB_DEFAULTS_FILE"


def read_job_defaults(path: str, name: str) -> dict[str, Any]:
    """The platform's job defaults (the chart's jobDefaults, mounted from a ConfigMap) from the file at `path`; {}
    when no file is named. A ValueError naming `name` and the problem otherwise."""
    if not path.strip():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1024 * 1024)
    except OSError as exc:
        raise ValueError(f"{name}={path!r}: cannot read it ({exc.strerror})") from None
    return defaults.parse(text, f"{name}={path}")


def parse_peers(name: str, raw: str) -> list[dict[str, Any]]:
    """A JSON list of NetworkPolicyPeer objects (the chart's networkPolicy.metricsFrom); '' → []."""
    if not raw.strip():
        return []
    try:
        peers = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{name} is not JSON ({exc})") from None
    if not isinstance(peers, list) or not all(isinstance(p, dict) and p for p in peers):
        raise ValueError(f"{name} must be a JSON list of NetworkPolicyPeer objects, e.g. "
                         f"[{{\"namespaceSelector\": {{\"matchLabels\": {{\"name\": \"monitoring\"}}}}}}]")
    return peers


def env_number(name: str, raw: str, kind: type = float, what: str = "") -> Any:
    """`raw` (the value of env `name`) as `kind`; a ValueError naming the variable otherwise."""
    try:
        return kind(raw)
    except ValueError:
        what = what or ("an integer" if kind is int else "a number")
        raise ValueError(f"{name}={raw!r} is not {what}") from None


def seconds_or_off(name: str, value: str) -> Optional[float]:
    """'60' → 60.0; 'off', 'never', '' or a negative number → None (the feature is off)."""
    if value.strip().lower() in ("", "off", "never", "none", "false"):
        return None
    seconds = env_number(name, value, float, "a number of seconds or 'off'")
    return None if seconds < 0 else seconds


def parse(argv: Optional[Sequence[str]] = None) -> Settings:
    """Flags over the environment, validated together: a bad value or combination is a usage error (exit 2) naming
    the flag or variable, never a traceback."""
    p = parser()
    try:
        cfg = Settings.from_env()
    except ValueError as exc:
        p.error(f"environment: {exc}")  # exits 2 with the usage line, like a bad flag
    try:
        apply_flags(cfg, p.parse_args(argv))
    except ValueError as exc:
        p.error(str(exc))
    problem = check(cfg)
    if problem:
        p.error(problem)
    return cfg


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo-operator", description="Kubernetes operator for GRPO post-training jobs.")
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
    p.add_argument("--trainer-image", help="trainer image of pods with GPUs, the CUDA build (env GRPO_TRAINER_IMAGE)")
    p.add_argument("--trainer-cpu-image", help="trainer image of pods without GPUs, the CPU build (env "
                   "GRPO_TRAINER_CPU_IMAGE)")
    p.add_argument("--job-defaults", metavar="FILE", help="platform defaults merged under every job's spec.template "
                   "(env GRPO_JOB_DEFAULTS_FILE; the chart's jobDefaults)")
    p.add_argument("--no-controller", action="store_true", help="serve only the webhook")
    p.add_argument("--peering", metavar="NAME", help="kopf peering object for HA (env GRPO_PEERING); default standalone")
    p.add_argument("--leader-elect", action="store_true", default=None,
                   help="high availability: only the holder of a coordination.k8s.io/v1 Lease runs the controller; "
                        "every replica serves the webhook (env GRPO_LEADER_ELECT)")
    p.add_argument("--leader-elect-lease", metavar="NS/NAME",
                   help="the Lease (env GRPO_LEADER_ELECT_LEASE; default: the operator's namespace/grpo-operator)")
    p.add_argument("--metrics-listen", metavar="ADDR:PORT",
                   help="serve the operator's Prometheus metrics at /metrics here (env GRPO_METRICS_LISTEN), "
                        "e.g. 0.0.0.0:8081")
    p.add_argument("--progress-interval", type=float, metavar="SECONDS",
                   help="scrape running trainers' metrics this often and write status.progress at most this often "
                        "per job (env GRPO_PROGRESS_INTERVAL_SECONDS, default 15; 0: no live progress)")
    p.add_argument("--trainer-metrics-port", type=int, metavar="PORT",
                   help="port of the trainer pods' /metrics for new jobs (env GRPO_TRAINER_METRICS_PORT, default "
                        "9400; 0: trainers serve no metrics)")
    return p


def apply_flags(cfg: Settings, a: argparse.Namespace) -> None:
    """Given flags win over the environment."""
    if a.namespaces:
        cfg.namespaces = a.namespaces
    if a.all_namespaces:
        cfg.all_namespaces = True
    for attr in ("webhook_listen", "webhook_host", "webhook_cert_dir", "webhook_service", "liveness", "log_level",
                 "peering", "metrics_listen", "leader_elect_lease"):
        if getattr(a, attr):
            setattr(cfg, attr, getattr(a, attr))
    if a.webhook_manage:
        cfg.webhook_manage = True
    if a.leader_elect:
        cfg.leader_elect = True
    if a.json_logs or a.log_format == "json":
        cfg.json_logs = True
    elif a.log_format == "text":
        cfg.json_logs = False
    if a.trainer_image:
        cfg.image = a.trainer_image
    if a.trainer_cpu_image:
        cfg.cpu_image = a.trainer_cpu_image
    if a.job_defaults:
        cfg.limits = dataclasses.replace(cfg.limits, job_defaults=read_job_defaults(a.job_defaults, "--job-defaults"))
    if a.no_controller:
        cfg.controller = False
    if a.progress_interval is not None:
        cfg.progress_interval = a.progress_interval
    if a.trainer_metrics_port is not None:
        cfg.trainer_metrics_port = a.trainer_metrics_port
    if cfg.leader_elect and not cfg.leader_elect_lease:
        cfg.leader_elect_lease = f"{own_namespace(cfg)}/{DEFAULT_LEASE_NAME}"


def own_namespace(cfg: Settings) -> str:
    """Where the default Lease lives: the pod's namespace in a cluster, else the first watched one."""
    ns = os.environ.get("POD_NAMESPACE", "")
    if not ns and os.path.exists(SA_NAMESPACE_FILE):
        with open(SA_NAMESPACE_FILE) as f:
            ns = f.read().strip()
    return ns or (cfg.namespaces[0] if cfg.namespaces else "default")


def check(cfg: Settings) -> Optional[str]:
    """The first problem with the settings taken together, as a usage message; None: fine."""
    if cfg.progress_interval < 0:
        return "--progress-interval must be >= 0"
    if not 0 <= cfg.trainer_metrics_port <= 65535:
        return "--trainer-metrics-port must be a port number (0: off)"
    if cfg.max_concurrent_writes < 1:  # 0 would let no write through, ever
        return f"environment: GRPO_MAX_CONCURRENT_WRITES must be >= 1, got {cfg.max_concurrent_writes}"
    if cfg.limits.problem():
        return f"environment: {cfg.limits.problem()}"
    if cfg.resync_seconds <= 0:  # 0 would re-kick every job in a busy loop
        return f"environment: GRPO_RESYNC_SECONDS must be > 0, got {cfg.resync_seconds:g}"
    if stall_problem(cfg.policy.stall, cfg.progress_interval):
        return f"environment: {stall_problem(cfg.policy.stall, cfg.progress_interval)}"
    for flag, listen in (("--metrics-listen", cfg.metrics_listen), ("--webhook-listen", cfg.webhook_listen)):
        if listen:
            try:
                parse_listen(listen)
            except ValueError:
                return f"{flag} must be ADDR:PORT (e.g. 0.0.0.0:8443), got {listen!r}"
    if cfg.webhook_service:
        try:
            parse_service(cfg.webhook_service)
        except ValueError as exc:
            return f"--webhook-service: {exc}"
    if cfg.webhook_failure_policy not in ("Fail", "Ignore"):
        return f"environment: GRPO_WEBHOOK_FAILURE_POLICY must be Fail or Ignore, got {cfg.webhook_failure_policy!r}"
    if cfg.all_namespaces and cfg.namespaces:
        return "--all-namespaces and --namespace are mutually exclusive"
    if not cfg.all_namespaces and not cfg.namespaces:
        return "give --namespace NS (repeatable) or --all-namespaces"
    if cfg.webhook_manage and not cfg.webhook_listen:
        return "--webhook-manage needs --webhook-listen"
    if cfg.job_network_policy and not cfg.operator_pod_labels:
        return ("environment: GRPO_JOB_NETWORK_POLICY=1 needs GRPO_OPERATOR_POD_LABELS (the operator pods' labels, "
                "k=v,k2=v2, which the job policies admit; the chart sets both), or GRPO_JOB_NETWORK_POLICY=0")
    return check_leader_elect(cfg)


def check_leader_elect(cfg: Settings) -> Optional[str]:
    if not cfg.leader_elect:
        return None
    if cfg.peering:
        return "--leader-elect and --peering are mutually exclusive (the Lease replaces kopf peering)"
    if not cfg.controller:
        return "--leader-elect needs the controller (a webhook-only replica elects nothing)"
    ns, _, name = (cfg.leader_elect_lease or "").partition("/")
    if not ns or not name or "/" in name:
        return f"--leader-elect-lease must be NAMESPACE/NAME, got {cfg.leader_elect_lease!r}"
    problem = cfg.leader_timing.problem()
    return f"environment: {problem}" if problem else None


# GRPO_STALL_<NAME>_SECONDS (and GRPO_STALL_MULTIPLE) → lifecycle.StallPolicy's field (docs/operator.md#stalls)
STALL_ENV = {"floor": "GRPO_STALL_FLOOR_SECONDS", "multiple": "GRPO_STALL_MULTIPLE",
             "startup": "GRPO_STALL_STARTUP_SECONDS", "save": "GRPO_STALL_SAVE_SECONDS",
             "evaluate": "GRPO_STALL_EVAL_SECONDS",
             "heartbeat": "GRPO_STALL_HEARTBEAT_SECONDS", "unanswered": "GRPO_STALL_UNANSWERED_SECONDS",
             "stack_wait": "GRPO_STALL_STACK_WAIT_SECONDS"}


def stall_policy(num: Callable[[str, str], Any]) -> StallPolicy:
    """The operator's stall defaults, each from its environment variable (a bad value: exit 2 naming it)."""
    defaults = StallPolicy()
    return StallPolicy(**{f: num(env, str(getattr(defaults, f))) for f, env in STALL_ENV.items()},
                       ddp_margin=defaults.ddp_margin)


def stall_problem(policy: StallPolicy, progress_interval: float) -> Optional[str]:
    """A stall setting that would declare healthy jobs hung: not positive, or a heartbeat or silence limit the scraper
    cannot tell apart from its own interval (a heartbeat is seen to move once per scrape)."""
    for f, env in STALL_ENV.items():
        if getattr(policy, f) <= 0:
            return f"{env} must be > 0, got {getattr(policy, f):g}"
    for f in ("heartbeat", "unanswered"):
        if progress_interval > 0 and getattr(policy, f) < 2 * progress_interval:
            return (f"{STALL_ENV[f]} ({getattr(policy, f):g}) must be at least 2 × GRPO_PROGRESS_INTERVAL_SECONDS "
                    f"({progress_interval:g}): the scraper sees a heartbeat move once per scrape")
    return None

