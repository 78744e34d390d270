"""A trainer that exits with the lost-peer code (200) is usually the echo of another rank's failure, whose own exit
code reaches the API server a moment later (under load, after the echo). decide() waits a bounded grace for the
other trainers' codes before it restarts the gang, so that a permanent error (a config error) fails the job without
a useless restart first — what a loaded node showed: rank 1's 200 seen before rank 0's 10, one restart, then Failed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle.restart import PEER_EXIT_GRACE_SECONDS
from tests.support.jobs import job_body
from tests.support.lifecycle import T0, UID, decide, pod, then

RUNNING = {"phase": "Running", "restarts": 0, "startTime": "2030-01-01T11:00:00Z"}
LOST_PEER = 200  # grpo_trainer.contract.DISTRIBUTED


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_job() -> dict[str, Any]:
    return job_body("job", nodes=2, uid=UID, status=dict(RUNNING))


def echo(rank: int, finished: float) -> lc.PodInfo:
    return pod(rank, "Failed", exit_code=LOST_PEER, finished_at=at(finished))


def test_the_kubelets_finish_time_is_summarized() -> None:
    assert echo(1, -5).finished_at == T0 - dt.timedelta(seconds=5) and pod(0).finished_at is None


def test_an_echo_waits_for_the_running_peer_whose_permanent_code_then_fails_the_job() -> None:
    body = running_job()
    dec = decide(body, [pod(0, "Running"), echo(1, -5)])
    assert dec.requeue_after == pytest.approx(PEER_EXIT_GRACE_SECONDS - 5)
    assert not dec.delete_pods and not dec.create_pods and not dec.events
    assert dec.status is None or (dec.status["phase"] == "Running" and not dec.status.get("restarts"))
    body = then(body, dec) if dec.status is not None else body
    final = decide(body, [pod(0, "Failed", exit_code=10), echo(1, -5)], T0 + dt.timedelta(seconds=3))
    st = final.status
    assert st["phase"] == "Failed" and st["restarts"] == 0 and st["lastFailureReason"] == "ConfigError"


def test_an_echo_restarts_the_gang_once_the_grace_has_passed() -> None:
    dec = decide(running_job(), [pod(0, "Running"), echo(1, -PEER_EXIT_GRACE_SECONDS - 1)])
    assert dec.status["phase"] == "Restarting" and dec.status["restarts"] == 1
    assert sorted(dec.delete_pods) == ["job-node-0", "job-node-1"]


@pytest.mark.parametrize("pods", [
    [echo(0, -1), echo(1, -1)],                                  # no peer left running: nothing more will come
    [pod(0, "Failed", exit_code=143), echo(1, -1)],              # a failure of its own is there already
    [pod(0, "Running"), pod(1, "Failed", exit_code=LOST_PEER)],  # no finish time to count the grace from
    [pod(0, "Running"), echo(1, 5 * PEER_EXIT_GRACE_SECONDS)],   # the kubelet's clock far ahead of ours
    [pod(0, "Pending"), echo(1, -1)],                            # the peer never started: it will not exit
], ids=["all-echoes", "a-real-failure", "no-finish-time", "clock-ahead", "peer-pending"])
def test_otherwise_the_gang_restarts_at_once(pods: list[lc.PodInfo]) -> None:
    dec = decide(running_job(), pods)
    assert dec.status["phase"] == "Restarting" and dec.status["restarts"] == 1


def test_a_permanent_code_beside_an_echo_fails_at_once() -> None:
    dec = decide(running_job(), [pod(0, "Failed", exit_code=10), echo(1, -1)])
    assert dec.status["phase"] == "Failed" and dec.status["lastFailureReason"] == "ConfigError"
