"""spec.template's pod surface and the platform's jobDefaults, against the real API server: every pod the operator
would create for a job that sets every pod-template field (with platform defaults merged under it) is created with
dryRun=All and accepted, and the server keeps every field we send — a field the server does not know would be
dropped silently, and a pod would run without it.

The exception, asserted as such: the test API server is Kubernetes 1.20, which has no native sidecars (1.29+); it
accepts a sidecar's `restartPolicy: Always` and drops it, which would leave the pod forever in Init. That is why
docs/pod-template.md says sidecars need 1.29 and the operator (controller/creates.py) refuses to create pods with
sidecars on a server that drops the field.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from grpo_operator.render import job as render_job
from grpo_operator.rules import defaults, validation
from grpo_operator.rules.limits import Limits
from tests.support.cluster.kubectl import Kubectl

REPO = Path(__file__).resolve().parents[3]

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"example.com/owner": "rl-team"}},
    "securityContext": {"runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 4000,
                        "fsGroupChangePolicy": "OnRootMismatch", "supplementalGroups": [5000, 5001],
                        "seLinuxOptions": {"level": "s0:c123,c456"}},
    "capabilities": ["IPC_LOCK", "SYS_RESOURCE"],
    "envFrom": [{"configMapRef": {"name": "nccl-settings"}}, {"prefix": "S3_", "secretRef": {"name": "s3",
                                                                                          "optional": True}}],
    "terminationGracePeriodSeconds": 1800,
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"team": "rl"}}}],
    "dnsConfig": {"nameservers": ["10.0.0.10"], "searches": ["svc.cluster.local"],
                  "options": [{"name": "ndots", "value": "2"}]},
    "hostNetwork": True,
    "volumes": [{"name": "datasets", "emptyDir": {}}],
    "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["sh", "-c", "ls /data"],
                        "volumeMounts": [{"name": "datasets", "mountPath": "/data"}],
                        "resources": {"limits": {"cpu": "1", "memory": "256Mi"}}}],
    "sidecars": [{"name": "logs", "image": "fluent/fluent-bit:3.0", "envFrom": [{"configMapRef": {"name": "fb"}}],
                  "env": [{"name": "FLB_LOG_LEVEL", "value": "info"}]}],
}


def _job() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "vllm-server.yaml").read_text())
    doc["spec"]["nodes"] = 2
    doc["spec"]["cache"] = {"volumeClaimName": "hf-cache"}
    doc["spec"]["template"] = copy.deepcopy(TEMPLATE)
    return doc


def _priority_class(kubectl: Kubectl) -> None:
    """The example defaults' priorityClassName (admission refuses a pod naming one that does not exist)."""
    kubectl.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "training"},
                   "value": 1000})


def _subset(sent: Any, got: Any, where: str = "") -> list[str]:
    """Where `sent` has something `got` lacks or changed (the server may add defaults, never drop or alter)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [where]
        return [p for k, v in sent.items() for p in _subset(v, got.get(k), f"{where}.{k}")]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) < len(sent):
            return [where]
        if len(got) > len(sent):  # the server appended (e.g. DefaultTolerationSeconds' tolerations): each one kept
            return [f"{where}[{i}]" for i, v in enumerate(sent) if all(_subset(v, g) for g in got)]
        return [p for i, v in enumerate(sent) for p in _subset(v, got[i], f"{where}[{i}]")]
    return [] if str(sent) == str(got) else [f"{where}: sent {sent!r}, got {got!r}"]


def test_every_rendered_object_is_accepted_and_kept(kubectl: Kubectl, k8s_namespace: str) -> None:
    _priority_class(kubectl)
    platform = defaults.parse((REPO / "examples" / "platform" / "job-defaults-values.yaml").read_text(), "values")
    res = validation.validate(_job(), Limits(job_defaults=platform))
    assert res.valid, res.errors
    assert res.job is not None and res.topology is not None
    objs = render_job.render(res.job, res.topology, k8s_namespace, uid="", cpu_image="cpu:1")
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert sorted(p["metadata"]["labels"]["grpo.dev/role"] for p in pods) == \
        ["initializer", "trainer", "trainer", "vllm-server"]
    dropped: dict[str, list[str]] = {}
    for obj in objs:
        out = kubectl("create", "--dry-run=server", "--validate=false", "-o", "json", "-f", "-",
                      input=json.dumps(obj), check=False)
        assert out.returncode == 0, f"{obj['kind']} {obj['metadata']['name']} refused: {out.stderr}"
        missing = _subset(obj, json.loads(out.stdout))
        if missing:
            dropped[obj["metadata"]["name"]] = missing
    # the one field 1.20 drops: each sidecar's restartPolicy (native sidecars are 1.29+)
    sidecar_only = {name: [p for p in paths if not p.endswith("restartPolicy: sent 'Always', got None")]
                    for name, paths in dropped.items()}
    assert not any(sidecar_only.values()), sidecar_only
    runners = {p["metadata"]["name"] for p in pods if p["metadata"]["labels"]["grpo.dev/role"] != "initializer"}
    assert set(dropped) == runners, "every trainer and the server carry the sidecar; the download pod none"


def test_platform_defaults_reach_every_pod(kubectl: Kubectl, k8s_namespace: str) -> None:
    """The chart's example jobDefaults land where docs/pod-template.md says: tolerations, pull secrets, annotations,
    the pod securityContext on every pod, capabilities on the trainer and server containers only."""
    _priority_class(kubectl)
    platform = defaults.parse((REPO / "examples" / "platform" / "job-defaults-values.yaml").read_text(), "values")
    doc = yaml.safe_load((REPO / "examples" / "vllm-server.yaml").read_text())
    doc["spec"]["cache"] = {"volumeClaimName": "hf-cache"}
    res = validation.validate(doc, Limits(job_defaults=platform))
    assert res.valid, res.errors
    assert res.job is not None and res.topology is not None
    for obj in render_job.render(res.job, res.topology, k8s_namespace):
        if obj["kind"] != "Pod":
            continue
        out = kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj), check=False)
        assert out.returncode == 0, out.stderr
        pod = json.loads(out.stdout)
        role = pod["metadata"]["labels"]["grpo.dev/role"]
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false", role
        assert pod["spec"]["securityContext"]["fsGroup"] == 4000, role
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}], role
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            pod["spec"].get("tolerations", []) or role == "vllm-server", role  # the server's own replace them
        added = pod["spec"]["containers"][0]["securityContext"]["capabilities"].get("add")
        assert added == (None if role == "initializer" else ["IPC_LOCK"]), role
