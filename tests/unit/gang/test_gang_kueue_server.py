"""decide() for a server-mode job under Kueue (issue 21): the vLLM server is a Kueue pod group of its own, created
and admitted first; the trainers' group is created only once the server is Ready; a trainer's retryable failure
refills the trainers' group with the next attempt's trainers and keeps the server and its group; a server failure
replaces both; suspend, give-up, the deadline and deletion end both groups; success ends the server's. Through the
real decision (pure), with pods as Kueue leaves them (group label, finalizer, gate)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle as lc
from grpo_operator.api import gang as g
from grpo_operator.lifecycle.server import order as so
from grpo_operator.render import manifests
from grpo_operator.rules import validation
from tests.support.jobs import job_body, pod_body
from tests.support.lifecycle import T0, UID, decide, then

KUEUE = {g.KUEUE_QUEUE_LABEL: "team-a"}
SERVER_GROUP, TRAINER_GROUP = "job-uid1-vllm-a0", "job-uid1-a0"  # <base>-<uid>[-vllm]-a<attempt the run began at>
RUNNING = {"phase": "Running", "restarts": 0, "startTime": "2030-01-01T11:00:00Z"}


def body(status: Optional[dict[str, Any]] = None, **kw: Any) -> dict[str, Any]:
    return job_body("job", nodes=2, uid=UID, vllm_server=True, labels=KUEUE, status=status, **kw)


def kpod(rank: Optional[int], phase: str = "Running", *, attempt: int = 0, group: Optional[str] = None,
         gated: bool = False, ready: bool = True, unretriable: bool = False, deleting: bool = False,
         **kw: Any) -> lc.PodInfo:
    """rank None: the vLLM server pod. As the operator rendered it (per-attempt names, its role's group) and Kueue
    changed it (managed label, finalizer; the gate until admitted)."""
    server = rank is None
    pb = pod_body("job", rank or 0, phase, attempt=attempt, uid=UID, vllm=server, deleting=deleting, **kw)
    meta, spec = pb["metadata"], pb["spec"]
    if attempt:
        meta["name"] += f"-a{attempt}"
    total = 1 if server else 2
    meta["labels"].update({**KUEUE, g.KUEUE_GROUP_NAME_LABEL: group or (SERVER_GROUP if server else TRAINER_GROUP),
                           g.KUEUE_MANAGED_LABEL: "true"})
    meta["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION] = str(total)
    if unretriable:
        meta["annotations"][g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION] = "false"
    meta["finalizers"] = [g.KUEUE_POD_FINALIZER]
    if gated:
        spec["schedulingGates"] = [{"name": g.KUEUE_ADMISSION_GATE}]
    else:
        spec["nodeName"] = "gpu-1"
        pb["status"].update(startTime="2030-01-01T11:59:00Z", podIP="10.0.0.5")
    if phase == "Running":
        pb["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True" if ready else "False"})
    return lc.summarize_pod(pb)


def server(phase: str = "Running", **kw: Any) -> lc.PodInfo:
    return kpod(None, phase, **kw)


def trainers(phase: str = "Running", **kw: Any) -> list[lc.PodInfo]:
    return [kpod(r, phase, **kw) for r in range(2)]


def cond(dec: lc.Decision, ctype: str) -> dict[str, Any]:
    c = lc.get_condition(dec.status["conditions"], ctype)  # type: ignore[index]
    assert c is not None, ctype
    return c  # type: ignore[return-value]


def test_the_server_is_created_first_in_a_group_of_its_own_and_the_trainers_once_it_is_ready() -> None:
    b = body()
    d = decide(b, [])
    assert d.create_pods == ["job-vllm-0"] and d.create_attempt == 0
    assert d.groups.get("vllm-server") == SERVER_GROUP and d.groups.get("trainer") is None
    assert d.status["phase"] == "Pending" and cond(d, "Running")["reason"] == so.WAITING_FOR_SERVER

    # Kueue holds the server's group at its gate: queued, no trainer
    b = then(b, d)
    d = decide(b, [server("Pending", gated=True)], T0 + dt.timedelta(seconds=1))
    assert not d.create_pods and cond(d, "Queued")["status"] == "True"
    assert "waiting for Kueue to admit the vLLM server's pod group" in d.status["message"]

    # admitted and loading: still no trainer
    b = then(b, d)
    d = decide(b, [server(ready=False)], T0 + dt.timedelta(seconds=2))
    assert not d.create_pods and cond(d, "Queued")["status"] == "False" and d.status["phase"] == "Pending"

    # Ready: the trainers, in the trainers' own group (a second Workload), the server untouched
    b = then(b, d)
    d = decide(b, [server()], T0 + dt.timedelta(seconds=3))
    assert d.create_pods == ["job-node-0", "job-node-1"] and d.groups.get("trainer") == TRAINER_GROUP
    assert d.groups.get("vllm-server") is None and not d.delete_pods

    b = then(b, d)
    d = decide(b, [server(), *trainers()], T0 + dt.timedelta(seconds=4))
    assert d.status["phase"] == "Running" and not d.create_pods and not d.delete_pods


def test_render_puts_the_server_and_the_trainers_in_two_groups() -> None:
    """What the controller creates from the decision: the server's group counts the server pod, the trainers'
    group counts the trainers (a group Kueue admits only once all of its total-count pods exist)."""
    res = validation.validate(body())
    assert res.valid and res.job is not None and res.topology is not None, res.summary()
    pods = [o for o in manifests.core_objects(res.job, res.topology, "ns", uid=UID) if o["kind"] == "Pod"]
    groups = {p["metadata"]["name"]: (p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL],
                                      p["metadata"]["annotations"][g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION]) for p in pods}
    assert groups == {"job-vllm-0": (SERVER_GROUP, "1"), "job-node-0": (TRAINER_GROUP, "2"),
                      "job-node-1": (TRAINER_GROUP, "2")}
    assert all(p["metadata"]["labels"][g.KUEUE_QUEUE_LABEL] == "team-a" for p in pods)  # one queue, two Workloads
    again = manifests.core_objects(res.job, res.topology, "ns", uid=UID, attempt=2,
                             groups={"trainer": TRAINER_GROUP, "vllm-server": SERVER_GROUP})
    assert {p["metadata"]["labels"][g.KUEUE_GROUP_NAME_LABEL] for p in again if p["kind"] == "Pod"} == {
        SERVER_GROUP, TRAINER_GROUP}  # replacements join the lifecycle's groups


def test_a_trainer_exit_137_refills_the_trainers_group_and_keeps_the_server() -> None:
    b = body(dict(RUNNING))
    d = decide(b, [server(), kpod(0, "Failed", exit_code=137), kpod(1)])
    assert sorted(d.delete_pods) == ["job-node-0", "job-node-1"] and d.status["vllmServerAttempt"] == 0
    assert d.status["restarts"] == 1 and not d.release_pods  # no group ends: the server's Workload stays

    # Kueue's finalizer keeps the old trainers (Failed) until their replacements exist: they are waited for only
    # until settled, then (the backoff over) the kept server's engine is checked
    b = then(b, d)
    old = [kpod(r, "Failed", exit_code=137 if r == 0 else 143, deleting=True) for r in range(2)]
    d = decide(b, [server(), *old], T0 + dt.timedelta(seconds=11))
    assert d.probe_server is not None and d.probe_server.pod == "job-vllm-0" and not d.create_pods

    # the engine answered: attempt 1's trainers replace the old ones in the trainers' group; the server stays
    b = then(b, d)
    d = decide(b, [server(), *old], T0 + dt.timedelta(seconds=12),
               engine_probe=so.ProbeVerdict("pod-job-vllm-0-0", 1, True))
    assert d.create_pods == ["job-node-0-a1", "job-node-1-a1"] and d.create_attempt == 1
    assert d.groups.get("trainer") == TRAINER_GROUP and d.groups.get("vllm-server") is None and not d.delete_pods

    # running: the kept server (attempt 0, named for it) is the current attempt's, not a missing pod
    b = then(b, d)
    d = decide(b, [server(), *trainers(attempt=1)], T0 + dt.timedelta(seconds=20))
    assert d.status["phase"] == "Running" and not d.delete_pods and not d.create_pods
    assert d.status["vllmServerAttempt"] == 0 and d.status["restarts"] == 1


def test_a_server_failure_replaces_both_server_first() -> None:
    b = body(dict(RUNNING))
    d = decide(b, [server("Failed", exit_code=1), *trainers()])
    assert sorted(d.delete_pods) == ["job-node-0", "job-node-1", "job-vllm-0"] and "vllmServerAttempt" not in d.status

    # the old pods settled (Failed, held by Kueue's finalizer): the server's replacement joins its group; no trainer
    b = then(b, d)
    old = [server("Failed", exit_code=1), *trainers("Failed", exit_code=143, deleting=True)]
    d = decide(b, old, T0 + dt.timedelta(seconds=11))
    assert d.create_pods == ["job-vllm-0-a1"] and d.create_attempt == 1 and d.groups.get("vllm-server") == SERVER_GROUP

    # the new server Ready: the trainers replace theirs in the trainers' group
    b = then(b, d)
    d = decide(b, [*old, server(attempt=1)], T0 + dt.timedelta(seconds=12))
    assert d.create_pods == ["job-node-0-a1", "job-node-1-a1"] and d.groups.get("trainer") == TRAINER_GROUP


def test_a_server_that_exited_0_on_its_delete_ends_its_group_and_the_next_server_starts_a_new_one() -> None:
    """A deleted `vllm serve` exits 0: Kueue counts a Succeeded pod as its group's for good (a replacement would be
    deleted as excess), so that group is ended and the next server forms a new one."""
    b = body({**RUNNING, "phase": "Restarting", "restarts": 1})
    old = [server("Succeeded", exit_code=0, deleting=True), *trainers("Failed", exit_code=143, deleting=True)]
    d = decide(b, old, T0 + dt.timedelta(minutes=5))
    assert d.release_pods == ["job-vllm-0"] and not d.create_pods
    ended = [server("Succeeded", exit_code=0, deleting=True, unretriable=True), *old[1:]]
    d = decide(then(b, d), ended, T0 + dt.timedelta(minutes=5))
    assert d.create_pods == ["job-vllm-0-a1"] and d.groups.get("vllm-server") == "job-uid1-vllm-a1"


@pytest.mark.parametrize("how", ["suspend", "deadline", "give-up"])
def test_suspend_the_deadline_and_give_up_end_both_groups(how: str) -> None:
    status = {**RUNNING, "restarts": 1, "vllmServerAttempt": 0}
    kw = {"suspend": {"suspend": True}, "deadline": {"deadline": 60}, "give-up": {"backoff_limit": 1}}[how]
    pods = [server(), kpod(0, attempt=1), kpod(1, "Failed", attempt=1, exit_code=137)]
    d = decide(body(status, **kw), pods)
    assert "job-vllm-0" in d.delete_pods
    # one pod per group marked retriable-in-group: "false": Kueue finishes both Workloads and frees their quota
    assert sorted(d.release_pods) == ["job-node-0-a1", "job-vllm-0"]


def test_success_ends_the_servers_group() -> None:
    d = decide(body(dict(RUNNING)), [server(), *trainers("Succeeded", exit_code=0)])
    assert d.status["phase"] == "Succeeded" and d.delete_pods == ["job-vllm-0"]
    assert d.release_pods == ["job-vllm-0"]  # the trainers' group finished with its pods
    done = {**RUNNING, "phase": "Succeeded", "completionTime": "2030-01-01T12:00:00Z"}
    d = decide(body(done), [server(deleting=True), *trainers("Succeeded", exit_code=0)], T0 + dt.timedelta(seconds=1))
    assert d.release_pods == ["job-vllm-0"]  # repeated until the pod shows it
    d = decide(body(done), [server("Failed", deleting=True, unretriable=True), *trainers("Succeeded", exit_code=0)])
    assert d.release_pods == []


def test_deleting_the_job_ends_both_groups() -> None:
    b = body(dict(RUNNING))
    b["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    d = decide(b, [server(), *trainers()])
    assert sorted(d.release_pods) == ["job-node-0", "job-vllm-0"]


def test_a_kueue_eviction_replaces_both_without_charging_the_job() -> None:
    """Kueue preempts the trainers' Workload: the attempt ends for free; the server is replaced too (a kept server
    would need the trainers' failure evidence: an eviction is not one), server first."""
    d = decide(body(dict(RUNNING), backoff_limit=0), [server(), *(lc.summarize_pod(_evicted(r)) for r in range(2))])
    assert d.status["phase"] == "Restarting" and d.status["requeues"] == 1
    assert sorted(d.delete_pods) == ["job-node-0", "job-node-1", "job-vllm-0"]


