"""A pod create the API server refuses is reported: a FailedCreate Warning Event with the server's message
(controller/refused.py) and condition CreateFailed (lifecycle/create.py), cleared once the pods are created, on the
real control plane. This control plane runs no quota controller: the test writes the ResourceQuota's status itself
(what that controller would), and the API server's ResourceQuota admission then enforces it."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, pods_of, wait_job, wait_pods
from tests.support.policy_webhook import PolicyWebhook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_refused_pod_create_becomes_a_failed_create_event(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    op.start(wait=False)
    try:
        # what only the cluster knows: a PriorityClass that does not exist (the Priority admission plugin refuses the
        # pods; admission cannot know it, while a volume name the API server refuses is now refused by admission)
        job = manifest("refused", nodes=2)
        job["spec"]["template"] = {"priorityClassName": "no-such-class"}
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
        assert "no-such-class" in ev["message"] and "refused-node-" in ev["message"], \
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


def test_the_test_apiserver_has_no_pod_security_admission(controlplane) -> None:
    """Why the next test stands a webhook in for PodSecurity: this kube-apiserver (1.20) predates the plugin
    (1.22 alpha, 1.23 beta) and refuses to start with it. If it ever knows it, use the real plugin instead."""
    from tests.support.cluster.util import find_binary

    r = subprocess.run([str(find_binary("kube-apiserver")), "--enable-admission-plugins=PodSecurity"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and 'plugin "PodSecurity" is unknown' in r.stderr, r.stderr[-2000:]


def test_a_pod_policy_refusal_is_a_condition_until_the_spec_complies(crd, kubectl, k8s_namespace,
                                                                       tmp_path) -> None:
    """A policy engine refusing the pods (PodSecurity `restricted`, Kyverno, Gatekeeper) reaches the user as
    CreateFailed + a FailedCreate event with the policy's words, until the spec complies. The refusal is real: the
    API server calls a ValidatingWebhookConfiguration for pods served over HTTPS (tests/support/policy_webhook.py),
    which is how Kyverno and Gatekeeper refuse, worded as PodSecurity words it. PodSecurity itself is not in this
    1.20 API server (test above); its PodSecurityPolicy is no stand-in: it is removed since 1.25, admits a pod by
    the RBAC `use` of some policy (a different failure, for every pod without one), mutates pods, and would mean
    restarting the API server the session shares."""
    k, ns = kubectl, k8s_namespace
    from grpo_operator.render import manifests

    job = manifest("policy", nodes=2)
    job["spec"]["template"] = {"volumes": [{"name": "scratch", "hostPath": {"path": "/data"}}],
                               "volumeMounts": [{"name": "scratch", "mountPath": "/data"}]}
    expected = 'violates PodSecurity "restricted:latest": hostPath volumes (volume "scratch")'
    with PolicyWebhook(k, ns, tmp_path) as policy:
        op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
        op.start(wait=False)
        try:
            k.apply([job], "-n", ns)  # the operator's own rules accept a hostPath volume: only the policy refuses
            try:
                st = wait_job(k, ns, "policy", lambda s: _create_failed(s).get("status") == "True", timeout=60,
                              what="condition CreateFailed")["status"]
            except AssertionError:
                print(op.log(60))
                raise
            c = _create_failed(st)
            assert c["reason"] == "FailedCreate" and expected in c["message"] and "policy-node-" in c["message"], c
            assert st["phase"] == "Pending" and expected in st["message"], st
            assert not any(x["type"] == "Rejected" and x["status"] == "True" for x in st["conditions"]), st
            events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=policy")["items"]
            assert any(e["type"] == "Warning" and e["reason"] == "FailedCreate" and expected in e["message"]
                       for e in events), json.dumps(events)
            assert policy.reviews >= 1 and not pods_of(k, ns, "policy")
            # what the job has besides the refused pods: its headless Service and ConfigMap, created before the
            # pods (their rendezvous name and config) and owned by the job, so deleting the job collects them
            n, uid = manifests.names("policy"), k.json("get", "grpojob", "policy", "-n", ns)["metadata"]["uid"]
            for kind, name in (("service", n.service), ("configmap", n.config_map)):
                owners = k.json("get", kind, name, "-n", ns)["metadata"]["ownerReferences"]
                assert [o["uid"] for o in owners] == [uid], (kind, owners)

            # the fix: no hostPath volume; the next try (an update, or the backoff ≤ 30 s) creates the pods
            k("patch", "grpojob", "policy", "-n", ns, "--type=json",
              "-p", json.dumps([{"op": "remove", "path": "/spec/template"}]))
            pods = wait_pods(k, ns, "policy", 2, timeout=60)
            assert not any("hostPath" in v for p in pods for v in p["spec"]["volumes"])
            st = wait_job(k, ns, "policy", lambda s: _create_failed(s).get("status") == "False", timeout=30,
                          what="condition CreateFailed cleared")["status"]
            assert _create_failed(st)["reason"] == "PodsCreated"
            assert "refused" not in (st.get("message") or ""), st
        finally:
            op.stop()


def test_a_failing_admission_webhook_is_a_condition_and_no_start_is_claimed(crd, kubectl, k8s_namespace,
                                                                            tmp_path) -> None:
    """Finding (issue 27, Low): 5xx create refusals (a failing third-party webhook) got no Event or condition, and
    `Created=True`/`startTime` were written before any create succeeded. A webhook for pods whose server is down
    (failurePolicy Fail: the API server answers every pod create with a 500): CreateFailed with the server's words,
    a FailedCreate Event, no startTime, no Created=True; once the webhook is gone, the pods, the start and Created."""
    from tests.support.cluster.util import free_port

    k, ns = kubectl, k8s_namespace
    name, label = f"down-{ns}.grpo.dev", f"down-webhook-{ns}"
    k("label", "namespace", ns, f"{label}=on")
    k.apply([{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
              "metadata": {"name": name},
              "webhooks": [{"name": name, "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/validate"},
                            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                       "resources": ["pods"], "scope": "Namespaced"}],
                            "namespaceSelector": {"matchLabels": {label: "on"}}, "failurePolicy": "Fail",
                            "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 2}]}])
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    wait_until(lambda: "failed calling webhook" in k.create(probe, "-n", ns, "--dry-run=server", check=False).stderr,
               30, 0.2, what="the failing webhook enforced")
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    op.start(wait=False)
    try:
        k.apply([manifest("down", nodes=2, deadline=3600)], "-n", ns)
        try:
            st = wait_job(k, ns, "down", lambda s: _create_failed(s).get("status") == "True", timeout=60,
                          what="condition CreateFailed")["status"]
        except AssertionError:
            print(op.log(60))
            raise
        c = _create_failed(st)
        assert "500" in c["message"] and "failed calling webhook" in c["message"], c
        assert "startTime" not in st, st
        assert not any(x["type"] == "Created" and x["status"] == "True" for x in st["conditions"]), st
        events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=down")["items"]
        assert any(e["reason"] == "FailedCreate" and "failed calling webhook" in e["message"] for e in events)

        k("delete", "validatingwebhookconfiguration", name)  # the webhook's owner fixes it
        wait_pods(k, ns, "down", 2, timeout=60)
        st = wait_job(k, ns, "down", lambda s: _create_failed(s).get("status") == "False", timeout=30,
                      what="condition CreateFailed cleared")["status"]
        assert st.get("startTime") and any(x["type"] == "Created" and x["status"] == "True"
                                           for x in st["conditions"]), st
    finally:
        k("delete", "validatingwebhookconfiguration", name, "--ignore-not-found", check=False)
        op.stop()
