"""Server mode's rules (lifecycle/server/order.py), as tables: server first, trainers withheld until every server pod
is Ready, the start-up deadline, the wedged-server exception. What a restart keeps: test_server_keep.py."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle.server import order as so
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


def server(phase: str = "Running", *, ready: bool = False, started: Optional[str] = STARTED, **kw: Any) -> lc.PodInfo:
    body = pod_body("job", 0, phase, vllm=True, **kw)
    if started:
        body["status"]["startTime"] = started
    body["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True" if ready else "False"})
    return lc.summarize_pod(body)


S = so.SyncEvidence
AFTER = T0 + dt.timedelta(seconds=1800)


# (name, servers, now, action, reason, counts a failure): the attempt has no trainers yet (server/first.py)
TABLE = [
    ("nothing yet: the server first", [], T0, so.CREATE_SERVER, so.WAITING_FOR_SERVER, False),
    ("server not on a node: no deadline yet", [server("Pending", started=None)], AFTER,
     so.WAIT_FOR_SERVER, so.WAITING_FOR_SERVER, False),
    ("server loading: trainers withheld", [server()], T0 + dt.timedelta(seconds=600),
     so.WAIT_FOR_SERVER, so.WAITING_FOR_SERVER, False),
    ("server past startupTimeoutSeconds", [server()], AFTER, so.RESTART_ALL, so.SERVER_STARTUP_TIMEOUT, True),
    ("server Ready: the trainers now", [server(ready=True)], T0, so.CREATE_TRAINERS, "", False),
    ("server failed while loading: restart both", [server("Failed", exit_code=1)], T0,
     so.RESTART_ALL, so.SERVER_FAILED, True),
    ("old server terminating: wait", [server("Running", deleting=True)], T0,
     so.WAIT_FOR_SERVER, so.WAITING_FOR_SERVER, False),
]


@pytest.mark.parametrize("name,servers,now,action,reason,failure", TABLE, ids=[t[0] for t in TABLE])
def test_order(name, servers, now, action, reason, failure):
    d = so.plan(job(), servers, now)
    assert (d.action, d.reason) == (action, reason), d
    assert (d.failure is not None and d.failure.retryable) == failure, d
    if action == so.WAIT_FOR_SERVER:
        assert "waiting for" in d.message and "vLLM server" in d.message


def test_the_deadline_counts_from_the_kubelet_start_and_is_requeued():
    j = job(timeout=120)
    d = so.plan(j, [server()], T0 + dt.timedelta(seconds=100))
    assert d.action == so.WAIT_FOR_SERVER and d.requeue_after == pytest.approx(20)
    assert "20s left of startupTimeoutSeconds (120s)" in d.message
    late = so.plan(j, [server()], T0 + dt.timedelta(seconds=120))
    assert late.action == so.RESTART_ALL and late.failure is not None
    assert "startupTimeoutSeconds" in late.failure.message
    assert so.plan(j, [server(started=None)], T0 + dt.timedelta(days=1)).action == so.WAIT_FOR_SERVER


@pytest.mark.parametrize("evidence,wedged", [
    (S(), False), (S(engine_probe=True), False), (S(engine_probe=False), True),
    (S(server_reused=True), True), (S(server_reused=True, progressed=True), False),
    (S(server_reused=True, progressed=True, engine_probe=False), True), (S(progressed=True), False),
])
def test_wedged_rule(evidence, wedged):
    assert (so.server_wedged(evidence) is not None) == wedged
