"""vLLM server mode on the real control plane (kube-apiserver + controller-manager + etcd, the real operator
process): the server pod alone first and the job Pending waiting for it; the trainers only once the server pod is
Ready; the start-up deadline and a server failure restart the attempt, again server first; a trainer's exit 137
restarts only the trainers and keeps the server pod (same uid), after the operator's engine probe reached it. No
kubelet: the test plays it through pods/status (the Ready condition is what the server's /health readiness probe
would set; the server's pod IP is loopback, where a stand-in of vLLM's OpenAI API answers the engine probe).

Prints the pods and their uids at each step (the transcript for issue 21's note; run with -s to see it)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.support.cluster.util import wait_until
from tests.support.fake_vllm import FakeVllm
from tests.support.jobs import manifest
from tests.support.operator import get_job, pod_exit, pod_running, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def cond(status: dict[str, Any], ctype: str) -> Any:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), None)


def stamp(ago: float = 0.0) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def server_started(k: Any, ns: str, pod: str, *, ready: bool, ago: float = 0.0, ip: str = "") -> None:
    """The kubelet accepted the server pod (status.startTime) and its readiness probe passes or not yet."""
    k.patch_status("pod", pod, {"phase": "Running", "startTime": stamp(ago), **(
        {"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {}), "conditions": [
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


def attempts(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["metadata"]["annotations"]["grpo.dev/attempt"])
            for p in pods}


def live(k: Any, ns: str, job: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(k, ns, job) if not p["metadata"].get("deletionTimestamp")]


def test_a_trainer_exit_137_keeps_the_server(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    with FakeVllm("ok") as engine:
        m = manifest("keep", nodes=2, vllm_server=True)
        m["spec"]["vllm"]["server"]["port"] = engine.port  # the engine probe dials <pod IP>:<port>
        k.apply(m, "-n", ns)
        server = wait_pods(k, ns, "keep", 1)[0]["metadata"]
        server_started(k, ns, server["name"], ready=True, ip="127.0.0.1")
        pods = wait_pods(k, ns, "keep", 3)
        for p in pods:
            if p["metadata"]["name"] != server["name"]:
                pod_running(k, ns, p["metadata"]["name"])
        wait_job(k, ns, "keep", lambda s: s.get("phase") == "Running")
        before = attempts(transcript(k, ns, "keep", "running, attempt 0"))

        # 1. a trainer is OOM-killed (exit 137): the trainers go, the server stays; the engine probe, then new trainers
        pod_exit(k, ns, "keep-node-0", 137)
        st = wait_job(k, ns, "keep", lambda s: s.get("restarts") == 1)["status"]
        assert st.get("vllmServerAttempt") == 0 and st["lastFailureReason"] == "ExitCode137", st

        def restart_event() -> Any:  # the Restarting Event carries the restart's message
            evs = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=keep")["items"]
            return [e["message"] for e in evs if e["reason"] == "Restarting"] or None

        message = wait_until(restart_event, 30, 0.5, what="the Restarting event")[0]
        assert "exited with code 137" in message and "keeping the Ready vLLM server keep-vllm-0" in message, message
        print(f"\n[Restarting event] {message}")

        def restarted() -> Any:
            now = attempts(live(k, ns, "keep"))
            trainers = [n for n in now if n != server["name"]]
            return now if len(trainers) == 2 and all(now[n][1] == "1" for n in trainers) else None

        after = wait_until(restarted, 60, 0.3, what="attempt 1's trainers next to the kept server")
        transcript(k, ns, "keep", "trainer exit 137: trainers restarted, server kept")
        assert after[server["name"]] == before[server["name"]] == (server["uid"], "0")  # the same server pod
        assert all(after[n][0] != before[n][0] for n in after if n != server["name"])  # new trainer pods
        assert engine.requests >= 1  # the operator asked the kept engine for a token before the new trainers

        # 2. the kept server fails under the new trainers: every pod goes, attempt 2 starts with a new server alone
        pod_exit(k, ns, server["name"], 1)
        st = wait_job(k, ns, "keep", lambda s: s.get("restarts") == 2)["status"]
        assert "vllmServerAttempt" not in st, st
        pods = wait_pods(k, ns, "keep", 1, attempt=2)
        assert roles(pods) == ["vllm-server"] and pods[0]["metadata"]["uid"] != server["uid"]
        transcript(k, ns, "keep", "kept server failed: all restarted, server first")
        server_started(k, ns, pods[0]["metadata"]["name"], ready=True, ip="127.0.0.1")
        pods = wait_pods(k, ns, "keep", 3, attempt=2)
        assert roles(pods) == ["trainer", "trainer", "vllm-server"]
        transcript(k, ns, "keep", "attempt 2: new server Ready, trainers created")


def test_a_wedged_kept_server_is_replaced_before_the_trainers(operator_process, kubectl, k8s_namespace) -> None:
    """The engine probe fails (the engine answers 500, as one whose workers died in a weight sync): the kept server is
    replaced, without counting a second restart, and attempt 1 starts server first."""
    k, ns = kubectl, k8s_namespace
    with FakeVllm("error") as engine:
        m = manifest("wedge", nodes=1, vllm_server=True)
        m["spec"]["vllm"]["server"]["port"] = engine.port
        k.apply(m, "-n", ns)
        server = wait_pods(k, ns, "wedge", 1)[0]["metadata"]
        server_started(k, ns, server["name"], ready=True, ip="127.0.0.1")
        wait_pods(k, ns, "wedge", 2)
        pod_running(k, ns, "wedge-node-0")
        wait_job(k, ns, "wedge", lambda s: s.get("phase") == "Running")
        pod_exit(k, ns, "wedge-node-0", 137)
        pods = wait_pods(k, ns, "wedge", 1, attempt=1)
        assert roles(pods) == ["vllm-server"] and pods[0]["metadata"]["uid"] != server["uid"] and engine.requests >= 1
        st = get_job(k, ns, "wedge")["status"]
        assert st["restarts"] == 1 and "vllmServerAttempt" not in st, st
        transcript(k, ns, "wedge", "engine probe failed: server replaced")
        server_started(k, ns, pods[0]["metadata"]["name"], ready=True, ip="127.0.0.1")
        pods = wait_pods(k, ns, "wedge", 2, attempt=1)
        assert roles(pods) == ["trainer", "vllm-server"]
