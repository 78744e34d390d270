"""The API server's own rules for what spec.template passes into pods (rules/kube_rules.py, rules/pod_rules.py,
rules/accelerators.py): each case names the rule's limit; the real API server agrees
(tests/integration/cluster/test_admission_equals_apiserver.py)."""

from __future__ import annotations

import copy

import pytest

from grpo_operator.rules import kube_rules, validation
from tests.support.jobs import manifest


@pytest.mark.parametrize("key, ok", [
    ("a" * 63, True), ("a" * 64, False), ("example.com/" + "a" * 63, True), ("example.com/" + "a" * 64, False),
    (("p" * 61 + ".") * 4 + "p/k", True), ("p" * 254 + "/k", False), ("a/b/c", False), ("Ex.com/k", False),
    ("my key", False), ("k-", False), ("/k", False), ("k8s.io/x_y.z", True),
])
def test_qualified_names(key, ok):
    assert (kube_rules.qualified_name(key) is None) is ok


def test_annotation_keys_are_checked_lowercased_and_the_total_is_bounded():
    assert kube_rules.annotation_map({"Example.COM/Owner": "x"}, "a") == []
    big = {f"k{i}": "v" * 4096 for i in range(64)}
    (field, message), = kube_rules.annotation_map(big, "a")
    assert field == "a" and "262144 (256 KiB)" in message


@pytest.mark.parametrize("tol, problem", [
    ({"key": "k", "operator": "Exists", "value": "v"}, "value must be empty when operator is Exists"),
    ({"operator": "Equal", "value": "v"}, "operator must be Exists when key is empty"),
    ({"key": "k", "operator": "In"}, "operator must be Equal or Exists"),
    ({"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}, "effect must be NoExecute"),
    ({"key": "k", "effect": "Never"}, "effect must be one of"),
    ({"key": "k", "opeartor": "Exists"}, "did you mean 'operator'"),
    ({"key": "k", "value": "v" * 64}, "at most 63"),
    ({"operator": "Exists"}, None),
    ({"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 30}, None),
])
def test_tolerations(tol, problem):
    found = kube_rules.toleration(tol, "t")
    assert (problem is None and not found) or (problem and any(problem in m for _, m in found)), found


@pytest.mark.parametrize("limits, requests, problem", [
    ({}, {"nvidia.com/gpu": 4}, "Limit must be set for non overcommitable resources"),
    ({"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 2}, "must equal limits"),
    ({"cpu": "4"}, {"cpu": "8"}, "must be at most limits"),
    ({"memory": "1gi"}, {}, "not a Kubernetes quantity"),
    ({"memory": "-1Gi"}, {}, "must not be negative"),
    ({"example.com/fpga": "0.5"}, {}, "whole number"),
    ({"gpu": 1}, {}, "not a container resource"),
    ({"hugepages-2Mi": "1Gi"}, {}, "hugepages need a cpu or memory"),
    ({"rdma/ib": 1, "cpu": "500m", "memory": "1e9"}, {"cpu": "0.25"}, None),
])
def test_resource_requirements(limits, requests, problem):
    found = kube_rules.resource_requirements(limits, requests, "r")
    assert (problem is None and not found) or (problem and any(problem in m for _, m in found)), found


def _with_template(**template):
    doc = manifest("j")
    doc["spec"]["template"] = copy.deepcopy(template)
    return validation.validate(doc)


def test_a_mount_must_name_a_volume_of_the_pod():
    """Finding (issue 26): a mount of a missing volume was valid and rendered; the API server refused the pod."""
    res = _with_template(volumeMounts=[{"name": "missingvol", "mountPath": "/m"}])
    assert [e.field for e in res.errors] == ["spec.template.volumeMounts[0].name"]
    assert "no volume named 'missingvol'" in res.errors[0].message
    assert _with_template(volumes=[{"name": "d", "emptyDir": {}}], volumeMounts=[{"name": "d", "mountPath": "/m"},
                                                                                  {"name": "output", "mountPath": "/o"}]).valid


def test_gpu_requests_without_limits_are_refused_with_the_fix():
    doc = manifest("j")
    doc["spec"]["resources"] = {"requests": {"nvidia.com/gpu": 4}}
    res = validation.validate(doc)
    assert not res.valid and "set spec.resources.limits[nvidia.com/gpu]: 4" in res.summary()


@pytest.mark.parametrize("resources, extra, problem", [
    ({"nvidia.com/mig-3g.40gb": 2}, {}, "NCCL does not support communication between MIG instances"),
    ({"nvidia.com/mig-3g.40gb": 1}, {"nodes": 2}, "NCCL does not support"),
    ({"nvidia.com/mig-3g.40gb": 1}, {}, None),
    ({"amd.com/gpu": 8}, {}, "ROCm"),
    ({"amd.com/gpu": 8}, {"image": "registry.example.com/grpo:rocm"}, None),
    ({"habana.ai/gaudi": 8}, {}, "hpu backend"),
    ({"nvidia.com/gpu": 17}, {}, "at most 16"),
])
def test_accelerators(resources, extra, problem):
    doc = manifest("j")
    doc["spec"]["resources"] = {"limits": resources}
    doc["spec"]["training"] = {"perDeviceTrainBatchSize": 4, "numGenerations": 4}
    doc["spec"].update(extra)
    res = validation.validate(doc)
    assert (problem is None and res.valid) or (problem is not None and problem in res.summary()), res.summary()
    if problem is None:
        assert res.topology is not None and res.topology.gpu_resource == next(iter(resources))


def test_eval_needs_eval_data():
    """Finding (issue 26): evalStrategy steps was valid with no eval dataset; transformers raised in the pod."""
    doc = manifest("j")
    doc["spec"]["training"].update({"evalStrategy": "steps", "evalSteps": 5})
    res = validation.validate(doc)
    assert [e.field for e in res.errors] == ["spec.dataset.evalSplit"] and "evalStrategy" in res.errors[0].message
    doc["spec"]["dataset"]["evalSplit"] = "test"
    assert validation.validate(doc).valid
    doc["spec"]["training"]["evalStrategy"] = "no"
    assert any("evalSplit is set" in w for w in validation.validate(doc).warnings)
