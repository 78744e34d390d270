"""A pod create the API server refuses is reported: a FailedCreate Warning Event with the server's message
(controller/refused.py) and condition CreateFailed (lifecycle/create.py), cleared once the pods are created, on the
real control plane. This control plane runs no quota controller: the test writes the ResourceQuota's status itself
(what that controller would), and the API server's ResourceQuota admission then enforces it."""

from __future__ import annotations

import json

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_refused_pod_create_becomes_a_failed_create_event(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    op.start(wait=False)
    try:
        # a volume name the API server refuses (422 Invalid; volumes are free-form Kubernetes objects in the spec)
        job = manifest("refused", nodes=2)
        job["spec"]["template"] = {"volumes": [{"name": "Not_A_DNS_Label", "emptyDir": {}}]}
        k.apply([job], "-n", ns)

        def failed_create() -> list:
            items = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=refused")["items"]
            return [e for e in items if e.get("reason") == "FailedCreate"]

        try:
            events = wait_until(failed_create, 60, 0.3, what="a FailedCreate event")
        except TimeoutError:
            print(op.log(60))
            raise
        ev = events[0]
        assert ev["type"] == "Warning" and ev["involvedObject"]["kind"] == "GRPOJob"
        assert "422" in ev["message"] and "Not_A_DNS_Label" in ev["message"] and "refused-node-" in ev["message"], \
            json.dumps(ev)
        assert not pods_of(k, ns, "refused")
    finally:
        op.stop()


def _quota(k, ns: str, pods: int) -> None:
    k.apply([{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods", "namespace": ns},
              "spec": {"hard": {"pods": str(pods)}}}], "-n", ns)
    k.patch_status("resourcequota", "pods", {"hard": {"pods": str(pods)}, "used": {"pods": "0"}}, "-n", ns)


def _create_failed(status: dict) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == "CreateFailed"), {})


def test_a_quota_refusal_is_a_condition_until_the_quota_allows_the_pods(crd, kubectl, k8s_namespace,
                                                                        tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    _quota(k, ns, 0)
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    op.start(wait=False)
    try:
        k.apply([manifest("quota", nodes=2)], "-n", ns)
        try:
            st = wait_job(k, ns, "quota", lambda s: _create_failed(s).get("status") == "True", timeout=60,
                          what="condition CreateFailed")["status"]
        except AssertionError:
            print(op.log(60))
            raise
        c = _create_failed(st)
        assert c["reason"] == "FailedCreate" and "exceeded quota" in c["message"] and "403" in c["message"], c
        assert st["phase"] == "Pending" and "exceeded quota" in st["message"]
        events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=quota")["items"]
        assert any(e["reason"] == "FailedCreate" and "exceeded quota" in e["message"] for e in events)
        assert not pods_of(k, ns, "quota")

        _quota(k, ns, 10)  # the quota raised: the retry (the work queue's backoff, ≤ 30 s) creates the pods
        wait_pods(k, ns, "quota", 2, timeout=60)
        st = wait_job(k, ns, "quota", lambda s: _create_failed(s).get("status") == "False", timeout=30,
                      what="condition CreateFailed cleared")["status"]
        assert _create_failed(st)["reason"] == "PodsCreated"
    finally:
        op.stop()
