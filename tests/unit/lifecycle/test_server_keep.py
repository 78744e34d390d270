"""decide() in server mode across restarts (lifecycle/server/keep.py): a retryable trainer failure restarts the
trainers and keeps a healthy vLLM server (same pod, same uid), whose engine probe runs before the next trainers are
created; a failed or hung probe, a server failure or the kept-server-without-progress rule restart the server too,
in the server-first order; suspend, the deadline and give-up end both; the same under a PodGroup and Kueue;
colocate as before."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle.server import order as so
from tests.support.jobs import job_body, pod_body
from tests.support.lifecycle import T0, UID, decide, then

RUNNING = {"phase": "Running", "restarts": 0, "startTime": "2030-01-01T11:00:00Z"}
TRAINERS = ["job-node-0", "job-node-1"]
SERVER = "job-vllm-0"


def body(status: Optional[dict[str, Any]] = None, **kw: Any) -> dict[str, Any]:
    return job_body("job", nodes=2, uid=UID, vllm_server=True, status=dict(status or RUNNING), **kw)


def server(phase: str = "Running", *, ready: bool = True, attempt: int = 0, **kw: Any) -> lc.PodInfo:
    pb = pod_body("job", 0, phase, vllm=True, attempt=attempt, **kw)
    pb["status"].update(startTime="2030-01-01T11:00:00Z", podIP="10.0.0.5")
    pb["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True" if ready else "False"})
    return lc.summarize_pod(pb)


def trainer(rank: int, phase: str = "Running", attempt: int = 0, **kw: Any) -> lc.PodInfo:
    pb = pod_body("job", rank, phase, attempt=attempt, **kw)
    pb["status"]["startTime"] = "2030-01-01T11:00:00Z"
    return lc.summarize_pod(pb)


def cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    c = lc.get_condition(st["conditions"], ctype)
    assert c is not None
    return c  # type: ignore[return-value]


def trainer_failure(b: dict[str, Any], attempt: int = 0) -> lc.Decision:
    return decide(b, [server(), trainer(0, "Failed", attempt, exit_code=137), trainer(1, "Running", attempt)])


def test_a_trainer_exit_137_restarts_only_the_trainers() -> None:
    b = body()
    d = trainer_failure(b)
    st = d.status
    assert st["phase"] == "Restarting" and st["restarts"] == 1 and st["vllmServerAttempt"] == 0
    assert sorted(d.delete_pods) == TRAINERS and SERVER not in d.delete_pods and not d.create_pods
    assert "keeping the Ready vLLM server job-vllm-0" in st["message"]
    assert cond(st, "Restarting")["status"] == "True" and cond(st, "Restarting")["reason"] == "ExitCode137"

    # the old trainers terminate: the kept server is the new attempt's, the old trainers another attempt's
    b = then(b, d)
    going = [server(), trainer(0, "Failed", 0, exit_code=137, deleting=True), trainer(1, "Running", 0, deleting=True)]
    d = decide(b, going, T0 + dt.timedelta(seconds=1))
    assert not d.delete_pods and not d.create_pods and d.probe_server is None and d.status["phase"] == "Restarting"

    # gone, the backoff (10 s) still running: no probe yet
    b = then(b, d)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=5))
    assert d.probe_server is None and not d.create_pods and d.status["phase"] == "Restarting"

    # the backoff over: the engine probe of the kept server (same uid) for attempt 1, trainers withheld
    b = then(b, d)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=11))
    assert d.probe_server == so.EngineProbe(pod=SERVER, uid="pod-job-vllm-0-0", attempt=1, url="http://10.0.0.5:8000")
    assert not d.create_pods and not d.delete_pods and "checking the kept vLLM server" in d.status["message"]
    assert d.requeue_after is not None and d.requeue_after > so.ENGINE_PROBE_TIMEOUT

    # the engine answered: the trainers of attempt 1, against the same server pod
    b = then(b, d)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=12), engine_probe=so.ProbeVerdict("pod-job-vllm-0-0", 1, True))
    assert d.create_pods == TRAINERS and d.create_attempt == 1 and not d.delete_pods
    assert cond(d.status, "Restarting")["status"] == "False" and d.status["vllmServerAttempt"] == 0

    # running: the kept server (attempt 0) is the current attempt's, never deleted as an old attempt's pod
    b = then(b, d)
    d = decide(b, [server(), trainer(0, "Running", 1), trainer(1, "Running", 1)], T0 + dt.timedelta(seconds=30))
    assert d.status["phase"] == "Running" and not d.delete_pods and not d.create_pods


def test_a_verdict_for_another_attempt_or_pod_does_not_count() -> None:
    b = body({**RUNNING, "restarts": 1, "vllmServerAttempt": 0})
    for verdict in (so.ProbeVerdict("pod-job-vllm-0-0", 0, True), so.ProbeVerdict("other-uid", 1, True)):
        d = decide(b, [server()], T0, engine_probe=verdict)
        assert d.probe_server is not None and not d.create_pods


@pytest.mark.parametrize("detail", ["no answer within 60s", "POST /v1/completions answered 500: boom"])
def test_a_failed_or_hung_probe_replaces_the_server_first(detail: str) -> None:
    b = body({**RUNNING, "phase": "Restarting", "restarts": 1, "vllmServerAttempt": 0})
    d = decide(b, [server()], T0, engine_probe=so.ProbeVerdict("pod-job-vllm-0-0", 1, False, detail))
    assert d.delete_pods == [SERVER] and not d.create_pods and "vllmServerAttempt" not in d.status
    assert d.status["restarts"] == 1  # the same restart, not counted again
    assert any(e.reason == so.SERVER_WEDGED and detail in e.message for e in d.events)
    assert cond(d.status, "Running")["reason"] == so.SERVER_WEDGED
    # the old server on its way out is waited for, then attempt 1 starts with a new server, trainers after it
    b = then(b, d)
    d = decide(b, [server(deleting=True)], T0 + dt.timedelta(seconds=1))
    assert not d.create_pods and not d.delete_pods
    b = then(b, d)
    d = decide(b, [], T0 + dt.timedelta(seconds=2))
    assert d.create_pods == [SERVER] and d.create_attempt == 1


def test_a_kept_server_no_longer_ready_is_replaced() -> None:
    b = body({**RUNNING, "phase": "Restarting", "restarts": 1, "vllmServerAttempt": 0})
    d = decide(b, [server(ready=False)], T0)
    assert d.delete_pods == [SERVER] and d.probe_server is None and "vllmServerAttempt" not in d.status


def test_a_kept_server_deleted_by_hand_is_replaced() -> None:
    b = body({**RUNNING, "phase": "Restarting", "restarts": 1, "vllmServerAttempt": 0})
    d = decide(b, [], T0)
    assert d.create_pods == [SERVER] and d.create_attempt == 1 and "vllmServerAttempt" not in d.status


def test_a_server_failure_restarts_all_server_first() -> None:
    b = body()
    d = decide(b, [server("Failed", exit_code=1), trainer(0), trainer(1)])
    st = d.status
    assert st["phase"] == "Restarting" and st["restarts"] == 1 and "vllmServerAttempt" not in st
    assert sorted(d.delete_pods) == sorted(TRAINERS + [SERVER])
    b = then(b, d)
    d = decide(b, [], T0 + dt.timedelta(seconds=11))
    assert d.create_pods == [SERVER] and d.create_attempt == 1


def test_a_server_failure_under_a_kept_server_restarts_all() -> None:
    b = body({**RUNNING, "restarts": 1, "vllmServerAttempt": 0})
    d = decide(b, [server("Failed", exit_code=1), trainer(0, attempt=1), trainer(1, attempt=1)])
    assert d.status["restarts"] == 2 and "vllmServerAttempt" not in d.status
    assert sorted(d.delete_pods) == sorted(TRAINERS + [SERVER])


def test_a_server_not_ready_under_failing_trainers_is_restarted_too() -> None:
    d = decide(body(), [server(ready=False), trainer(0, "Failed", exit_code=137), trainer(1)])
    assert sorted(d.delete_pods) == sorted(TRAINERS + [SERVER]) and "vllmServerAttempt" not in d.status


def test_reused_server_and_no_step_restarts_the_server_too() -> None:
    """The wedge a probe cannot see: the trainers that reused a kept server failed before a logged step."""
    b = body({**RUNNING, "restarts": 1, "vllmServerAttempt": 0})
    d = decide(b, [server(), trainer(0, "Failed", 1, exit_code=137), trainer(1, "Running", 1)])
    assert sorted(d.delete_pods) == sorted(TRAINERS + [SERVER]) and "vllmServerAttempt" not in d.status
    assert "restarting the vLLM server too" in d.status["message"] and d.status["restarts"] == 2
    # with a logging step after the trainers started, the server is kept again (still the attempt-0 pod)
    b["status"]["progress"] = {"step": 3, "updateTime": "2030-01-01T11:30:00Z"}
    d = decide(b, [server(), trainer(0, "Failed", 1, exit_code=137), trainer(1, "Running", 1)])
    assert sorted(d.delete_pods) == TRAINERS and d.status["vllmServerAttempt"] == 0


def test_idempotent_after_a_crash_between_the_status_write_and_the_deletes() -> None:
    """The restart was written (restarts 1, server kept) but the deletes never went out: the next pass deletes the
    old trainers, never the kept server, and does not count again."""
    b = then(body(), trainer_failure(body()))
    pods = [server(), trainer(0, "Failed", 0, exit_code=137), trainer(1, "Running", 0)]
    for _ in range(2):
        d = decide(b, pods, T0 + dt.timedelta(seconds=1))
        assert sorted(d.delete_pods) == TRAINERS and d.status["restarts"] == 1 and d.status["vllmServerAttempt"] == 0


def test_backoff_limit_ends_both() -> None:
    b = body(backoff_limit=0)
    d = trainer_failure(b)
    # the failed trainer stays for its log (as in colocate); what still runs goes, the server included
    assert d.status["phase"] == "Failed" and sorted(d.delete_pods) == ["job-node-1", SERVER]


@pytest.mark.parametrize("how", ["suspend", "deadline"])
def test_suspend_and_deadline_end_the_kept_server_too(how: str) -> None:
    b = body({**RUNNING, "restarts": 1, "vllmServerAttempt": 0}, **({"suspend": True} if how == "suspend" else
                                                                     {"deadline": 60}))
    d = decide(b, [server(), trainer(0, attempt=1), trainer(1, attempt=1)])
    assert SERVER in d.delete_pods and set(TRAINERS) <= set(d.delete_pods)


def test_success_ends_the_kept_server() -> None:
    b = body({**RUNNING, "restarts": 1, "vllmServerAttempt": 0})
    d = decide(b, [server(), trainer(0, "Succeeded", 1, exit_code=0), trainer(1, "Succeeded", 1, exit_code=0)])
    assert d.status["phase"] == "Succeeded" and d.delete_pods == [SERVER]


def test_podgroup_keeps_the_server_too() -> None:
    """A PodGroup counts the trainers only (the server carries no PodGroup label): a trainer restart keeps it."""
    b = body()
    b["spec"]["scheduling"] = {"gang": "coscheduling"}
    d = trainer_failure(b)
    assert sorted(d.delete_pods) == TRAINERS and d.status["vllmServerAttempt"] == 0


def test_kueue_keeps_the_server_too() -> None:
    """Under Kueue the server is a pod group of its own: a trainer restart keeps it (the pod groups:
    tests/unit/gang/test_gang_kueue_server.py)."""
    b = body(labels={"kueue.x-k8s.io/queue-name": "q"})
    d = trainer_failure(b)
    assert sorted(d.delete_pods) == TRAINERS and d.status["vllmServerAttempt"] == 0


def test_colocate_unchanged() -> None:
    b = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    d = decide(b, [trainer(0, "Failed", exit_code=137), trainer(1)])
    assert sorted(d.delete_pods) == TRAINERS and "vllmServerAttempt" not in d.status
    assert "vLLM" not in d.status["message"]
