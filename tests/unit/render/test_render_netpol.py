"""The per-job NetworkPolicy (render/netpol.py): it selects every pod of its job and no other job's, admits the job's
own pods on every port and the operator on exactly the ports it scrapes and probes, and is owned by the job."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from grpo_operator import api
from grpo_operator.render import job as render_job
from grpo_operator.render import manifests, netpol
from grpo_operator.rules import validation
from grpo_trainer import contract

ACCESS = netpol.Access(operator_namespace="ops", operator_labels={"app.kubernetes.io/name": "grpo-operator",
                                                                  "app.kubernetes.io/instance": "rel"})


def job_doc(name: str = "job", *, mode: str = "none", nodes: int = 1, cache: bool = False,
            server_port: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": "org/tiny", "dataset": {"name": "org/data"}, "rewards": [{"name": "accuracy"}],
                            "nodes": nodes, "vllm": {"mode": mode},
                            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2}}
    if mode == "server":
        spec["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        if server_port is not None:
            spec["vllm"]["server"] = {"port": server_port}
    if cache:
        spec["cache"] = {"volumeClaimName": "hf-cache"}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def rendered(doc: dict[str, Any], access: netpol.Access | None = ACCESS, **kw: Any) -> list[dict[str, Any]]:
    res = validation.validate(doc)
    assert res.valid, res.summary()
    return render_job.render(res.job, res.topology, "ns", uid="u-1", network_policy=access, **kw)


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the policy uses matchLabels only
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def container_ports(pod: dict[str, Any]) -> set[int]:
    return {p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("doc", [job_doc(), job_doc(mode="server", nodes=2), job_doc(mode="server", cache=True),
                                 job_doc(mode="colocate", nodes=3, cache=True)],
                         ids=["none", "server-2-nodes", "server-cache", "colocate-cache"])
def test_the_policy_fences_every_pod_of_the_job_and_admits_the_operator_on_each_served_port(doc) -> None:
    objs = rendered(doc)
    policy = objs[0]
    assert policy["kind"] == "NetworkPolicy" and [o["kind"] for o in objs].count("NetworkPolicy") == 1
    for version in ("1.29", "1.37"):
        kubernetes_validate.validate(policy, version, strict=True)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec  # egress stays open (Hub, trackers)
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert pods and all(matches(spec["podSelector"], p["metadata"]["labels"]) for p in pods)
    own, operator = spec["ingress"]
    # the job's own pods, every port: c10d 29400, NCCL's random ports, the weight-sync group back to the trainer
    assert "ports" not in own and len(own["from"]) == 1 and set(own["from"][0]) == {"podSelector"}
    assert all(matches(own["from"][0]["podSelector"], p["metadata"]["labels"]) for p in pods)
    # the operator: its namespace AND its pods (one peer, both selectors), on every port a pod serves it
    [peer] = operator["from"]
    assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                    "podSelector": {"matchLabels": ACCESS.operator_labels}}
    served = set().union(*(container_ports(p) for p in pods))
    assert contract.C10D_PORT in served  # the trainers declare it, but the rendezvous store is for the job's pods only
    assert {p["port"] for p in operator["ports"]} == served - {contract.C10D_PORT}
    assert all(p["protocol"] == "TCP" for p in operator["ports"])


def test_the_ports_follow_the_metrics_port_and_the_servers_port() -> None:
    [policy, *_] = rendered(job_doc(mode="server", server_port=8123), metrics_port=9500)
    assert [p["port"] for p in policy["spec"]["ingress"][1]["ports"]] == [9500, 8123]
    [policy, *_] = rendered(job_doc(), metrics_port=0)  # metrics off, no server: only the job's own pods get in
    assert len(policy["spec"]["ingress"]) == 1
    [policy, *_] = rendered(job_doc(mode="server"), metrics_port=0)
    assert [p["port"] for p in policy["spec"]["ingress"][1]["ports"]] == [8000]


def test_another_jobs_pods_are_neither_selected_nor_admitted() -> None:
    [policy, *_] = rendered(job_doc("a"))
    others = [o for o in rendered(job_doc("ab"), access=None) if o["kind"] == "Pod"]
    assert others and not any(matches(policy["spec"]["podSelector"], p["metadata"]["labels"]) for p in others)
    assert not any(matches(policy["spec"]["ingress"][0]["from"][0]["podSelector"], p["metadata"]["labels"])
                   for p in others)


def test_owned_by_the_job_like_its_other_children() -> None:
    objs = rendered(job_doc("my-job"))
    policy, service = objs[0], next(o for o in objs if o["kind"] == "Service")
    assert policy["metadata"]["ownerReferences"] == service["metadata"]["ownerReferences"] == [{
        "apiVersion": api.API_VERSION, "kind": api.KIND, "name": "my-job", "uid": "u-1", "controller": True,
        "blockOwnerDeletion": True}]
    assert policy["metadata"]["name"] == netpol.policy_name("my-job") == "my-job-ingress"
    assert policy["metadata"]["namespace"] == "ns"
    assert policy["metadata"]["labels"][manifests.LABEL_JOB] == "my-job"
    long_name = "x" * 200  # shortened with the same hash as the pods' label, and a valid object name
    [policy, *_] = rendered(job_doc(long_name))
    assert len(policy["metadata"]["name"]) <= 63
    assert policy["spec"]["podSelector"]["matchLabels"][manifests.LABEL_JOB] == manifests.names(long_name).base


def test_metrics_from_peers_get_the_metrics_port_only() -> None:
    prom = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    access = netpol.Access("ops", {"a": "b"}, metrics_from=(prom,))
    [policy, *_] = rendered(job_doc(mode="server"), access=access)
    assert policy["spec"]["ingress"][2] == {"from": [prom], "ports": [{"port": 9400, "protocol": "TCP"}]}
    kubernetes_validate.validate(policy, "1.29", strict=True)
    [policy, *_] = rendered(job_doc(), access=access, metrics_port=0)  # no metrics port: nothing for them
    assert len(policy["spec"]["ingress"]) == 1


def test_without_access_there_is_no_policy_and_render_is_deterministic() -> None:
    assert "NetworkPolicy" not in [o["kind"] for o in rendered(job_doc(), access=None)]
    doc = job_doc(mode="server")
    assert rendered(copy.deepcopy(doc)) == rendered(doc)


@pytest.mark.parametrize("raw, labels", [("", {}), ("a=b", {"a": "b"}), (" a = b , c=d,", {"a": "b", "c": "d"}),
                                         ("k=", {"k": ""})])
def test_parse_labels(raw: str, labels: dict[str, str]) -> None:
    assert netpol.parse_labels("X", raw) == labels


@pytest.mark.parametrize("raw", ["a", "=b", "a=b,c"])
def test_parse_labels_names_the_setting(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^X=.*is not KEY=VALUE"):
        netpol.parse_labels("X", raw)
