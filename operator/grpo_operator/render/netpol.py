"""The per-job NetworkPolicy (pure and deterministic): ingress to one GRPOJob's pods only from that job's own pods
(every port) and from the operator (the ports it scrapes and probes). Egress is left open: the pods download models,
reach the Hub and trackers. docs/install.md, "NetworkPolicy", says what it admits and protects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import api
from . import manifests

DEFAULT_OPERATOR_NAMESPACE = "grpo-system"  # docs/install.md's `helm install … --namespace grpo-system`
# The chart's selectorLabels for its documented release name (`helm install grpo-operator …`)
DEFAULT_OPERATOR_LABELS = {"app.kubernetes.io/name": "grpo-operator", "app.kubernetes.io/instance": "grpo-operator"}
# Set on every namespace by the API server (Kubernetes ≥ 1.21, NamespaceDefaultLabelName): selects one by its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Access:
    """Who may reach a job's pods besides the job itself: the operator's pods (their namespace and labels) and,
    on the trainers' metrics port, `metrics_from` (NetworkPolicyPeer objects, e.g. a Prometheus)."""
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    operator_labels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_OPERATOR_LABELS))
    metrics_from: tuple[dict[str, Any], ...] = ()


def parse_labels(name: str, raw: str) -> dict[str, str]:
    """'k=v,k2=v2' → {k: v, k2: v2} (GRPO_OPERATOR_POD_LABELS, `grpojob render --operator-labels`); a ValueError
    naming `name` otherwise."""
    labels: dict[str, str] = {}
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{name}={raw!r}: {item!r} is not KEY=VALUE (labels as k=v,k2=v2)")
        labels[key.strip()] = value.strip()
    return labels


def policy_name(job_name: str) -> str:
    return f"{manifests.names(job_name).base}-ingress"


def _tcp(port: int) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}


def network_policy(job: api.GRPOJob, namespace: str, access: Access, *, uid: str = "",
                   metrics_port: int = manifests.DEFAULT_METRICS_PORT) -> dict[str, Any]:
    """The job's NetworkPolicy, owned by the job like its other children.

    Selects every pod of the job (label grpo.dev/job-name: trainers, the vLLM server, the download pod) and admits
    * the job's own pods on every port: the c10d store (29400), NCCL's and torch distributed's random ports, the
      trainers' calls to the vLLM server and its weight-sync group connecting back to the trainer;
    * the operator's pods on the trainers' metrics port (progress scrape; the download pod's /progress is served
      there too) and the vLLM server's port (its engine probe);
    * `access.metrics_from` on the metrics port.
    `metrics_port` 0 (metrics off) leaves only the server's port to the operator."""
    name = job.metadata.name or ""
    n = manifests.names(name)
    own = {"podSelector": {"matchLabels": {manifests.LABEL_JOB: n.base}}}
    ingress: list[dict[str, Any]] = [{"from": [own]}]
    operator_ports = [_tcp(metrics_port)] if metrics_port else []
    if job.spec.vllm.mode == "server":
        server_port = (job.spec.vllm.server or api.VllmServerSpec()).port
        if server_port != metrics_port:
            operator_ports.append(_tcp(server_port))
    if operator_ports:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: access.operator_namespace}},
                      "podSelector": {"matchLabels": dict(sorted(access.operator_labels.items()))}}],
            "ports": operator_ports,
        })
    if metrics_port and access.metrics_from:
        ingress.append({"from": [dict(peer) for peer in access.metrics_from], "ports": [_tcp(metrics_port)]})
    labels = {k: v for k, v in manifests._labels(job, n, manifests.ROLE_TRAINER).items()
              if k not in (manifests.LABEL_ROLE, "app.kubernetes.io/component", "app.kubernetes.io/name")}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": manifests._meta(policy_name(name), namespace, labels, name, uid),
        "spec": {
            "podSelector": {"matchLabels": {manifests.LABEL_JOB: n.base}},
            "policyTypes": ["Ingress"],  # egress stays open: model downloads, the Hub, trackers
            "ingress": ingress,
        },
    }
