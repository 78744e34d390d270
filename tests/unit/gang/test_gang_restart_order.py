"""The gang rules of the lifecycle, as tables: what each mode waits for before a gang restart creates the next
attempt, what a pod's body says to those rules (Kueue's gate, group, retriable flag, TerminationTarget), which
group the next pods join, and which pod ends a Kueue group for good."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from grpo_operator.api import gang as g
from grpo_operator.lifecycle import gangs
from grpo_operator.lifecycle.gangs import kueue as gang
from grpo_operator.lifecycle.gangs.kueue import GangFacts
from grpo_operator.rules import validation
from tests.support.jobs import job_body

NONE, KUEUE, COSCHEDULING, VOLCANO = "none", "kueue", "coscheduling", "volcano"


@dataclass(frozen=True)
class P:
    name: str
    phase: str = "Running"
    deleting: bool = False
    attempt: int = 0
    gang: GangFacts = field(default_factory=GangFacts)


ON_NODE = GangFacts(scheduled=True)
GATED = GangFacts(gated=True)

# (old pods left after the delete, may a Kueue job create? may the others create?)
RESTART_TABLE = [
    ("nothing left", [], True, True),
    ("all Failed, held by Kueue's finalizer", [P("a", "Failed", True, gang=ON_NODE), P("b", "Failed", True, gang=ON_NODE)],
     True, False),
    ("one still running its grace period", [P("a", "Failed", True, gang=ON_NODE), P("b", "Running", True, gang=ON_NODE)],
     False, False),
    ("one pending on a node (image pull), deleted", [P("a", "Pending", True, gang=ON_NODE)], False, False),
    ("gated, deleted before admission: no kubelet will end it", [P("a", "Pending", True, gang=GATED)], True, False),
    ("unscheduled, deleted", [P("a", "Pending", True)], True, False),
    ("node lost: phase Unknown, deleted", [P("a", "Unknown", True, gang=ON_NODE)], False, False),
    ("succeeded (exit 0 despite SIGTERM)", [P("a", "Succeeded", True, gang=ON_NODE)], True, False),
]


@pytest.mark.parametrize("what, old, kueue_may, others_may", RESTART_TABLE, ids=[r[0] for r in RESTART_TABLE])
def test_restart_order(what: str, old: list[P], kueue_may: bool, others_may: bool) -> None:
    ok, why = gangs.policy(KUEUE).may_create_next(old)
    assert ok is kueue_may, why
    assert bool(why) is not ok
    for mode in (NONE, COSCHEDULING, VOLCANO):
        ok, why = gangs.policy(mode).may_create_next(old)
        assert ok is others_may, (mode, why)
        assert bool(why) is not ok


def test_the_reasons_name_the_pods_and_the_rule() -> None:
    ok, why = gangs.policy(KUEUE).may_create_next([P("job-node-1", "Running", True, gang=ON_NODE)])
    assert not ok and "job-node-1" in why and "excess" in why
    ok, why = gangs.policy(COSCHEDULING).may_create_next([P("job-node-1", "Failed", True)])
    assert not ok and "gone" in why and "PodGroup label" in why


@pytest.mark.parametrize("queue, gang_, expected", [
    (None, None, NONE), ("lq", None, KUEUE), (None, "coscheduling", COSCHEDULING), (None, "volcano", VOLCANO),
    ("", None, NONE), ("lq", "volcano", KUEUE),
])
def test_mode(queue: Any, gang_: Any, expected: str) -> None:
    body = job_body("job", labels={g.KUEUE_QUEUE_LABEL: queue} if queue is not None else None)
    if gang_:
        body["spec"]["scheduling"] = {"gang": gang_}
    job = validation.validate(body).job  # kueue and a PodGroup together: refused, yet parsed
    assert job is not None and gangs.for_job(job).mode == expected


def kueue_pod(**over: Any) -> dict[str, Any]:
    """A pod the way Kueue's webhook and reconciler leave it (v0.19.2): managed label, role hash, finalizer,
    admission + topology gates; then `over` merged in."""
    pod: dict[str, Any] = {
        "metadata": {
            "name": "job-node-0-a1",
            "labels": {g.KUEUE_QUEUE_LABEL: "lq", g.KUEUE_GROUP_NAME_LABEL: "job-0123abcd-a0",
                       g.KUEUE_MANAGED_LABEL: "true"},
            "annotations": {g.KUEUE_GROUP_TOTAL_COUNT_ANNOTATION: "2", g.KUEUE_ROLE_HASH_ANNOTATION: "5b9c1d2e"},
            "finalizers": [g.KUEUE_POD_FINALIZER],
        },
        "spec": {"schedulingGates": [{"name": g.KUEUE_ADMISSION_GATE}, {"name": "kueue.x-k8s.io/topology"}]},
        "status": {"phase": "Pending"},
    }
    for k, v in over.items():
        pod[k] = {**pod[k], **v}
    return pod


def test_facts_of_a_gated_kueue_pod() -> None:
    f = gang.facts(kueue_pod())
    assert f == GangFacts(scheduled=False, gated=True, kueue_group="job-0123abcd-a0", unretriable=False, evicted=None)


def test_facts_of_an_admitted_running_pod() -> None:
    f = gang.facts(kueue_pod(spec={"schedulingGates": [], "nodeName": "n1"}, status={"phase": "Running"}))
    assert f.scheduled and not f.gated and f.evicted is None


def test_facts_of_a_pod_kueue_evicted() -> None:
    cond = {"type": g.KUEUE_TERMINATION_TARGET, "status": "True", "reason": "WorkloadEvicted",
            "message": "Preempted to accommodate a workload with higher priority"}
    f = gang.facts(kueue_pod(spec={"nodeName": "n1", "schedulingGates": []},
                             status={"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, cond]}))
    assert f.evicted == "WorkloadEvicted: Preempted to accommodate a workload with higher priority"
    assert gang.evicted_by_kueue([P("x"), P("y", gang=f)]) == f"y: {f.evicted}"
    assert gang.evicted_by_kueue([P("x"), P("y", gang=ON_NODE)]) is None


def test_facts_of_an_unretriable_pod_and_of_a_plain_pod() -> None:
    f = gang.facts(kueue_pod(metadata={"annotations": {g.KUEUE_RETRIABLE_IN_GROUP_ANNOTATION: "false"}}))
    assert f.unretriable
    assert gang.facts({}) == GangFacts()
    assert gang.facts({"metadata": {"labels": None}, "spec": {"schedulingGates": None}, "status": None}) == GangFacts()
    # another system's gate is not Kueue's: not "queued"
    assert not gang.facts({"spec": {"schedulingGates": [{"name": "example.com/wait"}]}}).gated


def test_queued_lists_gated_pods_not_being_deleted() -> None:
    assert gang.queued([P("a", gang=GATED), P("b", gang=ON_NODE), P("c", deleting=True, gang=GATED)]) == ["a"]


def grp(name: str, unretriable: bool = False) -> GangFacts:
    return GangFacts(kueue_group=name, unretriable=unretriable)


CARRY_TABLE = [
    ("first run: no pods", [], None),
    ("gang restart: old Failed pods still hold the group", [P("a", "Failed", True, 0, grp("j-a0"))], "j-a0"),
    ("the newest attempt's group wins", [P("a", "Failed", True, 0, grp("j-a0")), P("b", "Pending", False, 2, grp("j-a2"))],
     "j-a2"),
    ("an ended (unretriable) group is never joined again",
     [P("a", "Failed", True, 1, grp("j-a1", True)), P("b", "Failed", True, 1, grp("j-a1"))], None),
    ("pods without a group (Kueue off when they were made)", [P("a", "Failed", True, 0)], None),
]


@pytest.mark.parametrize("what, pods, expected", CARRY_TABLE, ids=[r[0] for r in CARRY_TABLE])
def test_carried_group(what: str, pods: list[P], expected: Any) -> None:
    assert gang.carried_group(pods) == expected


def test_release_target_one_pod_per_open_group() -> None:
    pods = [P("b", gang=grp("g1")), P("a", deleting=True, gang=grp("g1")), P("c", gang=grp("g2", True)),
            P("d", gang=grp("g2")), P("e")]
    # one pod per group that has no unretriable pod yet; a pod not being deleted is preferred
    assert gang.release_target(pods) == ["b"]
    assert gang.release_target([P("a", deleting=True, gang=grp("g1"))]) == ["a"]
    assert gang.release_target([P("e")]) == []


def test_a_succeeded_old_pod_ends_its_group_instead_of_being_replaced() -> None:
    old = [P("a", "Failed", True, 0, GangFacts(scheduled=True, kueue_group="g")),
           P("v", "Succeeded", True, 0, GangFacts(scheduled=True, kueue_group="g"))]
    assert gang.groups_to_end_before_replacing(old) == ["a"]
    ended = [P(p.name, p.phase, p.deleting, 0, GangFacts(scheduled=True, kueue_group="g", unretriable=p.name == "a"))
             for p in old]
    assert gang.groups_to_end_before_replacing(ended) == []
    assert gang.carried_group(ended) is None  # the next attempt starts a new group
    assert gang.groups_to_end_before_replacing([P("a", "Failed", True, 0, grp("g"))]) == []
