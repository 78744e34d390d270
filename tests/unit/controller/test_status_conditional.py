"""What a pass writes, and in which order (controller/handlers.py, writer.py): status writes are conditional on the
resourceVersion they were decided from (a 409 means the job changed meanwhile — a user's edit, another replica's
write: nothing of that pass is sent, the current version is read and the job decided again); a job's first creates
go before the status that records its start."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest

from grpo_operator import lifecycle
from grpo_operator.controller import handlers, kube
from grpo_operator.controller import metrics as opmetrics
from grpo_operator.controller.settings import Settings
from tests.support.jobs import job_body, pod_body

RUNNING = {"phase": "Running", "startTime": "2030-01-01T00:00:00Z", "observedGeneration": 1, "restarts": 0,
           "conditions": [{"type": "Created", "status": "True", "reason": "PodsCreated", "message": "attempt 0",
                           "lastTransitionTime": "2030-01-01T00:00:00Z"}]}


class Pods:
    synced = True

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.infos = [(lifecycle.pods.summarize_pod(b), None) for b in bodies]

    def of(self, key: Any) -> list[Any]:
        return self.infos


class Kube:
    def __init__(self, current: dict[str, Any], conflict: bool) -> None:
        self.current, self.conflict = current, conflict
        self.status_writes: list[tuple[dict[str, Any], Optional[str]]] = []
        self.sent: list[str] = []

    async def patch_status(self, kind: str, ns: str, name: str, patch: dict[str, Any],
                           resource_version: Optional[str] = None) -> dict[str, Any]:
        self.status_writes.append((patch, resource_version))
        if self.conflict:
            raise kube.Conflict(409, "Conflict", "the object has been modified")
        return {**self.current, "status": patch}

    async def get(self, kind: str, ns: str, name: str, api_version: Optional[str] = None) -> dict[str, Any]:
        self.sent.append("GET")
        return self.current

    async def delete(self, kind: str, ns: str, name: str, **_: Any) -> bool:
        self.sent.append(f"DELETE {name}")
        return True

    async def post_event(self, ns: str, event: dict[str, Any]) -> None:
        self.sent.append("EVENT")

    async def create(self, obj: dict[str, Any], want_body: bool = False) -> None:
        self.sent.append(f"POST {obj['kind']}")
        if obj["kind"] == "Pod" and self.refuse_pods:
            raise kube.ApiError(500, "InternalError", 'Internal error occurred: failed calling webhook "policy"')

    refuse_pods = False


async def suspend_pass(conflict: bool) -> tuple[handlers.Controller, Kube, list[Any]]:
    c = handlers.Controller(Settings(namespaces=["ns"]))
    stale = job_body("j", nodes=2, suspend=True, status=RUNNING)
    stale["metadata"]["resourceVersion"] = "7"
    current = job_body("j", nodes=2, suspend=False, status=RUNNING)  # the user took the suspend back meanwhile
    current["metadata"]["resourceVersion"] = "8"
    k = Kube(current, conflict)
    c.writer.kube, c.observers.pods = k, Pods([pod_body("j", 0), pod_body("j", 1)])  # type: ignore[assignment]
    c.observers.observe_job(stale)
    passes: list[Any] = []

    async def record(key: Any) -> None:  # the pass kicked again: recorded, not run
        passes.append(key)

    c.queue.work = record
    await c.reconcile(("ns", "j"))
    await c.writer.events.close(flush_seconds=30)  # every Event recorded is sent
    await asyncio.gather(*c.queue.tasks.values())  # the passes kicked meanwhile have run
    return c, k, passes


@pytest.mark.asyncio
async def test_the_status_write_carries_the_resource_version_it_was_decided_from() -> None:
    _, k, _ = await suspend_pass(conflict=False)
    assert k.status_writes and k.status_writes[0][1] == "7"
    assert k.status_writes[0][0]["phase"] == "Suspended"
    assert sorted(s for s in k.sent if s.startswith("DELETE")) == ["DELETE j-node-0", "DELETE j-node-1"]


@pytest.mark.asyncio
async def test_a_conflict_sends_nothing_of_the_pass_and_decides_again_from_the_current_version() -> None:
    """Finding (issue 27, Medium 6): status writes were unconditional merge patches (no resourceVersion backstop): a
    decision made from an older version of the job (here: suspend, since taken back) was written and acted on."""
    c, k, passes = await suspend_pass(conflict=True)
    assert [rv for _, rv in k.status_writes] == ["7"]
    assert k.sent == ["GET"]  # no pod deleted, no Event: the decision was not recorded
    assert c.observers.jobs[("ns", "j")]["metadata"]["resourceVersion"] == "8"
    assert passes == [("ns", "j")]  # decided again


@pytest.mark.asyncio
async def test_a_refused_first_create_writes_no_status_claiming_the_start() -> None:
    """Finding (issue 27, Low): `Created=True` and `startTime` were written before any create succeeded (the status
    write went alongside the creates): with every pod create failing (a broken admission webhook, a 500), the job
    said its pods were created and its activeDeadlineSeconds started."""
    c = handlers.Controller(Settings(namespaces=["ns"]))
    k = Kube(job_body("j", nodes=2), conflict=False)
    k.refuse_pods = True
    c.writer.kube, c.observers.pods = k, Pods([])  # type: ignore[assignment]
    c.observers.observe_job(job_body("j", nodes=2))
    with pytest.raises(kube.ApiError):
        await c.reconcile(("ns", "j"))  # the work queue retries it with backoff
    assert "POST Pod" in k.sent and k.status_writes == []
    assert "failed calling webhook" in c.writer.refusals.records[("ns", "j")]
    k.refuse_pods = False
    await c.reconcile(("ns", "j"))  # the retry knows the refusal: CreateFailed, still no claim of a start
    patch = k.status_writes[0][0]
    assert "startTime" not in patch and [x["type"] for x in patch["conditions"]] == ["CreateFailed"]


@pytest.mark.asyncio
async def test_a_first_create_refused_before_sending_writes_no_status_claiming_the_start(monkeypatch) -> None:
    """Finding (issue 27, Low), the same for a refusal the operator makes itself (a ConfigMap over the API server's
    size limit is never sent): the next pass writes CreateFailed, without startTime."""
    from grpo_operator.render import job as render_job

    monkeypatch.setattr(render_job, "oversized", lambda objs: "ConfigMap j-config is over 1 MiB: shorten the spec")
    c = handlers.Controller(Settings(namespaces=["ns"]))
    k = Kube(job_body("j", nodes=2), conflict=False)
    c.writer.kube, c.observers.pods = k, Pods([])  # type: ignore[assignment]
    c.observers.observe_job(job_body("j", nodes=2))
    passes: list[Any] = []

    async def record(key: Any) -> None:
        passes.append(key)

    c.queue.work = record
    await c.reconcile(("ns", "j"))
    await asyncio.gather(*c.queue.tasks.values())  # the pass kicked meanwhile has run
    assert k.status_writes == [] and passes == [("ns", "j")] and not any(s.startswith("POST") for s in k.sent)
    await c.reconcile(("ns", "j"))
    patch = k.status_writes[0][0]
    assert "startTime" not in patch and "over 1 MiB" in patch["message"]


def passes(name: str) -> Optional[float]:
    return opmetrics.REGISTRY.get_sample_value("grpo_operator_reconcile_passes_total", {"namespace": "ns", "name": name})


@pytest.mark.asyncio
async def test_each_completed_pass_is_counted_per_job_until_the_job_is_forgotten() -> None:
    """grpo_operator_reconcile_passes_total{namespace,name}: what tests wait on before asserting that nothing changed.
    A pass before the pods are listed decides nothing and a failed pass did not complete: neither counts."""
    c = handlers.Controller(Settings(namespaces=["ns"]))
    k = Kube(job_body("counted", nodes=2), conflict=False)
    pods = Pods([])
    c.writer.kube, c.observers.pods = k, pods  # type: ignore[assignment]
    c.observers.observe_job(job_body("counted", nodes=2))
    pods.synced = False
    await c.reconcile(("ns", "counted"))
    assert passes("counted") is None and not k.sent
    pods.synced = True
    k.refuse_pods = True
    with pytest.raises(kube.ApiError):
        await c.reconcile(("ns", "counted"))
    assert passes("counted") is None
    k.refuse_pods = False
    await c.reconcile(("ns", "counted"))
    await c.reconcile(("ns", "counted"))
    assert passes("counted") == 2 and passes("another") is None
    c.forget(("ns", "counted"))
    assert passes("counted") is None


@pytest.mark.asyncio
async def test_the_watch_event_of_a_version_a_pass_started_from_kicks_no_pass() -> None:
    """Finding (issue 29, item 7): the watch event of the operator's own status write kicked a pass on a version
    whose write response was already cached and decided from (the pods' events kick a pass first): a third pass per
    new job in the operator bench, decide() and all. A version no pass started from (a user's edit) still kicks."""
    c = handlers.Controller(Settings(namespaces=["ns"]))
    first = job_body("j", nodes=2)
    first["metadata"]["resourceVersion"] = "7"
    written = job_body("j", nodes=2)
    written["metadata"]["resourceVersion"] = "8"  # the response of this pass's status write
    k = Kube(written, conflict=False)
    c.writer.kube, c.observers.pods = k, Pods([pod_body("j", 0), pod_body("j", 1)])  # type: ignore[assignment]
    key = c.observers.observe_job(first)
    kicked: list[Any] = []

    def kick(key: Any) -> None:
        kicked.append(key)

    c.kick = kick  # type: ignore[method-assign]
    c.kick_changed(key)
    assert kicked == [key]  # a version no pass started from
    await c.reconcile(key)  # decides from 7, writes the status, caches the response: 8
    assert k.status_writes and c.observers.jobs[key]["metadata"]["resourceVersion"] == "8"
    c.kick_changed(key)  # the write's own event, before any pass on 8: a pass
    assert kicked == [key, key]
    await c.reconcile(key)  # the pass on 8 (the pods' kick in the operator)
    c.observers.observe_job(written)
    c.kick_changed(key)  # 8's event after it: nothing new to decide from
    assert kicked == [key, key]
    edited = job_body("j", nodes=2)
    edited["metadata"]["resourceVersion"] = "9"
    c.observers.observe_job(edited)
    c.kick_changed(key)
    assert kicked == [key, key, key]
