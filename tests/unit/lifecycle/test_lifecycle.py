"""lifecycle: exhaustive tables of pod states → job phase, conditions, restarts and actions (pure, fast)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from grpo_operator import api
from grpo_operator import lifecycle as lc
from grpo_operator.lifecycle.draft import spec_digest
from grpo_operator.render import manifests
from grpo_operator.rules import validation
from tests.support.jobs import job_body, pod_body
from tests.support.lifecycle import POLICY, T0, UID, decide, pod, then


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return lc.get_condition(status.get("conditions") or [], ctype)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------- classify
@pytest.mark.parametrize("phase, kw, retryable, reason", [
    ("Running", {}, None, None),
    ("Pending", {}, None, None),
    ("Succeeded", {"exit_code": 0}, None, None),
    ("Failed", {"exit_code": 1}, False, "InternalError"),
    ("Failed", {"exit_code": 2}, False, "ExitCode2"),
    ("Failed", {"exit_code": 127}, False, "ExitCode127"),
    ("Failed", {"exit_code": 128}, True, "ExitCode128"),
    ("Failed", {"exit_code": 137}, True, "ExitCode137"),
    ("Failed", {"exit_code": 143}, True, "Preempted"),
    ("Failed", {"exit_code": 255}, True, "ExitCode255"),
    ("Failed", {"exit_code": 1, "signal": 9}, True, "Signal9"),
    ("Failed", {"exit_code": 137, "container_reason": "OOMKilled"}, True, "OOMKilled"),
    ("Failed", {"exit_code": 1, "container_reason": "OOMKilled"}, True, "OOMKilled"),
    ("Failed", {"pod_reason": "Evicted"}, True, "Evicted"),
    ("Failed", {"pod_reason": "Evicted", "exit_code": 1}, True, "Evicted"),
    ("Failed", {"pod_reason": "DeadlineExceeded"}, True, "DeadlineExceeded"),
    ("Failed", {"pod_reason": "UnexpectedAdmissionError"}, True, "UnexpectedAdmissionError"),
    ("Failed", {"pod_reason": "NodeLost"}, True, "NodeLost"),
    ("Failed", {"pod_reason": "Shutdown"}, True, "NodeLost"),
    ("Running", {"pod_reason": "NodeLost"}, True, "NodeLost"),
    ("Unknown", {}, True, "NodeLost"),
    ("Failed", {}, True, "PodFailed"),
    ("Failed", {"pod_reason": "SomethingNew"}, True, "SomethingNew"),
])
def test_classify(phase: str, kw: dict[str, Any], retryable: bool | None, reason: str | None) -> None:
    f = lc.classify(pod(0, phase, **kw))
    if retryable is None:
        assert f is None
    else:
        assert f is not None and f.retryable is retryable and f.reason == reason
        assert "job-node-0" in f.message


def test_summarize_pod_fields() -> None:
    p = pod(1, "Pending", attempt=3, unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            waiting="ImagePullBackOff")
    assert (p.name, p.rank, p.attempt, p.owner_uid, p.owner_kind, p.role) == ("job-node-1", 1, 3, UID, "GRPOJob", "trainer")
    assert p.unschedulable and "Insufficient" in p.unschedulable
    assert p.waiting and p.waiting.startswith("ImagePullBackOff")
    assert lc.summarize_pod({}).name == ""  # tolerant of anything
    bad = pod_body("job", 0, "Running", attempt=0, uid=UID)
    bad["metadata"]["annotations"][manifests.ANNOTATION_ATTEMPT] = "garbage"
    assert lc.summarize_pod(bad).attempt == 0


@pytest.mark.parametrize("restarts, expected", [(0, 0), (1, 10), (2, 20), (3, 40), (5, 160), (6, 300), (30, 300)])
def test_backoff(restarts: int, expected: float) -> None:
    assert lc.backoff_seconds(restarts, POLICY) == expected


# --------------------------------------------------------------------------------------------- conditions
def test_set_condition_keeps_transition_time_unless_status_changes() -> None:
    conds: list[api.Condition] = []
    lc.set_condition(conds, "Running", "True", "A", "a", T0, 1)
    later = T0 + dt.timedelta(minutes=5)
    lc.set_condition(conds, "Running", "True", "B", "b", later, 2)
    assert [c.model_dump(exclude_unset=True) for c in conds] == [
        {"type": "Running", "status": "True", "reason": "B", "message": "b",
         "lastTransitionTime": "2030-01-01T12:00:00Z", "observedGeneration": 2}]
    lc.set_condition(conds, "Running", "False", "C", "c", later, 2)
    assert conds[0].lastTransitionTime == "2030-01-01T12:05:00Z"
    lc.clear_condition(conds, "Missing", "X", "x", later, 2)
    assert len(conds) == 1


def test_status_patch() -> None:
    assert lc.status_patch({"a": 1}, {"a": 1}) is None
    assert lc.status_patch({"a": 1, "b": 2}, {"a": 3}) == {"a": 3, "b": None}


# --------------------------------------------------------------------------------------------- creation
def test_new_job_creates_all_pods_and_pending_status() -> None:
    body = job_body("job", nodes=2, uid=UID)
    dec = decide(body, [])
    assert dec.create_attempt == 0 and dec.create_pods == ["job-node-0", "job-node-1"]
    st = dec.status
    assert st["phase"] == "Pending" and st["restarts"] == 0 and st["observedGeneration"] == 1
    assert st["topology"] == "2x4" and st["batch"]["worldSize"] == 8 and set(st["batch"]) == set(lc.BATCH_KEYS)
    assert st["startTime"] == "2030-01-01T12:00:00Z"
    assert cond(st, "Created")["status"] == "True"
    assert [e.reason for e in dec.events] == ["Pending"]
    assert all(c["observedGeneration"] == 1 for c in st["conditions"])


def test_vllm_server_mode_expects_vllm_pod() -> None:
    body = job_body("job", nodes=1, uid=UID, vllm_server=True)
    dec = decide(body, [])
    assert dec.create_pods == ["job-vllm-0"]  # the server first (lifecycle/server/first.py; test_server_wiring.py)


def test_partial_creation_is_completed_without_restart() -> None:
    body = job_body("job", nodes=3, uid=UID)
    dec = decide(body, [pod(0, "Pending")])
    assert dec.create_pods == ["job-node-1", "job-node-2"] and dec.create_attempt == 0
    assert not dec.delete_pods and dec.status["restarts"] == 0


def test_synthetic_pods_are_not_recreated() -> None:
    body = job_body("job", nodes=2, uid=UID)
    syn = [lc.PodInfo(name=f"job-node-{r}", attempt=0, owner_uid=UID, synthetic=True) for r in range(2)]
    dec = decide(body, syn)
    assert not dec.create_pods and dec.status["phase"] == "Pending" and dec.requeue_after is not None


def test_is_idempotent_once_status_written() -> None:
    body = job_body("job", nodes=2, uid=UID)
    pods = [pod(0, "Pending"), pod(1, "Pending")]
    d1 = decide(body, pods)
    d2 = decide(then(body, d1), pods, T0 + dt.timedelta(seconds=30))
    assert lc.status_patch(d1.status, d2.status) is None and not d2.events and not d2.create_pods


# --------------------------------------------------------------------------------------------- phases
@pytest.mark.parametrize("phases, expected", [
    (["Pending", "Pending"], "Pending"),
    (["Running", "Pending"], "Pending"),
    (["Running", "Running"], "Running"),
    (["Running", "Succeeded"], "Running"),
    (["Succeeded", "Succeeded"], "Succeeded"),
])
def test_phase_from_pods(phases: list[str], expected: str) -> None:
    body = job_body("job", nodes=2, uid=UID, status={"phase": "Pending", "restarts": 0, "startTime": "2030-01-01T11:00:00Z"})
    dec = decide(body, [pod(i, ph, exit_code=0 if ph == "Succeeded" else None) for i, ph in enumerate(phases)])
    assert dec.status["phase"] == expected
    if expected == "Succeeded":
        assert dec.status["completionTime"] == "2030-01-01T12:00:00Z"
        assert cond(dec.status, "Succeeded")["status"] == "True"
    if expected == "Running":
        assert cond(dec.status, "Running")["status"] == "True"
        assert any(e.reason == "Running" and e.type == "Normal" for e in dec.events)


def test_success_deletes_vllm_server() -> None:
    body = job_body("job", nodes=1, uid=UID, vllm_server=True, status={"phase": "Running", "restarts": 0})
    vllm = lc.summarize_pod(pod_body("job", 0, "Running", uid=UID, vllm=True))
    dec = decide(body, [pod(0, "Succeeded", exit_code=0), vllm])
    assert dec.status["phase"] == "Succeeded" and dec.delete_pods == ["job-vllm-0"]


def test_unschedulable_condition_carries_scheduler_message() -> None:
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    body = job_body("job", nodes=2, uid=UID, status={"phase": "Pending", "restarts": 0})
    dec = decide(body, [pod(0, "Pending", unschedulable=msg), pod(1, "Pending")])
    c = cond(dec.status, "Unschedulable")
    assert c["status"] == "True" and msg in c["message"] and msg in dec.status["message"]
    assert any(e.reason == "Unschedulable" and e.type == "Warning" for e in dec.events)
    dec2 = decide(then(body, dec), [pod(0, "Running"), pod(1, "Running")])
    assert cond(dec2.status, "Unschedulable")["status"] == "False" and dec2.status["phase"] == "Running"


# --------------------------------------------------------------------------------------------- failures
RUNNING = {"phase": "Running", "restarts": 0, "startTime": "2030-01-01T11:00:00Z"}


def test_permanent_failure_fails_without_restart() -> None:
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    dec = decide(body, [pod(0, "Failed", exit_code=1), pod(1, "Running")])
    st = dec.status
    assert st["phase"] == "Failed" and st["restarts"] == 0 and st["lastFailureReason"] == "InternalError"
    assert st["completionTime"] and cond(st, "Failed")["reason"] == "InternalError"
    assert dec.delete_pods == ["job-node-1"] and not dec.create_pods
    assert any(e.type == "Warning" and e.reason == "Failed" for e in dec.events)


@pytest.mark.parametrize("kw", [{"exit_code": 143}, {"exit_code": 137, "container_reason": "OOMKilled"},
                                {"pod_reason": "Evicted"}, {"signal": 9, "exit_code": 137}])
def test_retryable_failure_gang_restarts(kw: dict[str, Any]) -> None:
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    dec = decide(body, [pod(0, "Failed", **kw), pod(1, "Running")])
    st = dec.status
    assert st["phase"] == "Restarting" and st["restarts"] == 1 and st["lastFailureReason"]
    assert sorted(dec.delete_pods) == ["job-node-0", "job-node-1"] and not dec.create_pods
    assert cond(st, "Restarting")["status"] == "True" and dec.requeue_after == pytest.approx(10, abs=0.1)
    assert any(e.type == "Warning" and e.reason == "Restarting" for e in dec.events)


def test_restart_flow_waits_for_old_pods_then_backoff_then_creates_next_attempt() -> None:
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    d1 = decide(body, [pod(0, "Failed", exit_code=143), pod(1, "Running")])
    b1 = then(body, d1)
    # old pods still terminating: wait, do not delete twice, do not create
    d2 = decide(b1, [pod(0, "Failed", exit_code=143, deleting=True), pod(1, "Running", deleting=True)],
                T0 + dt.timedelta(seconds=1))
    assert not d2.create_pods and not d2.delete_pods and d2.status["phase"] == "Restarting"
    # gone, but backoff (10 s) not elapsed
    d3 = decide(then(b1, d2), [], T0 + dt.timedelta(seconds=5))
    assert not d3.create_pods and d3.status["phase"] == "Restarting" and d3.requeue_after == pytest.approx(5, abs=0.1)
    # backoff elapsed: attempt 1
    d4 = decide(then(b1, d3), [], T0 + dt.timedelta(seconds=11))
    assert d4.create_attempt == 1 and d4.create_pods == ["job-node-0", "job-node-1"]
    assert cond(d4.status, "Restarting")["status"] == "False" and d4.status["restarts"] == 1
    b4 = then(b1, d4)
    d5 = decide(b4, [pod(0, "Running", attempt=1), pod(1, "Running", attempt=1)], T0 + dt.timedelta(seconds=20))
    assert d5.status["phase"] == "Running" and d5.status["restarts"] == 1 and not d5.delete_pods


def test_backoff_limit_exceeded_fails() -> None:
    body = job_body("job", nodes=1, uid=UID, backoff_limit=2, status={**RUNNING, "restarts": 2})
    dec = decide(body, [pod(0, "Failed", attempt=2, exit_code=137)])
    assert dec.status["phase"] == "Failed" and cond(dec.status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert dec.status["restarts"] == 2


def test_backoff_limit_zero_fails_on_first_retryable() -> None:
    body = job_body("job", nodes=1, uid=UID, backoff_limit=0, status=dict(RUNNING))
    dec = decide(body, [pod(0, "Failed", exit_code=143)])
    assert dec.status["phase"] == "Failed" and cond(dec.status, "Failed")["reason"] == "BackoffLimitExceeded"


def test_deleted_pod_of_running_gang_restarts() -> None:
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    dec = decide(body, [pod(0, "Running")])  # node-1 vanished
    assert dec.status["phase"] == "Restarting" and dec.status["lastFailureReason"] == "PodDeleted"
    dec = decide(body, [pod(0, "Running"), pod(1, "Running", deleting=True)])
    assert dec.status["phase"] == "Restarting" and dec.status["lastFailureReason"] == "PodDeleted"


def test_pending_pod_deleted_before_start_is_recreated() -> None:
    body = job_body("job", nodes=2, uid=UID, status={"phase": "Pending", "restarts": 0})
    dec = decide(body, [pod(0, "Pending"), pod(1, "Pending", deleting=True)])
    assert dec.status["phase"] == "Pending" and not dec.create_pods and not dec.delete_pods
    dec = decide(body, [pod(0, "Pending")])
    assert dec.create_pods == ["job-node-1"]


def test_vllm_server_failure_is_always_retryable() -> None:
    body = job_body("job", nodes=1, uid=UID, vllm_server=True, status=dict(RUNNING))
    vllm = lc.summarize_pod(pod_body("job", 0, "Failed", uid=UID, vllm=True, exit_code=1))
    dec = decide(body, [pod(0, "Running"), vllm])
    assert dec.status["phase"] == "Restarting"


def test_lost_status_write_is_recovered_from_pod_attempts() -> None:
    # status says attempt 0 but the pods are attempt 2 (two status writes lost): adopt 2, do not restart
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    dec = decide(body, [pod(0, "Running", attempt=2), pod(1, "Running", attempt=2)])
    assert dec.status["restarts"] == 2 and dec.status["phase"] == "Running" and not dec.delete_pods


def test_repeated_decision_on_same_failure_is_idempotent() -> None:
    # the same failed pod seen twice with a stale status (our write not yet seen) → same restarts value
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    pods = [pod(0, "Failed", exit_code=143), pod(1, "Running")]
    assert decide(body, pods).status["restarts"] == decide(body, pods).status["restarts"] == 1


def test_stale_attempt_pods_are_deleted() -> None:
    body = job_body("job", nodes=2, uid=UID, status={"phase": "Pending", "restarts": 1})
    dec = decide(body, [pod(0, "Running", attempt=0), pod(1, "Pending", attempt=1)])
    assert dec.delete_pods == ["job-node-0"] and not dec.create_pods


# --------------------------------------------------------------------------------------------- ownership
def test_foreign_pod_is_a_conflict_not_touched() -> None:
    body = job_body("job", nodes=2, uid=UID)
    foreign = lc.summarize_pod(pod_body("job", 1, "Running", uid="other", owner_kind="ReplicaSet"))
    dec = decide(body, [foreign])
    assert dec.create_pods == ["job-node-0"] and "job-node-1" not in dec.delete_pods
    c = cond(dec.status, "Created")
    assert c["status"] == "False" and c["reason"] == "ChildConflict" and "job-node-1" in c["message"]
    assert any(e.reason == "ChildConflict" for e in dec.events)


def test_pod_of_older_incarnation_is_deleted() -> None:
    body = job_body("job", nodes=1, uid=UID)
    old = lc.summarize_pod(pod_body("job", 0, "Running", uid="previous-uid"))
    dec = decide(body, [old])
    assert dec.delete_pods == ["job-node-0"]


# --------------------------------------------------------------------------------------------- policies
def test_deadline_exceeded() -> None:
    body = job_body("job", nodes=1, uid=UID, deadline=60, status={**RUNNING, "startTime": "2030-01-01T11:58:00Z"})
    dec = decide(body, [pod(0, "Running")])
    assert dec.status["phase"] == "Failed" and cond(dec.status, "Failed")["reason"] == "DeadlineExceeded"
    assert dec.delete_pods == ["job-node-0"]
    body = job_body("job", nodes=1, uid=UID, deadline=600, status={**RUNNING, "startTime": "2030-01-01T11:58:00Z"})
    dec = decide(body, [pod(0, "Running")])
    assert dec.status["phase"] == "Running" and dec.requeue_after == pytest.approx(480, abs=1)


@pytest.mark.parametrize("elapsed, deletes", [(10, False), (3600, True)])
def test_ttl_after_finished(elapsed: int, deletes: bool) -> None:
    body = job_body("job", nodes=1, uid=UID, ttl=3600,
                    status={"phase": "Succeeded", "restarts": 0, "completionTime": "2030-01-01T12:00:00Z"})
    dec = decide(body, [pod(0, "Succeeded", exit_code=0)], T0 + dt.timedelta(seconds=elapsed))
    assert dec.delete_job is deletes
    if not deletes:
        assert dec.requeue_after == pytest.approx(3590, abs=1)


def test_terminal_is_sticky_and_cleans_running_pods() -> None:
    body = job_body("job", nodes=2, uid=UID, status={"phase": "Failed", "restarts": 0, "completionTime": "2030-01-01T12:00:00Z"})
    dec = decide(body, [pod(0, "Failed", exit_code=1), pod(1, "Running")])
    assert dec.status["phase"] == "Failed" and dec.delete_pods == ["job-node-1"] and not dec.create_pods
    assert not dec.events and not dec.delete_job


def test_suspend_and_resume() -> None:
    body = job_body("job", nodes=2, uid=UID, suspend=True, status=dict(RUNNING))
    d1 = decide(body, [pod(0, "Running"), pod(1, "Running")])
    assert d1.status["phase"] == "Suspended" and sorted(d1.delete_pods) == ["job-node-0", "job-node-1"]
    assert "startTime" not in d1.status and cond(d1.status, "Suspended")["status"] == "True"
    b1 = then(body, d1)
    d2 = decide(b1, [])
    assert d2.status["phase"] == "Suspended" and not d2.create_pods and not d2.events
    resumed = job_body("job", nodes=2, uid=UID, suspend=False, status=b1["status"])
    d3 = decide(resumed, [pod(0, "Running", deleting=True)])  # still terminating: wait
    assert not d3.create_pods and d3.status["phase"] == "Pending" and d3.status["restarts"] == 0
    d4 = decide(then(resumed, d3), [])
    assert d4.create_pods == ["job-node-0", "job-node-1"] and d4.create_attempt == 0 and d4.status["startTime"]
    assert cond(d4.status, "Suspended")["status"] == "False"


def test_suspended_at_creation_creates_nothing() -> None:
    dec = decide(job_body("job", nodes=1, uid=UID, suspend=True), [])
    assert dec.status["phase"] == "Suspended" and not dec.create_pods


def test_kueue_label_passes_to_pods() -> None:
    body = job_body("job", nodes=1, uid=UID, labels={"kueue.x-k8s.io/queue-name": "team-a"})
    res = validation.validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    objs = manifests.core_objects(res.job, res.topology, "ns", uid=UID)
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert pods and all(p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" for p in pods)


# --------------------------------------------------------------------------------------------- validation
def test_invalid_spec_is_rejected_with_no_pods() -> None:
    body = job_body("job", nodes=1, uid=UID, num_generations=7)
    dec = decide(body, [])
    st = dec.status
    assert st["phase"] == "Rejected" and not dec.create_pods
    c = cond(st, "Rejected")
    assert c["status"] == "True" and "numGenerations" in c["message"]
    assert any(e.type == "Warning" and e.reason == "Rejected" for e in dec.events)
    # running pods of a job whose spec was edited to an invalid one (webhook off) are removed: the operator never
    # saw that spec (status.specDigest records the one its pods came from); today's rules refusing the spec it
    # started with keep them (tests/unit/lifecycle/test_upgrade.py, test_spec_edits.py)
    started_with = spec_digest(job_body("job", nodes=1, uid=UID)["spec"])
    edited = job_body("job", nodes=1, uid=UID, num_generations=7, generation=2,
                      status={"phase": "Running", "observedGeneration": 1, "startTime": "2030-01-01T11:00:00Z",
                              "specDigest": started_with})
    dec = decide(edited, [pod(0, "Running")])
    assert dec.delete_pods == ["job-node-0"] and dec.status["phase"] == "Rejected"


def test_fixed_spec_leaves_rejected() -> None:
    bad = job_body("job", nodes=1, uid=UID, num_generations=7)
    d1 = decide(bad, [])
    good = job_body("job", nodes=1, uid=UID, status=d1.status)
    d2 = decide(good, [])
    assert d2.status["phase"] == "Pending" and cond(d2.status, "Rejected")["status"] == "False" and d2.create_pods


def test_a_deleting_job_writes_nothing_and_deletes_its_own_pods_itself() -> None:
    """Its pods go now, running or finished, not when the garbage collector gets to them (issue 22 item 6); a pod
    already on its way out or owned by another job is not touched."""
    body = job_body("job", nodes=3, uid=UID)
    body["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    other = lc.summarize_pod(pod_body("job", 5, "Running", uid="an-older-job"))
    dec = decide(body, [pod(0, "Running"), pod(1, "Succeeded"), pod(2, "Running", deleting=True), other])
    assert dec.status is None and not dec.create_pods
    assert dec.delete_pods == ["job-node-0", "job-node-1"]


# --------------------------------------------------------------------------------------------- exhaustive
PHASES = ["Pending", "Running", "Succeeded", "Failed-1", "Failed-143", "Unknown", "missing", "deleting"]


@pytest.mark.parametrize("job_phase", [None, "Pending", "Running"])
@pytest.mark.parametrize("a", PHASES)
@pytest.mark.parametrize("b", PHASES)
def test_two_node_table(job_phase: str | None, a: str, b: str) -> None:
    """Every pair of pod states of a 2-node job: the decision is consistent and converges."""
    status = {"restarts": 0} if job_phase is None else {"phase": job_phase, "restarts": 0, "startTime": "2030-01-01T11:00:00Z"}
    body = job_body("job", nodes=2, uid=UID, backoff_limit=3, status=status)
    pods = []
    for rank, s in enumerate((a, b)):
        if s == "missing":
            continue
        if s == "deleting":
            pods.append(pod(rank, "Running", deleting=True))
        elif s.startswith("Failed"):
            pods.append(pod(rank, "Failed", exit_code=int(s.split("-")[1])))
        else:
            pods.append(pod(rank, s, exit_code=0 if s == "Succeeded" else None))
    dec = decide(body, pods)
    st = dec.status
    states = {a, b}
    if "Failed-1" in states:
        assert st["phase"] == "Failed" and st["restarts"] == 0
    elif states & {"Failed-143", "Unknown"}:
        assert st["phase"] == "Restarting" and st["restarts"] == 1
    elif states == {"Succeeded"}:
        assert st["phase"] == "Succeeded"
    elif "deleting" in states and job_phase == "Running":
        assert st["phase"] == "Restarting"
    elif "missing" in states and (states & {"Running", "Succeeded", "deleting"}) and job_phase in (None, "Pending", "Running"):
        assert st["phase"] == "Restarting" or dec.create_pods
    elif states <= {"Running", "Succeeded"}:
        assert st["phase"] == "Running"
    else:
        assert st["phase"] == "Pending"
    # invariants: never create and delete the same pod; never create while old pods remain; status well-formed
    assert not set(dec.create_pods) & set(dec.delete_pods)
    if dec.create_pods:
        assert all(p.name not in dec.create_pods or p.deleting for p in pods)
    assert st["observedGeneration"] == 1 and isinstance(st["restarts"], int)
    for c in st["conditions"]:
        assert c["status"] in ("True", "False") and c["lastTransitionTime"].endswith("Z") and c["reason"]
    # convergence: applying the decision and deciding again with the same pods changes nothing further
    # (except terminal cleanups that were already requested)
    again = decide(then(body, dec), pods)
    assert again.status["phase"] == st["phase"] and again.status["restarts"] == st["restarts"]


def test_success_takes_the_final_progress_from_rank0_termination_message() -> None:
    """The last scrape may lag the end; rank 0's `GRPO_RESULT` termination message says where training ended."""
    status = {"phase": "Running", "restarts": 0, "progress": {"step": 106, "maxSteps": 120, "display": "106/120",
                                                                "reward": 0.2, "etaSeconds": 9}}
    body = job_body("job", nodes=2, uid=UID, status=status)
    p0 = lc.summarize_pod(pod_body("job", 0, "Succeeded", uid=UID, exit_code=0))
    p1 = lc.summarize_pod(pod_body("job", 1, "Succeeded", uid=UID, exit_code=0))
    p1 = lc.PodInfo(**{**p1.__dict__, "message": 'GRPO_RESULT {"step":120,"maxSteps":120,"reward":0.3}'})
    dec = decide(body, [p0, p1])
    assert dec.status["phase"] == "Succeeded"
    assert dec.status["progress"]["display"] == "120/120" and dec.status["progress"]["reward"] == 0.3
    assert dec.status["progress"]["etaSeconds"] == 0
    dec = decide(body, [p0, lc.summarize_pod(pod_body("job", 1, "Succeeded", uid=UID, exit_code=0))])
    assert dec.status["progress"]["display"] == "106/120"  # no record: the last scrape stays


