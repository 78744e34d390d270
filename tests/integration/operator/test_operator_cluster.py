"""The real control plane: kube-apiserver 1.20.2 + kube-controller-manager (GC) + etcd, the real kubectl, the
real `grpo-operator` process with its HTTPS webhook. The test plays the kubelet through pods/status.

Runs unchanged against any cluster given by GRPO_TEST_KUBECONFIG (then set GRPO_TEST_WEBHOOK_HOST to an
address of this machine the API server can dial)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import get_job, pod_exit, pod_running, pod_unschedulable, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def cond(status, ctype):
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), None)


def test_crd_installed_and_served(crd) -> None:
    k = crd.kubectl
    c = k.json("get", "crd", "grpojobs.grpo.dev")
    assert c["spec"]["names"]["shortNames"] == ["gj"]
    assert "gj" in k("api-resources", "--api-group=grpo.dev").stdout


def test_liveness_and_json_logs(operator_process) -> None:
    import urllib.request

    with urllib.request.urlopen(operator_process.liveness_url, timeout=5) as r:
        assert r.status == 200
    lines = [ln for ln in operator_process.log(200).splitlines() if ln.startswith("{")]
    assert lines and all(json.loads(ln)["level"] for ln in lines)


def test_invalid_job_is_refused_by_the_webhook(operator_process, kubectl, k8s_namespace) -> None:
    bad = manifest("wrong-batch", gpus=3, per_device=1, num_generations=8)
    r = kubectl.apply(bad, "-n", k8s_namespace, check=False)
    assert r.returncode != 0
    out = r.stderr
    assert "denied the request" in out and "spec.training.numGenerations" in out, out
    assert "generation_batch_size (3)" in out and "Valid numGenerations" in out and "numGenerations 8 → 3" in out, out
    assert not kubectl.exists("grpojob", "wrong-batch", "-n", k8s_namespace)


@pytest.mark.parametrize("where, typo, hint", [
    ("training", "numGeneration", "numGenerations"),   # a misspelt TRL argument
    ("spec", "node", "nodes"),                          # a misspelt top-level field
    ("runPolicy", "backofLimit", "backoffLimit"),       # a misspelt nested field
])
def test_a_typo_is_refused_by_name_on_every_path(operator_process, kubectl, kubeconfig, k8s_namespace,
                                                  where, typo, hint) -> None:
    """The API server keeps unknown spec fields (preserve-unknown-fields) so the webhook refuses them with "did you
    mean": sent without kubectl's client-side check, by the official Python client, the typo would otherwise be pruned
    and the job would run silently with TRL's default."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    body = manifest(f"typo-{typo.lower()}")
    target = body["spec"] if where == "spec" else body["spec"][where]
    target[typo] = 4
    r = kubectl.create(body, "-n", k8s_namespace, validate=False, check=False)
    assert r.returncode != 0 and "denied the request" in r.stderr, r.stderr
    assert f"'{typo}'" in r.stderr and f"did you mean '{hint}'" in r.stderr, r.stderr

    api = k8s_client.CustomObjectsApi(k8s_config.new_client_from_config(config_file=str(kubeconfig)))
    with pytest.raises(k8s_client.ApiException) as denied:
        api.create_namespaced_custom_object("grpo.dev", "v1alpha1", k8s_namespace, "grpojobs", body)
    assert denied.value.status in (400, 403, 422) and f"did you mean '{hint}'" in str(denied.value.body)
    assert not kubectl.exists("grpojob", body["metadata"]["name"], "-n", k8s_namespace)


def test_warnings_and_update_rules(operator_process, kubectl, k8s_namespace) -> None:
    m = manifest("upd", nodes=1)
    del m["spec"]["output"]["volumeClaimName"]
    r = kubectl.apply(m, "-n", k8s_namespace)
    assert "Warning:" in r.stderr and "volumeClaimName" in r.stderr
    r = kubectl("patch", "grpojob", "upd", "-n", k8s_namespace, "--type=merge", "-p", '{"spec":{"nodes":2}}', check=False)
    assert r.returncode != 0 and "spec.nodes cannot change" in r.stderr, r.stderr
    r = kubectl("patch", "grpojob", "upd", "-n", k8s_namespace, "--type=merge",
                "-p", '{"spec":{"runPolicy":{"backoffLimit":5}}}')
    assert get_job(kubectl, k8s_namespace, "upd")["spec"]["runPolicy"]["backoffLimit"] == 5


