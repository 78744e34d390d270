"""The pod template and the platform's defaults on the real node, as a platform team and a user do it:

  helm install the chart with `jobDefaults` (a toleration for the cluster's GPU-pool taint, an annotation)
  → the node tainted with that taint after the operator runs: only pods that tolerate it schedule
  → a 2-node CPU job with `envFrom` (a ConfigMap of settings), `securityContext.fsGroup` and
    `terminationGracePeriodSeconds`: its pods carry the job's fields and the platform's toleration, schedule on the
    tainted node, run the CPU trainer image (the chart's trainerCpuImage) and the job Succeeds.

~6 min cold (the images are built first), ~2 min with them built. Same node and fixtures as test_journey.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.journey import CHART, OP_NAMESPACE, User, install_chart, model_configmaps, storage, tiny_job
from tests.support.node import REPO, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NS = "podtmpl"
TRANSCRIPT_FILE = "pod-template-transcript.txt"
TIMINGS: dict[str, float] = {}
TAINT = {"key": "example.com/gpu-pool", "value": "true", "effect": "NoSchedule"}
JOB_DEFAULTS = {"tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}],
                "metadata": {"annotations": {"example.com/platform": "defaults"}}}


@pytest.fixture(scope="module")
def platform(user: User) -> Iterator[User]:
    values = REPO / "out" / "journey" / "job-defaults-values.yaml"
    values.parent.mkdir(parents=True, exist_ok=True)
    values.write_text(yaml.safe_dump({"jobDefaults": JOB_DEFAULTS}))
    user.transcript.note("helm install with jobDefaults (the platform's toleration and annotation)")
    TIMINGS["helm_install_s"] = install_chart(user, "-f", str(values))
    user.kubectl("create", "namespace", NS)
    yield user


def test_template_fields_and_platform_defaults_run_to_succeeded(platform: User) -> None:
    user, tr = platform, platform.transcript
    node = user.node.node_name()
    tr.note(f"taint the node {node} (already running pods stay): job pods schedule only with the platform's toleration")
    user.kubectl("taint", "nodes", node, f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}")
    model_configmaps(user, NS)
    storage(user, NS)
    user.kubectl("create", "configmap", "job-settings", "-n", NS, "--from-literal=GRPO_TEST_SETTING=from-envfrom")
    job = tiny_job("tmpl", max_steps=4, save_steps=2)
    job["spec"]["template"].update({"envFrom": [{"configMapRef": {"name": "job-settings"}}],
                                    "securityContext": {"fsGroup": 4000},
                                    "terminationGracePeriodSeconds": 300})
    manifest = REPO / "out" / "journey" / "tmpl.yaml"
    manifest.write_text(yaml.safe_dump(job, sort_keys=False))
    tr.write(manifest.read_text())
    user.kubectl("apply", "-n", NS, "-f", str(manifest))

    def trainers() -> list[dict[str, Any]] | None:
        items = (user.json("get", "pods", "-n", NS, "-l", "grpo.dev/job-name=tmpl,grpo.dev/role=trainer")
                 or {}).get("items", [])
        return items if len(items) == 2 else None

    pods = wait_for(trainers, 120, 0.5, what="the two trainer pods")
    cpu_image = yaml.safe_load((CHART / "values.yaml").read_text())["trainerCpuImage"]
    for pod in pods:
        spec = pod["spec"]
        assert {"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]} in spec["tolerations"]
        assert pod["metadata"]["annotations"]["example.com/platform"] == "defaults"
        assert spec["containers"][0]["envFrom"] == [{"configMapRef": {"name": "job-settings"}}]
        assert spec["securityContext"]["fsGroup"] == 4000 and spec["terminationGracePeriodSeconds"] == 300
        assert spec["containers"][0]["image"] == cpu_image  # a CPU job: the chart's trainerCpuImage

    def finished() -> str | None:
        phase = ((user.json("get", "grpojob", "tmpl", "-n", NS) or {}).get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    try:
        phase = wait_for(finished, 600, 1.0, what="the job to finish")
    finally:
        user.kubectl("get", "grpojob,pods", "-n", NS, "-o", "wide", check=False)
        user.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)
        user.kubectl("logs", "-n", OP_NAMESPACE, "-l", "app.kubernetes.io/name=grpo-operator", "--tail=40",
                     check=False)
    assert phase == "Succeeded"
    # both ran on the tainted node (the kubelet starts a container only once its envFrom ConfigMap resolved)
    env_out = user.kubectl("get", "pods", "-n", NS, "-l", "grpo.dev/job-name=tmpl,grpo.dev/role=trainer",
                           "-o", "jsonpath={.items[*].spec.nodeName}").stdout
    assert env_out.split() == [node, node]
