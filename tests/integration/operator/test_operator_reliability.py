"""Reliability on the real control plane: operator crashes mid-creation, API server + etcd restarts, and the
controller's own validation when no webhook is installed."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import (
    OperatorProcess,
    get_job,
    install_crd,
    pod_exit,
    pod_running,
    pods_of,
    wait_job,
    wait_pods,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def cond(status, ctype):
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), None)


def test_operator_killed_at_random_points_converges(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    n_jobs, nodes = 20, 3
    k.apply([manifest(f"r{i:02d}", nodes=nodes) for i in range(n_jobs)], "-n", ns)
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    rng = random.Random(1234)
    try:
        for _ in range(5):
            op.start(wait=False)
            time.sleep(rng.uniform(0.8, 2.5))  # python start ≈ 0.7 s; then it is mid-creation
            op.kill()
        op.start(wait=False)

        def converged() -> bool:
            items = k.json("get", "grpojobs", "-n", ns)["items"]
            if len(k.json("get", "pods", "-n", ns)["items"]) < n_jobs * nodes:
                return False
            return len(items) == n_jobs and all(
                (j.get("status") or {}).get("phase") == "Pending" and (cond(j["status"], "Created") or {}).get("status") == "True"
                for j in items)

        wait_until(converged, 120, 0.5, what="every job converged")
        pods = k.json("get", "pods", "-n", ns)["items"]
        names = Counter(p["metadata"]["name"] for p in pods)
        assert len(pods) == n_jobs * nodes and max(names.values()) == 1  # 0 duplicates
        jobs = {j["metadata"]["uid"]: j for j in k.json("get", "grpojobs", "-n", ns)["items"]}
        for p in pods:  # 0 orphans: every pod is owned by a live job and has a name of its gang
            ref = p["metadata"]["ownerReferences"][0]
            assert ref["uid"] in jobs and p["metadata"]["name"].startswith(ref["name"] + "-node-")
            assert p["metadata"]["annotations"]["grpo.dev/attempt"] == "0"
        assert all(j["status"]["restarts"] == 0 for j in jobs.values())
        for kind in ("configmaps", "services"):
            objs = [o for o in k.json("get", kind, "-n", ns)["items"] if o["metadata"].get("ownerReferences")]
            assert len(objs) == n_jobs
    finally:
        op.stop()


def test_controller_rejects_invalid_job_without_webhook(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns).start(wait=False)
    try:
        k.apply(manifest("bad", gpus=3, per_device=1, num_generations=8), "-n", ns)
        st = wait_job(k, ns, "bad", lambda s: s.get("phase") == "Rejected")["status"]
        c = cond(st, "Rejected")
        assert c["status"] == "True" and "numGenerations" in c["message"] and c["observedGeneration"] == 1

        def rejected_event() -> bool:  # Events are posted in the background, after the status
            events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=bad")["items"]
            return any(e["type"] == "Warning" and e["reason"] == "Rejected" for e in events)

        wait_until(rejected_event, 30, 0.3, what="a Warning event Rejected")
        op.wait_pass(ns, "bad")
        assert not pods_of(k, ns, "bad")
    finally:
        op.stop()


def test_apiserver_and_etcd_restart_failures_are_acted_on(controlplane_factory, tmp_path) -> None:
    cp = controlplane_factory(authorization_mode="AlwaysAllow")
    k = cp.kubectl
    install_crd(k)
    ns = "outage"
    cp.ensure_namespace(ns)
    op = OperatorProcess(cp.kubeconfig, tmp_path, "--namespace", ns).start(wait=False)
    try:
        k.apply([manifest("a", nodes=2), manifest("b", nodes=2)], "-n", ns)
        for job in ("a", "b"):
            for p in wait_pods(k, ns, job, 2, timeout=60):
                pod_running(k, ns, p["metadata"]["name"])
            wait_job(k, ns, job, lambda s: s.get("phase") == "Running")
        # a failure written right before the crash of etcd + apiserver (the operator may not have seen it) …
        pod_exit(k, ns, "a-node-0", 137, "OOMKilled")
        cp.restart(kill=True, downtime=2.0)
        # … and one written the moment the API is back, before the operator's watches reconnect
        pod_exit(k, ns, "b-node-1", 143)
        for job, reason in (("a", "OOMKilled"), ("b", "Preempted")):
            st = wait_job(k, ns, job, lambda s: s.get("restarts") == 1, timeout=90)["status"]
            assert st["lastFailureReason"] == reason
            wait_pods(k, ns, job, 2, attempt=1, timeout=60)
    finally:
        op.stop()


def test_restart_with_running_jobs_in_two_namespaces_acts_only_on_real_failures(crd, kubectl, k8s_namespace,
                                                                                  tmp_path) -> None:
    """A fresh operator process must list the pods of every watched namespace before it decides anything: a running
    job whose pods are merely "not listed yet" must not be gang-restarted. Then a real failure is acted on."""
    k, ns1 = kubectl, k8s_namespace
    ns2 = ns1 + "-b"
    crd.ensure_namespace(ns2)
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns1, "--namespace", ns2).start(wait=False)
    try:
        for ns in (ns1, ns2):
            k.apply(manifest("w", nodes=2), "-n", ns)
        for ns in (ns1, ns2):
            for p in wait_pods(k, ns, "w", 2, timeout=60):
                pod_running(k, ns, p["metadata"]["name"])
            wait_job(k, ns, "w", lambda s: s.get("phase") == "Running")
        for ns in (ns1, ns2):  # the status settles (progress is off: no trainer to scrape)
            op.wait_pass(ns, "w")
        before = {ns: get_job(k, ns, "w")["metadata"]["resourceVersion"] for ns in (ns1, ns2)}
        for _ in range(3):  # restart it a few times: each new process starts with an empty pod index
            op.stop()
            op.start(wait=False)
            for ns in (ns1, ns2):  # the new process's first pass (counted only once the pods are listed)
                wait_until(lambda ns=ns: op.passes(ns, "w") >= 1, 60, 0.2, what=f"the first pass of {ns}/w")
        for ns in (ns1, ns2):
            job = get_job(k, ns, "w")
            st = job["status"]
            assert st["phase"] == "Running" and st["restarts"] == 0, (ns, st)
            # nothing was written: no status flapping to Pending while the pods were "not listed yet"
            assert job["metadata"]["resourceVersion"] == before[ns], (ns, st)
            assert [p["metadata"]["annotations"]["grpo.dev/attempt"] for p in pods_of(k, ns, "w")] == ["0", "0"]
        pod_exit(k, ns2, "w-node-1", 137, "OOMKilled")
        st = wait_job(k, ns2, "w", lambda s: s.get("restarts") == 1, timeout=60)["status"]
        assert st["lastFailureReason"] == "OOMKilled"
        wait_pods(k, ns2, "w", 2, attempt=1, timeout=60)
        assert get_job(k, ns1, "w")["status"]["restarts"] == 0
    finally:
        op.stop()
        k("delete", "namespace", ns2, "--wait=false", "--ignore-not-found", check=False)


def test_a_started_job_that_todays_rules_refuse_keeps_its_pods(crd, kubectl, k8s_namespace, tmp_path) -> None:
    """An upgrade that tightened a rule: a job an earlier release admitted and started, stored as that release left it
    (its pods rendered from the stored spec and running, status Running), and a spec that today's validator refuses
    (a batch rule: the CRD's schema accepts it). The operator keeps the pods, says SpecInvalid, and the job still
    ends Succeeded."""
    from grpo_operator.render import manifests
    from grpo_operator.rules import validation

    k, ns = kubectl, k8s_namespace
    k.apply(manifest("old", gpus=3, per_device=1, num_generations=8), "-n", ns)
    job = get_job(k, ns, "old")
    res = validation.validate({key: job[key] for key in ("apiVersion", "kind", "metadata", "spec")})
    assert not res.valid and res.job is not None and res.topology is not None
    pods = [o for o in manifests.core_objects(res.job, res.topology, ns, uid=job["metadata"]["uid"]) if o["kind"] == "Pod"]
    k.apply(pods, "-n", ns)
    for p in pods:
        pod_running(k, ns, p["metadata"]["name"])
    k.patch_status("grpojob", "old", {"phase": "Running", "startTime": "2030-01-01T00:00:00Z", "observedGeneration": 1,
                                      "restarts": 0, "conditions": [
                                          {"type": "Created", "status": "True", "reason": "PodsCreated", "message": "x",
                                           "lastTransitionTime": "2030-01-01T00:00:00Z"}]}, "-n", ns)
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns).start(wait=False)
    try:
        st = wait_job(k, ns, "old", lambda s: (cond(s, "SpecInvalid") or {}).get("status") == "True",
                      what="condition SpecInvalid")["status"]
        assert st["phase"] == "Running" and "numGenerations" in cond(st, "SpecInvalid")["message"]
        assert cond(st, "Rejected") is None

        def warned() -> bool:  # Events are posted in the background, after the status
            events = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=old")["items"]
            return any(e["type"] == "Warning" and e["reason"] == "SpecInvalid" for e in events)

        wait_until(warned, 30, 0.3, what="a Warning event SpecInvalid")
        alive = pods_of(k, ns, "old")
        assert [p["metadata"]["uid"] for p in alive] and not any(p["metadata"].get("deletionTimestamp") for p in alive)
        assert len(alive) == len(pods)
        for p in alive:
            pod_exit(k, ns, p["metadata"]["name"], 0)
        wait_job(k, ns, "old", lambda s: s.get("phase") == "Succeeded", what="Succeeded")
        assert len(pods_of(k, ns, "old")) == len(pods)
    finally:
        op.stop()
