"""vLLM server mode on the real control plane (kube-apiserver + controller-manager + etcd, the real operator
process): the server pod alone first and the job Pending waiting for it; the trainers only once the server pod is
Ready; the start-up deadline and a server failure restart the attempt, again server first. No kubelet: the test
plays it through pods/status (the Ready condition is what the server's /health readiness probe would set).

Prints the pods and their uids at each step (the transcript for issue 21's note; run with -s to see it)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.support.jobs import manifest
from tests.support.operator import get_job, pod_exit, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def cond(status: dict[str, Any], ctype: str) -> Any:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), None)


def stamp(ago: float = 0.0) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def server_started(k: Any, ns: str, pod: str, *, ready: bool, ago: float = 0.0) -> None:
    """The kubelet accepted the server pod (status.startTime) and its readiness probe passes or not yet."""
    k.patch_status("pod", pod, {"phase": "Running", "startTime": stamp(ago), "conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": 0, "image": "vllm", "imageID": "",
                               "state": {"running": {"startedAt": stamp(ago)}}}]}, "-n", ns)


def transcript(k: Any, ns: str, job: str, step: str) -> list[dict[str, Any]]:
    pods = [p for p in pods_of(k, ns, job) if not p["metadata"].get("deletionTimestamp")]
    st = get_job(k, ns, job).get("status") or {}
    print(f"\n[{step}] phase={st.get('phase')} restarts={st.get('restarts')} message={st.get('message')!r}")
    for p in pods:
        m = p["metadata"]
        print(f"    {m['name']:<14} uid={m['uid']} role={m['labels']['grpo.dev/role']} "
              f"attempt={m['annotations']['grpo.dev/attempt']}")
    return pods


def roles(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["labels"]["grpo.dev/role"] for p in pods)


def test_server_first_then_trainers_and_restarts(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(manifest("srv", nodes=2, vllm_server=True), "-n", ns)

    # 1. the server pod alone, the job Pending and saying why
    pods = wait_pods(k, ns, "srv", 1)
    assert roles(pods) == ["vllm-server"]
    st = wait_job(k, ns, "srv", lambda s: (cond(s, "Running") or {}).get("reason") == "WaitingForVllmServer")["status"]
    assert st["phase"] == "Pending" and "waiting for the vLLM server" in st["message"], st
    server = pods[0]["metadata"]
    transcript(k, ns, "srv", "created")

    # 2. on a node and loading (not Ready): still no trainer, the message counts the Ready server pods
    server_started(k, ns, server["name"], ready=False)
    st = wait_job(k, ns, "srv", lambda s: "0/1 Ready" in (s.get("message") or ""))["status"]
    assert st["phase"] == "Pending" and roles(transcript(k, ns, "srv", "loading")) == ["vllm-server"]

    # 3. Ready: the trainers appear, the server is the same pod
    server_started(k, ns, server["name"], ready=True)
    pods = wait_pods(k, ns, "srv", 3)
    assert roles(pods) == ["trainer", "trainer", "vllm-server"]
    assert next(p for p in pods if p["metadata"]["name"] == server["name"])["metadata"]["uid"] == server["uid"]
    transcript(k, ns, "srv", "server Ready")

    # 4. the server fails under the trainers: every pod goes, attempt 1 starts with its server alone again
    pod_exit(k, ns, server["name"], 1)
    st = wait_job(k, ns, "srv", lambda s: s.get("restarts") == 1 and s.get("lastFailureReason"))["status"]
    pods = wait_pods(k, ns, "srv", 1, attempt=1)
    assert roles(pods) == ["vllm-server"] and pods[0]["metadata"]["uid"] != server["uid"]
    transcript(k, ns, "srv", "server failed")
    server_started(k, ns, pods[0]["metadata"]["name"], ready=True)
    pods = wait_pods(k, ns, "srv", 3, attempt=1)
    assert roles(pods) == ["trainer", "trainer", "vllm-server"]
    transcript(k, ns, "srv", "attempt 1: server Ready")


def test_startup_deadline_restarts_the_server(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    m = manifest("slow", nodes=1, vllm_server=True)
    m["spec"]["vllm"]["server"]["startupTimeoutSeconds"] = 30
    k.apply(m, "-n", ns)
    server = wait_pods(k, ns, "slow", 1)[0]["metadata"]
    transcript(k, ns, "slow", "created")
    server_started(k, ns, server["name"], ready=False, ago=60)  # loading for a minute: past its 30 s
    st = wait_job(k, ns, "slow", lambda s: s.get("restarts") == 1)["status"]
    assert st["lastFailureReason"] == "VllmServerStartupTimeout", st
    pods = wait_pods(k, ns, "slow", 1, attempt=1)
    assert roles(pods) == ["vllm-server"] and pods[0]["metadata"]["uid"] != server["uid"]
    transcript(k, ns, "slow", "past the start-up deadline")