def _evicted(rank: int, attempt: int = 0) -> dict[str, Any]:
    pb = pod_body("job", rank, "Running", uid=UID, attempt=attempt)
    if attempt:
        pb["metadata"]["name"] += f"-a{attempt}"
    pb["metadata"]["labels"].update({**KUEUE, g.KUEUE_GROUP_NAME_LABEL: TRAINER_GROUP})
    pb["status"]["conditions"] = [{"type": g.KUEUE_TERMINATION_TARGET, "status": "True", "reason": "WorkloadEvicted",
                                   "message": "Preempted"}]
    return pb


def test_a_job_from_an_older_release_with_one_shared_group_restarts_all_into_two_groups() -> None:
    """Before this release a server-mode job under Kueue put the server in the trainers' group: that server is not
    kept (its group is the trainers'), the shared group is ended, and the next attempt forms the two groups."""
    b = body(dict(RUNNING))
    shared = [server(group=TRAINER_GROUP), *trainers()]
    d = decide(b, [shared[0], kpod(0, "Failed", exit_code=137), shared[2]])
    assert sorted(d.delete_pods) == ["job-node-0", "job-node-1", "job-vllm-0"] and "vllmServerAttempt" not in d.status
    b = then(b, d)
    old = [server("Failed", group=TRAINER_GROUP, exit_code=143, deleting=True),
           *trainers("Failed", exit_code=143, deleting=True)]
    d = decide(b, old, T0 + dt.timedelta(seconds=11))
    assert len(d.release_pods) == 1 and not d.create_pods  # the shared group ends first
    old = [server("Failed", group=TRAINER_GROUP, exit_code=143, deleting=True, unretriable=True), *old[1:]]
    d = decide(then(b, d), old, T0 + dt.timedelta(seconds=12))
    assert d.create_pods == ["job-vllm-0-a1"] and d.groups.get("vllm-server") == "job-uid1-vllm-a1"
    d = decide(then(b, d), [*old, server(attempt=1, group="job-uid1-vllm-a1")], T0 + dt.timedelta(seconds=13))
    assert d.create_pods == ["job-node-0-a1", "job-node-1-a1"] and d.groups.get("trainer") == "job-uid1-a1"


