"""The client's view of a job: state only from status.phase and conditions (never from "no conditions" or from
pods), pods per attempt, why a Pending job waits. Pure: dicts in, dataclasses out."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from grpo_operator.client import Job, NodePod, Progress
from grpo_operator.render import manifests


# ---------------------------------------------------------------------------------------------- phase
def phase_of(b: Any, status: dict[str, Any]) -> str:
    return Job.from_dict(b.job(status)).phase


def test_a_job_without_status_is_unknown_not_created(b: Any) -> None:
    assert Job.from_dict(b.job()).phase == "Unknown"
    assert phase_of(b, {"conditions": []}) == "Unknown"


@pytest.mark.parametrize("phase", ["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended",
                                   "Rejected"])
def test_phase_is_the_operators(b: Any, phase: str) -> None:
    assert Job.from_dict(b.job({"phase": phase, "conditions": [b.cond("Created")]})).phase == phase


def test_resumed_job_is_what_its_phase_says(b: Any) -> None:
    """kubeflow/sdk#803: a resumed job has Suspended=False, so "no conditions → Running" never fired and the job
    read "Created" forever. Here the phase is the operator's, whatever conditions exist."""
    conds = [b.cond("Created", reason="PodsCreated"), b.cond("Suspended", "False", "Resumed"),
             b.cond("Running", reason="AllNodesRunning")]
    running = Job.from_dict(b.job({"phase": "Running", "conditions": conds, "restarts": 0}))
    assert running.phase == "Running" and not running.suspended
    pending = Job.from_dict(b.job({"phase": "Pending", "message": "resumed",
                                      "conditions": [b.cond("Created"), b.cond("Suspended", "False", "Resumed")]}))
    assert pending.phase == "Pending"
    # no phase written (yet): the True condition decides; Suspended=False does not make it Suspended
    assert phase_of(b, {"conditions": [b.cond("Suspended", "False"), b.cond("Running")]}) == "Running"
    assert phase_of(b, {"conditions": [b.cond("Suspended", "False"), b.cond("Created")]}) == "Pending"
    assert phase_of(b, {"conditions": [b.cond("Suspended"), b.cond("Created")]}) == "Suspended"


def test_terminal_conditions_win_when_no_phase_is_written(b: Any) -> None:
    assert phase_of(b, {"conditions": [b.cond("Running"), b.cond("Failed")]}) == "Failed"
    assert phase_of(b, {"conditions": [b.cond("Created"), b.cond("Succeeded")]}) == "Succeeded"
    assert phase_of(b, {"phase": "bogus", "conditions": [b.cond("Restarting")]}) == "Restarting"


def test_gated_pods_leave_the_job_pending_and_say_why(b: Any) -> None:
    """Kueue holds pods behind the admission gate: Pending, not Running; the pods have no log yet."""
    job = Job.from_dict(b.job({"phase": "Pending", "conditions": [b.cond("Created")]}),
                        [b.pod(0, 0, gated=True), b.pod(1, 0, gated=True)])
    assert job.phase == "Pending"
    pod = job.pod_for_rank(0)
    assert pod is not None and pod.gated and not pod.started
    assert "kueue.x-k8s.io/admission" in pod.detail
    assert "2 pod(s) gated" in job.waiting_for and "admission" in job.waiting_for
    # the operator's Queued condition (Kueue mode) is the first word on it
    queued = b.cond("Queued", reason="WaitingForKueue", message="2 pod(s) wait for Kueue to admit their pod group")
    job = Job.from_dict(b.job({"phase": "Pending", "conditions": [b.cond("Created"), queued]}),
                        [b.pod(0, 0, gated=True), b.pod(1, 0, gated=True)])
    assert job.phase == "Pending" and job.waiting_for == "2 pod(s) wait for Kueue to admit their pod group"


def test_unschedulable_condition_is_the_reason_to_wait(b: Any) -> None:
    job = Job.from_dict(b.job({"phase": "Pending", "conditions": [
        b.cond("Unschedulable", message="2 pod(s) unschedulable; 0/3 nodes have nvidia.com/gpu")]}),
        [b.pod(0, 0), b.pod(1, 0)])
    assert "nvidia.com/gpu" in job.waiting_for
    assert Job.from_dict(b.job({"phase": "Running"})).waiting_for == ""


