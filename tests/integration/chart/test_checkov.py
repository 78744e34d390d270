"""checkov (PyPI `checkov`, its own venv: .tools/checkov-venv, from scripts/install-test-deps.sh) on what the project
ships: the chart rendered by `helm template` and the objects `grpojob render` makes of every example job. Any finding
not allowed below fails the test; every allowed one carries its reason, and docs/install.md lists them for users.

Two scans: the chart's defaults, and the chart with `networkPolicy.enabled` for the jobs' namespace (the hardening
docs/install.md recommends), each with the examples' jobs rendered into that namespace. GRPO_CHECKOV overrides where
checkov is found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import REPO, template

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOBS_NAMESPACE = "grpo-jobs"
INVALID_EXAMPLES = {"invalid-batch.yaml"}  # refused by `grpojob render` on purpose (docs/examples)

# check id -> why it stays (docs/install.md, "Security scan", says the same to users)
ALLOWED: dict[str, str] = {
    "CKV_K8S_155": "the operator patches its own ValidatingWebhookConfiguration (its CA bundle), by resourceNames and "
                   "never creates one in chart installs; no mutating configuration is granted",
    "CKV_K8S_38": "the operator's pod talks to the API server with its service account token: it needs it mounted",
    "CKV_K8S_11": "no CPU limits: a CFS quota throttles the webhook's answers and the trainers' data loading and "
                  "NCCL threads; CPU requests are set, a job's limits are its spec.resources",
    "CKV_K8S_13": "a job's memory limits are its spec.resources (the user's choice; examples that set only GPUs and "
                  "the vLLM server's defaults leave them to the namespace's LimitRange)",
    "CKV_K8S_43": "images are referenced by release tag; pin a digest in image.tag / trainerImage / spec.image "
                  "through your registry if you need immutability",
    "CKV_K8S_15": "IfNotPresent: the trainer image is several GB and pulled once per node; Always re-contacts the "
                  "registry at every pod start (image.pullPolicy is a value)",
    "CKV_K8S_40": "the trainer image's user is uid 1000 (trainer_image/Dockerfile, fsGroup on volumes); pods run as "
                  "non-root with every capability dropped, no privilege escalation and a read-only root",
    "CKV_K8S_8": "training pods are batch workers: a liveness probe would kill a trainer inside a long collective or "
                 "checkpoint and restart the gang; the operator follows exit codes and progress instead",
    "CKV_K8S_9": "training pods receive no Service traffic that readiness could gate (the vLLM server has probes)",
    "CKV_K8S_35": "spec.hfTokenSecretRef becomes HF_TOKEN from the Secret (how Hugging Face libraries read it, in the "
                  "trainers, the download pod and vLLM alike)",
}
# only without networkPolicy.enabled (its default: it must be told the jobs' namespaces)
ALLOWED_BY_DEFAULT = {
    "CKV2_K8S_6": "the operator's own pod only: the job pods have their per-job NetworkPolicy (networkPolicy.perJob, "
                  "on by default); networkPolicy.enabled, which also covers the operator's namespace-wide access, is "
                  "off by default (it needs the job namespaces): the second scan turns it on and has no such finding",
}


def checkov_path() -> Path:
    path = Path(os.environ.get("GRPO_CHECKOV") or REPO / ".tools" / "checkov-venv" / "bin" / "checkov")
    if not os.access(path, os.X_OK):
        why = f"checkov not found at {path} (scripts/install-test-deps.sh installs it; or set GRPO_CHECKOV)"
        if os.environ.get("GRPO_TEST_REQUIRE_CLUSTER", "") not in ("", "0"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return path


def render_examples(into: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "trainer_image"),
                                                        os.environ.get("PYTHONPATH", "")])}
    rendered = []
    for example in sorted((REPO / "examples").glob("*.yaml")):
        cp = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "render", str(example),
                             "-n", JOBS_NAMESPACE], capture_output=True, text=True, timeout=120, env=env)
        if example.name in INVALID_EXAMPLES:
            assert cp.returncode != 0, f"{example.name} is meant to be refused"
            continue
        assert cp.returncode == 0, f"grpojob render {example.name}: {cp.stderr}"
        (into / f"job-{example.name}").write_text(cp.stdout)
        rendered.append(example.name)
    return rendered


def scan(directory: Path) -> dict[str, Any]:
    cp = subprocess.run([str(checkov_path()), "-d", str(directory), "--framework", "kubernetes", "--skip-download",
                         "--compact", "-o", "json"], capture_output=True, text=True, timeout=240,
                        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    assert cp.returncode in (0, 1), f"checkov failed ({cp.returncode}): {cp.stderr[-3000:]}"
    report = json.loads(cp.stdout)
    (result,) = [r for r in (report if isinstance(report, list) else [report]) if r.get("check_type") == "kubernetes"]
    return result


@pytest.mark.parametrize("network_policy", [False, True], ids=["chart-defaults", "network-policy"])
def test_checkov_finds_nothing_beyond_the_allowed_findings(network_policy: bool, tmp_path: Path) -> None:
    values = {"networkPolicy": {"enabled": True}, "watch": {"namespaces": [JOBS_NAMESPACE]}} if network_policy else {}
    (tmp_path / "chart.yaml").write_text(template("helm3", values, include_crds=False))
    examples = render_examples(tmp_path)
    assert len(examples) >= 5, examples
    result = scan(tmp_path)
    summary = result["summary"]
    allowed = ALLOWED if network_policy else {**ALLOWED, **ALLOWED_BY_DEFAULT}
    failed = result["results"]["failed_checks"]
    unexpected = [f"{f['check_id']} {f['resource']} ({f['file_path']}): {f['check_name']}" for f in failed
                  if f["check_id"] not in allowed]
    print(f"checkov {summary['checkov_version']}: {summary['passed']} passed, {summary['failed']} failed "
          f"(allowed: {sorted({f['check_id'] for f in failed})}) over {summary['resource_count']} resources")
    assert not unexpected, "checkov findings that are neither fixed nor allowed (with a reason):\n" + \
        "\n".join(unexpected)
    assert summary["resource_count"] >= 10 and summary["passed"] > 100  # it really scanned the objects
    kinds = {f["resource"].split(".")[0] for f in failed}
    assert "Pod" in kinds and "Deployment" in kinds  # both the chart and the jobs were read
    # every job pod is covered by its job's NetworkPolicy (grpojob render, as the operator creates it); what is
    # left is the operator's own pod (checkov names the Deployment's pod template "Pod.<namespace>.…")
    no_policy = {f["resource"] for f in failed if f["check_id"] == "CKV2_K8S_6"}
    assert not {r for r in no_policy if r.startswith(f"Pod.{JOBS_NAMESPACE}.")}, no_policy
    assert network_policy or no_policy  # the check really ran


def test_every_allowed_finding_is_documented_for_users() -> None:
    doc = (REPO / "docs" / "install.md").read_text()
    missing = [check for check in {**ALLOWED, **ALLOWED_BY_DEFAULT} if f"`{check}`" not in doc]
    assert not missing, f"docs/install.md lacks {missing}"
