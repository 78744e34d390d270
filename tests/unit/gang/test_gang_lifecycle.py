"""decide() under Kueue, and the restart order of each mode, through the real decision (pure, fast): a pod group
per run, new pod names per attempt, delete → wait until Failed → create, Kueue's edits ignored, Queued while
gated, Kueue's evictions free, groups ended on give-up and suspend."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api import gang as g
from tests.support.jobs import job_body, pod_body
from tests.support.lifecycle import T0, UID, decide, then

GROUP = "job-uid1-a0"  # <base>-<uid, alphanumerics, 8>-a<attempt the run started at>
KUEUE = {g.KUEUE_QUEUE_LABEL: "team-a"}


def job(labels: Optional[dict[str, str]] = KUEUE, status: Optional[dict[str, Any]] = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("nodes", 2)
    return job_body("job", uid=UID, labels=labels, status=status, **kw)


def kpod(rank: int, phase: str = "Running", *, attempt: int = 0, group: Optional[str] = GROUP, gated: bool = False,
         node: bool = True, evicted: Optional[str] = None, unretriable: bool = False, **kw: Any) -> lc.PodInfo:
    """A pod as the operator rendered it and Kueue then changed it (webhook: managed label, finalizer, role hash,
    gates; admission: gates removed, flavor nodeSelector/tolerations merged)."""
    body = pod_body("job", rank, phase, attempt=attempt, uid=UID, **kw)
    meta, spec = body["metadata"], body["spec"]
    if attempt:
        meta["name"] = f"job-node-{rank}-a{attempt}"
    if group:
        meta["labels"].update({**KUEUE, g.KUEUE_GROUP_NAME_LABEL: group, g.KUEUE_MANAGED_LABEL: "true"})
        meta["annotations"].update({g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION: "2", g.KUEUE_ROLE_HASH_ANNOTATION: "a1b2"})
        meta["finalizers"] = [g.KUEUE_POD_FINALIZER]
    if unretriable:
        meta["annotations"][g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION] = "false"
    if gated:
        spec["schedulingGates"] = [{"name": g.KUEUE_ADMISSION_GATE}, {"name": "kueue.x-k8s.io/topology"}]
    elif node:
        spec.update(nodeName="gpu-1", nodeSelector={"cloud.google.com/gke-accelerator": "h100"},
                    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    if evicted:
        body["status"].setdefault("conditions", []).append(
            {"type": g.KUEUE_TERMINATION_TARGET, "status": "True", "reason": evicted, "message": "Preempted"})
    return lc.summarize_pod(body)


def cond(dec: lc.Decision, ctype: str) -> Optional[dict[str, Any]]:
    return lc.get_condition(dec.status.get("conditions") or [], ctype)  # type: ignore[union-attr,return-value]


def running(attempt: int = 0, group: str = GROUP) -> list[lc.PodInfo]:
    return [kpod(r, attempt=attempt, group=group) for r in range(2)]


def test_the_first_pods_form_a_new_group_named_after_the_job_and_run() -> None:
    dec = decide(job(), [])
    assert dec.create_attempt == 0 and dec.create_pods == ["job-node-0", "job-node-1"]
    assert dec.groups.get("trainer") == GROUP
    dec = decide(job(labels=None), [])
    assert dec.groups.get("trainer") is None  # no Kueue, no group


def test_queued_while_gated_then_admitted() -> None:
    body = job()
    dec = decide(body, [kpod(r, "Pending", gated=True, node=False) for r in range(2)])
    assert dec.status["phase"] == "Pending" and "queued" in dec.status["message"]
    q = cond(dec, "Queued")
    assert q and q["status"] == "True" and q["reason"] == "WaitingForKueue" and "team-a" in q["message"]
    assert not dec.create_pods and not dec.delete_pods
    dec = decide(then(body, dec), running())
    q = cond(dec, "Queued")
    assert dec.status["phase"] == "Running" and q and q["status"] == "False" and q["reason"] == "Admitted"


def test_kueues_edits_are_not_drift() -> None:
    """The same running gang, bare and as Kueue left it: the same decision (nothing deleted or recreated)."""
    bare = [lc.summarize_pod(pod_body("job", r, "Running", uid=UID)) for r in range(2)]
    a, b = decide(job(), bare), decide(job(), running())
    assert a.status == b.status and a.status["phase"] == "Running"
    assert a.delete_pods == b.delete_pods == [] and a.create_pods == b.create_pods == []
    assert a.force_delete_pods == b.force_delete_pods == []


def restart(body: dict[str, Any]) -> tuple[dict[str, Any], lc.Decision]:
    """Attempt 0 runs; rank 1 fails retryably; the gang restart is decided."""
    pods = [kpod(0), kpod(1, "Failed", exit_code=137)]
    dec = decide(body, pods)
    assert dec.status["phase"] == "Restarting" and dec.status["restarts"] == 1
    assert sorted(dec.delete_pods) == ["job-node-0", "job-node-1"]
    return then(body, dec), dec


LATER = T0 + dt.timedelta(minutes=10)  # the backoff has run out; far past every deletionTimestamp


def test_kueue_gang_restart_waits_for_failed_not_for_gone() -> None:
    body, _ = restart(job())
    # rank 0 still runs out its grace period: Kueue counts it active; a replacement now would be excess
    old = [kpod(0, "Running", deleting=True), kpod(1, "Failed", exit_code=137, deleting=True)]
    dec = decide(body, old, LATER)
    assert not dec.create_pods and dec.status["phase"] in ("Restarting", "Pending")
    # both Failed, held by Kueue's finalizer (they never go before their replacements exist): create now
    old = [kpod(0, "Failed", exit_code=143, deleting=True), kpod(1, "Failed", exit_code=137, deleting=True)]
    dec = decide(body, old, LATER)
    assert dec.create_attempt == 1 and dec.create_pods == ["job-node-0-a1", "job-node-1-a1"]
    assert dec.groups.get("trainer") == GROUP  # replacements join the group: its Workload keeps the quota
    assert dec.force_delete_pods == []  # held by Kueue's finalizer, not by a lost kubelet: never forced
    # the replacements exist: the old pods are neither deleted again nor in the way
    new = [kpod(r, "Pending", attempt=1, gated=True, node=False) for r in range(2)]
    dec = decide(then(body, dec), old + new, LATER)
    assert not dec.create_pods and not dec.delete_pods and dec.force_delete_pods == []


@pytest.mark.parametrize("labels, gang", [(None, None), (None, "coscheduling"), (None, "volcano")])
def test_without_kueue_the_restart_waits_for_the_old_pods_to_be_gone(labels: Any, gang: Any) -> None:
    body = job(labels=labels)
    if gang:
        body["spec"]["scheduling"] = {"gang": gang}
    body, _ = restart(body)
    old = [lc.summarize_pod(pod_body("job", r, "Failed", exit_code=143, deleting=True, uid=UID)) for r in range(2)]
    assert not decide(body, old, LATER).create_pods
    dec = decide(body, [], LATER)
    assert dec.create_attempt == 1 and dec.create_pods == ["job-node-0", "job-node-1"]  # names per rank


def test_a_pod_deleted_while_gated_is_not_waited_for() -> None:
    body, _ = restart(job())
    old = [kpod(0, "Pending", gated=True, node=False, deleting=True), kpod(1, "Failed", exit_code=137, deleting=True)]
    assert decide(body, old, LATER).create_pods == ["job-node-0-a1", "job-node-1-a1"]


def test_a_succeeded_old_pod_ends_its_group_and_the_next_attempt_starts_a_new_one() -> None:
    body, _ = restart(job())
    old = [kpod(0, "Succeeded", exit_code=0, deleting=True), kpod(1, "Failed", exit_code=137, deleting=True)]
    dec = decide(body, old, LATER)
    assert not dec.create_pods and dec.release_pods == ["job-node-0"]
    old = [kpod(0, "Succeeded", exit_code=0, deleting=True, unretriable=True),
           kpod(1, "Failed", exit_code=137, deleting=True)]
    dec = decide(body, old, LATER)
    assert dec.create_pods == ["job-node-0-a1", "job-node-1-a1"] and dec.groups.get("trainer") == "job-uid1-a1"


def test_kueue_eviction_is_free_and_immediate() -> None:
    body = job(backoff_limit=0)  # not a single restart to spend
    evicted = [kpod(r, "Running", deleting=True, evicted="WorkloadEvicted") for r in range(2)]
    dec = decide(body, evicted)
    st = dec.status
    assert st["phase"] == "Restarting" and st["restarts"] == 1 and st["requeues"] == 1
    assert cond(dec, "Restarting")["reason"] == "EvictedByKueue" and "WorkloadEvicted" in st["message"]
    body = then(body, dec)
    ended = [kpod(r, "Failed", exit_code=143, deleting=True, evicted="WorkloadEvicted") for r in range(2)]
    dec = decide(body, ended, T0)  # no backoff
    assert dec.create_pods == ["job-node-0-a1", "job-node-1-a1"] and dec.groups.get("trainer") == GROUP
    # a real failure later still has its own budget counted without the eviction: 0 left → Failed
    body = then(body, dec)
    dec = decide(body, ended + [kpod(0, attempt=1), kpod(1, "Failed", attempt=1, exit_code=137)], T0)
    assert dec.status["phase"] == "Failed" and dec.status["restarts"] == 1


def test_the_backoff_limit_counts_only_the_jobs_own_failures() -> None:
    body = job(backoff_limit=1, status={"phase": "Running", "restarts": 2, "requeues": 2})
    pods = [kpod(0, attempt=2), kpod(1, "Failed", attempt=2, exit_code=137)]
    dec = decide(body, pods)
    assert dec.status["phase"] == "Restarting" and dec.status["restarts"] == 3 and dec.status["requeues"] == 2
    assert "gang restart 1/1" in dec.status["message"]


def test_giving_up_ends_the_group_once() -> None:
    body = job(backoff_limit=0)
    dec = decide(body, [kpod(0), kpod(1, "Failed", exit_code=137)])
    assert dec.status["phase"] == "Failed" and dec.release_pods == ["job-node-0"]
    body = then(body, dec)
    # a lost patch is sent again; once a pod carries the annotation, nothing more
    assert decide(body, [kpod(0, deleting=True), kpod(1, "Failed", exit_code=137)]).release_pods == ["job-node-1"]
    assert decide(body, [kpod(0, deleting=True), kpod(1, "Failed", exit_code=137, unretriable=True)]).release_pods == []
    # a permanent failure, a deadline: the same
    dec = decide(job(), [kpod(0), kpod(1, "Failed", exit_code=2)])
    assert dec.status["phase"] == "Failed" and dec.release_pods == ["job-node-0"]
    assert decide(job(labels=None), [lc.summarize_pod(pod_body("job", 1, "Failed", exit_code=2, uid=UID))]
                  ).release_pods == []


def test_suspend_ends_the_group_and_resume_starts_a_new_run() -> None:
    body = job()
    dec = decide(body, running())
    body = then(body, dec)
    body["spec"]["runPolicy"]["suspend"] = True
    dec = decide(body, running())
    assert dec.status["phase"] == "Suspended" and sorted(dec.delete_pods) == ["job-node-0", "job-node-1"]
    assert dec.release_pods == ["job-node-0"]
    body = then(body, dec)
    body["spec"]["runPolicy"]["suspend"] = False
    old = [kpod(0, "Failed", exit_code=143, deleting=True, unretriable=True),
           kpod(1, "Failed", exit_code=143, deleting=True)]
    dec = decide(body, old)
    # a new run: new names, a new group (the old Workload may linger, Finished), not charged
    assert dec.status["restarts"] == 1 and dec.status["requeues"] == 1
    assert dec.create_pods == ["job-node-0-a1", "job-node-1-a1"] and dec.groups.get("trainer") == "job-uid1-a1"


def test_resume_without_kueue_is_unchanged() -> None:
    body = job(labels=None, status={"phase": "Suspended", "restarts": 0})
    old = [lc.summarize_pod(pod_body("job", 0, "Failed", exit_code=143, deleting=True, uid=UID))]
    dec = decide(body, old)
    assert not dec.create_pods and dec.status.get("requeues") is None and dec.status["restarts"] == 0
    dec = decide(then(body, dec), [])
    assert dec.create_pods == ["job-node-0", "job-node-1"] and dec.create_attempt == 0


def test_a_deleted_job_ends_its_groups() -> None:
    body = job(status={"phase": "Running"})
    body["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    dec = decide(body, running())
    assert dec.status is None and dec.release_pods == ["job-node-0"]
    assert decide(body, [kpod(0, unretriable=True), kpod(1)]).release_pods == []
    plain = job(labels=None)
    plain["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    assert decide(plain, running()).release_pods == []
