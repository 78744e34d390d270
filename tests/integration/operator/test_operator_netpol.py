"""The per-job NetworkPolicy on the real control plane (kube-apiserver + kube-controller-manager's garbage collector):
the operator creates it with the job's other children, owned by the job; a gang restart after an operator restart
finds it (no second one, the same object); a policy of that name the job does not own keeps the pods from being
created; deleting the job garbage-collects it. Enforcement is not tested: this control plane has no pod network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grpo_operator.render import manifests, netpol
from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, get_job, pod_exit, pod_running, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

OPERATOR_ENV = {"GRPO_JOB_NETWORK_POLICY": "1", "GRPO_OPERATOR_NAMESPACE": "grpo-system",
                "GRPO_OPERATOR_POD_LABELS": "app.kubernetes.io/name=grpo-operator,app.kubernetes.io/instance=t"}


def policies(k: Any, ns: str) -> list[dict[str, Any]]:
    return k.json("get", "networkpolicies", "-n", ns)["items"]


def start_operator(crd: Any, tmp_path: Any, ns: str, run: int) -> OperatorProcess:
    return OperatorProcess(crd.kubeconfig, tmp_path / f"op{run}", "--namespace", ns, env=OPERATOR_ENV).start()


def test_the_job_policy_is_created_once_owned_by_the_job_and_collected_with_it(crd, k8s_namespace, tmp_path) -> None:
    k, ns = crd.kubectl, k8s_namespace
    op = start_operator(crd, tmp_path, ns, 0)
    try:
        job = manifest("np", nodes=2)
        k.apply(job, "-n", ns)
        pods = wait_pods(k, ns, "np", 2)
        uid = get_job(k, ns, "np")["metadata"]["uid"]
        [policy] = policies(k, ns)  # created with the other children, before any pod
        assert policy["metadata"]["name"] == netpol.policy_name("np") == "np-ingress"
        [owner] = policy["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and owner["kind"] == "GRPOJob" and owner["controller"] is True
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec
        assert spec["podSelector"] == {"matchLabels": {manifests.LABEL_JOB: "np"}}
        assert all(p["metadata"]["labels"][manifests.LABEL_JOB] == "np" for p in pods)
        own, operator = spec["ingress"]
        assert own == {"from": [{"podSelector": {"matchLabels": {manifests.LABEL_JOB: "np"}}}]}
        assert operator["from"] == [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "grpo-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "t",
                                            "app.kubernetes.io/name": "grpo-operator"}}}]
        assert operator["ports"] == [{"port": manifests.DEFAULT_METRICS_PORT, "protocol": "TCP"}]

        k.apply(job, "-n", ns)  # applied twice: unchanged, nothing new
        op.stop()  # a new operator process, then a gang restart: it creates every child again and finds the policy
        op = start_operator(crd, tmp_path, ns, 1)
        for p in pods:
            pod_running(k, ns, p["metadata"]["name"])
        wait_job(k, ns, "np", lambda s: s.get("phase") == "Running")
        pod_exit(k, ns, pods[1]["metadata"]["name"], 143)
        wait_pods(k, ns, "np", 2, attempt=1, timeout=60)  # attempt 1's pods: every child was created again first
        wait_job(k, ns, "np", lambda s: s.get("restarts") == 1)
        [again] = policies(k, ns)
        assert again["metadata"]["uid"] == policy["metadata"]["uid"]  # the same object: found, not replaced
        assert again["metadata"]["resourceVersion"] == policy["metadata"]["resourceVersion"]

        k("delete", "grpojob", "np", "-n", ns, "--wait=false")  # the garbage collector follows the owner reference
        wait_until(lambda: not policies(k, ns), 60, 0.5, what="the job's NetworkPolicy garbage-collected")
    except BaseException:
        print(op.log(80))
        raise
    finally:
        op.stop()


def test_a_policy_of_that_name_the_job_does_not_own_keeps_its_pods_from_being_created(crd, k8s_namespace,
                                                                                       tmp_path) -> None:
    k, ns = crd.kubectl, k8s_namespace
    foreign = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": netpol.policy_name("fj"), "namespace": ns},
               "spec": {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}}  # admits everything
    k.apply(foreign, "-n", ns)
    op = start_operator(crd, tmp_path, ns, 0)
    try:
        k.apply(manifest("fj", nodes=1), "-n", ns)
        st = wait_job(k, ns, "fj", lambda s: any(c["type"] == "Created" and c["status"] == "False"
                                                 for c in s.get("conditions") or []),
                      what="Created=False naming the foreign NetworkPolicy")["status"]
        created = next(c for c in st["conditions"] if c["type"] == "Created")
        assert "networkpolicy/fj-ingress" in created["message"], created
        assert not pods_of(k, ns, "fj")  # never run behind a policy that is not the job's
        k("delete", "networkpolicy", "fj-ingress", "-n", ns)  # the user removes it: the job goes on
        wait_pods(k, ns, "fj", 1, timeout=60)
        [policy] = policies(k, ns)
        assert policy["metadata"]["ownerReferences"][0]["uid"] == get_job(k, ns, "fj")["metadata"]["uid"]
    except BaseException:
        print(op.log(80))
        raise
    finally:
        op.stop()


def test_the_job_policy_is_put_back_as_rendered_after_a_hand_edit_and_a_new_operator_configuration(
        crd, k8s_namespace, tmp_path) -> None:
    """Issue 27 (Low): the policy was create-only. A hand edit that opened it to everything stayed, and an operator
    restarted in another namespace left every running job's policy admitting the old one (its probes and scrapes
    refused). Both are now put back on the same object: at the operator's first pass, and for a hand edit within
    a few resync periods."""
    k, ns = crd.kubectl, k8s_namespace
    fast = {**OPERATOR_ENV, "GRPO_RESYNC_SECONDS": "2"}  # the live policy is re-read every 5 resyncs: 10 s
    op = OperatorProcess(crd.kubeconfig, tmp_path / "op0", "--namespace", ns, env=fast).start()
    try:
        k.apply(manifest("npk", nodes=1), "-n", ns)
        wait_pods(k, ns, "npk", 1)
        [policy] = wait_until(lambda: policies(k, ns), 30, 0.2, what="the job's NetworkPolicy")
        k("patch", "networkpolicy", "npk-ingress", "-n", ns, "--type=merge", "-p",
          json.dumps({"spec": {"ingress": [{}]}, "metadata": {"labels": {"extra": "kept"}}}))  # admits everything
        assert policies(k, ns)[0]["spec"]["ingress"] == [{}]
        [back] = wait_until(lambda: [p for p in policies(k, ns) if p["spec"] == policy["spec"]], 60, 0.5,
                            what="the edited policy put back as rendered")
        assert back["metadata"]["uid"] == policy["metadata"]["uid"] and back["metadata"]["labels"]["extra"] == "kept"
        rv = back["metadata"]["resourceVersion"]

        op.stop()
        moved = {**fast, "GRPO_OPERATOR_NAMESPACE": "grpo-moved"}
        op = OperatorProcess(crd.kubeconfig, tmp_path / "op1", "--namespace", ns, env=moved).start()

        def operator_namespace() -> str:
            peer = policies(k, ns)[0]["spec"]["ingress"][1]["from"][0]
            return peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]

        wait_until(lambda: operator_namespace() == "grpo-moved", 60, 0.5, what="the policy admitting the new namespace")
        [moved_policy] = policies(k, ns)
        assert moved_policy["metadata"]["uid"] == policy["metadata"]["uid"]  # the same object, replaced in place
        assert int(moved_policy["metadata"]["resourceVersion"]) > int(rv)
    except BaseException:
        print(op.log(80))
        raise
    finally:
        op.stop()
