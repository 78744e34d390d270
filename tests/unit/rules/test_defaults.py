"""Platform defaults (rules/defaults.py): the one merge of the operator's jobDefaults under a job's spec.template —
the job's scalars win, maps merge, lists append (a default item the job names again is dropped), affinity is replaced
whole — and the validator validating the merged result (webhook, operator and `grpojob check --defaults`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from grpo_operator import api
from grpo_operator.rules import defaults, validation
from grpo_operator.rules.limits import Limits

REPO = Path(__file__).resolve().parents[3]
TOL_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TOL_SPOT = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize("platform, job, merged", [
    # scalars: the job's wins; absent, the default's
    ({"priorityClassName": "low"}, {"priorityClassName": "high"}, {"priorityClassName": "high"}),
    ({"priorityClassName": "low"}, {}, {"priorityClassName": "low"}),
    ({"terminationGracePeriodSeconds": 1800}, {"terminationGracePeriodSeconds": 60},
     {"terminationGracePeriodSeconds": 60}),
    # maps: merged key by key, recursively
    ({"nodeSelector": {"pool": "gpu", "zone": "a"}}, {"nodeSelector": {"zone": "b"}},
     {"nodeSelector": {"pool": "gpu", "zone": "b"}}),
    ({"securityContext": {"fsGroup": 4000, "runAsUser": 2000}}, {"securityContext": {"fsGroup": 5000}},
     {"securityContext": {"fsGroup": 5000, "runAsUser": 2000}}),
    ({"metadata": {"annotations": {"a": "1"}}}, {"metadata": {"labels": {"l": "x"}, "annotations": {"b": "2"}}},
     {"metadata": {"annotations": {"a": "1", "b": "2"}, "labels": {"l": "x"}}}),
    # lists: appended, the default's first; an equal item once
    ({"tolerations": [TOL_GPU]}, {"tolerations": [TOL_SPOT]}, {"tolerations": [TOL_GPU, TOL_SPOT]}),
    ({"tolerations": [TOL_GPU]}, {"tolerations": [TOL_GPU]}, {"tolerations": [TOL_GPU]}),
    ({"capabilities": ["IPC_LOCK"]}, {"capabilities": ["SYS_NICE", "IPC_LOCK"]},
     {"capabilities": ["SYS_NICE", "IPC_LOCK"]}),
    # named items (env, pull secrets, volumes): the job's item of the same name replaces the default's
    ({"env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "A", "value": "1"}]},
     {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
     {"env": [{"name": "A", "value": "1"}, {"name": "NCCL_DEBUG", "value": "INFO"}]}),
    ({"imagePullSecrets": [{"name": "regcred"}]}, {"imagePullSecrets": [{"name": "mine"}]},
     {"imagePullSecrets": [{"name": "regcred"}, {"name": "mine"}]}),
    # affinity: replaced whole (merged node-selector terms would be ORed: wider placement than either asked)
    ({"affinity": {"nodeAffinity": {"a": 1}, "podAntiAffinity": {"b": 2}}}, {"affinity": {"nodeAffinity": {"c": 3}}},
     {"affinity": {"nodeAffinity": {"c": 3}}}),
])
def test_merge_rules(platform: dict[str, Any], job: dict[str, Any], merged: dict[str, Any]) -> None:
    before = copy.deepcopy((platform, job))
    assert defaults.merge_template(platform, job) == merged
    assert (platform, job) == before, "neither argument is changed"


def _job(template: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": "m", "dataset": {"name": "d.jsonl"}, "rewards": [{"name": "accuracy"}],
                            "vllm": {"mode": "none"}, "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2}}
    if template is not None:
        spec["template"] = template
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "j"}, "spec": spec}


def test_the_validator_validates_the_merged_template() -> None:
    platform = Limits(job_defaults={"dnsConfig": {"nameservers": ["10.0.0.10"]}, "tolerations": [TOL_GPU]})
    job = _job({"dnsPolicy": "None"})
    assert not validation.validate(job).valid  # alone: no nameserver for dnsPolicy None
    res = validation.validate(job, platform)
    assert res.valid, res.summary()
    assert res.job is not None
    assert res.job.spec.template.tolerations == [TOL_GPU]
    assert res.job.spec.template.dnsConfig is not None and res.job.spec.template.dnsConfig.nameservers == ["10.0.0.10"]
    assert job["spec"]["template"] == {"dnsPolicy": "None"}, "the stored job is not changed"
    # a job without a template gets the defaults too
    bare = validation.validate(_job(), platform)
    assert bare.job is not None and bare.job.spec.template.tolerations == [TOL_GPU]


def test_a_merged_result_the_api_server_would_refuse_is_refused() -> None:
    platform = Limits(job_defaults={"initContainers": [{"name": "warm", "image": "busybox"}]})
    res = validation.validate(_job({"sidecars": [{"name": "warm", "image": "busybox"}]}), platform)
    assert not res.valid and "unique" in res.summary()


def test_parse_reads_a_template_or_a_values_file() -> None:
    values = (REPO / "examples" / "platform" / "job-defaults-values.yaml").read_text()
    parsed = defaults.parse(values, "values.yaml")
    assert parsed["capabilities"] == ["IPC_LOCK"] and parsed["terminationGracePeriodSeconds"] == 1800
    assert defaults.parse("tolerations: []\n", "f") == {"tolerations": []}
    assert defaults.parse("", "f") == {}


@pytest.mark.parametrize("text, words", [
    ("capabilities: [SYS_ADMIN]\n", ["f.yaml", "capabilities", "SYS_ADMIN", "not allowed"]),
    ("tolerations: {}\n", ["f.yaml", "tolerations"]),
    ("- a\n", ["f.yaml", "mapping"]),
    ("unknownField: 1\n", ["f.yaml", "unknownField"]),
    ("a: [\n", ["f.yaml", "not YAML"]),
])
def test_parse_refuses_bad_defaults_naming_the_file_and_field(text: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as exc:
        defaults.parse(text, "f.yaml")
    for word in words:
        assert word in str(exc.value), exc.value