# --------------------------------------------------------------------------------------------- lost node
def test_pods_stuck_terminating_on_a_lost_node_are_force_deleted_after_the_grace_period() -> None:
    body = job_body("job", nodes=2, uid=UID, status=dict(RUNNING))
    d1 = decide(body, [pod(0, "Running"), pod(1, "Running", deleting=True)])  # node of rank 1 lost, pod evicted
    assert d1.status["phase"] == "Restarting" and d1.delete_pods == ["job-node-0"] and not d1.force_delete_pods
    b1 = then(body, d1)
    stuck = [pod(0, "Running", deleting=True), pod(1, "Running", deleting=True)]  # deletionTimestamp = T0
    d2 = decide(b1, stuck, T0 + dt.timedelta(seconds=45))
    assert not d2.force_delete_pods and not d2.create_pods and not d2.delete_pods
    assert d2.requeue_after == pytest.approx(15, abs=0.1)  # comes back when they are due
    d3 = decide(then(b1, d2), stuck, T0 + dt.timedelta(seconds=61))
    assert [n for n, _ in d3.force_delete_pods] == ["job-node-0", "job-node-1"] and not d3.create_pods
    assert all("61s after its grace period" in why for _, why in d3.force_delete_pods)
    assert d3.status["phase"] == "Restarting" and d3.status["restarts"] == 1  # no second restart for the same loss
    d4 = decide(then(b1, d3), [], T0 + dt.timedelta(seconds=62))  # gone: the next attempt is created
    assert d4.create_attempt == 1 and d4.create_pods == ["job-node-0", "job-node-1"]


