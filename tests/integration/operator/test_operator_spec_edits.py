"""A runPolicy edit never changes a started job's phase or pods, on the real control plane (issue 27, finding 1):
the end-to-end story a lowered policy.maxNodesPerJob and an operator restart made lose running work."""

from __future__ import annotations

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, get_job, pod_exit, pod_running, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def cond(status, ctype):
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), None) or {}


def test_runpolicy_edits_after_a_lowered_node_limit_and_a_restart_keep_the_jobs(crd, kubectl, k8s_namespace,
                                                                                 tmp_path) -> None:
    """Finding 1: after GRPO_MAX_NODES_PER_JOB was lowered below a running 2-node job's nodes and the operator
    restarted, setting activeDeadlineSeconds (admitted: "this update adds no error") turned the job Rejected and
    deleted both pods; a Succeeded job given a TTL became Rejected. Now: the running job keeps its pods and stays
    Running (SpecInvalid=True as today), the Succeeded one stays Succeeded and its TTL fires."""
    k, ns = kubectl, k8s_namespace
    before = OperatorProcess(crd.kubeconfig, tmp_path / "before", "--namespace", ns, webhook=True).start()
    try:
        k.apply([manifest("run2", nodes=2), manifest("done2", nodes=2)], "-n", ns)
        for name in ("run2", "done2"):
            wait_pods(k, ns, name, 2)
        for rank in (0, 1):
            pod_running(k, ns, f"run2-node-{rank}")
            pod_exit(k, ns, f"done2-node-{rank}", 0)
        wait_job(k, ns, "run2", lambda s: s.get("phase") == "Running")
        wait_job(k, ns, "done2", lambda s: s.get("phase") == "Succeeded")
    finally:
        before.stop()
    after = OperatorProcess(crd.kubeconfig, tmp_path / "after", "--namespace", ns, webhook=True,
                            env={"GRPO_MAX_NODES_PER_JOB": "1"}).start()
    try:
        wait_job(k, ns, "run2", lambda s: cond(s, "SpecInvalid").get("status") == "True")
        uids = {p["metadata"]["uid"] for p in pods_of(k, ns, "run2")}
        k("patch", "grpojob", "run2", "-n", ns, "--type=merge", "-p",
          '{"spec":{"runPolicy":{"activeDeadlineSeconds":86400}}}')
        st = wait_job(k, ns, "run2", lambda s: s.get("observedGeneration") == 2)["status"]
        assert st["phase"] == "Running" and cond(st, "Rejected") == {}, st
        assert cond(st, "SpecInvalid")["status"] == "True"
        pods = pods_of(k, ns, "run2")
        assert {p["metadata"]["uid"] for p in pods} == uids and not any(
            p["metadata"].get("deletionTimestamp") for p in pods)

        # a TTL not yet due: the edit is acted on (generation 2) and the job stays Succeeded
        k("patch", "grpojob", "done2", "-n", ns, "--type=merge", "-p",
          '{"spec":{"runPolicy":{"ttlSecondsAfterFinished":3600}}}')
        st = wait_job(k, ns, "done2", lambda s: s.get("observedGeneration") == 2)["status"]
        assert st["phase"] == "Succeeded" and cond(st, "Rejected") == {}, st
        # a due one: the job is deleted
        k("patch", "grpojob", "done2", "-n", ns, "--type=merge", "-p",
          '{"spec":{"runPolicy":{"ttlSecondsAfterFinished":1}}}')
        wait_until(lambda: not k.exists("grpojob", "done2", "-n", ns), 60, 0.2, what="done2 deleted by its TTL")
        assert get_job(k, ns, "run2")["status"]["phase"] == "Running"
    finally:
        after.stop()
