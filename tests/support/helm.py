"""Rendering the chart with the real helm binaries (3.17 and 4.3, from scripts/install-test-deps.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "grpo-operator"
RELEASE, NAMESPACE = "grpo", "grpo-system"
HELMS = ("helm3", "helm4")

# Non-default value sets every test renders (name → values).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watch": {"namespaces": ["team-a", "team-b"]}},
    "cert-manager": {"webhook": {"certificates": "cert-manager"}},
    "cert-manager-issuer": {"webhook": {"certificates": "cert-manager",
                                        "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    "ha": {"replicaCount": 2, "webhook": {"certificates": "cert-manager"}},
    "ha-namespaced": {"replicaCount": 3, "watch": {"namespaces": ["team-a"]}, "webhook": {"enabled": False}},
    "custom-image": {"image": {"repository": "registry.example.com/ml/grpo-operator", "tag": "0.2.0-rc1",
                               "pullPolicy": "Always"},
                     "trainerImage": "registry.example.com/ml/grpo-trainer:0.2.0-cu124",
                     "imagePullSecrets": [{"name": "regcred"}]},
    "no-webhook": {"webhook": {"enabled": False}, "logging": {"format": "text", "level": "DEBUG"}},
    "monitors": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                             "podMonitor": {"enabled": True, "interval": "30s"}, "progressIntervalSeconds": 5}},
    "monitors-namespaced": {"watch": {"namespaces": ["team-a"]},
                            "metrics": {"podMonitor": {"enabled": True}, "trainerPort": 0}},
    "no-metrics": {"metrics": {"enabled": False}},
    "ha-hard": {"replicaCount": 3, "webhook": {"enabled": False},
                "highAvailability": {"podAntiAffinity": "hard", "podDisruptionBudget": {"minAvailable": "50%"},
                                     "topologySpread": {"whenUnsatisfiable": "DoNotSchedule"}}},
    "no-user-roles": {"rbac": {"aggregatedRoles": False}},
    # the production example users copy (charts/grpo-operator/values-production.yaml)
    "production": yaml.safe_load((CHART / "values-production.yaml").read_text()),
}


def helm_path(name: str) -> Path:
    from tests.support.cluster.util import BinaryNotFound, find_binary

    try:
        return find_binary(name)
    except BinaryNotFound as exc:
        if os.environ.get("GRPO_TEST_REQUIRE_CLUSTER", "") not in ("", "0"):
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(f"{exc}")


def helm(name: str, *args: str, values: dict[str, Any] | None = None, check: bool = True,
         set_args: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
    argv = [str(helm_path(name)), *args]
    tmp = None
    if values is not None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        json.dump(values, tmp)
        tmp.close()
        argv += ["-f", tmp.name]
    for s in set_args:
        argv += ["--set", s]
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/grpo-helm/cache", "HELM_CONFIG_HOME": "/tmp/grpo-helm/config",
           "HELM_DATA_HOME": "/tmp/grpo-helm/data"}
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    if check and cp.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({cp.returncode}):\n{cp.stderr}\n{cp.stdout[-2000:]}")
    return cp


def template(name: str = "helm3", values: dict[str, Any] | None = None, *, include_crds: bool = True,
             namespace: str = NAMESPACE, release: str = RELEASE, kube_version: str | None = None) -> str:
    """`helm template`; kube_version: render for that server (as `helm install` does for the one it talks to)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if include_crds:
        args.append("--include-crds")
    if kube_version:
        args += ["--kube-version", kube_version]
    return helm(name, *args, values=values or {}).stdout


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader: the CRD is 100 KB of YAML


def objects(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(rendered, Loader=_LOADER) if d]


def render(values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Objects of `helm template` (without the CRDs unless include_crds=True)."""
    kw.setdefault("include_crds", False)
    return objects(template("helm3", values, **kw))
