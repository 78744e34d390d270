"""Upgrade safety: a job that started under earlier rules and that today's rules refuse (a release tightened a rule)
keeps its pods with condition SpecInvalid; terminal phases stay final and their TTL fires; a job that has not
started is Rejected as before (lifecycle/validity.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from tests.support.jobs import job_body
from tests.support.lifecycle import T0, UID, decide, pod

STARTED = "2030-01-01T10:00:00Z"
FINISHED = "2030-01-01T11:00:00Z"  # an hour before T0: a 60 s TTL is due


def refused(kind: str, status: Optional[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A stored job that today's rules refuse: `rule` parses (a batch rule: 7 generations do not divide the batch),
    `unparseable` does not even parse with today's models (a field a newer release renamed)."""
    if kind == "rule":
        return job_body("job", nodes=2, uid=UID, status=status, num_generations=7, **spec)
    body = job_body("job", nodes=2, uid=UID, status=status, **spec)
    body["spec"]["renamedInANewerRelease"] = True
    return body


def status(phase: str, **extra: Any) -> dict[str, Any]:
    out = {"phase": phase, "observedGeneration": 1, "startTime": STARTED, "topology": "2x1cpu",
           "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated", "message": "2 pod(s)",
                           "lastTransitionTime": STARTED}]}
    out.update(extra)
    return out


def cond(dec: lc.Decision, ctype: str) -> dict[str, Any]:
    assert dec.status is not None
    return lc.get_condition(dec.status.get("conditions") or [], ctype) or {}  # type: ignore[return-value]


KINDS = ["rule", "unparseable"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_running_job_keeps_its_pods_with_a_warning_naming_the_rule(kind: str) -> None:
    dec = decide(refused(kind, status("Running")), [pod(0), pod(1)])
    assert dec.status is not None and dec.status["phase"] == "Running"
    assert not dec.delete_pods and not dec.create_pods and not dec.delete_job
    c = cond(dec, "SpecInvalid")
    assert c["status"] == "True" and c["reason"] == "InvalidSpec"
    assert ("numGenerations" if kind == "rule" else "renamedInANewerRelease") in c["message"]
    assert cond(dec, "Rejected") == {}
    assert dec.status["topology"] == "2x1cpu"  # the values it started with
    assert [e.reason for e in dec.events if e.type == "Warning"] == ["SpecInvalid"]
    # level-triggered: the next pass changes nothing and warns no more
    again = decide(refused(kind, dec.status), [pod(0), pod(1)])
    assert again.status == dec.status and not again.events and not again.delete_pods


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("phase, pod_phase", [("Succeeded", "Succeeded"), ("Failed", "Failed")])
def test_terminal_stays_terminal_and_the_ttl_fires(kind: str, phase: str, pod_phase: str) -> None:
    st = status(phase, completionTime=FINISHED)
    pods = [pod(0, pod_phase, exit_code=0 if pod_phase == "Succeeded" else 1), pod(1, pod_phase, exit_code=0)]
    dec = decide(refused(kind, st, ttl=60), pods)
    assert dec.status is not None and dec.status["phase"] == phase and dec.delete_job
    assert any(e.reason == "TTLExpired" for e in dec.events)
    assert cond(dec, "Rejected") == {} and cond(dec, "SpecInvalid")["status"] == "True"
    # before it is due: requeued for the rest of the TTL, nothing else
    early = decide(refused(kind, st, ttl=7200), pods)
    assert early.status is not None and early.status["phase"] == phase and not early.delete_job
    assert early.requeue_after == pytest.approx(3600)


@pytest.mark.parametrize("kind", KINDS)
def test_a_pending_job_that_never_started_is_rejected_as_before(kind: str) -> None:
    for st in (None, {"phase": "Pending", "observedGeneration": 1}):
        dec = decide(refused(kind, st), [])
        assert dec.status is not None and dec.status["phase"] == "Rejected" and not dec.create_pods
        assert cond(dec, "Rejected")["status"] == "True" and cond(dec, "SpecInvalid") == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_pending_job_whose_pods_were_created_started(kind: str) -> None:
    dec = decide(refused(kind, status("Pending")), [pod(0, "Pending"), pod(1, "Pending")])
    assert dec.status is not None and dec.status["phase"] == "Pending" and not dec.delete_pods


def test_a_parseable_refused_job_restarts_as_any_job() -> None:
    """Today's models still render its pods: a retryable failure restarts the gang, and the next attempt's pods are
    created after the backoff (the job keeps going)."""
    dec = decide(refused("rule", status("Running")), [pod(0, "Failed", exit_code=137), pod(1)])
    assert dec.status is not None and dec.status["phase"] == "Restarting" and "job-node-1" in dec.delete_pods
    assert dec.status["restarts"] == 1
    later = decide(refused("rule", dec.status), [], now=T0 + dt.timedelta(seconds=60))
    assert later.create_attempt == 1 and len(later.create_pods) == 2


def test_an_unparseable_job_gets_no_new_pods_and_deletes_none() -> None:
    dec = decide(refused("unparseable", status("Running")), [pod(0, "Failed", exit_code=137), pod(1)])
    assert dec.status is not None and dec.status["phase"] == "Running"
    assert not dec.delete_pods and not dec.create_pods
    assert "no new pods" in dec.status["message"]


def test_an_unparseable_job_succeeds_when_its_trainers_do() -> None:
    pods = [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)]
    dec = decide(refused("unparseable", status("Running"), ttl=60), pods)
    assert dec.status is not None and dec.status["phase"] == "Succeeded" and "completionTime" in dec.status
    assert cond(dec, "Succeeded")["status"] == "True" and dec.requeue_after == pytest.approx(60)
    # one trainer of two is not enough (status.topology says 2 nodes)
    one = decide(refused("unparseable", status("Running")), pods[:1])
    assert one.status is not None and one.status["phase"] == "Running"


def test_a_fixed_spec_clears_the_warning() -> None:
    dec = decide(refused("rule", status("Running")), [pod(0), pod(1)])
    fixed = decide(job_body("job", nodes=2, uid=UID, status=dec.status), [pod(0), pod(1)])
    assert cond(fixed, "SpecInvalid")["status"] == "False" and cond(fixed, "SpecInvalid")["reason"] == "SpecValid"
