"""decide() in server mode (lifecycle/server/first.py carrying out order.plan()): the server pod first, the
trainers only once it is Ready, the start-up deadline a retryable failure of the server, the status saying why it
waits (Kueue included: the server is its own pod group); colocate unchanged."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle.server import order as so
from tests.support.jobs import job_body, pod_body
from tests.support.lifecycle import POLICY, T0, UID, decide, then


def body(timeout: Optional[int] = None, **kw: Any) -> dict[str, Any]:
    b = job_body("job", nodes=2, uid=UID, vllm_server=True, **kw)
    if timeout is not None:
        b["spec"]["vllm"]["server"]["startupTimeoutSeconds"] = timeout
    return b


def server(phase: str = "Running", *, ready: bool = False, started: Optional[str] = "2030-01-01T12:00:00Z",
           attempt: int = 0, **kw: Any) -> lc.PodInfo:
    pb = pod_body("job", 0, phase, vllm=True, attempt=attempt, **kw)
    if started:
        pb["status"]["startTime"] = started
    pb["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True" if ready else "False"})
    return lc.summarize_pod(pb)


def trainer(rank: int, phase: str = "Pending", attempt: int = 0, **kw: Any) -> lc.PodInfo:
    return lc.summarize_pod(pod_body("job", rank, phase, attempt=attempt, **kw))


def running_cond(st: dict[str, Any]) -> dict[str, Any]:
    c = lc.get_condition(st["conditions"], "Running")
    assert c is not None
    return c  # type: ignore[return-value]


def test_summary_carries_ready_and_start_time() -> None:
    p = server(ready=True)
    assert p.ready and p.start_time == T0 and p.role == "vllm-server"
    assert not trainer(0).ready and trainer(0).start_time is None


def test_the_server_alone_first_then_waiting_then_the_trainers() -> None:
    b = body()
    d = decide(b, [])
    assert d.create_pods == ["job-vllm-0"] and d.create_attempt == 0
    st = d.status
    assert st["phase"] == "Pending" and st["startTime"] and "waiting for the vLLM server" in st["message"]
    assert running_cond(st)["reason"] == so.WAITING_FOR_SERVER and d.requeue_after == POLICY.expectation_ttl

    # on a node, loading (Running, not Ready): trainers withheld, a timer for the deadline (1800 s by default)
    b = then(b, d)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=600))
    assert not d.create_pods and not d.delete_pods and d.status["phase"] == "Pending"
    assert "0/1 Ready, 1200s left of startupTimeoutSeconds (1800s)" in d.status["message"]
    assert running_cond(d.status)["reason"] == so.WAITING_FOR_SERVER and d.requeue_after == 1200

    # Ready: the trainers, in the attempt's group; then the usual phases
    b = then(b, d)
    d = decide(b, [server(ready=True)], T0 + dt.timedelta(seconds=601))
    assert d.create_pods == ["job-node-0", "job-node-1"] and d.create_attempt == 0 and not d.delete_pods
    assert lc.get_condition(d.status["conditions"], "Created")["status"] == "True"  # type: ignore[index]
    b = then(b, d)
    d = decide(b, [server(ready=True), trainer(0, "Running"), trainer(1, "Running")], T0 + dt.timedelta(seconds=700))
    assert d.status["phase"] == "Running" and not d.create_pods and not d.delete_pods


def test_a_started_server_is_not_a_started_gang() -> None:
    """Before, a Running server made the (not yet created) trainers count as 'disappeared': a restart loop."""
    d = decide(body(), [server()], T0 + dt.timedelta(seconds=5))
    assert d.status.get("restarts") == 0 and d.status["phase"] == "Pending" and not d.delete_pods


def test_the_startup_deadline_is_a_retryable_failure_of_the_server() -> None:
    b = body(timeout=120)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=121))
    st = d.status
    assert st["phase"] == "Restarting" and st["restarts"] == 1 and st["lastFailureReason"] == so.SERVER_STARTUP_TIMEOUT
    assert d.delete_pods == ["job-vllm-0"] and not d.create_pods
    assert "startupTimeoutSeconds" in st["message"]
    # the next attempt starts with its server again, after the backoff (the old one gone)
    b = then(b, d)
    d = decide(b, [], T0 + dt.timedelta(seconds=140))
    assert d.create_pods == ["job-vllm-0"] and d.create_attempt == 1
    assert lc.get_condition(d.status["conditions"], "Restarting")["status"] == "False"  # type: ignore[index]


def test_backoff_limit_ends_a_server_that_never_gets_ready() -> None:
    b = body(timeout=60, backoff_limit=0)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=61))
    assert d.status["phase"] == "Failed" and d.status["lastFailureReason"] == so.SERVER_STARTUP_TIMEOUT
    assert lc.get_condition(d.status["conditions"], "Failed")["reason"] == "BackoffLimitExceeded"  # type: ignore[index]


def test_a_server_failing_before_ready_restarts_the_attempt() -> None:
    d = decide(body(), [server("Failed", exit_code=1)])
    assert d.status["phase"] == "Restarting" and d.status["restarts"] == 1 and d.delete_pods == ["job-vllm-0"]


def test_unschedulable_server_is_said() -> None:
    d = decide(body(), [server("Pending", started=None, unschedulable="0/3 nodes: Insufficient nvidia.com/gpu")])
    assert "not yet on a node" in d.status["message"] and "Insufficient nvidia.com/gpu" in d.status["message"]
    assert lc.get_condition(d.status["conditions"], "Unschedulable")["status"] == "True"  # type: ignore[index]


def test_trainers_are_not_withheld_once_created() -> None:
    """The server going un-Ready under running trainers is not a reason to wait: decide()'s usual rules."""
    pods = [server(), trainer(0, "Running"), trainer(1, "Running")]
    d = decide(body(), pods)
    assert d.status["phase"] == "Running" and not d.create_pods and not d.delete_pods


def test_kueue_server_first_in_its_own_group() -> None:
    """Under Kueue too: the server alone first, in a pod group of its own (tests/unit/gang/test_gang_kueue_server.py)."""
    d = decide(body(labels={"kueue.x-k8s.io/queue-name": "q"}), [])
    assert d.create_pods == ["job-vllm-0"] and d.groups == {"vllm-server": "job-uid1-vllm-a0"}


def test_colocate_unchanged() -> None:
    d = decide(job_body("job", nodes=2, uid=UID), [])
    assert d.create_pods == ["job-node-0", "job-node-1"]