def test_job_lifecycle_running_retry_success_and_gc(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("train", nodes=2), "-n", ns)
    pods = wait_pods(k, ns, "train", 2)
    job = get_job(k, ns, "train")
    uid = job["metadata"]["uid"]
    for obj in [*pods, k.json("get", "configmap", "train-config", "-n", ns), k.json("get", "service", "train", "-n", ns)]:
        refs = obj["metadata"]["ownerReferences"]
        assert refs[0]["uid"] == uid and refs[0]["controller"] is True
    st = wait_job(k, ns, "train", lambda s: s.get("phase") == "Pending" and s.get("startTime"))["status"]
    assert st["topology"] == "2x4" and st["batch"]["worldSize"] == 8 and st["observedGeneration"] == 1
    assert cond(st, "Created")["status"] == "True"

    for p in pods:
        pod_running(k, ns, p["metadata"]["name"])
    st = wait_job(k, ns, "train", lambda s: s.get("phase") == "Running")["status"]
    assert cond(st, "Running")["status"] == "True" and cond(st, "Running")["observedGeneration"] == 1

    # retryable failure (SIGTERM → 143): the whole gang is deleted and recreated with attempt 1
    old_uids = {p["metadata"]["uid"] for p in pods}
    pod_exit(k, ns, "train-node-1", 143)
    new = wait_pods(k, ns, "train", 2, attempt=1)
    assert not old_uids & {p["metadata"]["uid"] for p in new}
    assert all("-1" in " ".join(p["spec"]["containers"][0]["args"]) for p in new)  # new rendezvous id
    st = wait_job(k, ns, "train", lambda s: s.get("restarts") == 1 and s.get("phase") == "Pending")["status"]
    assert st["lastFailureReason"] == "Preempted" and cond(st, "Restarting")["status"] == "False"

    for p in new:
        pod_running(k, ns, p["metadata"]["name"])
    wait_job(k, ns, "train", lambda s: s.get("phase") == "Running")
    for p in new:
        pod_exit(k, ns, p["metadata"]["name"], 0)
    st = wait_job(k, ns, "train", lambda s: s.get("phase") == "Succeeded")["status"]
    assert st["completionTime"] and st["restarts"] == 1 and cond(st, "Succeeded")["status"] == "True"

    def events_posted() -> Any:  # Events are posted in the background, after the status
        evs = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=train")["items"]
        return evs if {"Pending", "Running", "Restarting", "Succeeded"} <= {e["reason"] for e in evs} else None

    events = wait_until(events_posted, 30, 0.5, what="the job's events")
    assert any(e["type"] == "Warning" and e["reason"] == "Restarting" for e in events)

    # deleting the job garbage-collects every child (kube-controller-manager's GC)
    k("delete", "grpojob", "train", "-n", ns, "--wait=false")

    def gone() -> bool:
        return (not pods_of(k, ns, "train") and not k.exists("configmap", "train-config", "-n", ns)
                and not k.exists("service", "train", "-n", ns))

    wait_until(gone, 60, 0.5, what="children garbage-collected")


def test_permanent_failure_fails_without_restart(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("perm", nodes=2), "-n", ns)
    pods = wait_pods(k, ns, "perm", 2)
    for p in pods:
        pod_running(k, ns, p["metadata"]["name"])
    wait_job(k, ns, "perm", lambda s: s.get("phase") == "Running")
    pod_exit(k, ns, "perm-node-0", 1)
    st = wait_job(k, ns, "perm", lambda s: s.get("phase") == "Failed")["status"]
    assert st["restarts"] == 0 and st["lastFailureReason"] == "InternalError" and st["completionTime"]
    assert cond(st, "Failed")["reason"] == "InternalError"
    # the other node is stopped; nothing is recreated
    wait_until(lambda: [p["metadata"]["name"] for p in pods_of(k, ns, "perm")] == ["perm-node-0"], 30, 0.3,
               what="running node deleted")
    operator_process.wait_pass(ns, "perm")  # decided again since: still nothing recreated
    left = pods_of(k, ns, "perm")
    assert [p["metadata"]["annotations"]["grpo.dev/attempt"] for p in left] == ["0"]
    assert get_job(k, ns, "perm")["status"]["phase"] == "Failed"


def test_unschedulable_surfaces_scheduler_message(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("big", nodes=1, gpus=8), "-n", ns)
    wait_pods(k, ns, "big", 1)
    msg = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    pod_unschedulable(k, ns, "big-node-0", msg)
    st = wait_job(k, ns, "big", lambda s: (cond(s, "Unschedulable") or {}).get("status") == "True")["status"]
    assert msg in cond(st, "Unschedulable")["message"] and st["phase"] == "Pending"


