"""Server mode's order and restarts (lifecycle/server_order.py), as tables: server first, trainers withheld until
every server pod is Ready, the start-up deadline, what a restart keeps, the wedged-server exception, the gangs."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle import gangs as gang_rules
from grpo_operator.lifecycle import server_order as so
from grpo_operator.rules import validation
from tests.support.jobs import pod_body

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
STARTED = "2030-01-01T12:00:00Z"


def job(mode: str = "server", timeout: Optional[int] = None) -> Any:
    server: dict[str, Any] = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    if timeout is not None:
        server["startupTimeoutSeconds"] = timeout
    vllm: dict[str, Any] = {"mode": mode, **({"server": server} if mode == "server" else {})}
    doc = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "job"},
           "spec": {"model": "/m", "dataset": {"name": "/d.jsonl"}, "rewards": [{"name": "length"}], "nodes": 2,
                    "resources": {"limits": {"nvidia.com/gpu": 1}}, "output": {"volumeClaimName": "c"},
                    "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2, "maxSteps": 2}, "vllm": vllm}}
    res = validation.validate(doc)
    assert res.valid, res.errors
    return res.job


def server(phase: str = "Running", *, ready: bool = False, started: Optional[str] = STARTED, **kw: Any) -> so.ServerPod:
    body = pod_body("job", 0, phase, vllm=True, **kw)
    if started:
        body["status"]["startTime"] = started
    body["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True" if ready else "False"})
    return so.observe_server(body)


def trainer(rank: int, phase: str = "Running", **kw: Any) -> lc.PodInfo:
    return lc.summarize_pod(pod_body("job", rank, phase, **kw))


S = so.SyncEvidence
AFTER = T0 + dt.timedelta(seconds=1800)


# (name, servers, trainers, now, evidence, action, reason, deletes server, deletes trainers, counts a failure)
TABLE = [
    ("nothing yet: the server first", [], [], T0, S(), so.CREATE_SERVER, so.WAITING_FOR_SERVER, False, False, False),
    ("server not on a node: no deadline yet", [server("Pending", started=None)], [], AFTER,
     S(), so.WAIT_FOR_SERVER, so.WAITING_FOR_SERVER, False, False, False),
    ("server loading: trainers withheld", [server()], [], T0 + dt.timedelta(seconds=600), S(),
     so.WAIT_FOR_SERVER, so.WAITING_FOR_SERVER, False, False, False),
    ("server past startupTimeoutSeconds", [server()], [], AFTER, S(),
     so.RESTART_ALL, so.SERVER_STARTUP_TIMEOUT, True, False, True),
    ("server Ready: the trainers now", [server(ready=True)], [], T0, S(), so.CREATE_TRAINERS, "", False, False, False),
    ("kept server Ready: the trainers now", [server(ready=True)], [], T0, S(server_reused=True),
     so.CREATE_TRAINERS, so.SERVER_KEPT, False, False, False),
    ("all running", [server(ready=True)], [trainer(0), trainer(1)], T0, S(), so.PROCEED, "", False, False, False),
    ("trainer exit 137: trainers only", [server(ready=True)], [trainer(0, "Failed", exit_code=137), trainer(1)], T0,
     S(), so.RESTART_TRAINERS, so.SERVER_KEPT, False, True, False),
    ("trainer OOM-killed: trainers only", [server(ready=True)],
     [trainer(0, "Failed", container_reason="OOMKilled"), trainer(1)], T0, S(engine_probe=True),
     so.RESTART_TRAINERS, so.SERVER_KEPT, False, True, False),
    ("trainer node lost: trainers only", [server(ready=True)], [trainer(0, "Failed", pod_reason="NodeLost")], T0,
     S(server_reused=True, progressed=True), so.RESTART_TRAINERS, so.SERVER_KEPT, False, True, False),
    ("engine probe hung: wedged, restart both", [server(ready=True)], [trainer(0, "Failed", exit_code=137)], T0,
     S(engine_probe=False), so.RESTART_ALL, so.SERVER_WEDGED, True, True, False),
    ("reused server, no step: restart both", [server(ready=True)], [trainer(0, "Failed", exit_code=202)], T0,
     S(server_reused=True), so.RESTART_ALL, so.SERVER_WEDGED, True, True, False),
    ("permanent trainer failure: decide() ends both", [server(ready=True)], [trainer(0, "Failed", exit_code=10)],
     T0, S(), so.PROCEED, "", False, False, False),
    ("trainers succeeded: decide()'s", [server(ready=True)], [trainer(0, "Succeeded", exit_code=0)], T0, S(),
     so.PROCEED, "", False, False, False),
    ("server failed while loading: restart both", [server("Failed", exit_code=1)], [], T0, S(),
     so.RESTART_ALL, so.SERVER_FAILED, True, False, True),
    ("server failed under trainers: restart both", [server("Failed", exit_code=1)], [trainer(0), trainer(1)], T0,
     S(), so.RESTART_ALL, so.SERVER_FAILED, True, True, True),
    ("server node lost: restart both", [server("Unknown", ready=True)], [trainer(0)], T0, S(),
     so.RESTART_ALL, so.SERVER_FAILED, True, True, True),
    ("server deleted under trainers: restart both", [], [trainer(0), trainer(1)], T0, S(),
     so.RESTART_ALL, so.SERVER_FAILED, False, True, True),
    ("old server terminating: wait", [server("Running", deleting=True)], [], T0, S(),
     so.WAIT_FOR_SERVER, so.WAITING_FOR_SERVER, False, False, False),
]


@pytest.mark.parametrize("name,servers,trainers,now,evidence,action,reason,del_server,del_trainers,failure",
                         TABLE, ids=[t[0] for t in TABLE])
def test_order_and_restarts(name, servers, trainers, now, evidence, action, reason, del_server, del_trainers,
                            failure):
    d = so.plan(job(), servers, trainers, now, evidence)
    assert (d.action, d.reason) == (action, reason), d
    deleted = set(d.delete)
    assert bool(deleted & {s.pod.name for s in servers}) == del_server, d
    assert bool(deleted & {t.name for t in trainers if not t.deleting}) == del_trainers, d
    assert (d.failure is not None and d.failure.retryable) == failure, d
    if action == so.WAIT_FOR_SERVER:
        assert "waiting for" in d.message and "vLLM server" in d.message


def test_the_deadline_counts_from_the_kubelet_start_and_is_requeued():
    j = job(timeout=120)
    d = so.plan(j, [server()], [], T0 + dt.timedelta(seconds=100))
    assert d.action == so.WAIT_FOR_SERVER and d.requeue_after == pytest.approx(20)
    assert "20s left of startupTimeoutSeconds (120s)" in d.message
    late = so.plan(j, [server()], [], T0 + dt.timedelta(seconds=120))
    assert late.action == so.RESTART_ALL and late.failure is not None
    assert "startupTimeoutSeconds" in late.failure.message
    assert so.plan(j, [server(started=None)], [], T0 + dt.timedelta(days=1)).action == so.WAIT_FOR_SERVER


def test_not_server_mode_is_never_ours():
    assert so.plan(job("colocate"), [], [], T0).action == so.PROCEED


@pytest.mark.parametrize("evidence,wedged", [
    (S(), False), (S(engine_probe=True), False), (S(engine_probe=False), True),
    (S(server_reused=True), True), (S(server_reused=True, progressed=True), False),
    (S(server_reused=True, progressed=True, engine_probe=False), True), (S(progressed=True), False),
])
def test_wedged_rule(evidence, wedged):
    assert (so.server_wedged(evidence) is not None) == wedged


def test_ending_takes_the_server_too():
    assert set(so.ending([server(ready=True)], [trainer(0), trainer(1, deleting=True)])) == {"job-vllm-0", "job-node-0"}


@pytest.mark.parametrize("mode,server_count,trainer_count", [
    (gang_rules.NONE, None, None), ("kueue", 1, 3), ("coscheduling", None, 3), ("volcano", None, 3),
])
def test_the_server_is_not_in_the_trainers_gang(mode, server_count, trainer_count):
    """A gang holding the server and the trainers could not be created server-first: Kueue gates a pod group until
    total-count pods exist, a PodGroup holds pods at Permit until minMember. The server has a group of its own
    (Kueue) or none (PodGroups), kept across trainer restarts; the trainers' count is nodes."""
    g = so.gang_groups(mode, nodes=3)
    assert g["server"] == so.GroupPlan(server_count, True)
    assert g["trainers"] == so.GroupPlan(trainer_count, False)
    with pytest.raises(ValueError):
        so.gang_groups("slurm", 3)