@pytest.mark.parametrize("how", ["eviction", "suspend"])
def test_a_kept_server_ended_by_an_eviction_or_a_suspend_is_not_reported_wedged(how: str) -> None:
    """Neither keeps the server: the next attempt starts with a new one, server first, without a VllmServerWedged
    warning about the old one."""
    b = body({**RUNNING, "restarts": 1, "vllmServerAttempt": 0}, **({"suspend": True} if how == "suspend" else {}))
    ran = [server(), *trainers(attempt=1)]
    if how == "eviction":
        ran[1:] = [lc.summarize_pod(_evicted(r, attempt=1)) for r in range(2)]
    d = decide(b, ran)
    assert "vllmServerAttempt" not in d.status and "job-vllm-0" in d.delete_pods
    if how == "suspend":
        b = then(b, d)
        b["spec"]["runPolicy"]["suspend"] = False
        ran = [server("Failed", exit_code=143, deleting=True, unretriable=True),
               *trainers("Failed", attempt=1, exit_code=143, deleting=True)]
        ran[1] = kpod(0, "Failed", attempt=1, exit_code=143, deleting=True, unretriable=True)
    else:
        b = then(b, d)
        ran = [server("Failed", exit_code=143, deleting=True), *trainers("Failed", attempt=1, exit_code=143,
                                                                         deleting=True)]
    d = decide(b, ran, T0 + dt.timedelta(seconds=1))
    assert d.create_pods == ["job-vllm-0-a2"] and not any(e.reason == so.SERVER_WEDGED for e in d.events)
    # after a suspend the ended groups are not joined again; after an eviction the server's group is
    assert d.groups.get("vllm-server") == ("job-uid1-vllm-a2" if how == "suspend" else SERVER_GROUP)