def test_suspend_resume_and_deadline(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("sus", nodes=2), "-n", ns)
    wait_pods(k, ns, "sus", 2)
    k("patch", "grpojob", "sus", "-n", ns, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    wait_job(k, ns, "sus", lambda s: s.get("phase") == "Suspended")
    wait_until(lambda: not pods_of(k, ns, "sus"), 30, 0.3, what="pods deleted on suspend")
    k("patch", "grpojob", "sus", "-n", ns, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    wait_pods(k, ns, "sus", 2)
    wait_job(k, ns, "sus", lambda s: s.get("phase") == "Pending" and (cond(s, "Suspended") or {}).get("status") == "False")

    k.apply(manifest("late", nodes=1, deadline=2), "-n", ns)
    wait_pods(k, ns, "late", 1)
    pod_running(k, ns, "late-node-0")
    st = wait_job(k, ns, "late", lambda s: s.get("phase") == "Failed", timeout=30)["status"]
    assert cond(st, "Failed")["reason"] == "DeadlineExceeded"
    wait_until(lambda: not pods_of(k, ns, "late"), 30, 0.3, what="pods deleted after the deadline")


def test_ttl_after_finished_deletes_the_job(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("ttl", nodes=1, ttl=1), "-n", ns)
    wait_pods(k, ns, "ttl", 1)
    pod_exit(k, ns, "ttl-node-0", 0)
    wait_until(lambda: not k.exists("grpojob", "ttl", "-n", ns), 30, 0.3, what="job deleted by TTL")


def test_vllm_server_mode_gang_restart(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("srv", nodes=1, vllm_server=True), "-n", ns)
    # the server first, the trainer once it is Ready (test_operator_server.py has the order in detail)
    assert [p["metadata"]["name"] for p in wait_pods(k, ns, "srv", 1)] == ["srv-vllm-0"]
    pod_running(k, ns, "srv-vllm-0")
    pods = wait_pods(k, ns, "srv", 2)
    assert {p["metadata"]["name"] for p in pods} == {"srv-node-0", "srv-vllm-0"}
    assert k.exists("service", "srv-vllm", "-n", ns)
    pod_running(k, ns, "srv-node-0")
    wait_job(k, ns, "srv", lambda s: s.get("phase") == "Running")
    server_uid = next(p["metadata"]["uid"] for p in pods if p["metadata"]["name"] == "srv-vllm-0")
    pod_exit(k, ns, "srv-node-0", 143)  # the trainer restarts; the Ready server is kept (test_operator_server.py)
    st = wait_job(k, ns, "srv", lambda s: "checking the kept vLLM server" in (s.get("message") or ""))["status"]
    assert st["restarts"] == 1 and st["vllmServerAttempt"] == 0
    # no pod IP here, so no engine probe: the kept server stays, and a pass since creates no trainer
    operator_process.wait_pass(ns, "srv")
    assert [(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods_of(k, ns, "srv")] == [("srv-vllm-0", server_uid)]
    assert get_job(k, ns, "srv")["status"]["restarts"] == 1


def test_lost_node_pod_stuck_terminating_is_force_deleted_and_the_gang_restarts(operator_process, kubectl,
                                                                               k8s_namespace) -> None:
    """A node that stops answering: its pod is evicted (deletionTimestamp set) but no kubelet ever confirms, so
    the pod would stay Terminating forever and block the gang restart. The operator runs with
    GRPO_FORCE_DELETE_AFTER_SECONDS=2."""
    k, ns = kubectl, k8s_namespace
    node = f"lost-{ns}"
    k.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        k.apply(manifest("lost", nodes=2), "-n", ns)
        wait_pods(k, ns, "lost", 2)
        # the scheduler puts rank 1 on the node that will be lost (rank 0 stays unbound: its deletion is instant,
        # as on a healthy node whose kubelet confirms at once)
        k.create({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "lost-node-1"},
                  "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, "-n", ns)
        for name in ("lost-node-0", "lost-node-1"):
            pod_running(k, ns, name)
        wait_job(k, ns, "lost", lambda s: s.get("phase") == "Running")
        old_uid = k.json("get", "pod", "lost-node-1", "-n", ns)["metadata"]["uid"]

        k("delete", "pod", "lost-node-1", "-n", ns, "--grace-period=1", "--wait=false")  # the eviction
        stuck = k.json("get", "pod", "lost-node-1", "-n", ns, check=False)
        assert stuck and stuck["metadata"].get("deletionTimestamp"), stuck  # terminating, not gone

        new = wait_pods(k, ns, "lost", 2, attempt=1, timeout=60)
        assert old_uid not in {p["metadata"]["uid"] for p in new}
        st = wait_job(k, ns, "lost", lambda s: s.get("restarts") == 1 and s.get("phase") == "Pending")["status"]
        assert st["lastFailureReason"] == "PodDeleted", st

        def force_event() -> Any:
            evs = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=lost")["items"]
            return [e for e in evs if e["reason"] == "ForceDeleted"]

        evs = wait_until(force_event, 30, 0.5, what="a ForceDeleted event")
        assert evs[0]["type"] == "Warning" and "lost-node-1" in evs[0]["message"], evs
        assert "grace period" in evs[0]["message"]
    finally:
        k("delete", "node", node, "--wait=false", check=False)
