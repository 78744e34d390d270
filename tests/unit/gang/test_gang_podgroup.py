"""Rendered PodGroups and gang pod decorations, checked against the real CRDs of scheduler-plugins and Volcano
(fixtures/, pinned by commit): JSON-schema validation of spec.versions[].schema.openAPIV3Schema, plus every
rendered key must exist in the schema (a structural CRD silently prunes unknown fields, so a typo would never be
rejected by the API server)."""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_operator.api import gang as g
from grpo_operator.render import manifests, quantities
from grpo_operator.render.gangs import coscheduling, kueue
from grpo_operator.rules import validation

FIXTURES = Path(__file__).parent / "fixtures"
CRDS = {g.COSCHEDULING_API_VERSION: "scheduling.x-k8s.io_podgroups.yaml",
        g.VOLCANO_API_VERSION: "scheduling.volcano.sh_podgroups.yaml"}
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def crd_schema(api_version: str) -> dict[str, Any]:
    crd = yaml.safe_load((FIXTURES / CRDS[api_version]).read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == "PodGroup"
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


def unknown_keys(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Keys of `obj` that the structural schema does not declare (metadata is the API server's, not the CRD's)."""
    out = []
    if isinstance(obj, dict) and schema.get("type") == "object" and path != ".metadata":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in obj.items():
            if props is not None and k in props:
                out += unknown_keys(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += unknown_keys(v, extra, f"{path}.{k}")
            elif props is not None:
                out.append(f"{path}.{k}")
    return out


def check_against_crd(obj: dict[str, Any]) -> None:
    schema = crd_schema(obj["apiVersion"])
    jsonschema.Draft7Validator(schema).validate(obj)
    assert unknown_keys(obj, schema) == []


def job_body(name: str = "qwen", *, nodes: int = 2, scheduling: Any = None, labels: Any = None,
             server: bool = False, **spec_over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"}, "rewards": [{"name": "accuracy"}],
        "nodes": nodes, "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "16", "memory": "64Gi"},
                                      "requests": {"cpu": "15500m"}},
        "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 8, "maxSteps": 10},
    }
    if server:
        spec["vllm"] = {"mode": "server", "server": {"resources": {"limits": {"nvidia.com/gpu": 1, "memory": "512Mi"}}}}
    if scheduling is not None:
        spec["scheduling"] = scheduling
    spec.update(spec_over)
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": "0b7e8f3a-1111-2222-3333-444455556666"}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": meta, "spec": spec}


def render(body: dict[str, Any], **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Every object of the job, as the operator and `grpojob render` make them."""
    res = validation.validate(body)
    assert res.valid, res.summary()
    return res.job, manifests.core_objects(res.job, res.topology, "ns", uid=body["metadata"]["uid"], **kw)


def rendered(body: dict[str, Any], **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    job, objs = render(body, **kw)
    return job, [o for o in objs if o["kind"] == "Pod"]


def pod_group_of(body: dict[str, Any]) -> Any:
    _, objs = render(body)
    groups = [o for o in objs if o["kind"] == "PodGroup"]
    assert len(groups) <= 1
    if groups:  # created before every pod
        assert objs.index(groups[0]) < min(i for i, o in enumerate(objs) if o["kind"] == "Pod")
    return groups[0] if groups else None


@pytest.mark.parametrize("gang, api_version", [("coscheduling", g.COSCHEDULING_API_VERSION),
                                               ("volcano", g.VOLCANO_API_VERSION)])
@pytest.mark.parametrize("server", [False, True])
def test_pod_group_is_valid_for_the_real_crd(gang: str, api_version: str, server: bool) -> None:
    pg = pod_group_of(job_body(scheduling={"gang": gang}, server=server))
    assert pg is not None and pg["apiVersion"] == api_version
    check_against_crd(pg)
    assert pg["metadata"]["name"] == manifests.names("qwen").base == "qwen"
    assert pg["metadata"]["ownerReferences"] == [{
        "apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "name": "qwen",
        "uid": "0b7e8f3a-1111-2222-3333-444455556666", "controller": True, "blockOwnerDeletion": True}]
    # every pod that must start together: the 2 trainers. The vLLM server is created before them (lifecycle/server/order.py
    # says why): a PodGroup counting it would hold it at Permit until the trainers exist, which wait for it.
    assert pg["spec"]["minMember"] == 2
    expected = {"cpu": "31", "memory": "128Gi", "nvidia.com/gpu": "8"}  # requests win over limits: 2 × 15.5 cpu
    assert pg["spec"]["minResources"] == expected
    _, objs = render(job_body(scheduling={"gang": gang}, server=server))
    grouped = [o["metadata"]["labels"].get(g.COSCHEDULING_POD_GROUP_LABEL)
               or o["metadata"]["annotations"].get(g.VOLCANO_GROUP_NAME_ANNOTATION)
               for o in objs if o["kind"] == "Pod"]
    assert grouped == ["qwen", "qwen"] + ([None] if server else []) or grouped == ([None] if server else []) + ["qwen", "qwen"]


def test_coscheduling_spec_fields() -> None:
    pg = pod_group_of(job_body(scheduling={"gang": "coscheduling", "scheduleTimeoutSeconds": 600}))
    check_against_crd(pg)
    assert pg["spec"]["scheduleTimeoutSeconds"] == 600 and "queue" not in pg["spec"]


def test_volcano_spec_fields() -> None:
    pg = pod_group_of(job_body(scheduling={"gang": "volcano", "queue": "research", "priorityClassName": "high"}))
    check_against_crd(pg)
    assert pg["spec"]["queue"] == "research" and pg["spec"]["priorityClassName"] == "high"
    pg = pod_group_of(job_body(scheduling={"gang": "volcano"}, template={"priorityClassName": "low"}))
    assert pg["spec"]["queue"] == "default" and pg["spec"]["priorityClassName"] == "low"


def test_no_gang_no_pod_group() -> None:
    _, objs = render(job_body())
    assert not [o for o in objs if o["kind"] == "PodGroup"]
    assert not any(k.startswith(("kueue.x-k8s.io/pod-group", "scheduling.")) for o in objs
                   for k in {**o["metadata"].get("labels", {}), **o["metadata"].get("annotations", {})})


def test_the_schema_check_catches_what_the_api_server_would_prune_or_reject() -> None:
    """The checker is not a rubber stamp: a misspelt key, a wrong type and minMember 0 (coscheduling) all fail."""
    pg = pod_group_of(job_body(scheduling={"gang": "coscheduling"}))
    typo = copy.deepcopy(pg)
    typo["spec"]["minMembers"] = 2
    assert unknown_keys(typo, crd_schema(typo["apiVersion"])) == [".spec.minMembers"]
    for bad in ({"minMember": "2"}, {"minMember": 0}, {"minResources": {"cpu": "lots"}}):
        broken = copy.deepcopy(pg)
        broken["spec"].update(bad)
        with pytest.raises(jsonschema.ValidationError):
            check_against_crd(broken)


@pytest.mark.parametrize("gang", ["coscheduling", "volcano"])
def test_pods_point_at_their_pod_group(gang: str) -> None:
    _, pods = rendered(job_body(scheduling={"gang": gang}, server=True))
    assert len(pods) == 3
    server = [p for p in pods if p["metadata"]["labels"]["grpo.dev/role"] == "vllm-server"]
    assert len(server) == 1  # created before the trainers, outside their PodGroup (lifecycle/server/order.py)
    assert g.COSCHEDULING_POD_GROUP_LABEL not in server[0]["metadata"]["labels"]
    assert g.VOLCANO_GROUP_NAME_ANNOTATION not in server[0]["metadata"]["annotations"]
    for pod in pods:
        if pod is server[0]:
            continue
        if gang == "coscheduling":
            assert pod["metadata"]["labels"][g.COSCHEDULING_POD_GROUP_LABEL] == "qwen"
            assert "schedulerName" not in pod["spec"]  # the user's template decides (scheduler-plugins' profile)
        else:
            assert pod["metadata"]["annotations"][g.VOLCANO_GROUP_NAME_ANNOTATION] == "qwen"
            assert pod["spec"]["schedulerName"] == "volcano"
        assert not any(k.startswith("kueue.x-k8s.io/pod-group") for k in pod["metadata"]["labels"])


def test_volcano_keeps_the_users_scheduler_name() -> None:
    _, pods = rendered(job_body(scheduling={"gang": "volcano"}, template={"schedulerName": "volcano-gpu"}))
    assert {p["spec"]["schedulerName"] for p in pods} == {"volcano-gpu"}


def test_kueue_trainers_form_one_group_the_server_its_own_and_nothing_kueue_owns_is_set() -> None:
    _, pods = rendered(job_body(labels={g.KUEUE_QUEUE_LABEL: "team-a"}, server=True))
    group = kueue.group_name("qwen", "0b7e8f3a-1111-2222-3333-444455556666", 0)
    server_group = kueue.group_name("qwen", "0b7e8f3a-1111-2222-3333-444455556666", 0, server=True)
    assert (group, server_group) == ("qwen-0b7e8f3a-a0", "qwen-0b7e8f3a-vllm-a0")
    assert {p["metadata"]["labels"][g.KUEUE_QUEUE_LABEL] for p in pods} == {"team-a"}
    # server mode: the server is admitted first, alone (lifecycle/server/order.py)
    assert {(p["metadata"]["labels"][manifests.LABEL_ROLE], p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL],
             p["metadata"]["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION]) for p in pods} == {
        ("trainer", group, "2"), ("vllm-server", server_group, "1")}
    for pod in pods:
        assert g.KUEUE_MANAGED_LABEL not in pod["metadata"]["labels"]
        assert not pod["metadata"].get("finalizers") and not pod["spec"].get("schedulingGates")
        assert g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION not in pod["metadata"]["annotations"]
    # Kueue builds one PodSet per "shape" (requests, ports, nodeSelector, affinity, tolerations, ...):
    # the trainers differ only in env and args, so they are one PodSet of count 2
    shapes = {shape(p) for p in pods if p["metadata"]["labels"][manifests.LABEL_ROLE] == "trainer"}
    assert len(shapes) == 1


def shape(pod: dict[str, Any]) -> str:
    """What kueue pkg/util/pod/pod.go SpecShape hashes (v0.19.2): not env, not command."""
    spec = pod["spec"]
    keep = {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations", "runtimeClassName", "priority",
                                     "topologySpreadConstraints", "overhead", "resourceClaims")}
    keep["containers"] = [(c.get("resources"), c.get("ports")) for c in spec["containers"]]
    return repr(keep)


def test_kueue_group_name_examples() -> None:
    assert kueue.group_name("qwen", "0b7e8f3a-1111-2222", 0) == "qwen-0b7e8f3a-a0"
    assert kueue.group_name("qwen", "0b7e8f3a-1111-2222", 12) == "qwen-0b7e8f3a-a12"
    # an older job of the same name (another uid) never shares a group, nor does another run
    assert kueue.group_name("qwen", "ffff0000", 0) != kueue.group_name("qwen", "0b7e8f3a", 0)


@settings(max_examples=300, deadline=None)
@given(name=st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?", fullmatch=True),
       uid=st.uuids().map(str) | st.just(""), attempt=st.integers(0, 10 ** 6))
def test_kueue_group_name_is_a_valid_label_value_and_subdomain(name: str, uid: str, attempt: int) -> None:
    for server in (False, True):
        group = kueue.group_name(manifests.names(name).base, uid, attempt, server=server)
        assert len(group) <= 63 and DNS1123_SUBDOMAIN.match(group), group
        assert group.endswith(f"-vllm-a{attempt}" if server else f"-a{attempt}")


@pytest.mark.parametrize("attempt, kueue_, expected", [
    (0, False, "qwen-node-1"), (3, False, "qwen-node-1"), (0, True, "qwen-node-1"), (3, True, "qwen-node-1-a3"),
])
def test_pod_names_per_attempt_under_kueue_only(attempt: int, kueue_: bool, expected: str) -> None:
    assert (kueue.UNIT if kueue_ else coscheduling.UNIT).pod_name("qwen-node-1", attempt) == expected


@pytest.mark.parametrize("values, expected", [
    (["4", "500m"], "4500m"), (["64Gi", "64Gi"], "128Gi"), (["1G", "500M"], "1500M"), ([4, 4], "8"),
    (["1.5", "1.5"], "3"), (["100Mi", "1G"], "1104857600"), (["1e3", 1], "1001"), (["0.1m"], "1m"),
])
def test_sum_of_quantities(values: list[Any], expected: str) -> None:
    pods = [{"spec": {"containers": [{"resources": {"requests": {"r": v}}}]}} for v in values]
    assert quantities.sum_requests(pods) == {"r": expected}


def test_effective_pod_request_counts_init_containers_and_overhead() -> None:
    pod = {"spec": {"containers": [{"resources": {"limits": {"cpu": "2"}}}, {"resources": {"requests": {"cpu": "1"}}}],
                    "initContainers": [{"resources": {"requests": {"cpu": "5", "memory": "1Gi"}}}],
                    "overhead": {"cpu": "250m"}}}
    assert quantities.sum_requests([pod]) == {"cpu": "5250m", "memory": "1Gi"}
    assert quantities.pod_requests(pod)["cpu"][0] == Decimal("5.25")


def test_a_bad_quantity_names_itself() -> None:
    with pytest.raises(ValueError, match="lots"):
        quantities.parse_quantity("lots")


def test_kueue_and_a_pod_group_together_are_refused_with_the_fix() -> None:
    res = validation.validate(job_body(labels={g.KUEUE_QUEUE_LABEL: "lq"}, scheduling={"gang": "volcano"}))
    assert not res.valid and [e.field for e in res.errors] == ["spec.scheduling.gang"]
    assert "remove spec.scheduling.gang, or remove the label" in res.errors[0].message
    assert validation.validate(job_body(labels={g.KUEUE_QUEUE_LABEL: "lq"})).valid
    assert validation.validate(job_body(scheduling={"gang": "volcano"})).valid


@pytest.mark.parametrize("scheduling, field_msg", [
    ({"gang": "volcano", "scheduleTimeoutSeconds": 5}, "scheduleTimeoutSeconds is a coscheduling PodGroup field"),
    ({"queue": "q"}, "queue is a Volcano PodGroup field"),
    ({"gang": "coscheduling", "priorityClassName": "p"}, "priorityClassName is a Volcano PodGroup field"),
    ({"gang": "kueue"}, "coscheduling"),
    ({"gang": "volcano", "queue": "Not_A_Name"}, "spec.scheduling.queue: has an invalid format"),
])
def test_scheduling_spec_errors(scheduling: dict[str, Any], field_msg: str) -> None:
    res = validation.validate(job_body(scheduling=scheduling))
    assert not res.valid
    assert field_msg in res.summary() and "spec.scheduling" in res.summary()


@pytest.mark.parametrize("server", [False, True])
def test_kueue_pods_of_a_later_attempt_have_new_names_and_the_same_hostnames(server: bool) -> None:
    body = job_body(labels={g.KUEUE_QUEUE_LABEL: "team-a"}, server=server)
    _, first = rendered(body, attempt=0)
    _, later = rendered(body, attempt=3, groups={"trainer": "qwen-0b7e8f3a-a0", "vllm-server": "qwen-0b7e8f3a-vllm-a0"})
    assert [p["metadata"]["name"] for p in first] == ["qwen-vllm-0"] * server + ["qwen-node-0", "qwen-node-1"]
    assert [p["metadata"]["name"] for p in later] == ["qwen-vllm-0-a3"] * server + ["qwen-node-0-a3", "qwen-node-1-a3"]
    assert [p["spec"].get("hostname") for p in later] == [p["spec"].get("hostname") for p in first]
    assert [p["spec"].get("subdomain") for p in later] == [p["spec"].get("subdomain") for p in first]
    assert [p["spec"]["containers"][0].get("args") for p in later if "hostname" in p["spec"]] and all(
        "--rdzv-endpoint=qwen-node-0.qwen:29400" in p["spec"]["containers"][0]["args"]
        for p in later if "hostname" in p["spec"])
    # the replacements join the run's groups (the lifecycle's choice)
    assert {p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL] for p in later} == {
        "qwen-0b7e8f3a-a0", *(["qwen-0b7e8f3a-vllm-a0"] * server)}
    assert {p["metadata"]["labels"]["grpo.dev/attempt"] for p in later if "hostname" in p["spec"]} == {"3"}


def test_without_kueue_names_stay_per_rank() -> None:
    _, later = rendered(job_body(), attempt=3)
    assert [p["metadata"]["name"] for p in later] == ["qwen-node-0", "qwen-node-1"]