def test_force_delete_can_be_turned_off_and_never_touches_live_or_synthetic_pods() -> None:
    body = job_body("job", nodes=2, uid=UID, status={**RUNNING, "phase": "Restarting", "restarts": 1})
    stuck = [pod(0, "Running", deleting=True), pod(1, "Running", deleting=True)]
    later = T0 + dt.timedelta(days=1)
    assert not decide(body, stuck, later, policy=lc.Policy(force_delete_after=None)).force_delete_pods
    live = [pod(0, "Running", attempt=1), pod(1, "Running", attempt=1),
            lc.PodInfo(name="job-node-1", attempt=1, owner_uid=UID, synthetic=True, deleting=True)]
    assert not decide(body, live, later).force_delete_pods


def test_a_stuck_pod_of_an_older_job_with_the_same_name_is_force_deleted_too() -> None:
    old = lc.summarize_pod(pod_body("job", 0, "Running", uid="uid-old", deleting=True))
    dec = decide(job_body("job", nodes=1, uid=UID), [old], T0 + dt.timedelta(seconds=120))
    assert [n for n, _ in dec.force_delete_pods] == ["job-node-0"]


@pytest.mark.parametrize("raw, seconds", [("60", 60.0), ("0", 0.0), ("2.5", 2.5), ("off", None), ("", None),
                                          ("-1", None), ("never", None)])
def test_force_delete_setting_from_the_environment(raw: str, seconds: float | None) -> None:
    from grpo_operator.controller.settings import Settings

    cfg = Settings.from_env({"GRPO_FORCE_DELETE_AFTER_SECONDS": raw})
    assert cfg.policy.force_delete_after == seconds
    assert Settings.from_env({}).policy.force_delete_after == 60.0
