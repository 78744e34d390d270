"""The chart's trainerCpuImage and jobDefaults: the CPU image reaches the operator as GRPO_TRAINER_CPU_IMAGE; the
platform defaults go into a ConfigMap mounted into the operator (GRPO_JOB_DEFAULTS_FILE), which the operator's own
reader (rules/defaults.parse) reads back as the values file gave them, with a checksum on the pod template so that a
change rolls the operator; no ConfigMap, mount or variable without them."""

from __future__ import annotations

from typing import Any

import yaml

from grpo_operator.rules import defaults
from tests.support.helm import REPO, render

EXAMPLE = REPO / "examples" / "platform" / "job-defaults-values.yaml"


def _operator(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]
    return pod, {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_job_defaults_reach_the_operator_as_a_mounted_file() -> None:
    values = yaml.safe_load(EXAMPLE.read_text())
    docs = render({**values, "trainerCpuImage": "registry.example.com/ml/grpo-trainer:0.2.0-cpu"})
    pod, env = _operator(docs)
    assert env["GRPO_TRAINER_CPU_IMAGE"] == "registry.example.com/ml/grpo-trainer:0.2.0-cpu"
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-job-defaults")]
    path = env["GRPO_JOB_DEFAULTS_FILE"]
    folder, _, key = path.rpartition("/")
    assert defaults.parse(cm["data"][key], path) == values["jobDefaults"]
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == folder)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == cm["metadata"]["name"] and mount["readOnly"] is True
    checksum = pod["metadata"]["annotations"]["checksum/job-defaults"]
    changed = {**values, "jobDefaults": {**values["jobDefaults"], "priorityClassName": "other"}}
    assert _operator(render(changed))[0]["metadata"]["annotations"]["checksum/job-defaults"] != checksum


def test_no_job_defaults_no_configmap() -> None:
    docs = render()
    pod, env = _operator(docs)
    assert env["GRPO_TRAINER_CPU_IMAGE"] == "ghcr.io/grpo-operator/grpo-trainer:0.1.0-cpu"
    assert "GRPO_JOB_DEFAULTS_FILE" not in env and "checksum/job-defaults" not in pod["metadata"]["annotations"]
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