def test_restart_in_flight_old_failed_and_new_pending_pods(b: Any) -> None:
    """The gang restart of attempt 0 → 1 half done: rank 0 already recreated (Pending, attempt 1), rank 1's old pod
    still there (Failed, attempt 0). The job is Restarting; a failed pod of the old attempt makes it neither Failed
    nor a rank of the current attempt."""
    status = {"phase": "Restarting", "restarts": 1, "lastFailureReason": "Signal",
              "conditions": [b.cond("Created"), b.cond("Restarting", reason="Signal"), b.cond("Running", "False")]}
    job = Job.from_dict(b.job(status), [b.pod(0, 1, "Pending"), b.pod(1, 0, "Failed", exit_code=137)])
    assert job.phase == "Restarting" and job.attempt == 1 and not job.finished
    assert [p.name for p in job.pods_of_attempt()] == ["train-node-0"]
    new = job.pod_for_rank(0)
    assert new is not None and new.attempt == 1 and new.phase == "Pending" and not new.started
    assert job.pod_for_rank(1) is None
    old = job.pod_for_rank(1, attempt=0)
    assert old is not None and old.finished and old.exit_code == 137 and old.started
    # the same moment seen after the operator moved the phase on: still never Failed
    job = Job.from_dict(b.job({**status, "phase": "Pending"}), [b.pod(0, 1), b.pod(1, 0, "Failed", exit_code=137)])
    assert job.phase == "Pending"


def test_pods_of_an_earlier_job_of_the_same_name_are_not_ours(b: Any) -> None:
    job = Job.from_dict(b.job({"phase": "Pending"}), [b.pod(0, 0, owner="old-uid"), b.pod(1, 0)])
    assert [p.rank for p in job.pods] == [1]


def test_attempt_from_the_label_or_the_annotation(b: Any) -> None:
    assert NodePod.from_dict(b.pod(0, 3, attempt_as_label=True)).attempt == 3
    assert NodePod.from_dict(b.pod(0, 2)).attempt == 2


def test_a_deleting_pod_yields_to_its_successor_of_the_same_attempt(b: Any) -> None:
    job = Job.from_dict(b.job({"phase": "Pending"}), [b.pod(0, 0, "Running", started=True, deleting=True)])
    assert job.pod_for_rank(0).deleting  # type: ignore[union-attr]


def test_progress_and_summary(b: Any) -> None:
    p = Progress.from_dict({"step": 5, "maxSteps": 20, "reward": 0.5, "display": "5/20", "newField": 1})
    assert p is not None and p.fraction == 0.25 and p.extra == {"newField": 1}
    assert Progress.from_dict({}) is None and Progress.from_dict(None) is None
    job = Job.from_dict(b.job({"phase": "Running", "restarts": 2, "requeues": 1, "progress": {"step": 5, "maxSteps": 20},
                                  "topology": "2x4", "observedGeneration": 1}, labels={
        "kueue.x-k8s.io/queue-name": "team-a"}))
    d = job.as_dict()
    assert d["phase"] == "Running" and d["attempt"] == 2 and d["queue"] == "team-a" and "raw" not in d
    assert d["requeues"] == 1
    assert d["progress"] == {"step": 5, "max_steps": 20} and job.up_to_date


def test_a_malformed_status_reads_as_the_operator_reads_it(b: Any) -> None:
    """The client parses the status with the operator's models (api.parse_status): an invalid value is dropped, the
    rest kept, never an exception."""
    job = Job.from_dict(b.job({"phase": "Runing", "restarts": "two", "message": "m",
                               "conditions": [b.cond("Running"), {"type": "Queued", "status": "Perhaps"}, "junk"],
                               "progress": {"step": "x", "maxSteps": 20, "reward": 1, "later": True},
                               "aNewerOperatorsField": 1}))
    assert (job.phase, job.attempt, job.message) == ("Running", 0, "m")  # no valid phase: the True condition
    assert [(x.type, x.status) for x in job.conditions] == [("Running", "True")] and job.condition("Queued") is None
    assert job.progress is not None and (job.progress.step, job.progress.max_steps, job.progress.reward) == (
        None, 20, 1.0)
    assert job.progress.extra == {"later": True} and job.progress.fraction is None
    assert Job.from_dict({"metadata": {"name": "x"}, "status": "junk"}).phase == "Unknown"


def test_the_client_imports_neither_kopf_nor_torch() -> None:
    code = ("import sys, grpo_operator.client, grpo_operator.cli.kubectl_grpo; "
            "bad = [m for m in ('kopf', 'torch', 'trl', 'transformers', 'grpo_operator.controller') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_rendered_pods_carry_the_attempt_as_a_selectable_label(b: Any) -> None:
    from grpo_operator.rules import validation

    body = b.job({"phase": "Running"})
    body["spec"] = {"model": "m", "dataset": {"name": "d"}, "rewards": [{"name": "accuracy"}], "nodes": 2,
                    "vllm": {"mode": "none"}, "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4}}
    res = validation.validate(body)
    assert res.valid, res.summary()
    pod = manifests.trainer_pod(res.job, res.topology, "ns", 1, uid=b.uid, attempt=2)
    assert pod["metadata"]["labels"]["grpo.dev/attempt"] == "2"
    del pod["metadata"]["annotations"]["grpo.dev/attempt"]  # the label alone is enough for the client
    node = NodePod.from_dict(pod)
    assert (node.rank, node.attempt, node.role) == (1, 2, "trainer")
